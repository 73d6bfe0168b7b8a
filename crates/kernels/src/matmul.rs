//! Matrix multiplication drivers: `out = x · Wᵀ` for a weight matrix in any GGML type.
//!
//! The per-row dot products live in `quant`; this module tiles the work, splits weight
//! rows across the thread pool and feeds each kernel up to four activation rows at
//! once so a weight block is unpacked once per four tokens during prefill.
//!
//! Architecture invariant: the value of `out[i][r]` never depends on how the work was
//! split between threads. For 32-element formats and float weights it depends only on
//! activation row `i` and weight row `r` (batch invariance); K-quant kernels follow
//! llama.cpp's batch-size-dependent paths on purpose (see `quant::dot_kernel_for`), and
//! the Q4_K one relies on activation rows arriving in groups of four from row 0.

use crate::pool::{SyncPtr, ThreadPool};
use crate::quant::{
    dot_kernel_for, quantize_row_q8, quantize_row_q8k, BlockQ8, BlockQ8K, DotKernel, GgmlType,
};

/// A borrowed weight matrix of `rows` rows of `cols` elements in GGML layout.
#[derive(Clone, Copy)]
pub struct WeightRef<'a> {
    pub ty: GgmlType,
    pub data: &'a [u8],
    pub rows: usize,
    pub cols: usize,
}

/// Activations `x` of shape (n_rows, cols), with their quantized copies made on demand
/// and reused across every weight that multiplies the same input: [`BlockQ8`] rows for
/// the 32-wide weight formats and [`BlockQ8K`] rows for the K-quants, each made the way
/// llama.cpp quantizes activations for that weight type.
pub struct Activations {
    pub n_rows: usize,
    pub cols: usize,
    pub f32: Vec<f32>,
    q8: Vec<BlockQ8>,
    q8_valid: bool,
    q8k: Vec<BlockQ8K>,
    q8k_valid: bool,
}

impl Activations {
    pub fn new() -> Self {
        Self {
            n_rows: 0,
            cols: 0,
            f32: Vec::new(),
            q8: Vec::new(),
            q8_valid: false,
            q8k: Vec::new(),
            q8k_valid: false,
        }
    }

    /// Resizes to (n_rows, cols) and returns the f32 buffer to fill. Invalidates the
    /// quantized copies.
    pub fn reset(&mut self, n_rows: usize, cols: usize) -> &mut [f32] {
        self.n_rows = n_rows;
        self.cols = cols;
        self.q8_valid = false;
        self.q8k_valid = false;
        self.f32.resize(n_rows * cols, 0.0);
        &mut self.f32[..n_rows * cols]
    }

    /// Makes the quantized copy that kernel `k` consumes, if not made yet.
    fn quantize_for(&mut self, k: &DotKernel) {
        match k {
            DotKernel::Q8(_) => self.ensure_q8(),
            DotKernel::Q8K(_) => self.ensure_q8k(),
            DotKernel::F32(_) => {}
        }
    }

    fn ensure_q8(&mut self) {
        if self.q8_valid {
            return;
        }
        assert!(
            self.cols.is_multiple_of(32),
            "quantized matmul needs cols divisible by 32, got {}",
            self.cols
        );
        let nb = self.cols / 32;
        self.q8.resize(self.n_rows * nb, BlockQ8::default());
        for (x, q) in self
            .f32
            .chunks_exact(self.cols)
            .zip(self.q8.chunks_exact_mut(nb))
        {
            quantize_row_q8(x, q);
        }
        self.q8_valid = true;
    }

    fn ensure_q8k(&mut self) {
        if self.q8k_valid {
            return;
        }
        assert!(
            self.cols.is_multiple_of(256),
            "K-quant matmul needs cols divisible by 256, got {}",
            self.cols
        );
        let nb = self.cols / 256;
        self.q8k.resize(self.n_rows * nb, BlockQ8K::default());
        for (x, q) in self
            .f32
            .chunks_exact(self.cols)
            .zip(self.q8k.chunks_exact_mut(nb))
        {
            quantize_row_q8k(x, q);
        }
        self.q8k_valid = true;
    }
}

impl Default for Activations {
    fn default() -> Self {
        Self::new()
    }
}

/// One product of a `matmul_many` call: weight and its (n_rows, w.rows) output.
pub struct MatmulJob<'a, 'b> {
    pub w: WeightRef<'a>,
    pub out: &'b mut [f32],
}

/// Weight rows per tile: a tile stays in L1 while four-row groups of activations stream.
const ROW_TILE: usize = 16;

/// `out = x · Wᵀ`, out shaped (x.n_rows, w.rows).
pub fn matmul(pool: &ThreadPool, x: &mut Activations, w: WeightRef<'_>, out: &mut [f32]) {
    matmul_many(pool, x, &mut [MatmulJob { w, out }]);
}

/// Several products sharing one input (Q, K and V; gate and up) in one parallel region,
/// so the threads meet at one barrier instead of one per weight.
pub fn matmul_many(pool: &ThreadPool, x: &mut Activations, jobs: &mut [MatmulJob<'_, '_>]) {
    let n = x.n_rows;
    for j in jobs.iter() {
        assert_eq!(
            j.w.cols, x.cols,
            "weight cols {} != activation cols {}",
            j.w.cols, x.cols
        );
        assert!(j.out.len() >= n * j.w.rows, "output buffer too small");
        assert!(j.w.data.len() >= j.w.rows * j.w.ty.row_bytes(j.w.cols).expect("whole blocks"));
        x.quantize_for(&dot_kernel_for(j.w.ty, j.w.rows, n));
    }
    let x = &*x;
    // Tiles of all jobs laid end to end; each thread takes a contiguous share of tiles,
    // weighted by bytes so that mixed types split evenly.
    let tiles: Vec<(usize, usize, usize)> = jobs
        .iter()
        .enumerate()
        .flat_map(|(ji, j)| {
            (0..j.w.rows)
                .step_by(ROW_TILE)
                .map(move |r0| (ji, r0, (r0 + ROW_TILE).min(j.w.rows)))
        })
        .collect();
    let outs: Vec<(SyncPtr<f32>, usize)> = jobs
        .iter_mut()
        .map(|j| (SyncPtr(j.out.as_mut_ptr()), j.w.rows))
        .collect();
    let ws: Vec<WeightRef<'_>> = jobs.iter().map(|j| j.w).collect();
    // The kernel reproducing llama.cpp's path for this product (it depends on the batch
    // size; for repacked Q4_K also on rows arriving in groups of four from row 0).
    let kernels: Vec<DotKernel> = ws.iter().map(|w| dot_kernel_for(w.ty, w.rows, n)).collect();
    // Threads take tiles from a shared counter in small chunks rather than fixed shares:
    // on shared vCPUs one thread is often slowed down, and a static split would make
    // everyone wait for it at the barrier.
    let next_tile = std::sync::atomic::AtomicUsize::new(0);
    pool.run(&|_tid, nt| loop {
        let chunk = (tiles.len() / (nt * 8)).max(1);
        let start = next_tile.fetch_add(chunk, std::sync::atomic::Ordering::Relaxed);
        if start >= tiles.len() {
            break;
        }
        for &(ji, r0, r1) in &tiles[start..(start + chunk).min(tiles.len())] {
            let w = ws[ji];
            let (out, stride) = outs[ji];
            let rb = w.ty.row_bytes(w.cols).expect("checked");
            let mut acc = [0f32; 4];
            let mut i0 = 0;
            while i0 < n {
                let na = (n - i0).min(4);
                for r in r0..r1 {
                    let row = &w.data[r * rb..(r + 1) * rb];
                    match kernels[ji] {
                        DotKernel::Q8(f) => {
                            let nb = x.cols / 32;
                            f(row, &x.q8[i0 * nb..(i0 + na) * nb], na, &mut acc)
                        }
                        DotKernel::Q8K(f) => {
                            let nb = x.cols / 256;
                            f(row, &x.q8k[i0 * nb..(i0 + na) * nb], na, &mut acc)
                        }
                        DotKernel::F32(f) => {
                            f(row, &x.f32[i0 * x.cols..(i0 + na) * x.cols], na, &mut acc)
                        }
                    }
                    for (k, v) in acc.iter().take(na).enumerate() {
                        // SAFETY: each (row, token) cell is written by exactly one thread,
                        // the one owning the tile of row `r`; the index is < n * stride.
                        unsafe { *out.get().add((i0 + k) * stride + r) = *v };
                    }
                }
                i0 += na;
            }
        }
    });
}

/// The plain definition, for tests: dequantize every row and take f32 dot products.
pub fn matmul_ref(x: &[f32], n_rows: usize, w: WeightRef<'_>, out: &mut [f32]) {
    let rb = w.ty.row_bytes(w.cols).expect("whole blocks");
    let mut wrow = vec![0f32; w.cols];
    for r in 0..w.rows {
        crate::quant::dequantize_row(w.ty, &w.data[r * rb..(r + 1) * rb], &mut wrow);
        for i in 0..n_rows {
            let xi = &x[i * w.cols..(i + 1) * w.cols];
            out[i * w.rows + r] = xi.iter().zip(&wrow).map(|(a, b)| a * b).sum();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::{Rng, SeedableRng};

    /// Random Q8_0 rows: an f16 scale then 32 int8 values per block.
    fn q8_0_rows(rng: &mut impl Rng, rows: usize, cols: usize) -> Vec<u8> {
        let mut v = Vec::new();
        for _ in 0..rows * cols / 32 {
            v.extend_from_slice(&half::f16::from_f32(rng.gen_range(0.001..0.05)).to_le_bytes());
            v.extend((0..32).map(|_| rng.gen::<u8>()));
        }
        v
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(40))]
        /// Tiling, threading and the multi-job split give the plain definition's result,
        /// for any batch size and any number of rows (including partial tiles).
        #[test]
        fn matmul_many_matches_reference(seed in 0u64..10_000, n in 1usize..10, rows in 1usize..50, blocks in 1usize..4) {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let cols = blocks * 32;
            let wq = q8_0_rows(&mut rng, rows, cols);
            let wf: Vec<u8> = (0..rows * cols).flat_map(|_| rng.gen_range(-1f32..1.0).to_le_bytes()).collect();
            let x: Vec<f32> = (0..n * cols).map(|_| rng.gen_range(-2f32..2.0)).collect();
            let pool = ThreadPool::new(3);
            let mut act = Activations::new();
            act.reset(n, cols).copy_from_slice(&x);
            let w_q = WeightRef { ty: GgmlType::Q8_0, data: &wq, rows, cols };
            let w_f = WeightRef { ty: GgmlType::F32, data: &wf, rows: rows.div_ceil(2), cols };
            let mut out_q = vec![0f32; n * rows];
            let mut out_f = vec![0f32; n * w_f.rows];
            matmul_many(&pool, &mut act, &mut [MatmulJob { w: w_q, out: &mut out_q }, MatmulJob { w: w_f, out: &mut out_f }]);
            for (w, out) in [(w_q, &out_q), (w_f, &out_f)] {
                let mut want = vec![0f32; n * w.rows];
                matmul_ref(&x, n, w, &mut want);
                let rb = w.ty.row_bytes(cols).unwrap();
                for (i, (a, b)) in out.iter().zip(&want).enumerate() {
                    // Q8 activations round each element by at most half a step (amax/127/2).
                    let mut wrow = vec![0f32; cols];
                    crate::quant::dequantize_row(w.ty, &w.data[(i % w.rows) * rb..][..rb], &mut wrow);
                    let amax = x[(i / w.rows) * cols..][..cols].iter().fold(0f32, |m, v| m.max(v.abs()));
                    let bound = wrow.iter().map(|v| v.abs()).sum::<f32>() * amax / 254.0;
                    let tol = if w.ty == GgmlType::F32 { 1e-4 } else { bound * 1.01 + 1e-4 };
                    prop_assert!((a - b).abs() <= tol, "{:?} cell {i}: {a} vs {b} (tol {tol})", w.ty);
                }
            }
            // Batch invariance: row 0 alone gives bit-identical results.
            let mut one = Activations::new();
            one.reset(1, cols).copy_from_slice(&x[..cols]);
            let mut out1 = vec![0f32; rows];
            matmul(&pool, &mut one, w_q, &mut out1);
            prop_assert_eq!(&out1[..], &out_q[..rows]);
        }
    }
}

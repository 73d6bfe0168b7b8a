//! Matrix multiplication drivers: `out = x · Wᵀ` for a weight matrix in any GGML type.
//!
//! The per-row dot products live in `quant`; this module tiles the work, splits weight
//! rows across the thread pool and feeds each kernel up to four activation rows at
//! once so a weight block is unpacked once per four tokens during prefill. Where a
//! register-tiled kernel exists (the 32-wide formats on AVX2), full groups of four
//! activation rows go through it two weight rows at a time; it gives each pair the
//! bits of the per-pair kernel, which handles the rows left over. Weights repacked at
//! load (`quant::interleave`) go through their own kernels eight rows at a time, or on
//! AVX-512 sixteen rows against up to eight activation rows (the same bits).
//!
//! Architecture invariant: the value of `out[i][r]` never depends on how the work was
//! split between threads, and for every weight format it depends only on activation
//! row `i` and weight row `r` (batch invariance): no kernel changes its arithmetic
//! with the batch size.

use crate::cpu::Numerics;
use crate::ops;
use crate::pool::{SyncPtr, ThreadPool};
use crate::quant::interleave::{
    block_isums, block_sub_sums, r16_kernel, r16k_kernel, r8_kernel, r8k_kernel, Interleaved,
    R16Fn, R16KFn, R8Fn, R8KFn, SubSums, ACT_ROWS, R16, R8,
};
use crate::quant::wq::{quantize_row_i8_tok, u4_act_sums};
use crate::quant::{
    dot_kernel, dot_kernel_i8_tok, pack_scales4, quantize_row_q8, quantize_row_q8k,
    tile_kernel_for, ActQuant, ActScales4, BlockQ8, BlockQ8K, DotI8TokFn, DotKernel, GgmlType,
    QuantParams, TileQ8Fn, TILE_W,
};

/// A borrowed weight matrix of `rows` rows of `cols` elements in GGML layout, or in a
/// checkpoint format with its scales in `params` (`ty.has_params()`).
#[derive(Clone, Copy)]
pub struct WeightRef<'a> {
    pub ty: GgmlType,
    pub data: &'a [u8],
    pub rows: usize,
    pub cols: usize,
    pub params: Option<&'a QuantParams>,
    /// The same rows repacked eight at a time ([`Interleaved`]); products then use the
    /// interleaved kernels and their arithmetic, whatever the batch size.
    pub packed: Option<&'a Interleaved>,
}

impl<'a> WeightRef<'a> {
    /// A weight whose scales are inside its data (GGML and float types).
    pub fn plain(ty: GgmlType, data: &'a [u8], rows: usize, cols: usize) -> Self {
        Self {
            ty,
            data,
            rows,
            cols,
            params: None,
            packed: None,
        }
    }
}

/// The kernel of one product and how its results are finished.
#[derive(Clone, Copy)]
enum Kernel {
    /// `DotKernel` results, times the row scale for `I8` and `F8E4M3` weights.
    Dot(DotKernel),
    /// W8A8: integer sums times the row's scale and the token's.
    I8Tok(DotI8TokFn),
    /// Interleaved weights, eight rows per call, or sixteen where the CPU has a
    /// two-group kernel (the same bits).
    R8(R8Fn, Option<R16Fn>),
    /// Interleaved K-quant weights, as `R8`.
    R8K(R8KFn, Option<R16KFn>),
}

fn kernel_for(w: &WeightRef<'_>) -> Kernel {
    if let Some(p) = w.packed {
        if let Some(f) = r8_kernel(p.ty) {
            return Kernel::R8(f, r16_kernel(p.ty));
        }
        if let Some(f) = r8k_kernel(p.ty) {
            return Kernel::R8K(f, r16k_kernel(p.ty));
        }
    }
    match w.params {
        Some(p) if w.ty == GgmlType::I8 && p.act == ActQuant::PerToken => {
            Kernel::I8Tok(dot_kernel_i8_tok())
        }
        _ => Kernel::Dot(dot_kernel(w.ty)),
    }
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
    /// The scales of `q8` packed for the tile kernels, per group of four rows from row
    /// 0 (full groups only), `cols / 32` entries per group.
    q8_scales: Vec<ActScales4>,
    /// `d · Σ qs` of each `q8` block, for the `U4` kernels' zero points.
    q8_sums: Vec<f32>,
    /// `Σ qs` of each `q8` block, exact, for the interleaved kernels' offsets.
    q8_isums: Vec<i32>,
    q8_valid: bool,
    q8k: Vec<BlockQ8K>,
    /// The sub-block sums of each `q8k` block, for the two-group K-quant kernels.
    q8k_sums: Vec<SubSums>,
    q8k_valid: bool,
    /// Per-token `i8` rows and their scales, for W8A8 weights.
    tok: Vec<i8>,
    tok_scales: Vec<f32>,
    tok_valid: bool,
    /// The column order the quantized copies are made in (an act-order weight's
    /// `perm`), and `f32` gathered into it.
    order: Option<Vec<u32>>,
    gathered: Vec<f32>,
    /// Fast kernels, or the float reference path (see [`Numerics`]).
    numerics: Numerics,
}

impl Activations {
    pub fn new() -> Self {
        Self {
            n_rows: 0,
            cols: 0,
            f32: Vec::new(),
            q8: Vec::new(),
            q8_scales: Vec::new(),
            q8_sums: Vec::new(),
            q8_isums: Vec::new(),
            q8_valid: false,
            q8k: Vec::new(),
            q8k_sums: Vec::new(),
            q8k_valid: false,
            tok: Vec::new(),
            tok_scales: Vec::new(),
            tok_valid: false,
            order: None,
            gathered: Vec::new(),
            numerics: crate::cpu::default_numerics(),
        }
    }

    /// The arithmetic of every product with these activations.
    pub fn numerics(&self) -> Numerics {
        self.numerics
    }

    /// Chooses the arithmetic of every product with these activations.
    pub fn set_numerics(&mut self, numerics: Numerics) {
        self.numerics = numerics;
    }

    /// Resizes to (n_rows, cols) and returns the f32 buffer to fill. Invalidates the
    /// quantized copies.
    pub fn reset(&mut self, n_rows: usize, cols: usize) -> &mut [f32] {
        self.n_rows = n_rows;
        self.cols = cols;
        self.q8_valid = false;
        self.q8k_valid = false;
        self.tok_valid = false;
        self.order = None;
        self.f32.resize(n_rows * cols, 0.0);
        &mut self.f32[..n_rows * cols]
    }

    /// Makes the quantized copies in column order `order` (input order for `None`).
    fn set_order(&mut self, order: Option<&[u32]>) {
        if self.order.as_deref() == order {
            return;
        }
        self.q8_valid = false;
        self.q8k_valid = false;
        self.tok_valid = false;
        self.order = order.map(<[u32]>::to_vec);
        if let Some(o) = order {
            assert_eq!(o.len(), self.cols, "act order of the wrong width");
            self.gathered.clear();
            for row in self.f32.chunks_exact(self.cols) {
                self.gathered.extend(o.iter().map(|&c| row[c as usize]));
            }
        }
    }

    /// Makes the quantized copy that kernel `k` consumes, if not made yet.
    fn quantize_for(&mut self, k: &Kernel, pool: &ThreadPool) {
        match k {
            Kernel::Dot(DotKernel::Q8(_) | DotKernel::U4(_)) | Kernel::R8(..) => {
                self.ensure_q8(pool)
            }
            Kernel::Dot(DotKernel::Q8K(_)) | Kernel::R8K(..) => self.ensure_q8k(pool),
            Kernel::Dot(DotKernel::F32(_)) => {}
            Kernel::I8Tok(_) => self.ensure_tok(),
        }
    }

    fn ensure_tok(&mut self) {
        if self.tok_valid {
            return;
        }
        self.tok.resize(self.n_rows * self.cols, 0);
        self.tok_scales.resize(self.n_rows, 0.0);
        let src = if self.order.is_some() {
            &self.gathered
        } else {
            &self.f32
        };
        for ((x, q), s) in src
            .chunks_exact(self.cols)
            .zip(self.tok.chunks_exact_mut(self.cols))
            .zip(self.tok_scales.iter_mut())
        {
            *s = quantize_row_i8_tok(x, q);
        }
        self.tok_valid = true;
    }

    fn ensure_q8(&mut self, pool: &ThreadPool) {
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
        let src = if self.order.is_some() {
            &self.gathered
        } else {
            &self.f32
        };
        let cols = self.cols;
        pool.rows_mut(&mut self.q8[..self.n_rows * nb], nb, &|i, q| {
            quantize_row_q8(&src[i * cols..][..cols], q)
        });
        let groups = self.n_rows / 4;
        self.q8_scales.resize(groups * nb, ActScales4::default());
        for (q, s) in self
            .q8
            .chunks_exact(4 * nb)
            .zip(self.q8_scales.chunks_exact_mut(nb))
        {
            pack_scales4(q, s);
        }
        self.q8_sums.resize(self.q8.len(), 0.0);
        u4_act_sums(&self.q8, &mut self.q8_sums);
        self.q8_isums.resize(self.q8.len(), 0);
        block_isums(&self.q8, &mut self.q8_isums);
        self.q8_valid = true;
    }

    fn ensure_q8k(&mut self, pool: &ThreadPool) {
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
        let src = if self.order.is_some() {
            &self.gathered
        } else {
            &self.f32
        };
        let cols = self.cols;
        pool.rows_mut(&mut self.q8k[..self.n_rows * nb], nb, &|i, q| {
            quantize_row_q8k(&src[i * cols..][..cols], q)
        });
        self.q8k_sums.resize(self.q8k.len(), SubSums::default());
        block_sub_sums(&self.q8k, &mut self.q8k_sums);
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
/// Whole interleaved groups.
const ROW_TILE: usize = 16;
const _: () = assert!(ROW_TILE.is_multiple_of(R8));

/// `out = x · Wᵀ`, out shaped (x.n_rows, w.rows).
pub fn matmul(pool: &ThreadPool, x: &mut Activations, w: WeightRef<'_>, out: &mut [f32]) {
    matmul_many(pool, x, &mut [MatmulJob { w, out }]);
}

/// Several products sharing one input (Q, K and V; gate and up) in one parallel region,
/// so the threads meet at one barrier instead of one per weight.
pub fn matmul_many(pool: &ThreadPool, x: &mut Activations, jobs: &mut [MatmulJob<'_, '_>]) {
    let n = x.n_rows;
    if x.numerics == Numerics::Reference {
        for j in jobs.iter_mut() {
            matmul_reference(pool, &x.f32[..n * x.cols], n, j.w, j.out);
        }
        return;
    }
    // Act-order weights take their input gathered into their column order; jobs sharing
    // one input share one order.
    let order = jobs
        .first()
        .and_then(|j| j.w.params.and_then(|p| p.perm.as_deref()));
    assert!(
        jobs.iter()
            .all(|j| j.w.params.and_then(|p| p.perm.as_deref()) == order),
        "weights sharing an input must share their act order"
    );
    x.set_order(order);
    for j in jobs.iter() {
        assert_eq!(
            j.w.cols, x.cols,
            "weight cols {} != activation cols {}",
            j.w.cols, x.cols
        );
        assert!(j.out.len() >= n * j.w.rows, "output buffer too small");
        assert!(j.w.data.len() >= j.w.rows * j.w.ty.row_bytes(j.w.cols).expect("whole blocks"));
        assert!(
            j.w.ty.has_params() == j.w.params.is_some(),
            "{} weight with{} params",
            j.w.ty.name(),
            if j.w.params.is_some() { "" } else { "out" }
        );
        if let Some(p) = j.w.packed {
            assert!(
                p.ty == j.w.ty && p.rows == j.w.rows && p.cols == j.w.cols,
                "interleaved copy of another weight"
            );
        }
        x.quantize_for(&kernel_for(&j.w), pool);
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
    // One kernel per weight type, whatever the batch size.
    let kernels: Vec<Kernel> = ws.iter().map(kernel_for).collect();
    // Register-tiled kernels (TILE_W weight rows x 4 activation rows) where one exists;
    // they give every pair the per-pair kernel's bits, so the split does not matter.
    let tiled: Vec<Option<TileQ8Fn>> = ws
        .iter()
        .map(|w| w.params.is_none().then(|| tile_kernel_for(w.ty)).flatten())
        .collect();
    // Threads take tiles from a shared counter rather than fixed shares: on shared vCPUs
    // one thread is often slowed down, and a static split would make everyone wait for
    // it at the barrier. Each takes 1/(2 × threads) of the tiles left ("guided"):
    // long contiguous runs first, which the hardware prefetcher follows when the
    // weights stream from memory (decoding), then ever smaller ones to even out the end.
    let next_tile = std::sync::atomic::AtomicUsize::new(0);
    pool.run(&|_tid, nt| loop {
        use std::sync::atomic::Ordering::Relaxed;
        let grab = |at: usize| (at < tiles.len()).then(|| at + (tiles.len() - at).div_ceil(2 * nt));
        let Ok(start) = next_tile.fetch_update(Relaxed, Relaxed, grab) else {
            break;
        };
        let end = grab(start).expect("start is below the tile count");
        for &(ji, r0, r1) in &tiles[start..end] {
            let w = ws[ji];
            let (out, stride) = outs[ji];
            match (kernels[ji], w.packed) {
                (Kernel::R8(f, f2), Some(p)) => {
                    let cb = x.cols / 32;
                    let span = |i0: usize, na: usize| i0 * cb..(i0 + na) * cb;
                    match f2.filter(|_| p.paired() && r1 - r0 == R16) {
                        Some(f2) => r16_tile(p, x.n_rows, r0, out, stride, |pair, i0, na, o| {
                            let s = span(i0, na);
                            f2(pair, &x.q8[s.clone()], &x.q8_isums[s], na, o)
                        }),
                        None => r8_tile(p, x.n_rows, r0, r1, out, stride, |g, i0, na, o| {
                            let s = span(i0, na);
                            f(g, &x.q8[s.clone()], &x.q8_isums[s], na, o)
                        }),
                    }
                    continue;
                }
                (Kernel::R8K(f, f2), Some(p)) => {
                    let cb = x.cols / 256;
                    let acts = |i0: usize, na: usize| &x.q8k[i0 * cb..(i0 + na) * cb];
                    match f2.filter(|_| p.paired() && r1 - r0 == R16) {
                        Some(f2) => r16_tile(p, x.n_rows, r0, out, stride, |pair, i0, na, o| {
                            let s = &x.q8k_sums[i0 * cb..(i0 + na) * cb];
                            f2(pair, acts(i0, na), s, na, o)
                        }),
                        None => r8_tile(p, x.n_rows, r0, r1, out, stride, |g, i0, na, o| {
                            f(g, acts(i0, na), na, o)
                        }),
                    }
                    continue;
                }
                _ => {}
            }
            let rb = w.ty.row_bytes(w.cols).expect("checked");
            let mut acc = [0f32; 4];
            let mut i0 = 0;
            while i0 < n {
                let na = (n - i0).min(4);
                let mut r_pair = r0;
                if let (4, Some(t)) = (na, tiled[ji]) {
                    let nb = x.cols / 32;
                    let acts = &x.q8[i0 * nb..(i0 + 4) * nb];
                    let scales = &x.q8_scales[i0 / 4 * nb..(i0 / 4 + 1) * nb];
                    while r_pair + TILE_W <= r1 {
                        let mut o = [[0f32; 4]; TILE_W];
                        let wt = &w.data[r_pair * rb..(r_pair + TILE_W) * rb];
                        t(wt, acts, scales, &mut o);
                        for (j, o) in o.iter().enumerate() {
                            for (k, v) in o.iter().enumerate() {
                                // SAFETY: as below, for rows r_pair..r_pair + TILE_W of
                                // this thread's tile.
                                unsafe { *out.get().add((i0 + k) * stride + r_pair + j) = *v };
                            }
                        }
                        r_pair += TILE_W;
                    }
                }
                // The rows left over by the tiles (or all rows) pair by pair.
                for r in r_pair..r1 {
                    let row = &w.data[r * rb..(r + 1) * rb];
                    let nb = x.cols / 32;
                    match kernels[ji] {
                        Kernel::Dot(DotKernel::Q8(f)) => {
                            f(row, &x.q8[i0 * nb..(i0 + na) * nb], na, &mut acc)
                        }
                        Kernel::Dot(DotKernel::Q8K(f)) => {
                            let nb = x.cols / 256;
                            f(row, &x.q8k[i0 * nb..(i0 + na) * nb], na, &mut acc)
                        }
                        Kernel::Dot(DotKernel::F32(f)) => {
                            f(row, &x.f32[i0 * x.cols..(i0 + na) * x.cols], na, &mut acc)
                        }
                        Kernel::Dot(DotKernel::U4(f)) => {
                            let p = w.params.expect("checked");
                            f(
                                row,
                                p.row_scales(r, w.cols),
                                p.row_zeros(r, w.cols),
                                p.group,
                                &x.q8[i0 * nb..(i0 + na) * nb],
                                &x.q8_sums[i0 * nb..(i0 + na) * nb],
                                na,
                                &mut acc,
                            )
                        }
                        Kernel::R8(..) | Kernel::R8K(..) => {
                            unreachable!("interleaved weights take `r8_tile`")
                        }
                        Kernel::I8Tok(f) => {
                            f(row, &x.tok[i0 * x.cols..(i0 + na) * x.cols], na, &mut acc);
                            let s = w.params.expect("checked").row_scales(r, w.cols)[0];
                            for (k, a) in acc.iter_mut().take(na).enumerate() {
                                *a = *a * s * x.tok_scales[i0 + k];
                            }
                        }
                    }
                    // I8 and F8E4M3 weights: the row scale.
                    if let (Kernel::Dot(_), Some(p)) = (kernels[ji], w.params) {
                        if w.ty != GgmlType::U4 {
                            let s = p.row_scales(r, w.cols)[0];
                            for a in acc.iter_mut().take(na) {
                                *a *= s;
                            }
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

/// Rows `r0..r1` (whole groups of eight) of an interleaved weight against all `n`
/// activation rows: each group's blocks stay in L1 while the activations stream past,
/// `call(group, first_row, rows, out)` taking up to four activation rows at a time.
fn r8_tile(
    p: &Interleaved,
    n: usize,
    r0: usize,
    r1: usize,
    out: SyncPtr<f32>,
    stride: usize,
    call: impl Fn(&[u8], usize, usize, &mut [[f32; R8]; 4]),
) {
    let mut o = [[0f32; R8]; 4];
    for g in r0 / R8..r1 / R8 {
        let group = p.group(g);
        for i0 in (0..n).step_by(4) {
            let na = (n - i0).min(4);
            call(group, i0, na, &mut o);
            for (k, row) in o.iter().take(na).enumerate() {
                // SAFETY: rows `r0..r1` belong to this thread's tile alone, and
                // `(i0 + k) * stride + g * 8 + 7 < n * stride` (checked by the caller).
                unsafe {
                    let dst = out.get().add((i0 + k) * stride + g * R8);
                    std::ptr::copy_nonoverlapping(row.as_ptr(), dst, R8);
                }
            }
        }
    }
}

/// As [`r8_tile`] for the sixteen rows `r0..r0 + 16`, a pair of groups stored together
/// (see [`Interleaved::pair`]), in one call each.
fn r16_tile(
    p: &Interleaved,
    n: usize,
    r0: usize,
    out: SyncPtr<f32>,
    stride: usize,
    call: impl Fn(&[u8], usize, usize, &mut [[f32; R16]; ACT_ROWS]),
) {
    let mut o = [[0f32; R16]; ACT_ROWS];
    let pair = p.pair(r0 / R16);
    for i0 in (0..n).step_by(ACT_ROWS) {
        let na = (n - i0).min(ACT_ROWS);
        call(pair, i0, na, &mut o);
        for (k, row) in o.iter().take(na).enumerate() {
            // SAFETY: as in `r8_tile`, for rows `r0..r0 + 16`.
            unsafe {
                let dst = out.get().add((i0 + k) * stride + r0);
                std::ptr::copy_nonoverlapping(row.as_ptr(), dst, R16);
            }
        }
    }
}

/// Row `r` of `w` dequantized to f32, in input order.
fn dequantize_weight_row(w: &WeightRef<'_>, r: usize, dst: &mut [f32]) {
    let rb = w.ty.row_bytes(w.cols).expect("whole blocks");
    let src = &w.data[r * rb..(r + 1) * rb];
    match w.params {
        Some(p) => crate::quant::wq::dequantize_row_wq(w.ty, p, r, src, dst),
        None => crate::quant::dequantize_row(w.ty, src, dst),
    }
}

/// The float reference product ([`Numerics::Reference`]): `out = x · Wᵀ` with each
/// weight row dequantized to f32 and dotted with the f32 activations `x` (`n_rows` rows
/// in input order) by [`ops::dot_lanes8`], whose fixed summation order gives the same
/// bits on every machine, whatever the thread split or batch.
pub fn matmul_reference(
    pool: &ThreadPool,
    x: &[f32],
    n_rows: usize,
    w: WeightRef<'_>,
    out: &mut [f32],
) {
    let (rows, cols) = (w.rows, w.cols);
    assert_eq!(
        x.len(),
        n_rows * cols,
        "activations do not match the weight's columns"
    );
    assert!(out.len() >= n_rows * rows, "output buffer too small");
    assert!(w.data.len() >= rows * w.ty.row_bytes(cols).expect("whole blocks"));
    let outp = SyncPtr(out.as_mut_ptr());
    pool.run(&|t, nt| {
        let per = rows.div_ceil(nt);
        let mut wrow = vec![0f32; cols];
        for r in (t * per).min(rows)..((t + 1) * per).min(rows) {
            dequantize_weight_row(&w, r, &mut wrow);
            for i in 0..n_rows {
                let v = ops::dot_lanes8(&x[i * cols..(i + 1) * cols], &wrow);
                // SAFETY: row `r` belongs to this thread alone; the index is checked
                // against `out` above.
                unsafe { *outp.get().add(i * rows + r) = v };
            }
        }
    });
}

/// The plain definition, for tests: dequantize every row and take f32 dot products
/// ([`matmul_reference`] on one thread).
pub fn matmul_ref(x: &[f32], n_rows: usize, w: WeightRef<'_>, out: &mut [f32]) {
    matmul_reference(&ThreadPool::new(1), x, n_rows, w, out);
}

#[cfg(test)]
mod tests;

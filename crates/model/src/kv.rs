//! Key/value storage for the forward pass.
//!
//! [`PagedKvCache`] holds every layer's keys and values in fixed-size blocks shaped
//! (num_blocks, n_layers, keys/values, n_kv_heads, block_size, head_dim): within a block
//! each KV head's rows are one contiguous run, which attention reads in one sweep, and a
//! block's layers sit together. A sequence reaches its tokens through
//! a block table (logical block i → physical block); which blocks a sequence owns is
//! decided by the engine's KV cache manager, not here. [`SeqKvCache`] is the one-sequence
//! special case (one block as long as the sequence) used by tests and the
//! single-stream benchmark.

use std::fmt;
use std::str::FromStr;

use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
use half::{bf16, f16};
use pagellm_kernels::mem::zeroed_huge;
use pagellm_kernels::ops::attention::KvView;
use pagellm_kernels::quant::wq::{e4m3_to_f32, f32_to_e4m3, E4M3_MAX};

use crate::error::{ModelError, Result};

/// Element type of the KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvDtype {
    /// llama.cpp's default cache type; what the reference-exact results assume.
    #[default]
    F16,
    Bf16,
    F32,
    /// FP8 E4M3 with one f16 scale per (token, KV head) row: `amax / 448`.
    Fp8,
    /// INT8 with one f16 scale per (token, KV head) row: `amax / 127`, symmetric.
    Int8,
}

impl KvDtype {
    /// Bytes per element, not counting the per-row scales of the 8-bit types.
    pub fn size(self) -> usize {
        match self {
            KvDtype::Fp8 | KvDtype::Int8 => 1,
            KvDtype::F16 | KvDtype::Bf16 => 2,
            KvDtype::F32 => 4,
        }
    }

    /// Bytes of scale per row of `head_dim` elements.
    pub fn scale_size(self) -> usize {
        match self {
            KvDtype::Fp8 | KvDtype::Int8 => 2,
            _ => 0,
        }
    }
}

impl FromStr for KvDtype {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" | "f16" | "fp16" | "float16" | "half" => Ok(KvDtype::F16),
            "bf16" | "bfloat16" => Ok(KvDtype::Bf16),
            "f32" | "fp32" | "float32" | "float" => Ok(KvDtype::F32),
            "fp8" | "fp8_e4m3" => Ok(KvDtype::Fp8),
            "int8" | "i8" => Ok(KvDtype::Int8),
            other => Err(format!(
                "unknown KV cache dtype {other:?}; expected one of auto, f16, bf16, f32, fp8 \
                 (E4M3), int8"
            )),
        }
    }
}

impl fmt::Display for KvDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KvDtype::F16 => "f16",
            KvDtype::Bf16 => "bf16",
            KvDtype::F32 => "f32",
            KvDtype::Fp8 => "fp8",
            KvDtype::Int8 => "int8",
        })
    }
}

/// One layer's keys or values. Half-precision data is kept as raw bits so the buffer
/// can be allocated zeroed (the OS maps pages lazily: capacity costs nothing until used).
enum Buf {
    F16(Vec<u16>),
    Bf16(Vec<u16>),
    F32(Vec<f32>),
    /// 8-bit codes and, per row of `head_dim`, an f16 scale (bits) beside them.
    Q8 {
        fp8: bool,
        head_dim: usize,
        codes: Vec<u8>,
        scales: Vec<u16>,
    },
}

/// The f16 scale of an 8-bit row whose largest magnitude `amax` maps to `top`, rounded
/// up so that `amax` still fits; 0 for an all-zero row.
fn row_scale(amax: f32, top: f32) -> f16 {
    let s = amax / top;
    let h = f16::from_f32(s);
    if h.to_f32() >= s {
        h
    } else {
        f16::from_bits(h.to_bits() + 1)
    }
}

impl Buf {
    fn zeroed(dtype: KvDtype, n: usize, head_dim: usize) -> Self {
        match dtype {
            KvDtype::F16 => Buf::F16(zeroed_huge(n)),
            KvDtype::Bf16 => Buf::Bf16(zeroed_huge(n)),
            KvDtype::F32 => Buf::F32(zeroed_huge(n)),
            KvDtype::Fp8 | KvDtype::Int8 => Buf::Q8 {
                fp8: dtype == KvDtype::Fp8,
                head_dim,
                codes: zeroed_huge(n),
                scales: vec![0; n / head_dim],
            },
        }
    }

    fn store(&mut self, at: usize, src: &[f32]) {
        let r = at..at + src.len();
        match self {
            Buf::F16(b) => {
                for (d, &s) in b[r].iter_mut().zip(src) {
                    *d = f16::from_f32(s).to_bits();
                }
            }
            Buf::Bf16(b) => {
                for (d, &s) in b[r].iter_mut().zip(src) {
                    *d = bf16::from_f32(s).to_bits();
                }
            }
            Buf::F32(b) => b[r].copy_from_slice(src),
            Buf::Q8 {
                fp8,
                head_dim,
                codes,
                scales,
            } => {
                let hd = *head_dim;
                for (i, (row, q)) in src.chunks(hd).zip(codes[r].chunks_mut(hd)).enumerate() {
                    let amax = row.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let top = if *fp8 { E4M3_MAX } else { 127.0 };
                    let sc = row_scale(amax, top);
                    scales[at / hd + i] = sc.to_bits();
                    let inv = if amax > 0.0 { 1.0 / sc.to_f32() } else { 0.0 };
                    for (d, &v) in q.iter_mut().zip(row) {
                        *d = if *fp8 {
                            f32_to_e4m3((v * inv).clamp(-E4M3_MAX, E4M3_MAX))
                        } else {
                            (v * inv).round_ties_even().clamp(-127.0, 127.0) as i8 as u8
                        };
                    }
                }
            }
        }
    }

    /// Asks the CPU to start fetching the `n` values from `at` (a hint, never a fault).
    #[inline]
    fn prefetch(&self, at: usize, n: usize) {
        let (p, bytes) = match self {
            Buf::F16(b) | Buf::Bf16(b) => (b.as_ptr().wrapping_add(at) as *const u8, 2 * n),
            Buf::F32(b) => (b.as_ptr().wrapping_add(at) as *const u8, 4 * n),
            Buf::Q8 { codes, .. } => (codes.as_ptr().wrapping_add(at), n),
        };
        pagellm_kernels::ops::prefetch_range(p, bytes);
    }

    /// Loads consecutive rows of `head_dim` from `at`: one call for the 16-bit and f32
    /// types, row by row for the 8-bit ones (a scale per row).
    #[inline]
    fn load_run(&self, at: usize, dst: &mut [f32]) {
        match self {
            Buf::Q8 { head_dim, .. } => {
                let hd = *head_dim;
                for (i, d) in dst.chunks_mut(hd).enumerate() {
                    self.load(at + i * hd, d);
                }
            }
            _ => self.load(at, dst),
        }
    }

    #[inline]
    fn load(&self, at: usize, dst: &mut [f32]) {
        let r = at..at + dst.len();
        match self {
            Buf::F16(b) => pagellm_kernels::ops::f16_bits_to_f32(&b[r], dst),
            Buf::Bf16(b) => {
                let h: &[bf16] = b[r].reinterpret_cast();
                h.convert_to_f32_slice(dst);
            }
            Buf::F32(b) => dst.copy_from_slice(&b[r]),
            Buf::Q8 {
                fp8,
                head_dim,
                codes,
                scales,
            } => {
                // Loads are one (token, head) row: one scale.
                debug_assert_eq!(dst.len(), *head_dim);
                let s = f16::from_bits(scales[at / head_dim]).to_f32();
                if *fp8 {
                    for (d, &q) in dst.iter_mut().zip(&codes[r]) {
                        *d = e4m3_to_f32(q) * s;
                    }
                } else {
                    for (d, &q) in dst.iter_mut().zip(&codes[r]) {
                        *d = q as i8 as f32 * s;
                    }
                }
            }
        }
    }
}

/// Every layer's keys and values in blocks of `block_size` tokens.
pub struct PagedKvCache {
    dtype: KvDtype,
    num_blocks: usize,
    block_size: usize,
    n_layers: usize,
    n_kv_heads: usize,
    head_dim: usize,
    /// Every block's keys and values, block after block (see [`run_start`]).
    buf: Buf,
}

/// Where the run of `block_size` rows of (`block`, `layer`, keys (0) or values (1), KV
/// head `h`) starts in a cache's buffer, in elements. A block's rows for every layer sit
/// together, so a block touches one stretch of memory: the OS maps pages as blocks are
/// first written, and on 2 MiB pages that keeps the resident size near the blocks used.
#[inline]
fn run_start(
    (n_layers, n_kv_heads, block_size, head_dim): (usize, usize, usize, usize),
    block: usize,
    layer: usize,
    part: usize,
    h: usize,
) -> usize {
    (((block * n_layers + layer) * 2 + part) * n_kv_heads + h) * block_size * head_dim
}

impl PagedKvCache {
    pub fn new(
        n_layers: usize,
        n_kv_heads: usize,
        head_dim: usize,
        block_size: usize,
        num_blocks: usize,
        dtype: KvDtype,
    ) -> Result<Self> {
        if block_size == 0 || num_blocks == 0 {
            return Err(ModelError::Other(format!(
                "a KV cache needs at least one block of at least one token \
                 (got {num_blocks} blocks of {block_size})"
            )));
        }
        let n = num_blocks
            .checked_mul(block_size)
            .and_then(|x| x.checked_mul(n_kv_heads * head_dim))
            .and_then(|x| x.checked_mul(2 * n_layers))
            .ok_or_else(|| ModelError::Other("KV cache size overflows".into()))?;
        Ok(Self {
            dtype,
            num_blocks,
            block_size,
            n_layers,
            n_kv_heads,
            head_dim,
            buf: Buf::zeroed(dtype, n, head_dim),
        })
    }

    fn dims(&self) -> (usize, usize, usize, usize) {
        (
            self.n_layers,
            self.n_kv_heads,
            self.block_size,
            self.head_dim,
        )
    }

    /// Bytes one block takes across all layers, keys and values (with the 8-bit types'
    /// scales, one per `head_dim` elements).
    pub fn bytes_per_block(
        n_layers: usize,
        kv_dim: usize,
        head_dim: usize,
        block_size: usize,
        dtype: KvDtype,
    ) -> usize {
        2 * n_layers * block_size * (kv_dim * dtype.size() + kv_dim / head_dim * dtype.scale_size())
    }

    pub fn dtype(&self) -> KvDtype {
        self.dtype
    }
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Stores one token's key and value rows (kv_dim each) of `layer` at `slot`
    /// (physical block × block_size + offset in the block): each KV head's row goes to
    /// that head's run of the block.
    pub(crate) fn write(&mut self, layer: usize, slot: usize, k: &[f32], v: &[f32]) {
        let (bs, hd, dims) = (self.block_size, self.head_dim, self.dims());
        for h in 0..self.n_kv_heads {
            let row = (slot % bs) * hd;
            let r = h * hd..(h + 1) * hd;
            let at = |part| run_start(dims, slot / bs, layer, part, h) + row;
            self.buf.store(at(0), &k[r.clone()]);
            self.buf.store(at(1), &v[r]);
        }
    }

    /// A view of `layer` through `block_table`.
    pub fn view<'a>(&'a self, layer: usize, block_table: &'a [u32]) -> PagedKvView<'a> {
        PagedKvView {
            buf: &self.buf,
            table: block_table,
            dims: self.dims(),
            layer,
        }
    }
}

/// One layer of a [`PagedKvCache`] as one sequence sees it.
pub struct PagedKvView<'a> {
    buf: &'a Buf,
    table: &'a [u32],
    dims: (usize, usize, usize, usize),
    layer: usize,
}

impl PagedKvView<'_> {
    /// Where the run of keys (`part` 0) or values (1) of head `h` in the sequence's
    /// block `b` starts.
    #[inline]
    fn run(&self, b: usize, part: usize, h: usize) -> usize {
        run_start(self.dims, self.table[b] as usize, self.layer, part, h)
    }

    #[inline]
    fn offset(&self, pos: usize, part: usize, h: usize) -> usize {
        let (_, _, bs, hd) = self.dims;
        self.run(pos / bs, part, h) + pos % bs * hd
    }
}

impl KvView for PagedKvView<'_> {
    #[inline]
    fn load_key(&self, pos: usize, h: usize, dst: &mut [f32]) {
        self.buf.load(self.offset(pos, 0, h), dst);
    }
    #[inline]
    fn load_value(&self, pos: usize, h: usize, dst: &mut [f32]) {
        self.buf.load(self.offset(pos, 1, h), dst);
    }
    /// The runs of an f16 cache with a power-of-two block size, one per block.
    fn f16_runs<'s>(
        &'s self,
        n: usize,
        h: usize,
        keys: &mut Vec<&'s [u16]>,
        values: &mut Vec<&'s [u16]>,
    ) -> Option<u32> {
        let (_, _, bs, hd) = self.dims;
        let Buf::F16(b) = self.buf else {
            return None;
        };
        if !bs.is_power_of_two() {
            return None;
        }
        keys.clear();
        values.clear();
        for blk in 0..n.div_ceil(bs) {
            let len = (n - blk * bs).min(bs) * hd;
            let run = |part| {
                let at = self.run(blk, part, h);
                &b[at..at + len]
            };
            keys.push(run(0));
            values.push(run(1));
        }
        Some(bs.trailing_zeros())
    }

    /// Block by block: a head's rows of a block are one contiguous run, converted in
    /// one call. Blocks sit at scattered addresses where the hardware prefetcher cannot
    /// follow, so the runs of the next `AHEAD` blocks are prefetched while one converts
    /// (one block ahead was not enough to cover the memory latency).
    fn load_rows(&self, n: usize, h: usize, k: &mut [f32], v: &mut [f32]) {
        const AHEAD: usize = 4;
        let (_, _, bs, hd) = self.dims;
        let rows = |b: usize| (n - b * bs).min(bs);
        let fetch = |b: usize| {
            self.buf.prefetch(self.run(b, 0, h), rows(b) * hd);
            self.buf.prefetch(self.run(b, 1, h), rows(b) * hd);
        };
        let blocks = n.div_ceil(bs);
        (0..blocks.min(AHEAD)).for_each(fetch);
        for b in 0..blocks {
            if b + AHEAD < blocks {
                fetch(b + AHEAD);
            }
            let r = b * bs * hd..(b * bs + rows(b)) * hd;
            self.buf.load_run(self.run(b, 0, h), &mut k[r.clone()]);
            self.buf.load_run(self.run(b, 1, h), &mut v[r]);
        }
    }
}

/// Keys and values of one sequence: a paged cache of a single block as long as the
/// sequence may grow, filled from position 0.
pub struct SeqKvCache {
    pub(crate) paged: PagedKvCache,
    len: usize,
}

impl SeqKvCache {
    pub fn new(n_layers: usize, n_kv_heads: usize, head_dim: usize, capacity: usize) -> Self {
        Self::with_dtype(n_layers, n_kv_heads, head_dim, capacity, KvDtype::F16)
    }

    pub fn with_dtype(
        n_layers: usize,
        n_kv_heads: usize,
        head_dim: usize,
        capacity: usize,
        dtype: KvDtype,
    ) -> Self {
        let paged = PagedKvCache::new(n_layers, n_kv_heads, head_dim, capacity.max(1), 1, dtype)
            .expect("one block of a valid size");
        Self { paged, len: 0 }
    }

    /// Tokens whose keys and values are stored.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.paged.block_size
    }

    /// Forgets everything from position `len` on.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    pub(crate) fn advance(&mut self, n: usize) {
        self.len += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 8-bit rows come back within their rounding step (INT8: half of amax/127; FP8:
    /// 2⁻⁴ relative, plus the subnormal step), zero rows as zeros, and each row's
    /// scale is its own.
    #[test]
    fn eight_bit_rows_round_trip_within_their_step() {
        let hd = 8;
        let row = |k: usize| -> Vec<f32> {
            (0..2 * hd)
                .map(|i| ((i * 37 + k * 11) % 23) as f32 / 7.0 - 1.5)
                .map(|v| v * if i_big(k) { 100.0 } else { 1.0 })
                .collect()
        };
        fn i_big(k: usize) -> bool {
            k == 1
        }
        for dtype in [KvDtype::Int8, KvDtype::Fp8] {
            let mut b = Buf::zeroed(dtype, 3 * 2 * hd, hd);
            for k in 0..3 {
                let src = if k == 2 { vec![0.0; 2 * hd] } else { row(k) };
                b.store(k * 2 * hd, &src);
            }
            for k in 0..3 {
                let src = if k == 2 { vec![0.0; 2 * hd] } else { row(k) };
                for h in 0..2 {
                    let want = &src[h * hd..(h + 1) * hd];
                    let mut got = vec![f32::NAN; hd];
                    b.load(k * 2 * hd + h * hd, &mut got);
                    let amax = want.iter().fold(0f32, |m, v| m.max(v.abs()));
                    for (g, w) in got.iter().zip(want) {
                        let tol = match dtype {
                            KvDtype::Int8 => amax / 127.0 * 0.5 * 1.01,
                            _ => w.abs() / 16.0 + amax / 448.0 * 2f32.powi(-9) * 1.01,
                        };
                        assert!((g - w).abs() <= tol + 1e-7, "{dtype} row {k}: {g} vs {w}");
                    }
                }
            }
        }
        assert!(KvDtype::from_str("fp8_e4m3").unwrap() == KvDtype::Fp8);
        let e = KvDtype::from_str("fp4").unwrap_err();
        assert!(e.contains("fp8") && e.contains("int8"), "{e}");
    }

    /// A paged view's bulk load walks the block table as the per-row loads do: blocks
    /// out of order, a partial last block, every dtype, head and layer; and each row
    /// read back is the one written there (exactly in f32, within the type's rounding
    /// otherwise), not a neighbouring layer's, head's or block's.
    #[test]
    fn bulk_rows_follow_the_block_table() {
        use pagellm_kernels::ops::attention::KvView;
        let (layers, heads, hd, bs) = (2, 3, 8, 4);
        let row = |layer: usize, pos: usize, s: f32| -> Vec<f32> {
            (0..heads * hd)
                .map(|i| s * ((layer * 17 + pos) * 31 + i) as f32 / 97.0 - 1.0)
                .collect()
        };
        for dtype in [KvDtype::F16, KvDtype::Bf16, KvDtype::F32, KvDtype::Int8] {
            let mut c = PagedKvCache::new(layers, heads, hd, bs, 6, dtype).unwrap();
            let table = [4u32, 1, 5, 0];
            let n = 14;
            for layer in 0..layers {
                for pos in 0..n {
                    let slot = table[pos / bs] as usize * bs + pos % bs;
                    c.write(layer, slot, &row(layer, pos, 1.0), &row(layer, pos, -0.5));
                }
            }
            for layer in 0..layers {
                let view = c.view(layer, &table);
                for h in 0..heads {
                    let (mut k, mut v) = (vec![f32::NAN; n * hd], vec![f32::NAN; n * hd]);
                    view.load_rows(n, h, &mut k, &mut v);
                    // f16 stores hand the kernels their runs to read in place.
                    let (mut kruns, mut vruns) = (Vec::new(), Vec::new());
                    let shift = view.f16_runs(n, h, &mut kruns, &mut vruns);
                    assert_eq!(shift.is_some(), dtype == KvDtype::F16, "{dtype}");
                    for pos in 0..n {
                        let (mut kr, mut vr) = (vec![0f32; hd], vec![0f32; hd]);
                        view.load_key(pos, h, &mut kr);
                        view.load_value(pos, h, &mut vr);
                        let at = format!("{dtype} layer {layer} pos {pos} head {h}");
                        assert_eq!(&k[pos * hd..(pos + 1) * hd], &kr[..], "key, {at}");
                        assert_eq!(&v[pos * hd..(pos + 1) * hd], &vr[..], "value, {at}");
                        if let Some(shift) = shift {
                            assert_eq!(1 << shift, bs);
                            let in_run = |runs: &[&[u16]]| -> Vec<f32> {
                                let r = &runs[pos >> shift][pos % bs * hd..][..hd];
                                r.iter()
                                    .map(|&b| half::f16::from_bits(b).to_f32())
                                    .collect()
                            };
                            assert_eq!(in_run(&kruns), kr, "key run, {at}");
                            assert_eq!(in_run(&vruns), vr, "value run, {at}");
                        }
                        for (got, s) in [(&kr, 1.0), (&vr, -0.5)] {
                            let want = &row(layer, pos, s)[h * hd..(h + 1) * hd];
                            let amax = want.iter().fold(0f32, |m, x| m.max(x.abs()));
                            for (g, w) in got.iter().zip(want) {
                                let tol = match dtype {
                                    KvDtype::F32 => 0.0,
                                    KvDtype::Int8 => amax / 127.0,
                                    _ => w.abs() / 64.0,
                                };
                                assert!((g - w).abs() <= tol, "{at}: {g} for {w}");
                            }
                        }
                    }
                }
            }
        }
    }
}

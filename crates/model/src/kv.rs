//! Key/value storage for the forward pass.
//!
//! [`PagedKvCache`] holds every layer's keys and values in fixed-size blocks shaped
//! (num_blocks, block_size, n_kv_heads, head_dim). A sequence reaches its tokens through
//! a block table (logical block i → physical block); which blocks a sequence owns is
//! decided by the engine's KV cache manager, not here. [`SeqKvCache`] is the one-sequence
//! special case (one block as long as the sequence) used by tests and the
//! single-stream benchmark.

use std::fmt;
use std::str::FromStr;

use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
use half::{bf16, f16};
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
            KvDtype::F16 => Buf::F16(vec![0; n]),
            KvDtype::Bf16 => Buf::Bf16(vec![0; n]),
            KvDtype::F32 => Buf::F32(vec![0.0; n]),
            KvDtype::Fp8 | KvDtype::Int8 => Buf::Q8 {
                fp8: dtype == KvDtype::Fp8,
                head_dim,
                codes: vec![0; n],
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
    n_kv_heads: usize,
    head_dim: usize,
    k: Vec<Buf>,
    v: Vec<Buf>,
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
            .ok_or_else(|| ModelError::Other("KV cache size overflows".into()))?;
        Ok(Self {
            dtype,
            num_blocks,
            block_size,
            n_kv_heads,
            head_dim,
            k: (0..n_layers)
                .map(|_| Buf::zeroed(dtype, n, head_dim))
                .collect(),
            v: (0..n_layers)
                .map(|_| Buf::zeroed(dtype, n, head_dim))
                .collect(),
        })
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

    fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Stores one token's key and value rows (kv_dim each) of `layer` at `slot`
    /// (physical block × block_size + offset in the block).
    pub(crate) fn write(&mut self, layer: usize, slot: usize, k: &[f32], v: &[f32]) {
        let at = slot * self.kv_dim();
        self.k[layer].store(at, k);
        self.v[layer].store(at, v);
    }

    /// A view of `layer` through `block_table`.
    pub fn view<'a>(&'a self, layer: usize, block_table: &'a [u32]) -> PagedKvView<'a> {
        PagedKvView {
            k: &self.k[layer],
            v: &self.v[layer],
            table: block_table,
            block_size: self.block_size,
            n_kv_heads: self.n_kv_heads,
            head_dim: self.head_dim,
        }
    }
}

/// One layer of a [`PagedKvCache`] as one sequence sees it.
pub struct PagedKvView<'a> {
    k: &'a Buf,
    v: &'a Buf,
    table: &'a [u32],
    block_size: usize,
    n_kv_heads: usize,
    head_dim: usize,
}

impl PagedKvView<'_> {
    #[inline]
    fn offset(&self, pos: usize, h: usize) -> usize {
        let slot =
            self.table[pos / self.block_size] as usize * self.block_size + pos % self.block_size;
        (slot * self.n_kv_heads + h) * self.head_dim
    }
}

impl KvView for PagedKvView<'_> {
    #[inline]
    fn load_key(&self, pos: usize, h: usize, dst: &mut [f32]) {
        self.k.load(self.offset(pos, h), dst);
    }
    #[inline]
    fn load_value(&self, pos: usize, h: usize, dst: &mut [f32]) {
        self.v.load(self.offset(pos, h), dst);
    }
    /// Block by block: one table lookup per block. The rows a few positions ahead are
    /// prefetched because blocks sit at scattered addresses; on the AVX-512 EPYC of
    /// BENCHMARKS.md (2026-12-07) that made no measurable difference, as a batched
    /// decode's key/value reads are bandwidth-bound there.
    fn load_rows(&self, n: usize, h: usize, k: &mut [f32], v: &mut [f32]) {
        const AHEAD: usize = 8;
        let (hd, bs) = (self.head_dim, self.block_size);
        let row = |pos: usize| {
            let slot = self.table[pos / bs] as usize * bs + pos % bs;
            (slot * self.n_kv_heads + h) * hd
        };
        for b in 0..n.div_ceil(bs) {
            let base = self.table[b] as usize * bs;
            for j in b * bs..((b + 1) * bs).min(n) {
                if j + AHEAD < n {
                    let o = row(j + AHEAD);
                    self.k.prefetch(o, hd);
                    self.v.prefetch(o, hd);
                }
                let o = ((base + j % bs) * self.n_kv_heads + h) * hd;
                self.k.load(o, &mut k[j * hd..(j + 1) * hd]);
                self.v.load(o, &mut v[j * hd..(j + 1) * hd]);
            }
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
    /// out of order, a partial last block, every dtype and head.
    #[test]
    fn bulk_rows_follow_the_block_table() {
        use pagellm_kernels::ops::attention::KvView;
        let (heads, hd, bs) = (3, 8, 4);
        for dtype in [KvDtype::F16, KvDtype::Bf16, KvDtype::F32, KvDtype::Int8] {
            let mut c = PagedKvCache::new(1, heads, hd, bs, 6, dtype).unwrap();
            let table = [4u32, 1, 5, 0];
            let n = 14;
            for pos in 0..n {
                let slot = table[pos / bs] as usize * bs + pos % bs;
                let row = |s: f32| -> Vec<f32> {
                    (0..heads * hd)
                        .map(|i| s * (pos * 31 + i) as f32 / 97.0 - 1.0)
                        .collect()
                };
                c.write(0, slot, &row(1.0), &row(-0.5));
            }
            let view = c.view(0, &table);
            for h in 0..heads {
                let (mut k, mut v) = (vec![f32::NAN; n * hd], vec![f32::NAN; n * hd]);
                view.load_rows(n, h, &mut k, &mut v);
                for pos in 0..n {
                    let (mut kr, mut vr) = (vec![0f32; hd], vec![0f32; hd]);
                    view.load_key(pos, h, &mut kr);
                    view.load_value(pos, h, &mut vr);
                    assert_eq!(
                        &k[pos * hd..(pos + 1) * hd],
                        &kr[..],
                        "{dtype} key {pos} head {h}"
                    );
                    assert_eq!(
                        &v[pos * hd..(pos + 1) * hd],
                        &vr[..],
                        "{dtype} value {pos} head {h}"
                    );
                    assert!(
                        kr.iter().any(|&x| x != 0.0),
                        "{dtype} key {pos} was never written"
                    );
                }
            }
        }
    }
}

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

use crate::error::{ModelError, Result};

/// Element type of the KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvDtype {
    /// llama.cpp's default cache type; what the reference-exact results assume.
    #[default]
    F16,
    Bf16,
    F32,
}

impl KvDtype {
    pub fn size(self) -> usize {
        match self {
            KvDtype::F16 | KvDtype::Bf16 => 2,
            KvDtype::F32 => 4,
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
            other => Err(format!(
                "unknown KV cache dtype {other:?}; expected one of auto, f16, bf16, f32"
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
        })
    }
}

/// One layer's keys or values. Half-precision data is kept as raw bits so the buffer
/// can be allocated zeroed (the OS maps pages lazily: capacity costs nothing until used).
enum Buf {
    F16(Vec<u16>),
    Bf16(Vec<u16>),
    F32(Vec<f32>),
}

impl Buf {
    fn zeroed(dtype: KvDtype, n: usize) -> Self {
        match dtype {
            KvDtype::F16 => Buf::F16(vec![0; n]),
            KvDtype::Bf16 => Buf::Bf16(vec![0; n]),
            KvDtype::F32 => Buf::F32(vec![0.0; n]),
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
            k: (0..n_layers).map(|_| Buf::zeroed(dtype, n)).collect(),
            v: (0..n_layers).map(|_| Buf::zeroed(dtype, n)).collect(),
        })
    }

    /// Bytes one block takes across all layers, keys and values.
    pub fn bytes_per_block(
        n_layers: usize,
        kv_dim: usize,
        block_size: usize,
        dtype: KvDtype,
    ) -> usize {
        2 * n_layers * block_size * kv_dim * dtype.size()
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
}

/// Keys and values of one sequence: a paged cache of a single block as long as the
/// sequence may grow, filled from position 0.
pub struct SeqKvCache {
    pub(crate) paged: PagedKvCache,
    len: usize,
}

impl SeqKvCache {
    pub fn new(n_layers: usize, n_kv_heads: usize, head_dim: usize, capacity: usize) -> Self {
        let paged = PagedKvCache::new(
            n_layers,
            n_kv_heads,
            head_dim,
            capacity.max(1),
            1,
            KvDtype::F16,
        )
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

//! A contiguous per-sequence KV cache: the simplest store the forward pass can run on.
//! The paged, shared cache of the serving engine replaces it for batched serving.

use half::f16;
use pagellm_kernels::ops::attention::ContiguousKv;

/// Keys and values of one sequence: per layer (capacity, kv_dim) f16 each, the cache
/// type llama.cpp uses by default.
pub struct SeqKvCache {
    k: Vec<Vec<f16>>,
    v: Vec<Vec<f16>>,
    kv_dim: usize,
    capacity: usize,
    len: usize,
}

impl SeqKvCache {
    pub fn new(n_layers: usize, kv_dim: usize, capacity: usize) -> Self {
        // Allocated lazily per layer as the sequence grows, so a large capacity costs
        // nothing until it is used.
        Self {
            k: vec![Vec::new(); n_layers],
            v: vec![Vec::new(); n_layers],
            kv_dim,
            capacity,
            len: 0,
        }
    }

    /// Tokens whose keys and values are stored.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Forgets everything from position `len` on.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Stores `k`, `v` (tokens, kv_dim) of layer `layer` at positions `start..`.
    pub(crate) fn write(&mut self, layer: usize, start: usize, k: &[f32], v: &[f32]) {
        let end = start * self.kv_dim + k.len();
        assert!(end <= self.capacity * self.kv_dim);
        for (store, src) in [(&mut self.k[layer], k), (&mut self.v[layer], v)] {
            if store.len() < end {
                store.resize(end, f16::ZERO);
            }
            for (d, &s) in store[start * self.kv_dim..end].iter_mut().zip(src) {
                *d = f16::from_f32(s);
            }
        }
    }

    /// Marks `n` more positions as stored (after every layer wrote them).
    pub(crate) fn advance(&mut self, n: usize) {
        self.len += n;
    }

    pub(crate) fn view(
        &self,
        layer: usize,
        n_kv_heads: usize,
        head_dim: usize,
    ) -> ContiguousKv<'_> {
        ContiguousKv {
            k: &self.k[layer],
            v: &self.v[layer],
            n_kv_heads,
            head_dim,
        }
    }
}

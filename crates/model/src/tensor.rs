//! Tensors whose bytes live in a memory map (or, rarely, an owned buffer).

use std::collections::HashMap;
use std::sync::Arc;

use pagellm_kernels::quant::interleave::Interleaved;
use pagellm_kernels::quant::{GgmlType, QuantParams};

use crate::error::{ModelError, Result};

/// Where a tensor's bytes live. Weights are memory-mapped so that loading a model
/// costs page-table entries, not copies.
pub enum Storage {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Storage {
    pub fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mmap(m) => m,
            Storage::Owned(v) => v,
        }
    }
}

/// A named tensor in GGML order: `shape[0]` is the contiguous (row) dimension, so a
/// weight matrix of `shape = [cols, rows]` multiplies a `cols`-vector into a `rows`-vector.
#[derive(Clone)]
pub struct Tensor {
    pub name: String,
    pub ty: GgmlType,
    pub shape: Vec<usize>,
    storage: Arc<Storage>,
    offset: usize,
    len: usize,
    /// Scales (and zero points) of a checkpoint-format weight (`ty.has_params()`).
    params: Option<Arc<QuantParams>>,
    /// The rows repacked eight at a time for the interleaved kernels, when made.
    packed: Option<Arc<Interleaved>>,
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tensor")
            .field("name", &self.name)
            .field("ty", &self.ty)
            .field("shape", &self.shape)
            .finish()
    }
}

impl Tensor {
    /// Creates a view of `storage[offset..offset + len]`. Checks the byte range and that
    /// `len` is exactly what `ty` and `shape` need.
    pub fn new(
        name: String,
        ty: GgmlType,
        shape: Vec<usize>,
        storage: Arc<Storage>,
        offset: usize,
    ) -> Result<Self> {
        let n_elems = shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| {
                ModelError::Other(format!("tensor `{name}`: shape {shape:?} overflows"))
            })?;
        let cols = shape.first().copied().unwrap_or(1);
        let row_bytes = ty.row_bytes(cols).ok_or_else(|| {
            ModelError::Other(format!(
                "tensor `{name}`: row length {cols} is not a multiple of the {} block size {}",
                ty.name(),
                ty.block_elems()
            ))
        })?;
        let len = n_elems.checked_div(cols).map_or(0, |rows| row_bytes * rows);
        let end = offset.checked_add(len);
        if end.is_none_or(|e| e > storage.bytes().len()) {
            return Err(ModelError::Other(format!(
                "tensor `{name}`: data [{offset}, +{len}) lies outside the {}-byte file",
                storage.bytes().len()
            )));
        }
        Ok(Self {
            name,
            ty,
            shape,
            storage,
            offset,
            len,
            params: None,
            packed: None,
        })
    }

    /// Attaches the scales of a checkpoint-format weight, checked against its shape.
    pub fn with_params(mut self, params: QuantParams) -> Result<Self> {
        params
            .check(self.ty, self.rows(), self.cols())
            .map_err(|e| ModelError::Other(format!("tensor `{}`: {e}", self.name)))?;
        self.params = Some(Arc::new(params));
        Ok(self)
    }

    /// The scales of a checkpoint-format weight.
    pub fn params(&self) -> Option<&QuantParams> {
        self.params.as_deref()
    }

    /// Repacks a weight matrix into the interleaved layout its type has one of (see
    /// [`Interleaved`]) and releases the mapped pages it came from: the repacked copy
    /// is the one kept in memory, and the rare readers of the original bytes (token
    /// lookups of a tied embedding, the float reference path) fault them back in from
    /// the file. Returns whether it repacked.
    pub fn repack(&mut self) -> bool {
        Self::repack_all(&mut [self]) == 1
    }

    /// [`Tensor::repack`] for several weights at once, into one buffer advised onto huge
    /// pages: a model's weights are mostly smaller than a huge page (2 MiB), and
    /// streaming them from 4 KiB pages costs a page walk every 4 KiB (a decode-shaped
    /// matmul from memory measured 33 GiB/s on small pages against 43 on huge ones, on
    /// the AVX-512 EPYC of BENCHMARKS.md). Returns how many it repacked.
    pub fn repack_all(tensors: &mut [&mut Tensor]) -> usize {
        let len = |t: &Tensor| {
            (t.packed.is_none() && t.params.is_none())
                .then(|| Interleaved::packed_len(t.ty, t.rows(), t.cols()))
                .flatten()
        };
        let total: usize = tensors.iter().filter_map(|t| len(t)).sum();
        let mut buf = pagellm_kernels::mem::zeroed_huge::<u8>(total);
        let mut made = Vec::new();
        let mut at = 0;
        for (i, t) in tensors.iter_mut().enumerate() {
            let Some(n) = len(t) else { continue };
            if t.repack_into(&mut buf[at..at + n]) {
                made.push((i, at));
            }
            at += n;
        }
        let buf = Arc::new(buf);
        for &(i, start) in &made {
            let t = &mut tensors[i];
            let p = Interleaved::in_buffer(t.ty, t.rows(), t.cols(), Arc::clone(&buf), start);
            t.packed = Some(Arc::new(p));
        }
        made.len()
    }

    /// Writes this weight's interleaved bytes into `out`, releasing each stretch of the
    /// mapped rows as soon as it has been copied, so the weight is never resident twice.
    fn repack_into(&self, out: &mut [u8]) -> bool {
        #[cfg(unix)]
        let mut released = 0;
        #[cfg(unix)]
        let release = |done: usize| {
            let from = std::mem::replace(&mut released, done);
            if let Storage::Mmap(m) = &*self.storage {
                // SAFETY: the map is read-only and file-backed, so dropping its pages
                // loses nothing: the next read of any byte in the range faults the same
                // bytes back in from the file. No reference into the map is invalidated.
                let _ = unsafe {
                    m.unchecked_advise_range(
                        memmap2::UncheckedAdvice::DontNeed,
                        self.offset + from,
                        done - from,
                    )
                };
            }
        };
        #[cfg(not(unix))]
        let release = |_: usize| {};
        Interleaved::repack_into(self.ty, self.data(), self.rows(), self.cols(), out, release)
    }

    /// The interleaved copy made by [`Tensor::repack`].
    pub fn packed(&self) -> Option<&Interleaved> {
        self.packed.as_deref()
    }

    pub fn data(&self) -> &[u8] {
        &self.storage.bytes()[self.offset..self.offset + self.len]
    }

    /// Contiguous row length (`shape[0]`).
    pub fn cols(&self) -> usize {
        self.shape.first().copied().unwrap_or(1)
    }

    /// Number of rows (product of the other dimensions).
    pub fn rows(&self) -> usize {
        self.shape.iter().skip(1).product()
    }

    pub fn row_bytes(&self) -> usize {
        self.ty
            .row_bytes(self.cols())
            .expect("checked in Tensor::new")
    }

    /// Bytes of row `r`.
    pub fn row(&self, r: usize) -> &[u8] {
        let rb = self.row_bytes();
        &self.data()[r * rb..(r + 1) * rb]
    }

    /// Dequantizes the whole tensor to f32 (used for small tensors such as norms, and by
    /// conversion; never for the big weight matrices on the hot path).
    pub fn to_f32(&self) -> Vec<f32> {
        let cols = self.cols();
        let mut out = vec![0f32; self.rows() * cols];
        for (r, dst) in out.chunks_exact_mut(cols.max(1)).enumerate() {
            self.dequantize_row(r, dst);
        }
        out
    }

    /// Dequantizes row `r` into `dst` (`cols` values).
    pub fn dequantize_row(&self, r: usize, dst: &mut [f32]) {
        match &self.params {
            Some(p) => {
                pagellm_kernels::quant::wq::dequantize_row_wq(self.ty, p, r, self.row(r), dst)
            }
            None => pagellm_kernels::quant::dequantize_row(self.ty, self.row(r), dst),
        }
    }

    /// Checks the shape against what the model expects.
    pub fn expect_shape(&self, expected: &[usize]) -> Result<&Self> {
        if self.shape != expected {
            return Err(ModelError::BadShape {
                name: self.name.clone(),
                expected: expected.to_vec(),
                found: self.shape.clone(),
            });
        }
        Ok(self)
    }
}

/// All tensors of a checkpoint, by GGUF name (`blk.0.attn_q.weight`, `token_embd.weight`).
/// Hugging Face checkpoints are renamed to GGUF names when loaded.
#[derive(Default, Clone)]
pub struct TensorSet {
    tensors: HashMap<String, Tensor>,
}

impl TensorSet {
    pub fn insert(&mut self, t: Tensor) {
        self.tensors.insert(t.name.clone(), t);
    }

    pub fn get(&self, name: &str) -> Result<&Tensor> {
        self.tensors
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor {
                name: name.to_string(),
            })
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Tensor> {
        self.tensors.values()
    }

    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Repacking several weights into one buffer gives each the bytes repacking it alone
    /// gives, and leaves alone what has no interleaved layout (f32; rows not a multiple
    /// of eight).
    #[test]
    fn repacking_together_matches_repacking_alone() {
        let shapes = [
            (GgmlType::Q4_1, 64, 16),
            (GgmlType::F32, 32, 8),
            (GgmlType::Q8_0, 96, 24),
            (GgmlType::Q4_1, 64, 12),
            (GgmlType::Q4_K, 256, 8),
        ];
        let mut bytes = Vec::new();
        let mut offsets = Vec::new();
        for &(ty, cols, rows) in &shapes {
            offsets.push(bytes.len());
            let n = ty.row_bytes(cols).unwrap() * rows;
            // Bytes below 0x40 keep every f16 scale finite.
            let base = bytes.len();
            bytes.extend((0..n).map(|i| ((i * 7919 + base * 31) % 64) as u8));
        }
        let storage = Arc::new(Storage::Owned(bytes));
        let make = || -> Vec<Tensor> {
            shapes
                .iter()
                .zip(&offsets)
                .map(|(&(ty, cols, rows), &off)| {
                    Tensor::new(
                        format!("{ty:?}"),
                        ty,
                        vec![cols, rows],
                        storage.clone(),
                        off,
                    )
                    .unwrap()
                })
                .collect()
        };
        let mut alone = make();
        let made_alone: Vec<bool> = alone.iter_mut().map(|t| t.repack()).collect();
        assert_eq!(made_alone, [true, false, true, false, true]);
        let mut together = make();
        let mut refs: Vec<&mut Tensor> = together.iter_mut().collect();
        assert_eq!(Tensor::repack_all(&mut refs), 3);
        assert_eq!(Tensor::repack_all(&mut refs), 0, "already repacked");
        for (a, t) in alone.iter().zip(&together) {
            match (a.packed(), t.packed()) {
                (Some(a), Some(t)) => assert_eq!(a.bytes(), t.bytes(), "{}", a.ty.name()),
                (None, None) => {}
                _ => panic!("repacked alone but not together, or the reverse"),
            }
        }
    }
}

//! Safetensors files → memory-mapped [`Tensor`]s with GGUF names.
//!
//! A safetensors file is an 8-byte little-endian header length, a JSON header
//! (`{"name": {"dtype", "shape", "data_offsets": [begin, end]}, ...}`, offsets relative
//! to the end of the header) and the raw row-major data. The header is parsed with the
//! `safetensors` crate's [`Metadata`]; every tensor pagellm uses is checked against
//! the file size here, with the tensor named, before a view into the map is made.

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use pagellm_kernels::quant::GgmlType;
use safetensors::tensor::Metadata;
use safetensors::Dtype;
use serde::Deserialize;

use crate::error::{ModelError, Result};
use crate::tensor::{Storage, Tensor, TensorSet};

use super::names::hf_to_gguf;
use super::quant::QuantConfig;

const SINGLE: &str = "model.safetensors";
const INDEX: &str = "model.safetensors.index.json";

/// Headers larger than this are refused before parsing (the `safetensors` crate's own
/// limit is the same 100 MB).
const MAX_HEADER: usize = 100_000_000;

#[derive(Deserialize)]
struct ShardIndex {
    weight_map: HashMap<String, String>,
}

/// Maps every weight file of `dir`. With `tied`, `lm_head.weight` is dropped so the
/// loader uses the embedding matrix as the LM head. With `quant`, the linear layers'
/// quantized tensors are assembled into checkpoint-format weights (see `quant.rs`).
pub(super) fn load(dir: &Path, tied: bool, quant: Option<&QuantConfig>) -> Result<TensorSet> {
    let mut set = TensorSet::default();
    // HF name → file it came from, to report duplicates across shards.
    let mut origin: HashMap<String, PathBuf> = HashMap::new();
    let mut raws: HashMap<String, RawTensor> = HashMap::new();
    for shard in shard_paths(dir)? {
        for t in map_file(&shard)? {
            if let Some(first) = origin.insert(t.hf_name.clone(), shard.clone()) {
                return Err(ModelError::Other(format!(
                    "tensor `{}` appears in both {} and {}",
                    t.hf_name,
                    first.display(),
                    shard.display()
                )));
            }
            raws.insert(t.hf_name.clone(), t);
        }
    }
    if let Some(q) = quant {
        for t in super::quant::assemble(q, &mut raws)? {
            set.insert(t);
        }
    }
    let mut names: Vec<String> = raws.keys().cloned().collect();
    names.sort();
    for hf_name in names {
        let Some(gguf_name) = hf_to_gguf(&hf_name) else {
            tracing::debug!("{}: ignoring tensor `{hf_name}`", dir.display());
            continue;
        };
        if tied && gguf_name == "output.weight" {
            continue;
        }
        let raw = &raws[&hf_name];
        let ty = ggml_type(raw.dtype).ok_or_else(|| ModelError::UnsupportedTensorType {
            name: hf_name.clone(),
            ty: format!("{:?} (supported: F32, F16, BF16)", raw.dtype),
        })?;
        set.insert(raw.tensor(gguf_name, ty)?);
    }
    Ok(set)
}

/// A tensor of a safetensors file as its header describes it, range-checked.
pub(super) struct RawTensor {
    pub hf_name: String,
    pub dtype: Dtype,
    /// Hugging Face (row-major) order.
    pub shape: Vec<usize>,
    pub storage: Arc<Storage>,
    pub offset: usize,
    pub len: usize,
    pub file: PathBuf,
}

impl RawTensor {
    pub fn bytes(&self) -> &[u8] {
        &self.storage.bytes()[self.offset..self.offset + self.len]
    }

    /// A view of the data as a `ty` tensor named `name`, in GGML shape order.
    pub fn tensor(&self, name: String, ty: GgmlType) -> Result<Tensor> {
        let shape: Vec<usize> = self.shape.iter().rev().copied().collect();
        Tensor::new(name, ty, shape, self.storage.clone(), self.offset)
    }

    /// Elements widened to f32 (float dtypes only).
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        let b = self.bytes();
        Ok(match self.dtype {
            Dtype::F32 => b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            Dtype::F16 => b
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            Dtype::BF16 => b
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            other => {
                return Err(ModelError::UnsupportedTensorType {
                    name: self.hf_name.clone(),
                    ty: format!("{other:?} (expected F32, F16 or BF16)"),
                })
            }
        })
    }

    /// Elements of an integer tensor (I32 or I64) as i64.
    pub fn to_i64(&self) -> Result<Vec<i64>> {
        let b = self.bytes();
        Ok(match self.dtype {
            Dtype::I32 => b
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64)
                .collect(),
            Dtype::I64 => b
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect(),
            other => {
                return Err(ModelError::UnsupportedTensorType {
                    name: self.hf_name.clone(),
                    ty: format!("{other:?} (expected I32 or I64)"),
                })
            }
        })
    }
}

/// `model.safetensors`, or the shards listed by `model.safetensors.index.json` (each
/// once, in name order).
fn shard_paths(dir: &Path) -> Result<Vec<PathBuf>> {
    let single = dir.join(SINGLE);
    if single.is_file() {
        return Ok(vec![single]);
    }
    let index_path = dir.join(INDEX);
    if !index_path.is_file() {
        let hint = if dir.join("pytorch_model.bin").exists() {
            " (pytorch_model.bin checkpoints are not supported; only safetensors)"
        } else {
            ""
        };
        return Err(ModelError::Other(format!(
            "{}: no weights: neither {SINGLE} nor {INDEX} exists{hint}",
            dir.display()
        )));
    }
    let index: ShardIndex = super::read_json(&index_path)?;
    let files: BTreeSet<&str> = index.weight_map.values().map(String::as_str).collect();
    if files.is_empty() {
        return Err(ModelError::Other(format!(
            "{}: weight_map is empty",
            index_path.display()
        )));
    }
    files
        .into_iter()
        .map(|f| {
            // Shards live next to the index; refuse names that would point elsewhere.
            if Path::new(f).file_name().and_then(|n| n.to_str()) != Some(f) {
                return Err(ModelError::Other(format!(
                    "{}: shard name `{f}` is not a plain file name",
                    index_path.display()
                )));
            }
            let path = dir.join(f);
            if !path.is_file() {
                return Err(ModelError::Other(format!(
                    "{}: shard {f} listed in {INDEX} does not exist",
                    dir.display()
                )));
            }
            Ok(path)
        })
        .collect()
}

fn ggml_type(dtype: Dtype) -> Option<GgmlType> {
    match dtype {
        Dtype::F32 => Some(GgmlType::F32),
        Dtype::F16 => Some(GgmlType::F16),
        Dtype::BF16 => Some(GgmlType::BF16),
        _ => None,
    }
}

/// Maps one safetensors file and returns every tensor it holds, range-checked.
fn map_file(path: &Path) -> Result<Vec<RawTensor>> {
    let bad = |reason: String| ModelError::Other(format!("{}: {reason}", path.display()));
    let io_err = |source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io_err)?;
    let file_len = file.metadata().map_err(io_err)?.len() as usize;
    if file_len < 8 {
        // Also avoids mapping an empty file, which fails on some platforms.
        return Err(bad(format!(
            "truncated safetensors file: {file_len} bytes, shorter than the 8-byte header length"
        )));
    }
    // SAFETY: read-only map; as for GGUF files (see `GgufFile::open`), the file must not
    // be truncated or rewritten while the model is loaded.
    let mmap = unsafe { memmap2::Mmap::map(&file) }.map_err(io_err)?;
    let bytes: &[u8] = &mmap;
    let header_len = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
    if header_len > MAX_HEADER as u64 {
        return Err(bad(format!(
            "safetensors header length {header_len} is implausibly large (corrupt file?)"
        )));
    }
    let header_len = header_len as usize;
    let data_start = 8 + header_len;
    if data_start > file_len {
        return Err(bad(format!(
            "truncated safetensors header: it declares {header_len} bytes but the file has \
             only {} after the length field",
            file_len - 8
        )));
    }
    let metadata: Metadata = serde_json::from_slice(&bytes[8..data_start])
        .map_err(|e| bad(format!("invalid safetensors header: {e}")))?;

    let mut infos: Vec<_> = metadata.tensors().into_iter().collect();
    infos.sort_by(|a, b| a.0.cmp(&b.0));
    let mut plan = Vec::new();
    for (hf_name, info) in infos {
        let n_bytes = info
            .shape
            .iter()
            .try_fold(info.dtype.size(), |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| {
                bad(format!(
                    "tensor `{hf_name}`: shape {:?} overflows",
                    info.shape
                ))
            })?;
        let (begin, end) = info.data_offsets;
        if end < begin || end - begin != n_bytes {
            return Err(bad(format!(
                "tensor `{hf_name}`: data_offsets [{begin}, {end}) do not match shape {:?} of {:?} \
                 ({n_bytes} bytes)",
                info.shape, info.dtype
            )));
        }
        let offset = data_start.checked_add(begin);
        if offset
            .and_then(|o| o.checked_add(n_bytes))
            .is_none_or(|e| e > file_len)
        {
            return Err(bad(format!(
                "tensor `{hf_name}`: data [{begin}, {end}) lies beyond the end of the file \
                 ({} data bytes; truncated?)",
                file_len - data_start
            )));
        }
        plan.push((
            hf_name,
            info.dtype,
            info.shape.clone(),
            data_start + begin,
            n_bytes,
        ));
    }

    let storage = Arc::new(Storage::Mmap(mmap));
    Ok(plan
        .into_iter()
        .map(|(hf_name, dtype, shape, offset, len)| RawTensor {
            hf_name,
            dtype,
            shape,
            storage: storage.clone(),
            offset,
            len,
            file: path.to_path_buf(),
        })
        .collect())
}

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
/// loader uses the embedding matrix as the LM head.
pub(super) fn load(dir: &Path, tied: bool) -> Result<TensorSet> {
    let mut set = TensorSet::default();
    // GGUF name → file it came from, to report duplicates across shards.
    let mut origin: HashMap<String, PathBuf> = HashMap::new();
    for shard in shard_paths(dir)? {
        for t in map_file(&shard)? {
            if tied && t.name == "output.weight" {
                continue;
            }
            if let Some(first) = origin.insert(t.name.clone(), shard.clone()) {
                return Err(ModelError::Other(format!(
                    "tensor `{}` appears in both {} and {}",
                    t.name,
                    first.display(),
                    shard.display()
                )));
            }
            set.insert(t);
        }
    }
    Ok(set)
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

/// Maps one safetensors file and returns views of the tensors pagellm uses, renamed to
/// GGUF names and with GGML shape order. Other tensors (e.g. `rotary_emb.inv_freq`)
/// are skipped.
fn map_file(path: &Path) -> Result<Vec<Tensor>> {
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
        let Some(gguf_name) = hf_to_gguf(&hf_name) else {
            tracing::debug!("{}: ignoring tensor `{hf_name}`", path.display());
            continue;
        };
        let ty = ggml_type(info.dtype).ok_or_else(|| ModelError::UnsupportedTensorType {
            name: hf_name.clone(),
            ty: format!("{:?} (supported: F32, F16, BF16)", info.dtype),
        })?;
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
        // Hugging Face shapes are [out, in] (row-major); GGML lists the contiguous
        // dimension first.
        let shape: Vec<usize> = info.shape.iter().rev().copied().collect();
        plan.push((gguf_name, ty, shape, data_start + begin));
    }

    let storage = Arc::new(Storage::Mmap(mmap));
    plan.into_iter()
        .map(|(name, ty, shape, offset)| Tensor::new(name, ty, shape, storage.clone(), offset))
        .collect()
}

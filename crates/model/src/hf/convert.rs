//! GGUF → Hugging Face directory (`pagellm convert`).
//!
//! Every tensor is dequantized to f32 and written as BF16 or F32 under its Hugging Face
//! name and `[out, in]` shape. llama Q/K projections get their rows un-permuted (see
//! [`unpermute_rows`]). The files are written into a staging directory next to
//! `out_dir` and renamed into place at the end, so an interrupted conversion never
//! leaves a half-written model behind under the requested name.

use std::borrow::Cow;
use std::fs;
use std::path::{Path, PathBuf};

use safetensors::{Dtype, View};
use serde_json::{json, Value};

use crate::config::{Arch, ModelConfig};
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::registry::{resolve, ResolvedModel};
use crate::tensor::{Tensor, TensorSet};
use crate::tokenizer::Tokenizer;

use super::names::gguf_to_hf;
use super::HfDtype;

/// Converts a GGUF model (registry name or path; registry models are pulled if needed)
/// into a Hugging Face directory at `out_dir`: `model.safetensors`, `config.json`,
/// `tokenizer.json`, `tokenizer_config.json` and `generation_config.json`.
/// Refuses to write into an existing non-empty directory.
pub fn convert_gguf_to_hf(input: &str, out_dir: &Path, dtype: HfDtype) -> Result<()> {
    let gguf_path = match resolve(input, true)? {
        ResolvedModel::Gguf(p) => p,
        ResolvedModel::HfDir(d) => {
            return Err(ModelError::Other(format!(
                "`{input}` is already a Hugging Face directory ({}); conversion reads GGUF files",
                d.display()
            )))
        }
    };
    check_out_dir(out_dir)?;

    let g = GgufFile::open(&gguf_path)?;
    let config = ModelConfig::from_gguf(&g)?;
    let tensors = g.tensor_set()?;
    let tokenizer = crate::loader::tokenizer_from_gguf(&g)?;
    // Building the model checks that every tensor is present with the right shape
    // before anything is written.
    crate::loader::build(config.clone(), &tensors)?;
    let tied = !tensors.contains("output.weight");

    let staging = Staging::create(out_dir)?;
    write_weights(
        &staging.path.join("model.safetensors"),
        &g,
        &config,
        &tensors,
        dtype,
    )?;
    write_json(
        &staging.path.join("config.json"),
        &super::config::to_json(&config, tied, dtype, tokenizer.bos_id(), tokenizer.eos_id()),
    )?;
    write_tokenizer(&staging.path, &tokenizer, &config)?;
    staging.finish(out_dir)
}

/// Fails unless `out_dir` is absent or an empty directory.
pub(super) fn check_out_dir(out_dir: &Path) -> Result<()> {
    let io_err = |source| ModelError::Io {
        path: out_dir.to_path_buf(),
        source,
    };
    match fs::symlink_metadata(out_dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err(e)),
        Ok(md) if !md.is_dir() => Err(ModelError::Other(format!(
            "{}: exists and is not a directory; refusing to overwrite it",
            out_dir.display()
        ))),
        Ok(_) => {
            if fs::read_dir(out_dir).map_err(io_err)?.next().is_some() {
                return Err(ModelError::Other(format!(
                    "{}: directory is not empty; refusing to overwrite it (choose a new \
                     output directory or remove this one)",
                    out_dir.display()
                )));
            }
            Ok(())
        }
    }
}

/// A hidden sibling of the output directory, removed on drop unless renamed into place.
pub(super) struct Staging {
    pub(super) path: PathBuf,
    done: bool,
}

impl Staging {
    pub(super) fn create(out_dir: &Path) -> Result<Self> {
        let name = out_dir
            .file_name()
            .ok_or_else(|| {
                ModelError::Other(format!(
                    "{}: output path has no directory name",
                    out_dir.display()
                ))
            })?
            .to_string_lossy();
        let parent = match out_dir.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        fs::create_dir_all(&parent).map_err(|source| ModelError::Io {
            path: parent.clone(),
            source,
        })?;
        let path = parent.join(format!(".{name}.partial-{}", std::process::id()));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir(&path).map_err(|source| ModelError::Io {
            path: path.clone(),
            source,
        })?;
        Ok(Self { path, done: false })
    }

    pub(super) fn finish(mut self, out_dir: &Path) -> Result<()> {
        // An empty directory at `out_dir` was allowed by `check_out_dir`; rename needs
        // the name free on every platform.
        if out_dir.is_dir() {
            fs::remove_dir(out_dir).map_err(|source| ModelError::Io {
                path: out_dir.to_path_buf(),
                source,
            })?;
        }
        fs::rename(&self.path, out_dir).map_err(|source| ModelError::Io {
            path: out_dir.to_path_buf(),
            source,
        })?;
        self.done = true;
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.done {
            let _ = fs::remove_dir_all(&self.path);
        }
    }
}

/// Undoes llama.cpp's Q/K row permutation for one projection whose `src` rows are
/// `row_len` elements long (a bias is rows of length 1).
///
/// llama.cpp's `convert_hf_to_gguf.py` (`LlamaModel.permute`) reshapes the rows of each
/// head as `(2, head_dim / 2)` and swaps the two axes, so that RoPE can rotate adjacent
/// pairs:
/// `weights.reshape(n_head, 2, rows // n_head // 2, *rest).swapaxes(1, 2)`.
/// Hence GGUF row `h*hd + 2*i + j` is Hugging Face row `h*hd + j*(hd/2) + i`
/// (`i < hd/2`, `j ∈ {0, 1}`), and this function moves each row back. Q uses the number
/// of query heads, K the number of KV heads (the converter's `n_head_kv` override).
pub(crate) fn unpermute_rows(src: &[f32], n_heads: usize, row_len: usize) -> Vec<f32> {
    move_qk_rows(src, n_heads, row_len, false)
}

/// llama.cpp's `LlamaModel.permute` (the inverse of [`unpermute_rows`]): Hugging Face
/// Q/K rows into GGUF's interleaved order, for `convert --to gguf`.
pub(crate) fn permute_rows(src: &[f32], n_heads: usize, row_len: usize) -> Vec<f32> {
    move_qk_rows(src, n_heads, row_len, true)
}

/// Moves every row between GGUF row `h*hd + 2*i + j` and Hugging Face row
/// `h*hd + j*(hd/2) + i`, towards GGUF when `to_gguf`.
fn move_qk_rows(src: &[f32], n_heads: usize, row_len: usize, to_gguf: bool) -> Vec<f32> {
    let rows = src.len() / row_len;
    assert_eq!(rows * row_len, src.len(), "partial row");
    assert_eq!(
        rows % (2 * n_heads),
        0,
        "{rows} rows do not split into {n_heads} heads of pairs"
    );
    let hd = rows / n_heads;
    let half = hd / 2;
    let mut out = vec![0f32; src.len()];
    for h in 0..n_heads {
        for i in 0..half {
            for j in 0..2 {
                let gguf_row = h * hd + 2 * i + j;
                let hf_row = h * hd + j * half + i;
                let (from, to) = if to_gguf {
                    (hf_row, gguf_row)
                } else {
                    (gguf_row, hf_row)
                };
                out[to * row_len..(to + 1) * row_len]
                    .copy_from_slice(&src[from * row_len..(from + 1) * row_len]);
            }
        }
    }
    out
}

/// One output tensor, converted only when the writer asks for its bytes so that at
/// most one dequantized tensor is in memory at a time.
struct LazyTensor<'a> {
    src: &'a Tensor,
    /// Hugging Face order (`[out, in]`): the GGML shape reversed.
    shape: Vec<usize>,
    /// `Some(n_heads)` for llama Q/K tensors that need [`unpermute_rows`].
    unpermute_heads: Option<usize>,
    dtype: HfDtype,
}

impl View for LazyTensor<'_> {
    fn dtype(&self) -> Dtype {
        match self.dtype {
            HfDtype::Bf16 => Dtype::BF16,
            HfDtype::F16 => Dtype::F16,
            HfDtype::F32 => Dtype::F32,
        }
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        let mut values = self.src.to_f32();
        if let Some(n_heads) = self.unpermute_heads {
            values = unpermute_rows(&values, n_heads, self.src.cols());
        }
        Cow::Owned(match self.dtype {
            HfDtype::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            // `from_f32` rounds to nearest even, like torch's `.to(torch.bfloat16)`.
            HfDtype::Bf16 => values
                .iter()
                .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
                .collect(),
            HfDtype::F16 => values
                .iter()
                .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
                .collect(),
        })
    }

    fn data_len(&self) -> usize {
        let elem = match self.dtype {
            HfDtype::Bf16 | HfDtype::F16 => 2,
            HfDtype::F32 => 4,
        };
        self.shape.iter().product::<usize>() * elem
    }
}

fn write_weights(
    path: &Path,
    g: &GgufFile,
    config: &ModelConfig,
    tensors: &TensorSet,
    dtype: HfDtype,
) -> Result<()> {
    let mut views = Vec::new();
    // GGUF file order; the writer sorts by name, which makes the output deterministic.
    for info in &g.tensors {
        let Some(hf_name) = gguf_to_hf(&info.name) else {
            tracing::warn!(
                "{}: tensor `{}` has no Hugging Face counterpart; skipped",
                g.path.display(),
                info.name
            );
            continue;
        };
        let src = tensors.get(&info.name)?;
        let unpermute_heads = match config.arch {
            Arch::Llama if info.name.contains(".attn_q.") => Some(config.n_heads),
            Arch::Llama if info.name.contains(".attn_k.") => Some(config.n_kv_heads),
            _ => None,
        };
        views.push((
            hf_name,
            LazyTensor {
                src,
                shape: src.shape.iter().rev().copied().collect(),
                unpermute_heads,
                dtype,
            },
        ));
    }
    let metadata = Some(
        [("format".to_string(), "pt".to_string())]
            .into_iter()
            .collect(),
    );
    safetensors::serialize_to_file(views, &metadata, path)
        .map_err(|e| ModelError::Other(format!("{}: writing safetensors: {e}", path.display())))
}

pub(super) fn write_json(path: &Path, value: &Value) -> Result<()> {
    let mut text = serde_json::to_string_pretty(value).expect("JSON values serialize");
    text.push('\n');
    fs::write(path, text).map_err(|source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// `tokenizer.json`, `tokenizer_config.json` and `generation_config.json`, written so
/// that [`Tokenizer::from_file`] rebuilds the GGUF tokenizer: the special-token texts
/// and `add_bos_token` in `tokenizer_config.json`, and the full end-of-generation set
/// as `eos_token_id` in `generation_config.json`.
pub(super) fn write_tokenizer(dir: &Path, tok: &Tokenizer, config: &ModelConfig) -> Result<()> {
    let tokenizer_json = dir.join("tokenizer.json");
    tok.inner()
        .save(&tokenizer_json, false)
        .map_err(|e| ModelError::Tokenizer(format!("{}: {e}", tokenizer_json.display())))?;

    let text = |id: Option<u32>| id.and_then(|id| tok.id_to_token(id)).map(str::to_string);
    let mut tc = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": text(tok.bos_id()),
        "eos_token": text(tok.eos_id()),
        "add_bos_token": tok.add_bos(),
        "add_eos_token": tok.add_eos(),
        "clean_up_tokenization_spaces": false,
        "model_max_length": config.context_length,
    });
    if let Some(template) = tok.chat_template() {
        tc["chat_template"] = json!(template);
    }
    write_json(&dir.join("tokenizer_config.json"), &tc)?;

    let eos_ids = tok.eos_ids();
    let eos: Value = match eos_ids {
        [] => json!(tok.eos_id()),
        [one] => json!(one),
        many => json!(many),
    };
    write_json(
        &dir.join("generation_config.json"),
        &json!({
            "_from_model_config": false,
            "bos_token_id": tok.bos_id(),
            "eos_token_id": eos,
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpermute_inverts_llama_cpp_permute() {
        let (n_heads, hd, row_len) = (3, 8, 5);
        let hf: Vec<f32> = (0..n_heads * hd * row_len).map(|x| x as f32).collect();
        let gguf = permute_rows(&hf, n_heads, row_len);
        assert_ne!(gguf, hf);
        assert_eq!(unpermute_rows(&gguf, n_heads, row_len), hf);
        // Head 0 of a bias (row_len 1): GGUF pairs (0, 4), (1, 5), ... of the HF order.
        let bias: Vec<f32> = (0..hd).map(|x| x as f32).collect();
        assert_eq!(permute_rows(&bias, 1, 1), [0., 4., 1., 5., 2., 6., 3., 7.]);
    }
}

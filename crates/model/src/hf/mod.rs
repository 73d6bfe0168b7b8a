//! Hugging Face model directories: `config.json`, safetensors weights and
//! `tokenizer.json`, plus the reverse conversion from a GGUF file.
//!
//! Loading maps every safetensors shard once and hands out [`Tensor`](crate::Tensor)
//! views into it, renamed to GGUF names (`model.layers.0.self_attn.q_proj.weight` →
//! `blk.0.attn_q.weight`) so the architecture loaders see one naming scheme. The
//! weights are never copied.
//!
//! The two formats differ in one place that matters for the maths: llama.cpp's
//! converter permutes the rows of llama Q/K projections so that RoPE rotates adjacent
//! pairs, while Hugging Face checkpoints keep the "rotate_half" order. A model loaded
//! from a Hugging Face directory therefore always uses [`RopeStyle::Neox`], and
//! [`convert_gguf_to_hf`] undoes the permutation (see `convert.rs`).
//!
//! * `config.rs`: `config.json` → [`ModelConfig`](crate::ModelConfig) and back.
//! * `names.rs`: tensor name mapping in both directions.
//! * `weights.rs`: safetensors headers → memory-mapped tensors.
//! * `quant.rs`: `quantization_config` and quantized linear layers (compressed-tensors)
//!   → checkpoint-format tensors.
//! * `convert.rs`: GGUF → Hugging Face directory.
//! * `write.rs`: a loaded model → a Hugging Face directory with chosen tensors (the
//!   quantizers' output).

mod config;
pub(crate) mod convert;
pub(crate) mod names;
pub mod packed;
pub mod quant;
mod weights;
pub mod write;

use std::path::{Path, PathBuf};

use crate::chat::ChatTemplate;
use crate::error::{ModelError, Result};
use crate::loader::LoadedModel;
use crate::tokenizer::Tokenizer;

pub use convert::convert_gguf_to_hf;

/// Element type of the weights [`convert_gguf_to_hf`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HfDtype {
    /// bfloat16, rounded to nearest even: half the size, what most checkpoints ship.
    Bf16,
    /// float16, rounded to nearest even: the dtype AutoAWQ and GPTQ checkpoints use.
    F16,
    /// Exact f32 values of the dequantized GGUF weights.
    F32,
}

/// Loads a Hugging Face model directory (`config.json`, `model.safetensors` or a sharded
/// `model.safetensors.index.json`, `tokenizer.json`, optional `tokenizer_config.json`).
/// Weights stay memory-mapped.
pub fn load_hf_dir(dir: &Path) -> Result<LoadedModel> {
    let hf = config::read(dir)?;
    let tensors = weights::load(dir, hf.tie_word_embeddings, hf.quant.as_ref())?;
    let tokenizer = load_hf_tokenizer(dir)?;
    let chat_template = ChatTemplate::from_tokenizer(&tokenizer)?;
    let transformer = crate::loader::build(hf.config, &tensors).map_err(|e| match e {
        // The loader speaks GGUF names; say which file-level tensor is absent too.
        ModelError::MissingTensor { name } => ModelError::MissingTensor {
            name: match names::gguf_to_hf(&name) {
                Some(hf_name) => format!("{hf_name} ({name})"),
                None => name,
            },
        },
        other => other,
    })?;
    Ok(LoadedModel {
        transformer,
        tokenizer,
        chat_template,
        source: dir.display().to_string(),
    })
}

/// Loads only the tokenizer of a Hugging Face model directory: `tokenizer.json`, with
/// BOS/EOS and the chat template from `tokenizer_config.json` when present.
pub fn load_hf_tokenizer(dir: &Path) -> Result<Tokenizer> {
    let tokenizer_json = required_file(dir, "tokenizer.json")?;
    let tokenizer_config = dir.join("tokenizer_config.json");
    Tokenizer::from_file(
        &tokenizer_json,
        tokenizer_config
            .is_file()
            .then_some(tokenizer_config.as_path()),
    )
}

/// `dir/name`, or an error that names the missing file and what a directory needs.
fn required_file(dir: &Path, name: &str) -> Result<PathBuf> {
    let path = dir.join(name);
    if path.is_file() {
        return Ok(path);
    }
    Err(ModelError::Other(format!(
        "{}: {name} not found; a Hugging Face model directory needs config.json, \
         tokenizer.json and model.safetensors (or model.safetensors.index.json)",
        dir.display()
    )))
}

/// Reads and parses a JSON file, naming the file in every error.
fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text)
        .map_err(|e| ModelError::Config(format!("{}: invalid JSON: {e}", path.display())))
}

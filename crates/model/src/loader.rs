//! One entry point from a `--model` argument to a runnable model: resolve (registry
//! name, GGUF file or Hugging Face directory), map the weights, build the tokenizer
//! and chat template, and pick the architecture.

use std::path::Path;

use crate::chat::ChatTemplate;
use crate::config::{Arch, ModelConfig};
use crate::error::Result;
use crate::gguf::GgufFile;
use crate::registry::{resolve, ResolvedModel};
use crate::tensor::TensorSet;
use crate::tokenizer::{GgufTokenizerData, Tokenizer};
use crate::transformer::Transformer;

/// Everything needed to run a model.
pub struct LoadedModel {
    pub transformer: Transformer,
    pub tokenizer: Tokenizer,
    pub chat_template: Option<ChatTemplate>,
    /// Where it came from (file or directory path), for messages and reports.
    pub source: String,
}

/// Loads the model a `--model` argument names, pulling registry models on first use.
pub fn load_model(model_arg: &str) -> Result<LoadedModel> {
    match resolve(model_arg, true)? {
        ResolvedModel::Gguf(p) => load_gguf(&p),
        ResolvedModel::HfDir(d) => crate::hf::load_hf_dir(&d),
    }
}

/// Loads only the tokenizer of the model a `--model` argument names.
pub fn load_tokenizer(model_arg: &str) -> Result<Tokenizer> {
    match resolve(model_arg, true)? {
        ResolvedModel::Gguf(p) => tokenizer_from_gguf(&GgufFile::open(&p)?),
        ResolvedModel::HfDir(d) => crate::hf::load_hf_tokenizer(&d),
    }
}

/// Loads a GGUF file: weights stay memory-mapped.
pub fn load_gguf(path: &Path) -> Result<LoadedModel> {
    let g = GgufFile::open(path)?;
    let config = ModelConfig::from_gguf(&g)?;
    let tensors = g.tensor_set()?;
    let tokenizer = tokenizer_from_gguf(&g)?;
    let chat_template = ChatTemplate::from_tokenizer(&tokenizer)?;
    let transformer = build(config, &tensors)?;
    Ok(LoadedModel {
        transformer,
        tokenizer,
        chat_template,
        source: path.display().to_string(),
    })
}

/// Picks the architecture's loader.
pub fn build(config: ModelConfig, tensors: &TensorSet) -> Result<Transformer> {
    match config.arch {
        Arch::Llama => crate::llama::load(config, tensors),
        Arch::Qwen2 => crate::qwen2::load(config, tensors),
    }
}

/// Reads the `tokenizer.ggml.*` keys into a [`Tokenizer`].
pub fn tokenizer_from_gguf(g: &GgufFile) -> Result<Tokenizer> {
    let opt_u32 = |k: &str| g.get(k).map(|_| g.get_u32(k)).transpose();
    let opt_bool = |k: &str, default: bool| g.get(k).map_or(Ok(default), |_| g.get_bool(k));
    let data = GgufTokenizerData {
        model: g.get_str("tokenizer.ggml.model")?.to_string(),
        pre: g
            .get("tokenizer.ggml.pre")
            .map(|_| g.get_str("tokenizer.ggml.pre").map(str::to_string))
            .transpose()?,
        tokens: g
            .get_str_array("tokenizer.ggml.tokens")?
            .into_iter()
            .map(str::to_string)
            .collect(),
        token_types: match g.get("tokenizer.ggml.token_type") {
            Some(_) => g.get_i32_array("tokenizer.ggml.token_type")?,
            None => Vec::new(),
        },
        merges: match g.get("tokenizer.ggml.merges") {
            Some(_) => g
                .get_str_array("tokenizer.ggml.merges")?
                .into_iter()
                .map(str::to_string)
                .collect(),
            None => Vec::new(),
        },
        bos_id: opt_u32("tokenizer.ggml.bos_token_id")?,
        eos_id: opt_u32("tokenizer.ggml.eos_token_id")?,
        add_bos: opt_bool("tokenizer.ggml.add_bos_token", false)?,
        add_eos: opt_bool("tokenizer.ggml.add_eos_token", false)?,
        chat_template: g
            .get("tokenizer.chat_template")
            .map(|_| g.get_str("tokenizer.chat_template").map(str::to_string))
            .transpose()?,
    };
    Tokenizer::from_gguf_data(data)
}

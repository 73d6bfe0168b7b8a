//! [`ModelConfig::from_gguf`]: the typed configuration from GGUF metadata
//! (`{arch}.block_count`, `{arch}.attention.head_count`, ...).

use crate::config::{Arch, ModelConfig, RopeStyle};
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;

/// llama.cpp's default when `{arch}.rope.freq_base` is absent.
const DEFAULT_ROPE_THETA: f32 = 10_000.0;

impl ModelConfig {
    /// Reads the hyperparameters of a `llama` or `qwen2` GGUF file and validates them.
    pub fn from_gguf(g: &GgufFile) -> Result<ModelConfig> {
        let arch = g.architecture()?;
        let a = arch.name();
        let key = |suffix: &str| format!("{a}.{suffix}");

        let n_layers = g.get_usize(&key("block_count"))?;
        let d_model = g.get_usize(&key("embedding_length"))?;
        let n_heads = g.get_usize(&key("attention.head_count"))?;
        let n_kv_heads = match g.get(&key("attention.head_count_kv")) {
            Some(_) => g.get_usize(&key("attention.head_count_kv"))?,
            None => n_heads,
        };
        if n_heads == 0 || d_model % n_heads != 0 {
            return Err(ModelError::Config(format!(
                "{a}.embedding_length ({d_model}) is not a multiple of {a}.attention.head_count ({n_heads})"
            )));
        }
        let head_dim = d_model / n_heads;
        // The forward pass assumes head_dim = d_model / n_heads. Models that decouple
        // them say so with key/value_length; refuse those rather than compute garbage.
        for k in ["attention.key_length", "attention.value_length"] {
            if g.get(&key(k)).is_some() && g.get_usize(&key(k))? != head_dim {
                return Err(ModelError::Config(format!(
                    "{a}.{k} = {} differs from embedding_length / head_count = {head_dim}, which is not supported",
                    g.get_usize(&key(k))?
                )));
            }
        }
        // Partial rotary embeddings are not implemented: RoPE must cover the whole head.
        if g.get(&key("rope.dimension_count")).is_some() {
            let rope_dims = g.get_usize(&key("rope.dimension_count"))?;
            if rope_dims != head_dim {
                return Err(ModelError::Config(format!(
                    "{a}.rope.dimension_count = {rope_dims} but head_dim = {head_dim}; partial RoPE is not supported"
                )));
            }
        }

        let d_ff = g.get_usize(&key("feed_forward_length"))?;
        let context_length = g.get_usize(&key("context_length"))?;
        let rms_eps = g.get_f32(&key("attention.layer_norm_rms_epsilon"))?;
        let rope_theta = match g.get(&key("rope.freq_base")) {
            Some(_) => g.get_f32(&key("rope.freq_base"))?,
            None => DEFAULT_ROPE_THETA,
        };
        let vocab_size = match g.get(&key("vocab_size")) {
            Some(_) => g.get_usize(&key("vocab_size"))?,
            None => match g.get("tokenizer.ggml.tokens") {
                Some(_) => g.get_array("tokenizer.ggml.tokens")?.len(),
                None => {
                    return Err(ModelError::MissingKey {
                        key: format!("{a}.vocab_size (or tokenizer.ggml.tokens)"),
                    })
                }
            },
        };
        let rope_style = match arch {
            // convert_hf_to_gguf.py permutes llama's Q/K rows into interleaved pairs.
            Arch::Llama => RopeStyle::Interleaved,
            Arch::Qwen2 => RopeStyle::Neox,
        };
        let name = match g.get("general.name") {
            Some(_) => g.get_str("general.name")?.to_string(),
            None => String::new(),
        };

        let cfg = ModelConfig {
            arch,
            name,
            n_layers,
            d_model,
            n_heads,
            n_kv_heads,
            head_dim,
            d_ff,
            vocab_size,
            context_length,
            rms_eps,
            rope_theta,
            rope_style,
        };
        cfg.validate()?;
        Ok(cfg)
    }
}

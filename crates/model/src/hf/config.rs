//! `config.json` ⇄ [`ModelConfig`].
//!
//! Defaults for absent fields are the ones `transformers` uses for `LlamaConfig` /
//! `Qwen2Config`, so a directory loads here exactly as it would there. Fields that would
//! change the computation in ways pagellm does not implement (RoPE scaling, biases on
//! llama, a non-SiLU activation) are refused instead of silently ignored.

use std::path::Path;

use serde::Deserialize;
use serde_json::{json, Value};

use crate::config::{Arch, ModelConfig, RopeStyle};
use crate::error::{ModelError, Result};

use super::HfDtype;

/// The `config.json` fields pagellm reads. Everything is optional at the serde level so
/// that a missing field gets a message naming it rather than a generic serde error.
#[derive(Debug, Default, Deserialize)]
struct RawConfig {
    architectures: Option<Vec<String>>,
    model_type: Option<String>,
    #[serde(rename = "_name_or_path")]
    name_or_path: Option<String>,
    hidden_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    num_attention_heads: Option<usize>,
    num_key_value_heads: Option<usize>,
    intermediate_size: Option<usize>,
    vocab_size: Option<usize>,
    max_position_embeddings: Option<usize>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    head_dim: Option<usize>,
    tie_word_embeddings: Option<bool>,
    hidden_act: Option<String>,
    attention_bias: Option<bool>,
    mlp_bias: Option<bool>,
    rope_scaling: Option<Value>,
    quantization_config: Option<Value>,
}

/// A parsed `config.json`.
#[derive(Debug, Clone)]
pub(super) struct HfConfig {
    pub config: ModelConfig,
    /// The LM head is the embedding matrix (`lm_head.weight`, if present, is ignored).
    pub tie_word_embeddings: bool,
    /// How the linear layers are quantized, if they are.
    pub quant: Option<super::quant::QuantConfig>,
}

const ARCHITECTURES: [(&str, Arch); 2] = [
    ("LlamaForCausalLM", Arch::Llama),
    ("Qwen2ForCausalLM", Arch::Qwen2),
];

/// Reads `dir/config.json`.
pub(super) fn read(dir: &Path) -> Result<HfConfig> {
    let path = super::required_file(dir, "config.json")?;
    let raw: RawConfig = super::read_json(&path)?;
    from_raw(raw).map_err(|e| match e {
        ModelError::Config(m) => ModelError::Config(format!("{}: {m}", path.display())),
        other => other,
    })
}

fn from_raw(raw: RawConfig) -> Result<HfConfig> {
    let arch = arch_of(&raw)?;
    let need = |v: Option<usize>, key: &str| {
        v.ok_or_else(|| ModelError::Config(format!("required field `{key}` is missing")))
    };
    let d_model = need(raw.hidden_size, "hidden_size")?;
    let n_layers = need(raw.num_hidden_layers, "num_hidden_layers")?;
    let n_heads = need(raw.num_attention_heads, "num_attention_heads")?;
    let d_ff = need(raw.intermediate_size, "intermediate_size")?;
    let vocab_size = need(raw.vocab_size, "vocab_size")?;
    if n_heads == 0 {
        return Err(ModelError::Config("num_attention_heads is 0".into()));
    }

    if let Some(act) = raw.hidden_act.as_deref() {
        if act != "silu" {
            return Err(ModelError::Config(format!(
                "hidden_act `{act}` is not supported (only silu)"
            )));
        }
    }
    // qwen2 always has Q/K/V biases and transformers ignores `attention_bias` for it; a
    // llama with biases would need them loaded, which the llama loader does not do.
    if arch == Arch::Llama && raw.attention_bias == Some(true) {
        return Err(ModelError::Config(
            "attention_bias = true is not supported for llama".into(),
        ));
    }
    if raw.mlp_bias == Some(true) {
        return Err(ModelError::Config(
            "mlp_bias = true is not supported".into(),
        ));
    }
    if let Some(scaling) = raw.rope_scaling.as_ref().filter(|v| !v.is_null()) {
        let kind = scaling
            .get("rope_type")
            .or_else(|| scaling.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("?");
        if kind != "default" {
            return Err(ModelError::Config(format!(
                "rope_scaling of type `{kind}` is not supported"
            )));
        }
    }

    // transformers' defaults (LlamaConfig / Qwen2Config).
    let (default_ctx, default_eps) = match arch {
        Arch::Llama => (2048, 1e-6),
        Arch::Qwen2 => (32768, 1e-6),
    };
    let config = ModelConfig {
        arch,
        name: raw.name_or_path.unwrap_or_default(),
        n_layers,
        d_model,
        n_heads,
        n_kv_heads: raw.num_key_value_heads.unwrap_or(n_heads),
        head_dim: raw.head_dim.unwrap_or(d_model / n_heads),
        d_ff,
        vocab_size,
        context_length: raw.max_position_embeddings.unwrap_or(default_ctx),
        rms_eps: raw.rms_norm_eps.unwrap_or(default_eps) as f32,
        rope_theta: raw.rope_theta.unwrap_or(10_000.0) as f32,
        // Hugging Face checkpoints keep Q/K rows in rotate_half order.
        rope_style: RopeStyle::Neox,
    };
    config.validate()?;
    let quant = raw
        .quantization_config
        .as_ref()
        .filter(|v| !v.is_null())
        .map(super::quant::parse)
        .transpose()?;
    Ok(HfConfig {
        config,
        tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
        quant,
    })
}

/// `architectures` decides when present; `model_type` is the fallback for configs that
/// omit it.
fn arch_of(raw: &RawConfig) -> Result<Arch> {
    match raw.architectures.as_deref() {
        Some(list) if !list.is_empty() => list
            .iter()
            .find_map(|a| {
                ARCHITECTURES
                    .iter()
                    .find(|(n, _)| n == a)
                    .map(|&(_, arch)| arch)
            })
            .ok_or_else(|| ModelError::UnsupportedArch(list.join(", "))),
        _ => match raw.model_type.as_deref() {
            Some(t) => Arch::parse(t),
            None => Err(ModelError::Config(
                "neither `architectures` nor `model_type` is set".into(),
            )),
        },
    }
}

/// The `config.json` that [`read`] turns back into `config` (apart from `rope_style`,
/// which is always NEOX for Hugging Face weights).
pub(super) fn to_json(
    config: &ModelConfig,
    tie_word_embeddings: bool,
    dtype: HfDtype,
    bos: Option<u32>,
    eos: Option<u32>,
) -> Value {
    let (architecture, model_type) = match config.arch {
        Arch::Llama => ("LlamaForCausalLM", "llama"),
        Arch::Qwen2 => ("Qwen2ForCausalLM", "qwen2"),
    };
    let mut v = json!({
        "_name_or_path": config.name,
        "architectures": [architecture],
        "model_type": model_type,
        "hidden_size": config.d_model,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.n_kv_heads,
        "head_dim": config.head_dim,
        "intermediate_size": config.d_ff,
        "vocab_size": config.vocab_size,
        "max_position_embeddings": config.context_length,
        "rms_norm_eps": short_f64(config.rms_eps),
        "rope_theta": short_f64(config.rope_theta),
        "rope_scaling": null,
        "hidden_act": "silu",
        "tie_word_embeddings": tie_word_embeddings,
        "torch_dtype": match dtype {
            HfDtype::Bf16 => "bfloat16",
            HfDtype::F16 => "float16",
            HfDtype::F32 => "float32",
        },
        "bos_token_id": bos,
        "eos_token_id": eos,
        "use_cache": true,
    });
    let map = v.as_object_mut().expect("object literal");
    match config.arch {
        Arch::Llama => {
            map.insert("attention_bias".into(), json!(false));
            map.insert("mlp_bias".into(), json!(false));
        }
        Arch::Qwen2 => {
            map.insert("use_sliding_window".into(), json!(false));
        }
    }
    v
}

/// `x` as the f64 with the shortest decimal form that reads back as the same f32, so
/// the file says `1e-05` rather than `9.999999747378752e-06`.
fn short_f64(x: f32) -> f64 {
    let short: f64 = x.to_string().parse().unwrap_or(f64::from(x));
    if short as f32 == x {
        short
    } else {
        f64::from(x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ModelConfig {
        ModelConfig {
            arch: Arch::Qwen2,
            name: "demo".into(),
            n_layers: 2,
            d_model: 64,
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 16,
            d_ff: 128,
            vocab_size: 100,
            context_length: 4096,
            rms_eps: 1e-6,
            rope_theta: 1_000_000.0,
            rope_style: RopeStyle::Neox,
        }
    }

    #[test]
    fn json_round_trips() {
        let cfg = sample();
        let v = to_json(&cfg, true, HfDtype::Bf16, Some(1), Some(2));
        assert_eq!(v["rms_norm_eps"], json!(1e-6));
        let back = from_raw(serde_json::from_value(v).unwrap()).unwrap();
        assert_eq!(back.config, cfg);
        assert!(back.tie_word_embeddings);
    }

    #[test]
    fn defaults_and_refusals() {
        let v = json!({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 1,
                       "num_attention_heads": 4, "intermediate_size": 96, "vocab_size": 10});
        let c = from_raw(serde_json::from_value(v.clone()).unwrap())
            .unwrap()
            .config;
        assert_eq!((c.n_kv_heads, c.head_dim, c.rope_theta), (4, 16, 10_000.0));

        let mut scaled = v.clone();
        scaled["rope_scaling"] = json!({"rope_type": "llama3", "factor": 8.0});
        let err = from_raw(serde_json::from_value(scaled).unwrap()).unwrap_err();
        assert!(err.to_string().contains("llama3"), "{err}");

        let mut missing = v;
        missing.as_object_mut().unwrap().remove("vocab_size");
        let err = from_raw(serde_json::from_value(missing).unwrap()).unwrap_err();
        assert!(err.to_string().contains("vocab_size"), "{err}");
    }
}

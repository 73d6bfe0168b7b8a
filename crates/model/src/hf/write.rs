//! Writing a loaded model back out as a Hugging Face directory whose tensors the caller
//! chooses (the quantizers replace the linear layers), with the tokenizer files and a
//! `config.json` that carries the `quantization_config`.

use std::borrow::Cow;
use std::path::Path;

use safetensors::{Dtype, View};
use serde_json::Value;

use crate::config::{Arch, RopeStyle};
use crate::error::{ModelError, Result};
use crate::loader::LoadedModel;
use crate::tensor::Tensor;

use super::convert::{check_out_dir, unpermute_rows, write_json, write_tokenizer, Staging};
use super::HfDtype;

/// One tensor to write, under its Hugging Face name and `[out, in]`-style shape.
pub struct OutTensor {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

impl OutTensor {
    /// A float tensor in `dtype` (BF16 rounded to nearest even, or F32).
    pub fn float(name: String, shape: Vec<usize>, values: &[f32], dtype: HfDtype) -> Self {
        let (dtype, data) = match dtype {
            HfDtype::F32 => (
                Dtype::F32,
                values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            ),
            HfDtype::Bf16 => (
                Dtype::BF16,
                values
                    .iter()
                    .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
                    .collect(),
            ),
            HfDtype::F16 => (
                Dtype::F16,
                values
                    .iter()
                    .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
                    .collect(),
            ),
        };
        Self {
            name,
            dtype,
            shape,
            data,
        }
    }
}

impl View for &OutTensor {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// What a model weight is, for a quantizer deciding what to replace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightKind {
    /// A linear layer of a decoder block (`q/k/v/o_proj`, `gate/up/down_proj`).
    Linear,
    /// Embeddings, the LM head, norms and biases: written as they are.
    Other,
}

/// One weight of a model in Hugging Face terms.
pub struct HfWeight {
    pub name: String,
    pub kind: WeightKind,
    /// Hugging Face shape (`[out, in]` for matrices).
    pub shape: Vec<usize>,
    /// Row-major f32 values, in Hugging Face row order.
    pub values: Vec<f32>,
}

/// Calls `f` with every weight of `model`, one at a time (at most one dequantized
/// matrix in memory), in layer order. GGUF llama Q/K rows are un-permuted back to the
/// Hugging Face order.
pub fn for_each_weight(
    model: &LoadedModel,
    mut f: impl FnMut(HfWeight) -> Result<()>,
) -> Result<()> {
    let t = &model.transformer;
    let c = &t.config;
    let permuted = c.arch == Arch::Llama && c.rope_style == RopeStyle::Interleaved;
    let mat = |name: String, kind, x: &Tensor, heads: Option<usize>| {
        let mut values = x.to_f32();
        if let (true, Some(h)) = (permuted, heads) {
            values = unpermute_rows(&values, h, x.cols());
        }
        HfWeight {
            name,
            kind,
            shape: vec![x.rows(), x.cols()],
            values,
        }
    };
    let vec = |name: String, v: &[f32], heads: Option<usize>| {
        let values = match (permuted, heads) {
            (true, Some(h)) => unpermute_rows(v, h, 1),
            _ => v.to_vec(),
        };
        HfWeight {
            name,
            kind: WeightKind::Other,
            shape: vec![v.len()],
            values,
        }
    };
    f(mat(
        "model.embed_tokens.weight".into(),
        WeightKind::Other,
        &t.token_embd,
        None,
    ))?;
    for (i, l) in t.layers.iter().enumerate() {
        let n = |s: &str| format!("model.layers.{i}.{s}");
        f(vec(n("input_layernorm.weight"), &l.attn_norm, None))?;
        f(mat(
            n("self_attn.q_proj.weight"),
            WeightKind::Linear,
            &l.attn_q,
            Some(c.n_heads),
        ))?;
        f(mat(
            n("self_attn.k_proj.weight"),
            WeightKind::Linear,
            &l.attn_k,
            Some(c.n_kv_heads),
        ))?;
        f(mat(
            n("self_attn.v_proj.weight"),
            WeightKind::Linear,
            &l.attn_v,
            None,
        ))?;
        for (b, name, heads) in [
            (&l.attn_q_bias, "self_attn.q_proj.bias", Some(c.n_heads)),
            (&l.attn_k_bias, "self_attn.k_proj.bias", Some(c.n_kv_heads)),
            (&l.attn_v_bias, "self_attn.v_proj.bias", None),
        ] {
            if let Some(b) = b {
                f(vec(n(name), b, heads))?;
            }
        }
        f(mat(
            n("self_attn.o_proj.weight"),
            WeightKind::Linear,
            &l.attn_output,
            None,
        ))?;
        f(vec(n("post_attention_layernorm.weight"), &l.ffn_norm, None))?;
        f(mat(
            n("mlp.gate_proj.weight"),
            WeightKind::Linear,
            &l.ffn_gate,
            None,
        ))?;
        f(mat(
            n("mlp.up_proj.weight"),
            WeightKind::Linear,
            &l.ffn_up,
            None,
        ))?;
        f(mat(
            n("mlp.down_proj.weight"),
            WeightKind::Linear,
            &l.ffn_down,
            None,
        ))?;
    }
    f(vec("model.norm.weight".into(), &t.output_norm, None))?;
    if !t.tied_embeddings {
        f(mat(
            "lm_head.weight".into(),
            WeightKind::Other,
            &t.output,
            None,
        ))?;
    }
    Ok(())
}

/// Writes `tensors` as `out_dir/model.safetensors` with `model`'s config (plus
/// `quantization_config`) and tokenizer files. The directory appears only when complete;
/// an existing non-empty one is refused.
pub fn write_checkpoint(
    out_dir: &Path,
    model: &LoadedModel,
    tensors: &[OutTensor],
    dtype: HfDtype,
    quantization_config: Option<Value>,
) -> Result<()> {
    check_out_dir(out_dir)?;
    let t = &model.transformer;
    let staging = Staging::create(out_dir)?;
    let path = staging.path.join("model.safetensors");
    let metadata = Some(
        [("format".to_string(), "pt".to_string())]
            .into_iter()
            .collect(),
    );
    safetensors::serialize_to_file(
        tensors.iter().map(|t| (t.name.clone(), t)),
        &metadata,
        &path,
    )
    .map_err(|e| ModelError::Other(format!("{}: writing safetensors: {e}", path.display())))?;
    let mut config = super::config::to_json(
        &t.config,
        t.tied_embeddings,
        dtype,
        model.tokenizer.bos_id(),
        model.tokenizer.eos_id(),
    );
    if let Some(q) = quantization_config {
        config["quantization_config"] = q;
    }
    write_json(&staging.path.join("config.json"), &config)?;
    write_tokenizer(&staging.path, &model.tokenizer, &t.config)?;
    staging.finish(out_dir)
}

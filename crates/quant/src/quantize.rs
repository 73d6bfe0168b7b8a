//! `pagellm quantize`: every linear layer of a model through one method, written as a
//! Hugging Face directory in the method's standard format; embeddings, norms, biases
//! and the (tied) LM head are written as they are, in BF16.

use std::path::Path;

use pagellm_kernels::quant::ActQuant;
use pagellm_model::hf::write::{for_each_weight, write_checkpoint, OutTensor, WeightKind};
use pagellm_model::hf::HfDtype;
use pagellm_model::loader::LoadedModel;
use serde::Serialize;

use crate::error::{QuantError, Result};
use crate::rtn::{self, QWeight};

/// A quantization method (`--method`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// Weight-only INT8 per output channel (W8A16).
    Int8,
    /// INT8 weights per channel and INT8 activations per token.
    W8a8,
    /// INT4 round-to-nearest per group.
    Rtn,
    /// FP8 E4M3 weights, per channel (or per tensor).
    Fp8,
}

impl Method {
    pub fn name(self) -> &'static str {
        match self {
            Method::Int8 => "int8",
            Method::W8a8 => "w8a8",
            Method::Rtn => "rtn",
            Method::Fp8 => "fp8",
        }
    }
}

/// Options of `pagellm quantize`.
#[derive(Debug, Clone)]
pub struct QuantizeOptions {
    pub method: Method,
    /// Columns per INT4 scale.
    pub group_size: usize,
    /// INT4 with zero points (asymmetric) instead of symmetric.
    pub zero_point: bool,
    /// FP8 with one scale per tensor instead of per channel.
    pub per_tensor: bool,
}

/// What was written.
#[derive(Debug, Clone, Serialize)]
pub struct QuantizeSummary {
    pub method: String,
    pub linear_layers: usize,
    pub bytes_on_disk: u64,
    pub seconds: f64,
}

/// Checks the options against the model before any work: group sizes must divide every
/// linear layer's width.
pub fn check(model: &LoadedModel, o: &QuantizeOptions) -> Result<()> {
    if o.method == Method::Rtn {
        let g = o.group_size;
        if g == 0 || !g.is_multiple_of(32) {
            return Err(QuantError::Invalid(format!(
                "--group-size {g} is not a positive multiple of 32"
            )));
        }
        let c = &model.transformer.config;
        for (what, width) in [
            ("hidden size", c.d_model),
            ("intermediate size", c.d_ff),
            ("attention width", c.q_dim()),
        ] {
            if !width.is_multiple_of(g) {
                let fits: Vec<String> = [128, 64, 32]
                    .iter()
                    .filter(|&&x| {
                        width.is_multiple_of(x)
                            && c.d_model.is_multiple_of(x)
                            && c.d_ff.is_multiple_of(x)
                    })
                    .map(|x| x.to_string())
                    .collect();
                return Err(QuantError::Invalid(format!(
                    "--group-size {g} does not divide the model's {what} of {width}; try {}",
                    fits.first()
                        .map_or("a smaller group".to_string(), |f| format!(
                            "--group-size {f}"
                        ))
                )));
            }
        }
    }
    Ok(())
}

/// Quantizes one weight matrix with the method.
pub fn quantize_matrix(
    w: &[f32],
    rows: usize,
    cols: usize,
    o: &QuantizeOptions,
) -> Result<QWeight> {
    if !cols.is_multiple_of(32) {
        return Err(QuantError::Invalid(format!(
            "a linear layer of {cols} columns cannot be quantized: widths must be multiples of 32"
        )));
    }
    Ok(match o.method {
        Method::Int8 => rtn::int8_channel(w, rows, cols, ActQuant::Block32),
        Method::W8a8 => rtn::int8_channel(w, rows, cols, ActQuant::PerToken),
        Method::Rtn => rtn::int4_rtn(w, rows, cols, o.group_size, o.zero_point),
        Method::Fp8 => rtn::fp8(w, rows, cols, o.per_tensor),
    })
}

/// Quantizes `model` into `out_dir`; `progress(done, total)` after each layer.
pub fn quantize_model(
    model: &LoadedModel,
    o: &QuantizeOptions,
    out_dir: &Path,
    mut progress: impl FnMut(usize, usize),
) -> Result<QuantizeSummary> {
    check(model, o)?;
    let t0 = std::time::Instant::now();
    let n_layers = model.transformer.layers.len();
    let mut tensors: Vec<OutTensor> = Vec::new();
    let mut sample: Option<QWeight> = None;
    let mut linear = 0;
    let mut err = None;
    let mut last_layer = usize::MAX;
    for_each_weight(model, |w| {
        match w.kind {
            WeightKind::Linear => {
                let [rows, cols] = w.shape[..] else {
                    unreachable!("matrices are 2-D")
                };
                let q = quantize_matrix(&w.values, rows, cols, o).map_err(|e| {
                    err = Some(e);
                    pagellm_model::ModelError::Other(String::new())
                })?;
                let prefix = w
                    .name
                    .strip_suffix(".weight")
                    .expect("linear weights end in .weight");
                tensors.extend(crate::ct::module_tensors(prefix, &q));
                linear += 1;
                sample.get_or_insert(q);
                let layer = layer_of(&w.name);
                if layer != last_layer {
                    if last_layer != usize::MAX {
                        progress(last_layer + 1, n_layers);
                    }
                    last_layer = layer;
                }
            }
            WeightKind::Other => {
                tensors.push(OutTensor::float(w.name, w.shape, &w.values, HfDtype::Bf16))
            }
        }
        Ok(())
    })
    .map_err(|e| err.take().unwrap_or(QuantError::Model(e)))?;
    progress(n_layers, n_layers);
    let sample =
        sample.ok_or_else(|| QuantError::Invalid("the model has no linear layers".into()))?;
    let config = crate::ct::quantization_config(&sample);
    write_checkpoint(out_dir, model, &tensors, HfDtype::Bf16, Some(config))?;
    let bytes_on_disk = std::fs::metadata(out_dir.join("model.safetensors"))
        .map(|m| m.len())
        .unwrap_or(0);
    Ok(QuantizeSummary {
        method: o.method.name().into(),
        linear_layers: linear,
        bytes_on_disk,
        seconds: t0.elapsed().as_secs_f64(),
    })
}

/// `model.layers.{i}.…` → i.
fn layer_of(name: &str) -> usize {
    name.strip_prefix("model.layers.")
        .and_then(|r| r.split('.').next())
        .and_then(|i| i.parse().ok())
        .unwrap_or(0)
}

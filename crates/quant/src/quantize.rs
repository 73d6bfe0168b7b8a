//! `pagellm quantize`: every linear layer of a model through one method, written as a
//! Hugging Face directory in the method's standard format; embeddings, norms, biases
//! and the (tied) LM head are written as they are, in BF16.

use std::path::Path;

use pagellm_kernels::quant::ActQuant;
use pagellm_model::hf::write::{
    for_each_weight, write_checkpoint, HfWeight, OutTensor, WeightKind,
};
use pagellm_model::hf::HfDtype;
use pagellm_model::loader::LoadedModel;
use serde::Serialize;

use std::collections::HashMap;

use pagellm_kernels::pool::ThreadPool;

use crate::attn::AttnGeom;
use crate::awq::AwqOptions;
use crate::calib::{CalibOptions, Calibration, LayerInputs};
use crate::error::{QuantError, Result};
use crate::gptq::GptqOptions;
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
    /// INT4 per group with zero points, activation-aware scales and clipping.
    Awq,
    /// INT4 per group from the Hessian of the calibration inputs.
    Gptq,
}

impl Method {
    pub fn name(self) -> &'static str {
        match self {
            Method::Int8 => "int8",
            Method::W8a8 => "w8a8",
            Method::Rtn => "rtn",
            Method::Fp8 => "fp8",
            Method::Awq => "awq",
            Method::Gptq => "gptq",
        }
    }

    fn calibrated(self) -> bool {
        matches!(self, Method::Awq | Method::Gptq)
    }

    fn is_int4(self) -> bool {
        matches!(self, Method::Rtn | Method::Awq | Method::Gptq)
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
    /// Calibration text, for the methods that need it.
    pub calib: Option<CalibOptions>,
    /// Tokens the AWQ scale search measures its loss on.
    pub awq_search_tokens: usize,
    /// GPTQ: quantize columns by decreasing Hessian diagonal (`desc_act`).
    pub act_order: bool,
    /// GPTQ: dampening as a fraction of the mean Hessian diagonal.
    pub damp: f32,
    /// W8A8: SmoothQuant migration strength α (`None`: no smoothing).
    pub smooth_alpha: Option<f32>,
    /// Threads for calibration and the searches.
    pub threads: usize,
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
    if let Some(a) = o.smooth_alpha {
        if o.method != Method::W8a8 {
            return Err(QuantError::Invalid(format!(
                "--smooth-alpha applies to --method w8a8, not {}",
                o.method.name()
            )));
        }
        if !(0.0..=1.0).contains(&a) {
            return Err(QuantError::Invalid(format!(
                "--smooth-alpha {a} is not in [0, 1]"
            )));
        }
        if o.calib.is_none() {
            return Err(QuantError::Invalid(
                "--smooth-alpha needs calibration text: give --calib FILE".into(),
            ));
        }
    }
    if o.method.calibrated() && o.calib.is_none() {
        return Err(QuantError::Invalid(format!(
            "--method {} needs calibration text: give --calib FILE",
            o.method.name()
        )));
    }
    if o.method == Method::Awq && o.awq_search_tokens == 0 {
        return Err(QuantError::Invalid(
            "--awq-search-tokens 0: the scale search needs at least one token".into(),
        ));
    }
    if o.act_order && o.method != Method::Gptq {
        return Err(QuantError::Invalid(format!(
            "--act-order applies to --method gptq, not {}",
            o.method.name()
        )));
    }
    if o.method == Method::Gptq && !(o.damp > 0.0 && o.damp < 1.0) {
        return Err(QuantError::Invalid(format!(
            "--damp {} is not in (0, 1)",
            o.damp
        )));
    }
    if matches!(o.method, Method::Awq | Method::Gptq) {
        // AutoAWQ's and GPTQ's layouts pack eight outputs to a word.
        let c = &model.transformer.config;
        for (what, width) in [
            ("hidden size", c.d_model),
            ("intermediate size", c.d_ff),
            ("attention width", c.q_dim()),
            ("key/value width", c.kv_dim()),
        ] {
            if !width.is_multiple_of(8) {
                return Err(QuantError::Invalid(format!(
                    "--method {}: the model's {what} of {width} is not a multiple of 8, \
                     which the checkpoint layout needs",
                    o.method.name()
                )));
            }
        }
    }
    if o.method.is_int4() {
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
        Method::Awq | Method::Gptq => unreachable!("calibrated methods quantize whole layers"),
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
    let pool = ThreadPool::new(o.threads.max(1));
    let mut calib = match &o.calib {
        Some(c) if o.method.calibrated() || o.smooth_alpha.is_some() => {
            let windows = crate::calib::windows(model, c)?;
            Some(Calibration::new(model, &pool, &windows)?)
        }
        _ => None,
    };
    // AutoAWQ and GPTQ checkpoints are float16 models.
    let float = match o.method {
        Method::Awq | Method::Gptq => HfDtype::F16,
        _ => HfDtype::Bf16,
    };
    // A decoder layer's weights, by Hugging Face suffix, until its last one arrives.
    let mut layer: HashMap<String, HfWeight> = HashMap::new();
    let mut layer_order: Vec<String> = Vec::new();
    for_each_weight(model, |w| {
        let Some((li, suffix)) = split_layer(&w.name) else {
            tensors.push(OutTensor::float(w.name, w.shape, &w.values, float));
            return Ok(());
        };
        let last = suffix == "mlp.down_proj.weight";
        layer_order.push(suffix.to_string());
        layer.insert(suffix.to_string(), w);
        if !last {
            return Ok(());
        }
        let quantized = quantize_layer(&pool, &mut layer, calib.as_mut(), o).map_err(|e| {
            err = Some(e);
            pagellm_model::ModelError::Other(String::new())
        })?;
        let mut quantized: HashMap<String, QWeight> = quantized.into_iter().collect();
        for suffix in layer_order.drain(..) {
            let w = layer.remove(&suffix).expect("buffered");
            match quantized.remove(&suffix) {
                Some(q) => {
                    let prefix = w
                        .name
                        .strip_suffix(".weight")
                        .expect("linear weights end in .weight");
                    tensors.extend(match o.method {
                        Method::Awq => crate::packed::awq_tensors(prefix, &q),
                        Method::Gptq => crate::packed::gptq_tensors(prefix, &q),
                        _ => crate::ct::module_tensors(prefix, &q),
                    });
                    linear += 1;
                    sample.get_or_insert(q);
                }
                None => tensors.push(OutTensor::float(w.name, w.shape, &w.values, float)),
            }
        }
        progress(li + 1, n_layers);
        Ok(())
    })
    .map_err(|e| err.take().unwrap_or(QuantError::Model(e)))?;
    progress(n_layers, n_layers);
    let sample =
        sample.ok_or_else(|| QuantError::Invalid("the model has no linear layers".into()))?;
    let config = match o.method {
        Method::Awq => crate::packed::awq_config(o.group_size),
        Method::Gptq => {
            crate::packed::gptq_config(o.group_size, !o.zero_point, o.act_order, o.damp)
        }
        _ => crate::ct::quantization_config(&sample),
    };
    write_checkpoint(out_dir, model, &tensors, float, Some(config))?;
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

/// GPTQ of one decoder layer: one Hessian per input (Q, K and V share theirs, as do gate
/// and up), each linear layer solved against its input's.
fn gptq_layer(
    layer: &HashMap<String, HfWeight>,
    x: &LayerInputs,
    g: &GptqOptions,
    threads: usize,
) -> Result<Vec<(String, QWeight)>> {
    let n = x.tokens;
    let mut out = Vec::new();
    for (input, names) in [
        (
            &x.qkv,
            &[
                "self_attn.q_proj.weight",
                "self_attn.k_proj.weight",
                "self_attn.v_proj.weight",
            ][..],
        ),
        (&x.attn_output, &["self_attn.o_proj.weight"][..]),
        (
            &x.gate_up,
            &["mlp.gate_proj.weight", "mlp.up_proj.weight"][..],
        ),
        (&x.down, &["mlp.down_proj.weight"][..]),
    ] {
        let cols = layer[names[0]].shape[1];
        let h = crate::gptq::hessian(input, n, cols, threads);
        for name in names {
            let w = &layer[*name];
            let q = crate::gptq::quantize(&w.values, w.shape[0], cols, &h, g, threads, &w.name)?;
            out.push((name.to_string(), q));
        }
    }
    Ok(out)
}

/// `model.layers.{i}.{suffix}` → (i, suffix).
fn split_layer(name: &str) -> Option<(usize, &str)> {
    let rest = name.strip_prefix("model.layers.")?;
    let (i, suffix) = rest.split_once('.')?;
    Some((i.parse().ok()?, suffix))
}

/// Quantizes one decoder layer's linear layers (by suffix); AWQ also rescales the
/// layer's norms in `layer`.
fn quantize_layer(
    pool: &ThreadPool,
    layer: &mut HashMap<String, HfWeight>,
    calib: Option<&mut Calibration<'_>>,
    o: &QuantizeOptions,
) -> Result<Vec<(String, QWeight)>> {
    if o.method == Method::Awq {
        let calib = calib.expect("AWQ has calibration");
        let c = &calib.model().transformer.config;
        let a = AwqOptions {
            group_size: o.group_size,
            search_tokens: o.awq_search_tokens,
            attn_tokens: 2 * o.awq_search_tokens,
            clip_tokens: 512,
            attention: Some(AttnGeom {
                n_heads: c.n_heads,
                n_kv_heads: c.n_kv_heads,
                head_dim: c.head_dim,
                rope_theta: c.rope_theta,
            }),
        };
        let inputs = calib.next_layer();
        return crate::awq::quantize_layer(pool, layer, inputs, &a);
    }
    if o.method == Method::Gptq {
        let inputs = calib.expect("GPTQ has calibration").next_layer();
        let g = GptqOptions {
            group_size: o.group_size,
            zero_point: o.zero_point,
            act_order: o.act_order,
            damp: o.damp,
        };
        return gptq_layer(layer, &inputs, &g, o.threads);
    }
    if let (Some(alpha), Some(c)) = (o.smooth_alpha, calib) {
        crate::smooth::smooth_layer(layer, &c.next_layer(), alpha);
    }
    let mut out = Vec::new();
    for (suffix, w) in layer.iter() {
        if w.kind == WeightKind::Linear {
            let [rows, cols] = w.shape[..] else {
                unreachable!("matrices are 2-D")
            };
            out.push((suffix.clone(), quantize_matrix(&w.values, rows, cols, o)?));
        }
    }
    Ok(out)
}

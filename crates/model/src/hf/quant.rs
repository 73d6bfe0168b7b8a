//! Quantized Hugging Face checkpoints: `quantization_config` in `config.json`, and the
//! linear layers' quantized tensors assembled into checkpoint-format weights
//! (`pagellm_kernels::quant::wq`) that the kernels run without dequantizing.
//!
//! compressed-tensors (llm-compressor's format), per linear module `p`:
//!
//! | format | tensors | becomes |
//! |---|---|---|
//! | `pack-quantized`, 4 bits | `p.weight_packed` I32 `[out, in/8]` (value `q + 8`, element `8j + k` at bits `4k` of word `j`), `p.weight_scale` `[out, in/group]`, `p.weight_shape`, asymmetric: `p.weight_zero_point` I32 `[out/8, groups]` (packed along the output dimension, `zp + 8`) | `U4`, mapped in place |
//! | `pack-quantized`, 8 bits | `p.weight_packed` I32 `[out, in/4]` (`q + 128`, byte order) | `I8`, repacked |
//! | `int-quantized` / `naive-quantized`, int 8 | `p.weight` I8 `[out, in]`, `p.weight_scale` `[out, 1]` or `[1]` | `I8`, mapped in place |
//! | `float-quantized` / `naive-quantized`, float 8 | `p.weight` F8_E4M3, `p.weight_scale` | `F8E4M3`, mapped in place |
//!
//! Dynamic per-token INT8 input activations (`strategy: token`) make the weight W8A8;
//! FP8 input activations are kept in f32 (more precise than the checkpoint asks).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use pagellm_kernels::quant::{ActQuant, GgmlType, QuantParams};
use safetensors::Dtype;
use serde_json::Value;

use crate::error::{ModelError, Result};
use crate::tensor::{Storage, Tensor};

use super::names::hf_to_gguf;
use super::weights::RawTensor;

/// How a checkpoint's linear layers are quantized.
#[derive(Debug, Clone, PartialEq)]
pub enum QuantConfig {
    CompressedTensors(CtScheme),
    /// AutoAWQ (GEMM) or GPTQ, INT4 packed into int32 words (`hf::packed`).
    Packed(super::packed::PackedScheme),
}

/// The weight scheme of a compressed-tensors checkpoint (one config group).
#[derive(Debug, Clone, PartialEq)]
pub struct CtScheme {
    pub format: String,
    pub bits: u32,
    pub float: bool,
    pub symmetric: bool,
    /// `None` for one scale per channel or per tensor.
    pub group_size: Option<usize>,
    /// Input activations quantized to INT8 per token at run time (W8A8).
    pub act_per_token_int8: bool,
}

fn cfg_err(m: impl Into<String>) -> ModelError {
    ModelError::Config(format!("quantization_config: {}", m.into()))
}

/// Parses `config.json`'s `quantization_config`.
pub fn parse(v: &Value) -> Result<QuantConfig> {
    let method = v
        .get("quant_method")
        .and_then(Value::as_str)
        .ok_or_else(|| cfg_err("`quant_method` is missing"))?;
    match method {
        "compressed-tensors" => parse_ct(v).map(QuantConfig::CompressedTensors),
        "awq" => super::packed::parse_awq(v).map(QuantConfig::Packed),
        "gptq" => super::packed::parse_gptq(v).map(QuantConfig::Packed),
        other => Err(cfg_err(format!(
            "quant_method `{other}` is not supported (supported: compressed-tensors, awq, gptq)"
        ))),
    }
}

fn parse_ct(v: &Value) -> Result<CtScheme> {
    let groups = v
        .get("config_groups")
        .and_then(Value::as_object)
        .ok_or_else(|| cfg_err("`config_groups` is missing"))?;
    if groups.len() != 1 {
        return Err(cfg_err(format!(
            "{} config groups; pagellm reads checkpoints with one scheme for every Linear",
            groups.len()
        )));
    }
    let (gname, g) = groups.iter().next().expect("one group");
    let targets: Vec<&str> = g
        .get("targets")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if !targets.contains(&"Linear") {
        return Err(cfg_err(format!(
            "config group `{gname}` targets {targets:?}; only [\"Linear\"] is supported"
        )));
    }
    let w = g
        .get("weights")
        .filter(|w| !w.is_null())
        .ok_or_else(|| cfg_err(format!("config group `{gname}` has no `weights` scheme")))?;
    let format = g
        .get("format")
        .and_then(Value::as_str)
        .or_else(|| v.get("format").and_then(Value::as_str))
        .ok_or_else(|| cfg_err("`format` is missing"))?
        .to_string();
    let bits = w.get("num_bits").and_then(Value::as_u64).unwrap_or(0) as u32;
    let float = match w.get("type").and_then(Value::as_str).unwrap_or("int") {
        "int" => false,
        "float" => true,
        other => return Err(cfg_err(format!("weights.type `{other}` is not supported"))),
    };
    let symmetric = w.get("symmetric").and_then(Value::as_bool).unwrap_or(true);
    let strategy = w
        .get("strategy")
        .and_then(Value::as_str)
        .unwrap_or("tensor");
    let group_size = match strategy {
        "group" => Some(
            w.get("group_size")
                .and_then(Value::as_u64)
                .filter(|&g| g > 0)
                .ok_or_else(|| cfg_err("strategy `group` without a positive `group_size`"))?
                as usize,
        ),
        "channel" | "tensor" => None,
        other => {
            return Err(cfg_err(format!(
                "weights.strategy `{other}` is not supported (channel, group, tensor)"
            )))
        }
    };
    if w.get("actorder").is_some_and(|a| !a.is_null()) {
        return Err(cfg_err(
            "weights.actorder is set: act-order compressed-tensors checkpoints are not supported",
        ));
    }
    match (float, bits) {
        (false, 4) | (false, 8) | (true, 8) => {}
        _ => {
            return Err(cfg_err(format!(
                "{bits}-bit {} weights are not supported (4- and 8-bit int, 8-bit float)",
                if float { "float" } else { "int" }
            )))
        }
    }
    if !symmetric && bits != 4 {
        return Err(cfg_err("asymmetric weights are supported at 4 bits only"));
    }
    let act = g.get("input_activations").filter(|a| !a.is_null());
    let mut act_per_token_int8 = false;
    if let Some(a) = act {
        let a_float = a.get("type").and_then(Value::as_str) == Some("float");
        let dynamic = a.get("dynamic").and_then(Value::as_bool).unwrap_or(false);
        let a_strategy = a
            .get("strategy")
            .and_then(Value::as_str)
            .unwrap_or("tensor");
        if !a_float {
            if !(dynamic && a_strategy == "token") {
                return Err(cfg_err(
                    "static INT8 input activations (input_scale) are not supported; dynamic \
                     per-token ones are",
                ));
            }
            act_per_token_int8 = true;
        }
    }
    Ok(CtScheme {
        format,
        bits,
        float,
        symmetric,
        group_size,
        act_per_token_int8,
    })
}

/// The tensor name suffixes a quantized linear module may have.
const PARTS: [&str; 6] = [
    "weight",
    "weight_packed",
    "weight_scale",
    "weight_zero_point",
    "weight_shape",
    "weight_g_idx",
];

/// Takes the quantized linear modules out of `raws` and returns them as GGUF-named
/// checkpoint-format tensors. Float `*.weight` tensors of modules the scheme left alone
/// (the `ignore` list) stay in `raws`.
pub(super) fn assemble(
    q: &QuantConfig,
    raws: &mut HashMap<String, RawTensor>,
) -> Result<Vec<Tensor>> {
    let s = match q {
        QuantConfig::CompressedTensors(s) => s,
        QuantConfig::Packed(s) => return super::packed::assemble(s, raws),
    };
    let mut prefixes = BTreeSet::new();
    for (name, t) in raws.iter() {
        let quantized_weight =
            name.ends_with(".weight") && matches!(t.dtype, Dtype::I8 | Dtype::F8_E4M3 | Dtype::I32);
        if quantized_weight
            || name.ends_with(".weight_packed")
            || name.ends_with(".weight_scale")
            || name.ends_with(".weight_zero_point")
        {
            prefixes.insert(name[..name.rfind('.').expect("has a dot")].to_string());
        }
    }
    let mut out = Vec::new();
    for p in prefixes {
        let Some(gguf) = hf_to_gguf(&format!("{p}.weight")) else {
            tracing::debug!("ignoring quantized module `{p}`");
            continue;
        };
        let mut parts: HashMap<&str, RawTensor> = HashMap::new();
        for part in PARTS {
            if let Some(t) = raws.remove(&format!("{p}.{part}")) {
                parts.insert(part, t);
            }
        }
        out.push(ct_module(s, &p, gguf, parts)?);
    }
    Ok(out)
}

fn need<'a>(parts: &'a HashMap<&str, RawTensor>, p: &str, part: &str) -> Result<&'a RawTensor> {
    parts.get(part).ok_or_else(|| ModelError::MissingTensor {
        name: format!("{p}.{part}"),
    })
}

fn bad(t: &RawTensor, m: impl std::fmt::Display) -> ModelError {
    ModelError::Other(format!("{}: tensor `{}`: {m}", t.file.display(), t.hf_name))
}

/// The scales of `rows` rows as f32, `rows × groups` values, from a `[rows, groups]`,
/// `[rows, 1]` or `[1]` (per-tensor, replicated) tensor; returns (scales, groups).
fn scales(t: &RawTensor, rows: usize) -> Result<(Vec<f32>, usize)> {
    let v = t.to_f32()?;
    match t.shape.as_slice() {
        [] | [1] => Ok((vec![v[0]; rows], 1)),
        [r, g] if *r == rows && *g > 0 => Ok((v, *g)),
        other => Err(bad(
            t,
            format!("shape {other:?} does not give scales for {rows} rows"),
        )),
    }
}

fn ct_module(
    s: &CtScheme,
    p: &str,
    gguf: String,
    parts: HashMap<&str, RawTensor>,
) -> Result<Tensor> {
    if let Some(g) = parts.get("weight_g_idx") {
        return Err(bad(g, "act-order group indices are not supported"));
    }
    let act = if s.act_per_token_int8 {
        ActQuant::PerToken
    } else {
        ActQuant::Block32
    };
    if let Some(packed) = parts.get("weight_packed") {
        if packed.dtype != Dtype::I32 {
            return Err(bad(
                packed,
                format!("dtype {:?}, expected I32", packed.dtype),
            ));
        }
        let shape_t = need(&parts, p, "weight_shape")?;
        let dims = shape_t.to_i64()?;
        let [rows, cols] = dims[..] else {
            return Err(bad(shape_t, format!("{dims:?} is not [out, in]")));
        };
        let (rows, cols) = (rows as usize, cols as usize);
        let per_word = 32 / s.bits as usize;
        if packed.shape != [rows, cols.div_ceil(per_word)] || !cols.is_multiple_of(per_word) {
            return Err(bad(
                packed,
                format!(
                    "shape {:?} does not hold [{rows}, {cols}] at {} bits",
                    packed.shape, s.bits
                ),
            ));
        }
        let scale_t = need(&parts, p, "weight_scale")?;
        let (sc, groups) = scales(scale_t, rows)?;
        if !cols.is_multiple_of(groups) {
            return Err(bad(
                scale_t,
                format!("{groups} groups do not divide {cols} columns"),
            ));
        }
        let group = cols / groups;
        if let Some(g) = s.group_size.filter(|&g| g != group && groups > 1) {
            return Err(bad(
                scale_t,
                format!("{groups} groups of {group} columns, but group_size is {g}"),
            ));
        }
        let name = gguf.clone();
        let t = match s.bits {
            4 => {
                let zeros = match (s.symmetric, parts.get("weight_zero_point")) {
                    (true, _) => None,
                    (false, None) => {
                        return Err(ModelError::MissingTensor {
                            name: format!("{p}.weight_zero_point"),
                        })
                    }
                    (false, Some(z)) => Some(unpack_zeros(z, rows, groups)?),
                };
                // The int32 words read as bytes are exactly U4's nibble order.
                Tensor::new(
                    name,
                    GgmlType::U4,
                    vec![cols, rows],
                    packed.storage.clone(),
                    packed.offset,
                )?
                .with_params(QuantParams {
                    group,
                    scales: sc,
                    zeros,
                    act: ActQuant::Block32,
                    perm: None,
                })
            }
            _ => {
                // 8-bit values are stored `q + 128`, byte k of a word being element k.
                let data: Vec<u8> = packed.bytes().iter().map(|b| b ^ 0x80).collect();
                Tensor::new(
                    name,
                    GgmlType::I8,
                    vec![cols, rows],
                    Arc::new(Storage::Owned(data)),
                    0,
                )?
                .with_params(QuantParams::per_row(
                    per_row(scale_t, sc, groups)?,
                    act,
                    cols,
                ))
            }
        };
        return t.map_err(|e| prefix_err(e, p));
    }
    let w = need(&parts, p, "weight")?;
    let ty = match (w.dtype, s.float) {
        (Dtype::I8, false) => GgmlType::I8,
        (Dtype::F8_E4M3, true) => GgmlType::F8E4M3,
        (d, _) => {
            return Err(bad(
                w,
                format!(
                    "dtype {d:?} does not match the {}-bit {} scheme",
                    s.bits,
                    if s.float { "float" } else { "int" }
                ),
            ))
        }
    };
    let [rows, cols] = w.shape[..] else {
        return Err(bad(w, format!("shape {:?} is not [out, in]", w.shape)));
    };
    let scale_t = need(&parts, p, "weight_scale")?;
    let (sc, groups) = scales(scale_t, rows)?;
    let act = if ty == GgmlType::I8 {
        act
    } else {
        ActQuant::Block32
    };
    w.tensor(gguf, ty)?
        .with_params(QuantParams::per_row(
            per_row(scale_t, sc, groups)?,
            act,
            cols,
        ))
        .map_err(|e| prefix_err(e, p))
}

fn prefix_err(e: ModelError, p: &str) -> ModelError {
    match e {
        ModelError::Other(m) => ModelError::Other(format!("module `{p}`: {m}")),
        other => other,
    }
}

fn per_row(t: &RawTensor, sc: Vec<f32>, groups: usize) -> Result<Vec<f32>> {
    if groups != 1 {
        return Err(bad(
            t,
            format!("{groups} scales per row; this format has one per row"),
        ));
    }
    Ok(sc)
}

/// `weight_zero_point` I32 `[ceil(rows/8), groups]`, packed along the rows: the zero of
/// (row r, group g) is nibble `r % 8` of word `(r / 8, g)`, stored `zp + 8`.
fn unpack_zeros(z: &RawTensor, rows: usize, groups: usize) -> Result<Vec<u8>> {
    if z.shape != [rows.div_ceil(8), groups] {
        return Err(bad(
            z,
            format!(
                "shape {:?}, expected [{}, {groups}]",
                z.shape,
                rows.div_ceil(8)
            ),
        ));
    }
    let words = z.to_i64()?;
    let mut out = vec![0u8; rows * groups];
    for r in 0..rows {
        for g in 0..groups {
            out[r * groups + g] =
                ((words[(r / 8) * groups + g] as u32 >> (4 * (r % 8))) & 0xF) as u8;
        }
    }
    Ok(out)
}

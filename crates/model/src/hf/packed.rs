//! AutoAWQ (GEMM) and GPTQ checkpoints: their `quantization_config` and their INT4
//! linear modules, repacked into `U4` rows (`[out, in]`, two codes to a byte) that the
//! kernels run without dequantizing. The layouts are AutoAWQ's `WQLinear_GEMM` and
//! GPTQ's `QuantLinear.pack`, per module `p`:
//!
//! | layout | tensors |
//! |---|---|
//! | AutoAWQ GEMM | `p.qweight` I32 `[in, out/8]`, outputs `8c + ORDER[k]` at bits `4k` of word `(i, c)`, `ORDER = [0, 2, 4, 6, 1, 3, 5, 7]`; `p.qzeros` I32 `[in/group, out/8]`, same packing; `p.scales` `[in/group, out]` |
//! | GPTQ | `p.qweight` I32 `[in/8, out]`, input `8k + j` at bits `4j` of word `(k, o)`; `p.qzeros` I32 `[groups, out/8]`, output `8c + j` at bits `4j`, stored `zero − 1` in the `gptq` (v1) format and `zero` in `gptq_v2`; `p.scales` `[groups, out]`; `p.g_idx` I32 `[in]`, each input's group |
//!
//! A GPTQ `g_idx` that is not `i / group` (act order, `desc_act`) becomes the weight's
//! `perm`: inputs sorted by group (stably), so that groups are contiguous in stored
//! order; Q, K and V (and gate and up) must then share one order, as they do when they
//! were quantized against one Hessian.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use pagellm_kernels::quant::{ActQuant, GgmlType, QuantParams};
use safetensors::Dtype;
use serde_json::Value;

use crate::error::{ModelError, Result};
use crate::tensor::{Storage, Tensor};

use super::names::hf_to_gguf;
use super::weights::RawTensor;

/// Which packed INT4 layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    AwqGemm,
    Gptq,
}

/// An AutoAWQ or GPTQ `quantization_config`.
#[derive(Debug, Clone, PartialEq)]
pub struct PackedScheme {
    pub layout: Layout,
    /// `None` for one group per row (`group_size: -1`).
    pub group_size: Option<usize>,
    /// GPTQ `sym`; AutoAWQ checkpoints always have zero points.
    pub symmetric: bool,
    /// GPTQ `desc_act`.
    pub desc_act: bool,
    /// GPTQ zero points stored as they are (`gptq_v2`) rather than `zero − 1`.
    pub raw_zeros: bool,
}

fn cfg_err(m: impl Into<String>) -> ModelError {
    ModelError::Config(format!("quantization_config: {}", m.into()))
}

fn group_size(v: &Value) -> Result<Option<usize>> {
    match v.get("group_size").and_then(Value::as_i64) {
        Some(-1) => Ok(None),
        Some(g) if g > 0 => Ok(Some(g as usize)),
        other => Err(cfg_err(format!(
            "`group_size` {other:?} is not a positive size or -1"
        ))),
    }
}

fn bits(v: &Value, method: &str) -> Result<()> {
    let key = if method == "awq" && v.get("w_bit").is_some() {
        "w_bit"
    } else {
        "bits"
    };
    match v.get(key).and_then(Value::as_u64) {
        Some(4) => Ok(()),
        other => Err(cfg_err(format!(
            "{method} with `{key}` {other:?}: pagellm reads 4-bit {method} checkpoints"
        ))),
    }
}

/// `quant_method: awq`.
pub fn parse_awq(v: &Value) -> Result<PackedScheme> {
    bits(v, "awq")?;
    let version = v
        .get("version")
        .and_then(Value::as_str)
        .unwrap_or("gemm")
        .to_ascii_lowercase();
    if version != "gemm" {
        return Err(cfg_err(format!(
            "awq version `{version}` is not supported (gemm)"
        )));
    }
    if v.get("zero_point").and_then(Value::as_bool) == Some(false) {
        return Err(cfg_err("awq with `zero_point: false` is not supported"));
    }
    Ok(PackedScheme {
        layout: Layout::AwqGemm,
        group_size: group_size(v)?,
        symmetric: false,
        desc_act: false,
        raw_zeros: true,
    })
}

/// `quant_method: gptq`.
pub fn parse_gptq(v: &Value) -> Result<PackedScheme> {
    bits(v, "gptq")?;
    let raw_zeros = match v
        .get("checkpoint_format")
        .and_then(Value::as_str)
        .unwrap_or("gptq")
    {
        "gptq" => false,
        "gptq_v2" => true,
        other => {
            return Err(cfg_err(format!(
                "gptq checkpoint_format `{other}` is not supported (gptq, gptq_v2)"
            )))
        }
    };
    Ok(PackedScheme {
        layout: Layout::Gptq,
        group_size: group_size(v)?,
        symmetric: v.get("sym").and_then(Value::as_bool).unwrap_or(true),
        desc_act: v.get("desc_act").and_then(Value::as_bool).unwrap_or(false),
        raw_zeros,
    })
}

fn bad(t: &RawTensor, m: impl std::fmt::Display) -> ModelError {
    ModelError::Other(format!("{}: tensor `{}`: {m}", t.file.display(), t.hf_name))
}

fn need<'a>(parts: &'a HashMap<&str, RawTensor>, p: &str, part: &str) -> Result<&'a RawTensor> {
    parts.get(part).ok_or_else(|| ModelError::MissingTensor {
        name: format!("{p}.{part}"),
    })
}

fn words(t: &RawTensor, shape: [usize; 2]) -> Result<Vec<u32>> {
    if t.dtype != Dtype::I32 {
        return Err(bad(t, format!("dtype {:?}, expected I32", t.dtype)));
    }
    if t.shape != shape {
        return Err(bad(t, format!("shape {:?}, expected {shape:?}", t.shape)));
    }
    Ok(t.to_i64()?.into_iter().map(|w| w as u32).collect())
}

/// Takes the packed modules (those with a `qweight`) out of `raws` as GGUF-named `U4`
/// tensors.
pub(super) fn assemble(
    s: &PackedScheme,
    raws: &mut HashMap<String, RawTensor>,
) -> Result<Vec<Tensor>> {
    let prefixes: BTreeSet<String> = raws
        .keys()
        .filter_map(|n| n.strip_suffix(".qweight").map(str::to_string))
        .collect();
    let mut out = Vec::new();
    for p in prefixes {
        let mut parts: HashMap<&str, RawTensor> = HashMap::new();
        for part in ["qweight", "qzeros", "scales", "g_idx"] {
            if let Some(t) = raws.remove(&format!("{p}.{part}")) {
                parts.insert(part, t);
            }
        }
        let Some(gguf) = hf_to_gguf(&format!("{p}.weight")) else {
            tracing::debug!("ignoring quantized module `{p}`");
            continue;
        };
        out.push(module(s, &p, gguf, &parts)?);
    }
    same_orders(&out)?;
    Ok(out)
}

/// Q, K and V share an input and so must share an act order; so must gate and up.
fn same_orders(tensors: &[Tensor]) -> Result<()> {
    let by_name: HashMap<&str, &Tensor> = tensors.iter().map(|t| (t.name.as_str(), t)).collect();
    for t in tensors {
        let Some(blk) = t
            .name
            .strip_suffix(".attn_q.weight")
            .or(t.name.strip_suffix(".ffn_gate.weight"))
        else {
            continue;
        };
        let partners: &[&str] = if t.name.ends_with("attn_q.weight") {
            &["attn_k", "attn_v"]
        } else {
            &["ffn_up"]
        };
        let order = |t: &Tensor| t.params().and_then(|p| p.perm.clone());
        for part in partners {
            if let Some(o) = by_name.get(format!("{blk}.{part}.weight").as_str()) {
                if order(o) != order(t) {
                    return Err(ModelError::Other(format!(
                        "`{}` and `{}` have different act orders (g_idx); layers sharing \
                         an input must share one",
                        t.name, o.name
                    )));
                }
            }
        }
    }
    Ok(())
}

fn module(
    s: &PackedScheme,
    p: &str,
    gguf: String,
    parts: &HashMap<&str, RawTensor>,
) -> Result<Tensor> {
    let qw = need(parts, p, "qweight")?;
    let [a, b] = qw.shape[..] else {
        return Err(bad(qw, format!("shape {:?} is not 2-D", qw.shape)));
    };
    // (in, out) from the packed shape.
    let (cols, rows) = match s.layout {
        Layout::AwqGemm => (a, b * 8),
        Layout::Gptq => (a * 8, b),
    };
    let sc_t = need(parts, p, "scales")?;
    let sc = sc_t.to_f32()?;
    let groups = match sc_t.shape[..] {
        [g, o] if o == rows && g > 0 => g,
        _ => {
            return Err(bad(
                sc_t,
                format!(
                    "shape {:?} does not give scales for {rows} outputs",
                    sc_t.shape
                ),
            ))
        }
    };
    if !cols.is_multiple_of(groups) {
        return Err(bad(
            sc_t,
            format!("{groups} groups do not divide {cols} inputs"),
        ));
    }
    let group = cols / groups;
    if let Some(g) = s.group_size.filter(|&g| g != group) {
        return Err(bad(
            sc_t,
            format!("{groups} groups of {group} inputs, but group_size is {g}"),
        ));
    }
    let q = words(qw, [a, b])?;
    let zq = words(need(parts, p, "qzeros")?, [groups, rows.div_ceil(8)])?;
    if !rows.is_multiple_of(8) {
        return Err(bad(qw, format!("{rows} outputs are not a multiple of 8")));
    }
    // code(out, in) in input order and zero(out, group), unpacked.
    let n8 = rows / 8;
    let mut codes = vec![0u8; rows * cols];
    let mut zeros_i = vec![0i32; rows * groups];
    match s.layout {
        Layout::AwqGemm => {
            // Inverse of AutoAWQ's ORDER: output 8c + o sits at nibble REV[o].
            const REV: [usize; 8] = [0, 4, 1, 5, 2, 6, 3, 7];
            for o in 0..rows {
                let shift = 4 * REV[o % 8];
                for i in 0..cols {
                    codes[o * cols + i] = ((q[i * n8 + o / 8] >> shift) & 0xF) as u8;
                }
                for g in 0..groups {
                    zeros_i[o * groups + g] = ((zq[g * n8 + o / 8] >> shift) & 0xF) as i32;
                }
            }
        }
        Layout::Gptq => {
            let off = if s.raw_zeros { 0 } else { 1 };
            for o in 0..rows {
                for i in 0..cols {
                    codes[o * cols + i] = ((q[(i / 8) * rows + o] >> (4 * (i % 8))) & 0xF) as u8;
                }
                for g in 0..groups {
                    zeros_i[o * groups + g] =
                        ((zq[g * n8 + o / 8] >> (4 * (o % 8))) & 0xF) as i32 + off;
                }
            }
        }
    }
    // The stored column order: inputs by group, stably (identity unless act order).
    let perm: Option<Vec<u32>> = match (s.layout, parts.get("g_idx")) {
        (Layout::Gptq, Some(gt)) => {
            if gt.shape != [cols] {
                return Err(bad(gt, format!("shape {:?}, expected [{cols}]", gt.shape)));
            }
            let g_idx = gt.to_i64()?;
            if let Some(bad_g) = g_idx.iter().find(|&&g| g < 0 || g as usize >= groups) {
                return Err(bad(gt, format!("group {bad_g} outside 0..{groups}")));
            }
            if g_idx
                .iter()
                .enumerate()
                .all(|(i, &g)| g as usize == i / group)
            {
                None
            } else {
                let mut order: Vec<u32> = (0..cols as u32).collect();
                order.sort_by_key(|&i| g_idx[i as usize]);
                for (j, &i) in order.iter().enumerate() {
                    if g_idx[i as usize] as usize != j / group {
                        return Err(bad(
                            gt,
                            format!("group {} does not hold exactly {group} inputs", j / group),
                        ));
                    }
                }
                Some(order)
            }
        }
        (Layout::Gptq, None) if s.desc_act => {
            return Err(ModelError::MissingTensor {
                name: format!("{p}.g_idx (desc_act is set)"),
            })
        }
        _ => None,
    };
    let rb = cols / 2;
    let mut data = vec![0u8; rows * rb];
    for o in 0..rows {
        for j in 0..cols {
            let i = perm.as_ref().map_or(j, |p| p[j] as usize);
            data[o * rb + j / 2] |= codes[o * cols + i] << (4 * (j % 2));
        }
    }
    let mut zeros = vec![0u8; rows * groups];
    for o in 0..rows {
        for g in 0..groups {
            let z = zeros_i[o * groups + g];
            if !(0..=15).contains(&z) {
                return Err(bad(
                    need(parts, p, "qzeros")?,
                    format!(
                        "zero point {z} (output {o}, group {g}) does not fit in 4 bits: a \
                         v1 GPTQ zero of 0 wraps; this checkpoint needs checkpoint_format \
                         gptq_v2"
                    ),
                ));
            }
            zeros[o * groups + g] = z as u8;
        }
    }
    let symmetric = s.symmetric && zeros.iter().all(|&z| z == 8);
    if s.symmetric && !symmetric {
        tracing::debug!("{p}: sym is set but zero points differ from 8; keeping them");
    }
    // scales [groups, out] → [out, groups].
    let scales: Vec<f32> = (0..rows)
        .flat_map(|o| (0..groups).map(move |g| (g, o)))
        .map(|(g, o)| sc[g * rows + o])
        .collect();
    Tensor::new(
        gguf,
        GgmlType::U4,
        vec![cols, rows],
        Arc::new(Storage::Owned(data)),
        0,
    )?
    .with_params(QuantParams {
        group,
        scales,
        zeros: (!symmetric).then_some(zeros),
        act: ActQuant::Block32,
        perm,
    })
    .map_err(|e| match e {
        ModelError::Other(m) => ModelError::Other(format!("module `{p}`: {m}")),
        other => other,
    })
}

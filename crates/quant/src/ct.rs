//! compressed-tensors (llm-compressor's checkpoint format): the tensors of one quantized
//! linear module and the `quantization_config` describing them, as compressed-tensors
//! 0.12 writes them (`pack_to_int32`, `calculate_qparams`), so vLLM and
//! `pagellm-model`'s reader (`hf::quant`) load the output unchanged.
//!
//! | method | format | tensors of module `p` |
//! |---|---|---|
//! | `int8` (W8A16) | `pack-quantized`, 8 bits | `p.weight_packed` I32 `[out, in/4]` (`q + 128`), `p.weight_scale [out, 1]`, `p.weight_shape` |
//! | `w8a8` | `int-quantized` | `p.weight` I8 `[out, in]`, `p.weight_scale [out, 1]`; activations per token, dynamic |
//! | `rtn` (W4A16) | `pack-quantized`, 4 bits | `p.weight_packed` I32 `[out, in/8]` (`q + 8`), `p.weight_scale [out, in/group]`, `p.weight_shape`, asymmetric: `p.weight_zero_point` I32 `[out/8, groups]` |
//! | `fp8` (weight-only) | `naive-quantized` | `p.weight` F8_E4M3 `[out, in]`, `p.weight_scale [out, 1]` |

use pagellm_kernels::quant::{ActQuant, GgmlType};
use pagellm_model::hf::write::OutTensor;
use safetensors::Dtype;
use serde_json::{json, Value};

use crate::rtn::QWeight;

fn bf16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
        .collect()
}

/// The tensors of module `prefix` (e.g. `model.layers.0.mlp.up_proj`) holding `q`.
pub fn module_tensors(prefix: &str, q: &QWeight) -> Vec<OutTensor> {
    let (rows, cols) = (q.rows, q.cols);
    let groups = cols / q.params.group;
    let t = |suffix: &str, dtype, shape: Vec<usize>, data| OutTensor {
        name: format!("{prefix}.{suffix}"),
        dtype,
        shape,
        data,
    };
    let scale = t(
        "weight_scale",
        Dtype::BF16,
        vec![rows, groups],
        bf16_bytes(&q.params.scales),
    );
    let shape = t(
        "weight_shape",
        Dtype::I64,
        vec![2],
        [rows as i64, cols as i64]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
    );
    match (q.ty, q.params.act) {
        (GgmlType::I8, ActQuant::Block32) => vec![
            t(
                "weight_packed",
                Dtype::I32,
                vec![rows, cols / 4],
                q.data.iter().map(|b| b ^ 0x80).collect(),
            ),
            scale,
            shape,
        ],
        (GgmlType::I8, ActQuant::PerToken) => {
            vec![
                t("weight", Dtype::I8, vec![rows, cols], q.data.clone()),
                scale,
            ]
        }
        (GgmlType::F8E4M3, _) => vec![
            t("weight", Dtype::F8_E4M3, vec![rows, cols], q.data.clone()),
            scale,
        ],
        (GgmlType::U4, _) => {
            let mut v = vec![
                t(
                    "weight_packed",
                    Dtype::I32,
                    vec![rows, cols / 8],
                    q.data.clone(),
                ),
                scale,
                shape,
            ];
            if let Some(z) = &q.params.zeros {
                v.push(t(
                    "weight_zero_point",
                    Dtype::I32,
                    vec![rows.div_ceil(8), groups],
                    pack_zeros(z, rows, groups),
                ));
            }
            v
        }
        (other, _) => unreachable!("{} is not a checkpoint format", other.name()),
    }
}

/// Zero points (`zp + 8`, one per row and group) packed eight rows to an int32 along
/// the output dimension, as `pack_to_int32(..., packed_dim=0)` does.
fn pack_zeros(z: &[u8], rows: usize, groups: usize) -> Vec<u8> {
    let mut words = vec![0u32; rows.div_ceil(8) * groups];
    for r in 0..rows {
        for g in 0..groups {
            words[(r / 8) * groups + g] |= (z[r * groups + g] as u32) << (4 * (r % 8));
        }
    }
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// The weight and activation scheme of `method` as compressed-tensors' `QuantizationArgs`.
fn args(
    bits: u32,
    ty: &str,
    strategy: &str,
    group: Option<usize>,
    symmetric: bool,
    dynamic: bool,
) -> Value {
    json!({
        "num_bits": bits,
        "type": ty,
        "symmetric": symmetric,
        "group_size": group,
        "strategy": strategy,
        "block_structure": null,
        "dynamic": dynamic,
        "actorder": null,
        "observer": if dynamic { Value::Null } else { json!("minmax") },
        "observer_kwargs": {},
    })
}

/// `quantization_config` for checkpoints of weights like `sample` (every linear layer
/// quantized the same way; the embeddings and LM head left as they are).
pub fn quantization_config(sample: &QWeight) -> Value {
    let (format, weights, input) = match (sample.ty, sample.params.act) {
        (GgmlType::I8, ActQuant::Block32) => (
            "pack-quantized",
            args(8, "int", "channel", None, true, false),
            Value::Null,
        ),
        (GgmlType::I8, ActQuant::PerToken) => (
            "int-quantized",
            args(8, "int", "channel", None, true, false),
            args(8, "int", "token", None, true, true),
        ),
        (GgmlType::F8E4M3, _) => (
            "naive-quantized",
            args(8, "float", "channel", None, true, false),
            Value::Null,
        ),
        (GgmlType::U4, _) => (
            "pack-quantized",
            args(
                4,
                "int",
                "group",
                Some(sample.params.group),
                sample.params.zeros.is_none(),
                false,
            ),
            Value::Null,
        ),
        (other, _) => unreachable!("{} is not a checkpoint format", other.name()),
    };
    json!({
        "quant_method": "compressed-tensors",
        "format": format,
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": weights,
                "input_activations": input,
                "output_activations": null,
                "format": format,
            }
        },
        "ignore": ["lm_head"],
        "kv_cache_scheme": null,
        "global_compression_ratio": null,
        "sparsity_config": {},
        "transform_config": {},
    })
}

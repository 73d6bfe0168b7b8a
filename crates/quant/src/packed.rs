//! AutoAWQ's GEMM layout and GPTQ's layout: the tensors of one INT4 linear module and
//! the `quantization_config` describing them, packed as AutoAWQ's
//! `WQLinear_GEMM.from_linear` and GPTQ's `QuantLinear.pack` pack them, so vLLM and
//! `pagellm-model`'s reader (`hf::packed`) load the output unchanged. Both store the
//! weight transposed, `[in, out]`, with eight 4-bit codes to an int32 and f16 scales.
//!
//! | layout | tensors of module `p` |
//! |---|---|
//! | AutoAWQ GEMM | `p.qweight` I32 `[in, out/8]`: word `(i, c)` holds outputs `8c + ORDER[k]` at bits `4k`, `ORDER = [0, 2, 4, 6, 1, 3, 5, 7]`; `p.qzeros` I32 `[in/group, out/8]`, same packing; `p.scales` F16 `[in/group, out]` |
//! | GPTQ | `p.qweight` I32 `[in/8, out]`: word `(k, o)` holds inputs `8k + j` at bits `4j`; `p.qzeros` I32 `[groups, out/8]` holding `zero − 1` (outputs `8c + j` at bits `4j`); `p.scales` F16 `[groups, out]`; `p.g_idx` I32 `[in]`, each input's group |

use pagellm_model::hf::write::OutTensor;
use safetensors::Dtype;
use serde_json::{json, Value};

use crate::rtn::QWeight;

/// AutoAWQ's interleaving of eight outputs in a word (`AWQ_ORDER`).
pub const AWQ_ORDER: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];

fn i32_bytes(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

fn f16_bytes(v: impl Iterator<Item = f32>) -> Vec<u8> {
    v.flat_map(|x| half::f16::from_f32(x).to_le_bytes())
        .collect()
}

/// The codes of `q` as `[out, in]` bytes in input order, and each input's group.
fn codes_in_input_order(q: &QWeight) -> (Vec<u8>, Vec<usize>) {
    let (rows, cols, g) = (q.rows, q.cols, q.params.group);
    let rb = cols / 2;
    let mut codes = vec![0u8; rows * cols];
    let mut group_of = vec![0usize; cols];
    for j in 0..cols {
        let c = q.params.perm.as_ref().map_or(j, |p| p[j] as usize);
        group_of[c] = j / g;
        for r in 0..rows {
            codes[r * cols + c] = (q.data[r * rb + j / 2] >> (4 * (j % 2))) & 0xF;
        }
    }
    (codes, group_of)
}

fn zero(q: &QWeight, r: usize, g: usize) -> u8 {
    let groups = q.cols / q.params.group;
    q.params.zeros.as_ref().map_or(8, |z| z[r * groups + g])
}

/// `[groups, out]` scales, f16.
fn scales_t(q: &QWeight) -> Vec<u8> {
    let groups = q.cols / q.params.group;
    f16_bytes((0..groups).flat_map(|g| (0..q.rows).map(move |r| q.params.scales[r * groups + g])))
}

/// The AutoAWQ GEMM tensors of module `prefix` holding `q` (INT4 with zero points, no
/// act order; outputs a multiple of 8).
pub fn awq_tensors(prefix: &str, q: &QWeight) -> Vec<OutTensor> {
    let (rows, cols) = (q.rows, q.cols);
    let groups = cols / q.params.group;
    let (codes, _) = codes_in_input_order(q);
    let mut qweight = vec![0u32; cols * rows / 8];
    for i in 0..cols {
        for c in 0..rows / 8 {
            for (k, &o) in AWQ_ORDER.iter().enumerate() {
                qweight[i * rows / 8 + c] |= (codes[(8 * c + o) * cols + i] as u32) << (4 * k);
            }
        }
    }
    let mut qzeros = vec![0u32; groups * rows / 8];
    for g in 0..groups {
        for c in 0..rows / 8 {
            for (k, &o) in AWQ_ORDER.iter().enumerate() {
                qzeros[g * rows / 8 + c] |= (zero(q, 8 * c + o, g) as u32) << (4 * k);
            }
        }
    }
    let t = |suffix: &str, dtype, shape: Vec<usize>, data| OutTensor {
        name: format!("{prefix}.{suffix}"),
        dtype,
        shape,
        data,
    };
    vec![
        t(
            "qweight",
            Dtype::I32,
            vec![cols, rows / 8],
            i32_bytes(&qweight),
        ),
        t(
            "qzeros",
            Dtype::I32,
            vec![groups, rows / 8],
            i32_bytes(&qzeros),
        ),
        t("scales", Dtype::F16, vec![groups, rows], scales_t(q)),
    ]
}

/// The GPTQ tensors of module `prefix` holding `q` (outputs a multiple of 8); the zero
/// points are stored `zero − 1` (GPTQ's v1 format, what vLLM and AutoGPTQ read).
pub fn gptq_tensors(prefix: &str, q: &QWeight) -> Vec<OutTensor> {
    let (rows, cols) = (q.rows, q.cols);
    let groups = cols / q.params.group;
    let (codes, group_of) = codes_in_input_order(q);
    let mut qweight = vec![0u32; cols / 8 * rows];
    for k in 0..cols / 8 {
        for o in 0..rows {
            for j in 0..8 {
                qweight[k * rows + o] |= (codes[o * cols + 8 * k + j] as u32) << (4 * j);
            }
        }
    }
    let mut qzeros = vec![0u32; groups * rows / 8];
    for g in 0..groups {
        for o in 0..rows {
            let z = zero(q, o, g);
            debug_assert!(z >= 1, "GPTQ zero points are kept in 1..=15");
            qzeros[g * rows / 8 + o / 8] |= ((z as u32).wrapping_sub(1) & 0xF) << (4 * (o % 8));
        }
    }
    let g_idx: Vec<u32> = group_of.iter().map(|&g| g as u32).collect();
    let t = |suffix: &str, dtype, shape: Vec<usize>, data| OutTensor {
        name: format!("{prefix}.{suffix}"),
        dtype,
        shape,
        data,
    };
    vec![
        t(
            "qweight",
            Dtype::I32,
            vec![cols / 8, rows],
            i32_bytes(&qweight),
        ),
        t(
            "qzeros",
            Dtype::I32,
            vec![groups, rows / 8],
            i32_bytes(&qzeros),
        ),
        t("scales", Dtype::F16, vec![groups, rows], scales_t(q)),
        t("g_idx", Dtype::I32, vec![cols], i32_bytes(&g_idx)),
    ]
}

/// AutoAWQ's `quantization_config`.
pub fn awq_config(group: usize) -> Value {
    json!({
        "quant_method": "awq",
        "bits": 4,
        "group_size": group,
        "zero_point": true,
        "version": "gemm",
        "modules_to_not_convert": null,
    })
}

/// GPTQ's `quantization_config` (as GPTQModel writes it for the v1 format).
pub fn gptq_config(group: usize, sym: bool, desc_act: bool, damp: f32) -> Value {
    json!({
        "quant_method": "gptq",
        "bits": 4,
        "group_size": group,
        "desc_act": desc_act,
        "sym": sym,
        "damp_percent": damp,
        "true_sequential": true,
        "static_groups": false,
        "lm_head": false,
        "checkpoint_format": "gptq",
    })
}

//! AWQ (activation-aware weight quantization), as AutoAWQ does it for llama and qwen2:
//! per decoder layer, per group of linear layers sharing an input, search per-input-
//! channel scales `s` that the weights are multiplied by (and the previous operation
//! divided by) before INT4 quantization, then search a clipping range per output
//! channel and group, then quantize with zero points.
//!
//! * Groups (AutoAWQ's `get_layers_for_scaling`): `input_layernorm → q, k, v`;
//!   `v → o` only when their shapes match (never under grouped-query attention);
//!   `post_attention_layernorm → gate, up`; `up → down`.
//! * Scale search: `s = x̄^α / (w̄^(1−α) + 1e−4)` clamped at 1e−4 and normalised by
//!   `sqrt(max s · min s)`, for α on a grid of 20 (`x̄` the mean |activation| per input
//!   channel over every calibration token, `w̄` the mean over rows of |w| relative to
//!   its group's max). The loss is the squared error of the group's linear outputs on a
//!   subsample of tokens (AutoAWQ measures the whole attention or MLP block's output;
//!   the linear outputs are what those blocks are made of and cost far less on a CPU).
//! * Clip search (not for q and k): per output channel and group, the max magnitude
//!   shrunk by `i/20` for `i < 10`, keeping the one with least squared error of
//!   `x_g · w_g` over a subsample of tokens.
//! * Quantization: AutoAWQ's `pseudo_quantize_tensor` with zero points
//!   (`scale = (max − min) / 15`, `zero = clamp(−round(min / scale), 0, 15)`), scales
//!   rounded up to f16, the dtype AutoAWQ stores them in.

use std::collections::HashMap;

use pagellm_kernels::matmul::{matmul, Activations, WeightRef};
use pagellm_kernels::pool::ThreadPool;
use pagellm_kernels::quant::GgmlType;
use pagellm_model::hf::write::HfWeight;

use crate::calib::LayerInputs;
use crate::error::Result;
use crate::rtn::{int4_groups, int4_quant, round, snap_f16, QWeight};

/// Options of the AWQ search.
#[derive(Debug, Clone)]
pub struct AwqOptions {
    pub group_size: usize,
    /// Tokens the scale-search loss is measured on.
    pub search_tokens: usize,
    /// Tokens the clip search is measured on (AutoAWQ: 512).
    pub clip_tokens: usize,
}

const N_GRID: usize = 20;

/// AutoAWQ's scale and zero point of one group (no widening to include 0).
fn awq_params(seg: &[f32]) -> (f32, u8) {
    let (min, max) = seg
        .iter()
        .fold((f32::MAX, f32::MIN), |(a, b), &v| (a.min(v), b.max(v)));
    let s = snap_f16((max - min).max(1e-5) / 15.0);
    let z = (-round(min / s)).clamp(0.0, 15.0) as u8;
    (s, z)
}

/// INT4 with zero points, AutoAWQ's formulas.
pub fn quantize_awq(w: &[f32], rows: usize, cols: usize, group: usize) -> QWeight {
    int4_groups(w, rows, cols, group, true, awq_params)
}

/// Quantizes and dequantizes in place (the "pseudo-quantized" weight).
fn fake_quant(w: &mut [f32], cols: usize, group: usize) {
    for row in w.chunks_exact_mut(cols) {
        fake_quant_row(row, group);
    }
}

/// `w · diag(s)`, pseudo-quantized, then `· diag(s)⁻¹`: the weight a scale `s` gives,
/// rows split over `threads`.
fn scaled_fake_quant(w: &[f32], cols: usize, s: &[f32], group: usize, threads: usize) -> Vec<f32> {
    let mut out = w.to_vec();
    let rows = w.len() / cols;
    let per = rows.div_ceil(threads.max(1)) * cols;
    std::thread::scope(|scope| {
        for chunk in out.chunks_mut(per.max(cols)) {
            scope.spawn(move || {
                for row in chunk.chunks_exact_mut(cols) {
                    row.iter_mut().zip(s).for_each(|(a, b)| *a *= b);
                    fake_quant_row(row, group);
                    row.iter_mut().zip(s).for_each(|(a, b)| *a /= b);
                }
            });
        }
    });
    out
}

fn fake_quant_row(row: &mut [f32], group: usize) {
    for seg in row.chunks_exact_mut(group) {
        let (s, z) = awq_params(seg);
        for v in seg.iter_mut() {
            *v = (int4_quant(*v, s, z) as f32 - z as f32) * s;
        }
    }
}

/// `out = x · wᵀ` in f32 through the kernels' float path.
fn matmul_f32(
    pool: &ThreadPool,
    x: &[f32],
    n: usize,
    w: &[f32],
    rows: usize,
    cols: usize,
) -> Vec<f32> {
    let bytes: &[u8] = bytemuck::cast_slice(w);
    let mut act = Activations::new();
    act.reset(n, cols).copy_from_slice(x);
    let mut out = vec![0f32; n * rows];
    matmul(
        pool,
        &mut act,
        WeightRef::plain(GgmlType::F32, bytes, rows, cols),
        &mut out,
    );
    out
}

/// Every `tokens / k`-th row of `x`, at most `k` rows.
fn subsample(x: &[f32], tokens: usize, width: usize, k: usize) -> (Vec<f32>, usize) {
    let step = (tokens / k.max(1)).max(1);
    let rows: Vec<usize> = (0..tokens).step_by(step).take(k).collect();
    let mut out = Vec::with_capacity(rows.len() * width);
    for &r in &rows {
        out.extend_from_slice(&x[r * width..(r + 1) * width]);
    }
    (out, rows.len())
}

fn sq_err(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum()
}

/// The best input-channel scales for linear layers `ws` (each `(values, rows)`, all of
/// `cols` columns) sharing the input `x` (`tokens × cols`).
fn search_scales(
    pool: &ThreadPool,
    x: &[f32],
    tokens: usize,
    ws: &[(&[f32], usize)],
    cols: usize,
    o: &AwqOptions,
) -> Vec<f32> {
    let mut x_mean = vec![0f64; cols];
    for row in x.chunks_exact(cols) {
        for (m, &v) in x_mean.iter_mut().zip(row) {
            *m += v.abs() as f64;
        }
    }
    let x_mean: Vec<f32> = x_mean.iter().map(|m| (m / tokens as f64) as f32).collect();
    let total_rows: usize = ws.iter().map(|w| w.1).sum();
    let mut w_mean = vec![0f64; cols];
    for (w, _) in ws {
        for row in w.chunks_exact(cols) {
            for (g, seg) in row.chunks_exact(o.group_size).enumerate() {
                let amax = seg.iter().fold(0f32, |m, v| m.max(v.abs())) + 1e-6;
                for (e, v) in seg.iter().enumerate() {
                    w_mean[g * o.group_size + e] += (v.abs() / amax) as f64;
                }
            }
        }
    }
    let w_mean: Vec<f32> = w_mean
        .iter()
        .map(|m| (m / total_rows as f64) as f32)
        .collect();

    let (xs, ns) = subsample(x, tokens, cols, o.search_tokens);
    let reference: Vec<Vec<f32>> = ws
        .iter()
        .map(|(w, r)| matmul_f32(pool, &xs, ns, w, *r, cols))
        .collect();
    let mut best = (f64::INFINITY, vec![1f32; cols]);
    for step in 0..N_GRID {
        let ratio = step as f32 / N_GRID as f32;
        let mut s: Vec<f32> = x_mean
            .iter()
            .zip(&w_mean)
            .map(|(&xm, &wm)| (xm.powf(ratio) / (wm.powf(1.0 - ratio) + 1e-4)).max(1e-4))
            .collect();
        let (mx, mn) = s
            .iter()
            .fold((f32::MIN, f32::MAX), |(a, b), &v| (a.max(v), b.min(v)));
        let norm = (mx * mn).sqrt();
        for v in &mut s {
            *v /= norm;
            if !v.is_finite() {
                *v = 1.0;
            }
        }
        let mut loss = 0.0;
        for ((w, rows), want) in ws.iter().zip(&reference) {
            let scaled = scaled_fake_quant(w, cols, &s, o.group_size, pool.n_threads());
            loss += sq_err(&matmul_f32(pool, &xs, ns, &scaled, *rows, cols), want);
        }
        if loss < best.0 {
            best = (loss, s);
        }
    }
    best.1
}

/// Clips each (row, group) of `w` to the range that quantizes best on `x`.
fn search_clip(
    pool: &ThreadPool,
    x: &[f32],
    tokens: usize,
    w: &mut [f32],
    rows: usize,
    cols: usize,
    o: &AwqOptions,
) {
    let g = o.group_size;
    let (xs, ns) = subsample(x, tokens, cols, o.clip_tokens);
    for gi in 0..cols / g {
        // This group's columns of the tokens and of the weight.
        let xg: Vec<f32> = xs
            .chunks_exact(cols)
            .flat_map(|r| r[gi * g..(gi + 1) * g].to_vec())
            .collect();
        let wg: Vec<f32> = w
            .chunks_exact(cols)
            .flat_map(|r| r[gi * g..(gi + 1) * g].to_vec())
            .collect();
        let want = matmul_f32(pool, &xg, ns, &wg, rows, g);
        let org_max: Vec<f32> = wg
            .chunks_exact(g)
            .map(|r| r.iter().fold(0f32, |m, v| m.max(v.abs())))
            .collect();
        let mut best_err = vec![f64::INFINITY; rows];
        let mut best_max = org_max.clone();
        for i in 0..N_GRID / 2 {
            let shrink = 1.0 - i as f32 / N_GRID as f32;
            let mut q = wg.clone();
            for (r, row) in q.chunks_exact_mut(g).enumerate() {
                let m = org_max[r] * shrink;
                for v in row.iter_mut() {
                    *v = v.clamp(-m, m);
                }
            }
            fake_quant(&mut q, g, g);
            let got = matmul_f32(pool, &xg, ns, &q, rows, g);
            for r in 0..rows {
                let e: f64 = (0..ns)
                    .map(|t| ((got[t * rows + r] - want[t * rows + r]) as f64).powi(2))
                    .sum();
                if e < best_err[r] {
                    best_err[r] = e;
                    best_max[r] = org_max[r] * shrink;
                }
            }
        }
        for (r, row) in w.chunks_exact_mut(cols).enumerate() {
            let m = best_max[r];
            for v in &mut row[gi * g..(gi + 1) * g] {
                *v = v.clamp(-m, m);
            }
        }
    }
}

/// Scales `x` (`tokens × cols`) down by `s` per column.
pub(crate) fn div_cols(x: &mut [f32], cols: usize, s: &[f32]) {
    for row in x.chunks_exact_mut(cols) {
        for (a, b) in row.iter_mut().zip(s) {
            *a /= b;
        }
    }
}

pub(crate) fn mul_cols(w: &mut [f32], cols: usize, s: &[f32]) {
    for row in w.chunks_exact_mut(cols) {
        for (a, b) in row.iter_mut().zip(s) {
            *a *= b;
        }
    }
}

/// AWQ for one decoder layer. `layer` holds its weights by Hugging Face suffix
/// (`self_attn.q_proj.weight`, `input_layernorm.weight`, ...); the norms (and `up`'s
/// rows) are rescaled in place, and the quantized linear layers returned by suffix.
pub fn quantize_layer(
    pool: &ThreadPool,
    layer: &mut HashMap<String, HfWeight>,
    mut x: LayerInputs,
    o: &AwqOptions,
) -> Result<Vec<(String, QWeight)>> {
    let dims = |l: &HashMap<String, HfWeight>, k: &str| (l[k].shape[0], l[k].shape[1]);
    let n = x.tokens;
    let (q, k, v, op, gate, up, down) = (
        "self_attn.q_proj.weight",
        "self_attn.k_proj.weight",
        "self_attn.v_proj.weight",
        "self_attn.o_proj.weight",
        "mlp.gate_proj.weight",
        "mlp.up_proj.weight",
        "mlp.down_proj.weight",
    );
    let d = dims(layer, q).1;
    let ff = dims(layer, down).1;
    let qd = dims(layer, op).1;

    // Scales, all searched on the original weights and inputs.
    let s_qkv = {
        let ws: Vec<(&[f32], usize)> = [q, k, v]
            .iter()
            .map(|n| (&layer[*n].values[..], layer[*n].shape[0]))
            .collect();
        search_scales(pool, &x.qkv, n, &ws, d, o)
    };
    let s_vo = (dims(layer, v) == dims(layer, op)).then(|| {
        search_scales(
            pool,
            &x.attn_output,
            n,
            &[(&layer[op].values[..], dims(layer, op).0)],
            qd,
            o,
        )
    });
    let s_gu = {
        let ws: Vec<(&[f32], usize)> = [gate, up]
            .iter()
            .map(|n| (&layer[*n].values[..], layer[*n].shape[0]))
            .collect();
        search_scales(pool, &x.gate_up, n, &ws, d, o)
    };
    let s_down = search_scales(
        pool,
        &x.down,
        n,
        &[(&layer[down].values[..], dims(layer, down).0)],
        ff,
        o,
    );

    // Apply: the previous operation divided, the linear layers' columns multiplied, and
    // the captured inputs divided the way the rescaled model would produce them.
    for (val, s) in layer
        .get_mut("input_layernorm.weight")
        .expect("norm")
        .values
        .iter_mut()
        .zip(&s_qkv)
    {
        *val /= s;
    }
    for name in [q, k, v] {
        mul_cols(&mut layer.get_mut(name).expect("linear").values, d, &s_qkv);
    }
    div_cols(&mut x.qkv, d, &s_qkv);
    if let Some(s) = &s_vo {
        // v's output rows feed o's input columns (one head dim per row).
        for (r, row) in layer
            .get_mut(v)
            .expect("v")
            .values
            .chunks_exact_mut(d)
            .enumerate()
        {
            row.iter_mut().for_each(|a| *a /= s[r]);
        }
        if let Some(b) = layer.get_mut("self_attn.v_proj.bias") {
            b.values.iter_mut().zip(s).for_each(|(a, s)| *a /= s);
        }
        mul_cols(&mut layer.get_mut(op).expect("o").values, qd, s);
        div_cols(&mut x.attn_output, qd, s);
    }
    for (val, s) in layer
        .get_mut("post_attention_layernorm.weight")
        .expect("norm")
        .values
        .iter_mut()
        .zip(&s_gu)
    {
        *val /= s;
    }
    for name in [gate, up] {
        mul_cols(&mut layer.get_mut(name).expect("linear").values, d, &s_gu);
    }
    div_cols(&mut x.gate_up, d, &s_gu);
    for (r, row) in layer
        .get_mut(up)
        .expect("up")
        .values
        .chunks_exact_mut(d)
        .enumerate()
    {
        row.iter_mut().for_each(|a| *a /= s_down[r]);
    }
    mul_cols(&mut layer.get_mut(down).expect("down").values, ff, &s_down);
    div_cols(&mut x.down, ff, &s_down);

    // Clip (not q and k), then quantize.
    let mut out = Vec::new();
    for (name, input, cols) in [
        (q, &x.qkv, d),
        (k, &x.qkv, d),
        (v, &x.qkv, d),
        (op, &x.attn_output, qd),
        (gate, &x.gate_up, d),
        (up, &x.gate_up, d),
        (down, &x.down, ff),
    ] {
        let w = layer.get_mut(name).expect("linear");
        let rows = w.shape[0];
        if name != q && name != k {
            search_clip(pool, input, n, &mut w.values, rows, cols, o);
        }
        out.push((
            name.to_string(),
            quantize_awq(&w.values, rows, cols, o.group_size),
        ));
    }
    Ok(out)
}

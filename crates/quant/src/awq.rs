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
//!   its group's max), and no scaling at all. The loss is AutoAWQ's where it pays: for
//!   Q/K/V the squared error of the attention block's output (RoPE, causal attention
//!   and the float output projection over whole calibration windows); for gate/up and
//!   down the squared error of the linear outputs on a subsample of tokens (AutoAWQ
//!   measures the whole MLP's output for gate/up; on a CPU that costs half as much
//!   again, and measuring it made no difference to the result). Subsamples always
//!   hold every window's first token at its true weight (see `subsample`).
//! * Clip search (not for q and k): per output channel and group, the max magnitude
//!   shrunk by `i/20` for `i < 10`, keeping the one with least squared error of
//!   `x_g · w_g` over a subsample of tokens (taken from the group's Gram matrix).
//! * Quantization: AutoAWQ's `pseudo_quantize_tensor` with zero points
//!   (`scale = (max − min) / 15`, `zero = clamp(−round(min / scale), 0, 15)`), scales
//!   rounded up to f16, the dtype AutoAWQ stores them in.

use std::collections::HashMap;

use pagellm_kernels::matmul::{matmul, Activations, WeightRef};
use pagellm_kernels::pool::ThreadPool;
use pagellm_kernels::quant::GgmlType;
use pagellm_model::hf::write::HfWeight;

use crate::attn::{AttnBlock, AttnGeom};
use crate::calib::LayerInputs;
use crate::error::Result;
use crate::rtn::{int4_groups, int4_quant, round, snap_f16, QWeight};

/// Options of the AWQ search.
#[derive(Debug, Clone)]
pub struct AwqOptions {
    pub group_size: usize,
    /// Tokens the scale-search loss is measured on.
    pub search_tokens: usize,
    /// Tokens of whole calibration windows the Q/K/V search runs the attention block on.
    pub attn_tokens: usize,
    /// Tokens the clip search is measured on (AutoAWQ: 512).
    pub clip_tokens: usize,
    /// The layers' attention geometry: Q/K/V scales are then measured on the attention
    /// block's output, as AutoAWQ does; without it, on the Q/K/V outputs themselves.
    pub attention: Option<AttnGeom>,
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
pub(crate) fn matmul_f32(
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

/// About `k` rows of `x` (`(tokens, width)`, whole windows of `seq_len` tokens) whose
/// squared errors, summed, estimate the sum over every token with little variance:
/// each window's first token, scaled to stand for itself alone, and one token drawn
/// from each run of the others at a pseudo-random offset, standing for its run. The
/// first token of a window is where most models put their attention sink, with
/// activations hundreds of times the others'; one of them drawn or missed by chance
/// would swing the loss by more than the choice being made (and a fixed stride would
/// draw all of them or none).
fn subsample(x: &[f32], width: usize, seq_len: usize, k: usize) -> (Vec<f32>, usize) {
    let tokens = x.len() / width;
    let seq_len = seq_len.clamp(1, tokens.max(1));
    let windows = tokens / seq_len;
    if k >= tokens {
        return (x.to_vec(), tokens);
    }
    let (starts, rest) = if seq_len > 1 && 2 * windows <= k {
        (windows, tokens - windows)
    } else {
        (0, tokens)
    };
    let m = k - starts;
    let step = (rest / m.max(1)).max(1);
    let start_scale = (m as f32 / rest as f32).sqrt();
    let mut out = Vec::with_capacity(k * width);
    for w in 0..starts {
        let r = w * seq_len;
        out.extend(
            x[r * width..(r + 1) * width]
                .iter()
                .map(|v| v * start_scale),
        );
    }
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut n = starts;
    for i in 0..rest.div_ceil(step).min(m) {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let j = (i * step + (state >> 33) as usize % step).min(rest - 1);
        // The j-th token that is not a window's first.
        let r = if starts > 0 {
            j / (seq_len - 1) * seq_len + 1 + j % (seq_len - 1)
        } else {
            j
        };
        out.extend_from_slice(&x[r * width..(r + 1) * width]);
        n += 1;
    }
    (out, n)
}

fn sq_err(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum()
}

/// Every pseudo-quantized weight of a scale-search candidate, in the order of `ws`,
/// to the loss the search minimises.
type Loss<'a> = Box<dyn Fn(&[Vec<f32>]) -> f64 + 'a>;

/// The squared error of the linear layers' own outputs on a subsample of `x`'s tokens.
fn linear_loss<'a>(
    pool: &'a ThreadPool,
    x: &[f32],
    seq_len: usize,
    ws: &[(&[f32], usize)],
    cols: usize,
    k: usize,
) -> Loss<'a> {
    let (xs, ns) = subsample(x, cols, seq_len, k);
    let rows: Vec<usize> = ws.iter().map(|w| w.1).collect();
    let reference: Vec<Vec<f32>> = ws
        .iter()
        .map(|(w, r)| matmul_f32(pool, &xs, ns, w, *r, cols))
        .collect();
    Box::new(move |q| {
        q.iter()
            .zip(&rows)
            .zip(&reference)
            .map(|((w, &r), want)| sq_err(&matmul_f32(pool, &xs, ns, w, r, cols), want))
            .sum()
    })
}

/// The squared error of the attention block's output (through the float output
/// projection) on whole calibration windows, at most `k` tokens in all: AutoAWQ's loss
/// for the Q/K/V scales.
fn attention_loss<'a>(
    pool: &'a ThreadPool,
    block: &'a AttnBlock<'a>,
    x: &LayerInputs,
    ws: [&[f32]; 3],
    k: usize,
) -> Loss<'a> {
    let d = block.d_model;
    let len = x.seq_len.min(k.max(1));
    let samples = x.tokens / x.seq_len;
    let n_seq = (k / len).clamp(1, samples);
    let mut xs = Vec::with_capacity(n_seq * len * d);
    for i in 0..n_seq {
        let t0 = i * (samples / n_seq) * x.seq_len;
        xs.extend_from_slice(&x.qkv[t0 * d..(t0 + len) * d]);
    }
    let want = block.forward(pool, &xs, n_seq, len, ws);
    Box::new(move |q| {
        let got = block.forward(pool, &xs, n_seq, len, [&q[0], &q[1], &q[2]]);
        sq_err(&got, &want)
    })
}

/// The best input-channel scales for linear layers `ws` (each `(values, rows)`, all of
/// `cols` columns) sharing the input `x` (`tokens × cols`), by `loss`.
fn search_scales(
    pool: &ThreadPool,
    x: &[f32],
    ws: &[(&[f32], usize)],
    cols: usize,
    o: &AwqOptions,
    loss: Loss<'_>,
) -> Vec<f32> {
    let tokens = x.len() / cols;
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

    let loss_of = |s: &[f32]| -> f64 {
        let q: Vec<Vec<f32>> = ws
            .iter()
            .map(|(w, _)| scaled_fake_quant(w, cols, s, o.group_size, pool.n_threads()))
            .collect();
        loss(&q)
    };
    // No scaling at all is a candidate too (AutoAWQ's grid lacks it: at α = 0 its
    // scales are 1 / w̄), so the search is never worse than plain quantization on its
    // own loss.
    let plain = loss_of(&vec![1f32; cols]);
    let mut best = (plain, vec![1f32; cols], f32::NAN);
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
        let loss = loss_of(&s);
        if loss < best.0 {
            best = (loss, s, ratio);
        }
    }
    tracing::debug!(
        cols,
        ratio = best.2,
        loss = best.0,
        unscaled = plain,
        "awq scales"
    );
    best.1
}

/// `δ_r G δ_rᵀ` for every row `δ_r` of `delta` (`rows × g`), `G` symmetric `g × g`.
fn gram_errors(pool: &ThreadPool, delta: &[f32], rows: usize, gram: &[f32], g: usize) -> Vec<f64> {
    let dg = matmul_f32(pool, delta, rows, gram, g, g);
    delta
        .chunks_exact(g)
        .zip(dg.chunks_exact(g))
        .map(|(d, dgr)| d.iter().zip(dgr).map(|(a, b)| (a * b) as f64).sum())
        .collect()
}

/// Clips each (row, group) of `w` to the range that quantizes best on `x`.
fn search_clip(
    pool: &ThreadPool,
    x: &[f32],
    seq_len: usize,
    w: &mut [f32],
    rows: usize,
    cols: usize,
    o: &AwqOptions,
) {
    let g = o.group_size;
    let (xs, ns) = subsample(x, cols, seq_len, o.clip_tokens);
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
        // The error of a row's change δ on these tokens is Σ_t (x_t · δ)² = δ G δᵀ with
        // G the group's Gram matrix: one (g × g) product per row instead of one per
        // token, and no reference output.
        let mut xt = vec![0f32; g * ns];
        for (t, row) in xg.chunks_exact(g).enumerate() {
            for (e, &v) in row.iter().enumerate() {
                xt[e * ns + t] = v;
            }
        }
        let gram = matmul_f32(pool, &xt, g, &xt, g, ns);
        let org_max: Vec<f32> = wg
            .chunks_exact(g)
            .map(|r| r.iter().fold(0f32, |m, v| m.max(v.abs())))
            .collect();
        let mut best_err = vec![f64::INFINITY; rows];
        let mut best_max = org_max.clone();
        for i in 0..N_GRID / 2 {
            let shrink = 1.0 - i as f32 / N_GRID as f32;
            let mut delta = wg.clone();
            for (r, row) in delta.chunks_exact_mut(g).enumerate() {
                let m = org_max[r] * shrink;
                for v in row.iter_mut() {
                    *v = v.clamp(-m, m);
                }
            }
            fake_quant(&mut delta, g, g);
            delta.iter_mut().zip(&wg).for_each(|(a, b)| *a -= b);
            for (r, e) in gram_errors(pool, &delta, rows, &gram, g)
                .into_iter()
                .enumerate()
            {
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
        let bias = |name: &str| layer.get(name).map(|b| &b.values[..]);
        let block;
        let loss = match o.attention {
            Some(geom) => {
                block = AttnBlock {
                    geom,
                    bias: [
                        bias("self_attn.q_proj.bias"),
                        bias("self_attn.k_proj.bias"),
                        bias("self_attn.v_proj.bias"),
                    ],
                    o_proj: &layer[op].values,
                    d_model: d,
                };
                attention_loss(pool, &block, &x, [ws[0].0, ws[1].0, ws[2].0], o.attn_tokens)
            }
            None => linear_loss(pool, &x.qkv, x.seq_len, &ws, d, o.search_tokens),
        };
        search_scales(pool, &x.qkv, &ws, d, o, loss)
    };
    let s_vo = (dims(layer, v) == dims(layer, op)).then(|| {
        let ws = [(&layer[op].values[..], dims(layer, op).0)];
        let loss = linear_loss(pool, &x.attn_output, x.seq_len, &ws, qd, o.search_tokens);
        search_scales(pool, &x.attn_output, &ws, qd, o, loss)
    });
    let s_gu = {
        let ws: Vec<(&[f32], usize)> = [gate, up]
            .iter()
            .map(|n| (&layer[*n].values[..], layer[*n].shape[0]))
            .collect();
        let loss = linear_loss(pool, &x.gate_up, x.seq_len, &ws, d, o.search_tokens);
        search_scales(pool, &x.gate_up, &ws, d, o, loss)
    };
    let s_down = {
        let ws = [(&layer[down].values[..], dims(layer, down).0)];
        let loss = linear_loss(pool, &x.down, x.seq_len, &ws, ff, o.search_tokens);
        search_scales(pool, &x.down, &ws, ff, o, loss)
    };

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
            search_clip(pool, input, x.seq_len, &mut w.values, rows, cols, o);
        }
        out.push((
            name.to_string(),
            quantize_awq(&w.values, rows, cols, o.group_size),
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rnd(seed: &mut u32, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| {
                *seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (*seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5
            })
            .collect()
    }

    #[test]
    fn subsample_gives_window_starts_their_natural_share() {
        // 32 windows of 512 tokens, 1024 drawn: a stride of 16 would take all 32 starts.
        let (tokens, width) = (32 * 512, 1);
        let x: Vec<f32> = (0..tokens).map(|t| t as f32).collect();
        let (xs, n) = subsample(&x, width, 512, 1024);
        assert_eq!(n, 1024);
        // Every window's first token, scaled to its share (992 drawn of 16,352 others).
        let scale = (992.0f32 / 16_352.0).sqrt();
        for (w, &v) in xs[..32].iter().enumerate() {
            assert!(
                (v - (w * 512) as f32 * scale).abs() < 1e-2,
                "window {w}: {v}"
            );
        }
        // Then one of each run of 16 others, in order, none a window's first.
        let rows: Vec<usize> = xs[32..].iter().map(|&t| t as usize).collect();
        assert!(rows.iter().all(|r| r % 512 != 0));
        assert!(rows.windows(2).all(|p| p[0] < p[1]));
        let mut hit = [0usize; 512];
        rows.iter().for_each(|r| hit[r % 512] += 1);
        assert!(
            hit.iter().all(|&h| h <= 8),
            "positions drawn unevenly: {hit:?}"
        );
    }

    #[test]
    fn gram_errors_equal_the_output_errors() {
        let mut seed = 3;
        let (ns, rows, g) = (40, 6, 16);
        let x = rnd(&mut seed, ns * g);
        let delta = rnd(&mut seed, rows * g);
        let mut xt = vec![0f32; g * ns];
        for t in 0..ns {
            for e in 0..g {
                xt[e * ns + t] = x[t * g + e];
            }
        }
        let pool = ThreadPool::new(2);
        let gram = matmul_f32(&pool, &xt, g, &xt, g, ns);
        let got = gram_errors(&pool, &delta, rows, &gram, g);
        for r in 0..rows {
            let want: f64 = (0..ns)
                .map(|t| {
                    let y: f32 = (0..g).map(|e| x[t * g + e] * delta[r * g + e]).sum();
                    (y as f64).powi(2)
                })
                .sum();
            assert!(
                (got[r] - want).abs() <= 1e-4 * want.max(1.0),
                "row {r}: {} vs {want}",
                got[r]
            );
        }
    }

    #[test]
    fn scale_search_never_loses_to_no_scaling() {
        // An outlier input channel: the case AWQ's scales exist for.
        let mut seed = 11;
        let (tokens, rows, cols) = (64, 8, 64);
        let mut x = rnd(&mut seed, tokens * cols);
        for row in x.chunks_exact_mut(cols) {
            row[5] *= 40.0;
        }
        let w = rnd(&mut seed, rows * cols);
        let pool = ThreadPool::new(2);
        let o = AwqOptions {
            group_size: 32,
            search_tokens: tokens,
            attn_tokens: tokens,
            clip_tokens: tokens,
            attention: None,
        };
        let ws = [(&w[..], rows)];
        let s = search_scales(
            &pool,
            &x,
            &ws,
            cols,
            &o,
            linear_loss(&pool, &x, tokens, &ws, cols, tokens),
        );
        let loss = linear_loss(&pool, &x, tokens, &ws, cols, tokens);
        let with = loss(&[scaled_fake_quant(&w, cols, &s, 32, 2)]);
        let without = loss(&[scaled_fake_quant(&w, cols, &vec![1.0; cols], 32, 2)]);
        assert!(with <= without, "{with} > {without}");
        assert!(
            with < 0.9 * without,
            "the outlier channel gains nothing: {with} vs {without}"
        );
    }
}

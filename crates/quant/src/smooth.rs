//! SmoothQuant (Xiao et al., 2023) for W8A8: activation outliers are moved into the
//! weights before both are quantized to INT8. Per input channel `j` of a group of
//! linear layers behind one RMSNorm, `s_j = max|X_j|^α / max|W_j|^(1−α)` (max over the
//! calibration tokens and over the group's weight rows); the norm's weight is divided
//! by `s` and the layers' columns multiplied by it, which leaves the float model's
//! output unchanged. The groups are llm-compressor's `SmoothQuantModifier` mappings for
//! llama and qwen2: `input_layernorm → q, k, v` and `post_attention_layernorm → gate,
//! up`.

use std::collections::HashMap;

use pagellm_model::hf::write::HfWeight;

use crate::awq::mul_cols;
use crate::calib::LayerInputs;

/// The smoothing scales of inputs `x` (`tokens × cols`) for the weights `ws`.
fn scales(x: &[f32], cols: usize, ws: &[&[f32]], alpha: f32) -> Vec<f32> {
    let mut x_max = vec![0f32; cols];
    for row in x.chunks_exact(cols) {
        for (m, v) in x_max.iter_mut().zip(row) {
            *m = m.max(v.abs());
        }
    }
    let mut w_max = vec![0f32; cols];
    for w in ws {
        for row in w.chunks_exact(cols) {
            for (m, v) in w_max.iter_mut().zip(row) {
                *m = m.max(v.abs());
            }
        }
    }
    x_max
        .iter()
        .zip(&w_max)
        .map(|(&a, &w)| {
            // llm-compressor clamps both maxima at 1e-5.
            let s = a.max(1e-5).powf(alpha) / w.max(1e-5).powf(1.0 - alpha);
            if s.is_finite() && s > 0.0 {
                s
            } else {
                1.0
            }
        })
        .collect()
}

/// Smooths one decoder layer's weights (by Hugging Face suffix) in place.
pub fn smooth_layer(layer: &mut HashMap<String, HfWeight>, x: &LayerInputs, alpha: f32) {
    for (norm, input, names) in [
        (
            "input_layernorm.weight",
            &x.qkv,
            &[
                "self_attn.q_proj.weight",
                "self_attn.k_proj.weight",
                "self_attn.v_proj.weight",
            ][..],
        ),
        (
            "post_attention_layernorm.weight",
            &x.gate_up,
            &["mlp.gate_proj.weight", "mlp.up_proj.weight"][..],
        ),
    ] {
        let cols = layer[names[0]].shape[1];
        let s = {
            let ws: Vec<&[f32]> = names.iter().map(|n| &layer[*n].values[..]).collect();
            scales(input, cols, &ws, alpha)
        };
        for (v, s) in layer
            .get_mut(norm)
            .expect("decoder layers have both norms")
            .values
            .iter_mut()
            .zip(&s)
        {
            *v /= s;
        }
        for n in names {
            mul_cols(&mut layer.get_mut(*n).expect("linear").values, cols, &s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One outlier channel: its scale is the largest, and the smoothed product
    /// `(x / s) · (w · s)ᵀ` equals the original.
    #[test]
    fn moves_outliers_without_changing_the_product() {
        let cols = 4;
        let x = [1.0f32, 50.0, -2.0, 0.5, -1.0, 40.0, 1.0, 0.25];
        let w = [0.5f32, 0.01, -0.3, 0.2, 0.1, 0.02, 0.4, -0.6];
        let s = scales(&x, cols, &[&w], 0.5);
        assert!(s[1] > 10.0 * s[0], "{s:?}");
        let dot = |x: &[f32], w: &[f32]| x.iter().zip(w).map(|(a, b)| a * b).sum::<f32>();
        for t in 0..2 {
            for r in 0..2 {
                let xs: Vec<f32> = (0..cols).map(|j| x[t * cols + j] / s[j]).collect();
                let ws: Vec<f32> = (0..cols).map(|j| w[r * cols + j] * s[j]).collect();
                let (a, b) = (
                    dot(&x[t * cols..][..cols], &w[r * cols..][..cols]),
                    dot(&xs, &ws),
                );
                assert!((a - b).abs() < 1e-4 * a.abs().max(1.0), "{a} vs {b}");
            }
        }
    }
}

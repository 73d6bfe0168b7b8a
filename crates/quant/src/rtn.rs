//! Round-to-nearest quantizers: INT8 and FP8 per output channel, INT4 per group with or
//! without zero points. The scale and zero-point formulas are compressed-tensors'
//! (`calculate_qparams`), so a weight quantized here gets the values llm-compressor would
//! give it; AWQ and GPTQ reuse [`int4_params`] for their groups.

use pagellm_kernels::quant::wq::{f32_to_e4m3, E4M3_MAX};
use pagellm_kernels::quant::{ActQuant, GgmlType, QuantParams};

/// A quantized weight in pagellm's checkpoint formats (see `pagellm_kernels::quant::wq`).
#[derive(Debug, Clone, PartialEq)]
pub struct QWeight {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<u8>,
    pub params: QuantParams,
}

/// Rounds a positive scale up to a bfloat16, the dtype checkpoints store it in, so the
/// scale used to quantize is the one written and the range it was chosen for still
/// fits (rounding down could push the extreme value past the top code).
#[inline]
pub fn snap(s: f32) -> f32 {
    let b = half::bf16::from_f32(s);
    if b.to_f32() >= s {
        b.to_f32()
    } else {
        half::bf16::from_bits(b.to_bits() + 1).to_f32()
    }
}

/// Rounds a positive scale up to an f16, the dtype AutoAWQ and GPTQ checkpoints store
/// scales in.
#[inline]
pub fn snap_f16(s: f32) -> f32 {
    let h = half::f16::from_f32(s);
    if h.to_f32() >= s {
        h.to_f32()
    } else {
        half::f16::from_bits(h.to_bits() + 1).to_f32()
    }
}

/// Rounds half to even, as `torch.round` does.
#[inline]
pub fn round(v: f32) -> f32 {
    v.round_ties_even()
}

/// INT8, symmetric, one scale per row: `scale = amax / 127.5` (compressed-tensors'
/// symmetric range `(2⁸ − 1) / 2`), `q = clamp(round(w / scale), −128, 127)`.
pub fn int8_channel(w: &[f32], rows: usize, cols: usize, act: ActQuant) -> QWeight {
    let mut data = vec![0u8; rows * cols];
    let mut scales = vec![0f32; rows];
    for ((row, q), s) in w
        .chunks_exact(cols)
        .zip(data.chunks_exact_mut(cols))
        .zip(&mut scales)
    {
        let amax = row.iter().fold(0f32, |m, v| m.max(v.abs()));
        *s = if amax > 0.0 { snap(amax / 127.5) } else { 1.0 };
        for (q, &v) in q.iter_mut().zip(row) {
            *q = round(v / *s).clamp(-128.0, 127.0) as i8 as u8;
        }
    }
    QWeight {
        ty: GgmlType::I8,
        rows,
        cols,
        data,
        params: QuantParams::per_row(scales, act, cols),
    }
}

/// FP8 E4M3, one scale per row (`amax / 448`) or, with `per_tensor`, one for the
/// whole weight (stored once per row).
pub fn fp8(w: &[f32], rows: usize, cols: usize, per_tensor: bool) -> QWeight {
    let amax_of = |v: &[f32]| v.iter().fold(0f32, |m, v| m.max(v.abs()));
    let scale_of = |amax: f32| {
        if amax > 0.0 {
            snap(amax / E4M3_MAX)
        } else {
            1.0
        }
    };
    let tensor_scale = scale_of(amax_of(w));
    let mut data = vec![0u8; rows * cols];
    let mut scales = vec![0f32; rows];
    for ((row, q), s) in w
        .chunks_exact(cols)
        .zip(data.chunks_exact_mut(cols))
        .zip(&mut scales)
    {
        *s = if per_tensor {
            tensor_scale
        } else {
            scale_of(amax_of(row))
        };
        for (q, &v) in q.iter_mut().zip(row) {
            *q = f32_to_e4m3((v / *s).clamp(-E4M3_MAX, E4M3_MAX));
        }
    }
    QWeight {
        ty: GgmlType::F8E4M3,
        rows,
        cols,
        data,
        params: QuantParams::per_row(scales, ActQuant::Block32, cols),
    }
}

/// The INT4 scale and zero point (0..=15, 8 when symmetric) of one group, from its
/// (possibly clipped) range: symmetric `scale = max(|min|, |max|) / 7.5`; asymmetric
/// `scale = (max − min) / 15` over a range widened to include 0, and
/// `zero = clamp(round(−min / scale) , 0, 15)`.
pub fn int4_params(min: f32, max: f32, zero_point: bool) -> (f32, u8) {
    if zero_point {
        let (lo, hi) = (min.min(0.0), max.max(0.0));
        let s = snap((hi - lo) / 15.0);
        if s <= 0.0 {
            return (1.0, 8);
        }
        let z = round(-lo / s).clamp(0.0, 15.0) as u8;
        (s, z)
    } else {
        let amax = min.abs().max(max.abs());
        if amax <= 0.0 {
            return (1.0, 8);
        }
        (snap(amax / 7.5), 8)
    }
}

/// `clamp(round(v / scale) + zero, 0, 15)`.
#[inline]
pub fn int4_quant(v: f32, scale: f32, zero: u8) -> u8 {
    (round(v / scale) + zero as f32).clamp(0.0, 15.0) as u8
}

/// Packs row-major 4-bit values (one per byte) into `U4` bytes.
pub fn pack_u4(q: &[u8]) -> Vec<u8> {
    q.chunks_exact(2).map(|p| p[0] | (p[1] << 4)).collect()
}

/// INT4 round-to-nearest per group of `group` columns.
pub fn int4_rtn(w: &[f32], rows: usize, cols: usize, group: usize, zero_point: bool) -> QWeight {
    int4_groups(w, rows, cols, group, zero_point, |seg| {
        let (min, max) = seg
            .iter()
            .fold((f32::MAX, f32::MIN), |(a, b), &v| (a.min(v), b.max(v)));
        int4_params(min, max, zero_point)
    })
}

/// INT4 per group of `group` columns with each group's (scale, zero) from `params`;
/// `zero_point` says whether the zeros are stored (otherwise they must all be 8).
pub fn int4_groups(
    w: &[f32],
    rows: usize,
    cols: usize,
    group: usize,
    zero_point: bool,
    params: impl Fn(&[f32]) -> (f32, u8),
) -> QWeight {
    let ng = cols / group;
    let mut q = vec![0u8; rows * cols];
    let mut scales = vec![0f32; rows * ng];
    let mut zeros = vec![0u8; rows * ng];
    for (i, seg) in w.chunks_exact(group).enumerate() {
        let (s, z) = params(seg);
        scales[i] = s;
        zeros[i] = z;
        for (e, &v) in seg.iter().enumerate() {
            q[i * group + e] = int4_quant(v, s, z);
        }
    }
    QWeight {
        ty: GgmlType::U4,
        rows,
        cols,
        data: pack_u4(&q),
        params: QuantParams {
            group,
            scales,
            zeros: zero_point.then_some(zeros),
            act: ActQuant::Block32,
            perm: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pagellm_kernels::quant::wq::dequantize_row_wq;

    fn deq(q: &QWeight) -> Vec<f32> {
        let rb = q.ty.row_bytes(q.cols).unwrap();
        let mut out = vec![0f32; q.rows * q.cols];
        for r in 0..q.rows {
            dequantize_row_wq(
                q.ty,
                &q.params,
                r,
                &q.data[r * rb..(r + 1) * rb],
                &mut out[r * q.cols..(r + 1) * q.cols],
            );
        }
        out
    }

    fn max_err(a: &[f32], b: &[f32]) -> f32 {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
    }

    #[test]
    fn each_method_stays_within_half_a_step() {
        let (rows, cols) = (3, 128);
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
            .collect();
        let q8 = int8_channel(&w, rows, cols, ActQuant::Block32);
        q8.params.check(q8.ty, rows, cols).unwrap();
        assert!(max_err(&deq(&q8), &w) <= 1.004 / 127.5 / 2.0 + 1e-6);
        let q4 = int4_rtn(&w, rows, cols, 32, true);
        q4.params.check(q4.ty, rows, cols).unwrap();
        assert!(max_err(&deq(&q4), &w) <= 1.01 * 2.0 / 15.0 / 2.0 + 1e-6);
        let q4s = int4_rtn(&w, rows, cols, 64, false);
        // Symmetric: the top of the range is clipped by at most half a step.
        assert!(max_err(&deq(&q4s), &w) <= 1.01 / 7.5 + 1e-6);
        let f8 = fp8(&w, rows, cols, false);
        // E4M3 keeps 3 mantissa bits: relative error at most 2^-4 (normals).
        for (a, b) in deq(&f8).iter().zip(&w) {
            assert!((a - b).abs() <= b.abs() / 16.0 + 1e-3, "{a} vs {b}");
        }
    }

    #[test]
    fn zero_points_cover_one_sided_groups() {
        // All positive: zero point 0, scale max / 15.
        let (s, z) = int4_params(0.5, 1.5, true);
        assert_eq!(z, 0);
        assert_eq!(s, snap(0.1));
        assert!((0.1..0.1 * 1.004).contains(&s));
        assert_eq!(int4_quant(1.5, s, z), 15);
        let (s, z) = int4_params(-1.5, -0.5, true);
        assert_eq!(z, 15);
        assert_eq!(int4_quant(-1.5, s, z), 0);
    }
}

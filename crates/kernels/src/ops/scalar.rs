//! Scalar reference twins of the kernels in `ops`.

pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

pub fn dot_f16(a: &[f32], b: &[half::f16]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y.to_f32()).sum()
}

pub fn axpy_f16(y: &mut [f32], alpha: f32, x: &[half::f16]) {
    for (a, b) in y.iter_mut().zip(x) {
        *a += alpha * b.to_f32();
    }
}

pub fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
    for (a, b) in y.iter_mut().zip(x) {
        *a += alpha * b;
    }
}

pub fn exp_sub_sum(x: &mut [f32], max: f32) -> f32 {
    let mut sum = 0f32;
    for v in x {
        *v = expf_ggml(*v - max);
        sum += *v;
    }
    sum
}

/// RMSNorm of one row exactly as ggml computes it.
pub fn rmsnorm_row(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    // Squares in f32, summed in f64: `(ggml_float)(x[i] * x[i])` in ggml's rms_norm.
    let ss: f64 = x.iter().map(|&v| (v * v) as f64).sum();
    let mean = (ss / x.len() as f64) as f32;
    let s = 1.0 / (mean + eps).sqrt();
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = v * s * g;
    }
}

pub fn silu(x: f32) -> f32 {
    x / (1.0 + expf_ggml(-x))
}

pub fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = silu(g) * u;
    }
}

/// One lane of ggml's `ggml_v_expf` (see `avx2::exp256`), for the portable path.
pub fn expf_ggml(x: f32) -> f32 {
    let c = f32::from_bits;
    let r = c(0x4b40_0000);
    let z = x.mul_add(c(0x3fb8_aa3b), r);
    let n = z - r;
    let b = (-n).mul_add(c(0x35bf_be8e), (-n).mul_add(c(0x3f31_7200), x));
    let e = z.to_bits().wrapping_shl(23);
    let k = f32::from_bits(e.wrapping_add(1f32.to_bits()));
    let u = b * b;
    let j = c(0x3c07_2010)
        .mul_add(b, c(0x3d2b_9f17))
        .mul_add(u, c(0x3e2a_af33).mul_add(b, c(0x3eff_fedb)))
        .mul_add(u, c(0x3f7f_fff6) * b);
    if n.abs() <= 126.0 {
        return k.mul_add(j, k);
    }
    let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
    let s1 = f32::from_bits(g.wrapping_add(0x7f00_0000));
    let s2 = f32::from_bits(e.wrapping_sub(g));
    if n.abs() > 192.0 {
        s1 * s1
    } else {
        s2.mul_add(j, s2) * s1
    }
}

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
        *v = (*v - max).exp();
        sum += *v;
    }
    sum
}

/// llama.cpp accumulates the mean square in double precision; so do we.
pub fn rmsnorm_row(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let ss: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let mean = (ss / x.len() as f64) as f32;
    let s = 1.0 / (mean + eps).sqrt();
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = v * s * g;
    }
}

pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

pub fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = silu(g) * u;
    }
}

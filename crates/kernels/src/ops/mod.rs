//! Element-wise and small reduction kernels of a transformer layer: RMSNorm, RoPE,
//! SiLU-gated products, exp, dot/axpy for attention, and causal attention itself.
//!
//! Each public function dispatches once on [`crate::cpu::simd_level`]; `scalar` holds
//! the reference twins that the property tests compare against.

pub mod attention;
#[cfg(target_arch = "x86_64")]
mod avx2;
pub mod rope;
pub mod scalar;

use crate::cpu::{simd_level, SimdLevel};

/// Dot product of two equal-length f32 slices.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    #[cfg(target_arch = "x86_64")]
    if simd_level() >= SimdLevel::Avx2 {
        // SAFETY: the CPU supports AVX2+FMA (checked by simd_level).
        return unsafe { avx2::dot(a, b) };
    }
    scalar::dot(a, b)
}

/// Dot product of f32 values with f16 values.
#[inline]
pub fn dot_f16(a: &[f32], b: &[half::f16]) -> f32 {
    assert_eq!(a.len(), b.len());
    #[cfg(target_arch = "x86_64")]
    if simd_level() >= SimdLevel::Avx2 {
        // SAFETY: the CPU supports AVX2+FMA+F16C (checked by simd_level).
        return unsafe { avx2::dot_f16(a, b) };
    }
    scalar::dot_f16(a, b)
}

/// Hints the CPU to fetch the cache lines of `bytes` bytes from `p` into L2. A hint
/// only: the address is never dereferenced, so any pointer is allowed. L2, not L1:
/// prefetches into L1 hold the few L1 miss buffers and stall the loads they should
/// serve (converting scattered 2 KiB runs of f16 on the AVX-512 EPYC of BENCHMARKS.md:
/// 5.9 GB/s per core prefetched into L1, 10.8 GB/s into L2).
#[inline(always)]
pub fn prefetch_range(p: *const u8, bytes: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
        let mut o = 0;
        while o < bytes {
            // SAFETY: prefetch never faults and reads nothing architecturally.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(o) as *const i8) };
            o += 64;
        }
        // The last line when the range straddles one more boundary.
        if bytes > 0 {
            // SAFETY: as above.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(bytes - 1) as *const i8) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, bytes);
}

/// Converts f16 values (as raw bits) to f32; exact, so every path gives the same result.
#[inline]
pub fn f16_bits_to_f32(src: &[u16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len());
    #[cfg(target_arch = "x86_64")]
    if simd_level() >= SimdLevel::Avx2 {
        // SAFETY: the CPU supports F16C (checked by simd_level).
        return unsafe { avx2::f16_bits_to_f32(src, dst) };
    }
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = half::f16::from_bits(s).to_f32();
    }
}

/// `y += alpha * x` for f16 `x`.
#[inline]
pub fn axpy_f16(y: &mut [f32], alpha: f32, x: &[half::f16]) {
    assert_eq!(y.len(), x.len());
    #[cfg(target_arch = "x86_64")]
    if simd_level() >= SimdLevel::Avx2 {
        // SAFETY: as in `dot_f16`.
        return unsafe { avx2::axpy_f16(y, alpha, x) };
    }
    scalar::axpy_f16(y, alpha, x)
}

/// `y += alpha * x`.
#[inline]
pub fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
    assert_eq!(y.len(), x.len());
    #[cfg(target_arch = "x86_64")]
    if simd_level() >= SimdLevel::Avx2 {
        // SAFETY: as in `dot`.
        return unsafe { avx2::axpy(y, alpha, x) };
    }
    scalar::axpy(y, alpha, x)
}

/// `y *= alpha`.
#[inline]
pub fn scale(y: &mut [f32], alpha: f32) {
    for v in y {
        *v *= alpha;
    }
}

/// In place `x[i] = exp(x[i] - max)`, returning the sum: the core of a softmax.
#[inline]
pub fn exp_sub_sum(x: &mut [f32], max: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if simd_level() >= SimdLevel::Avx2 {
        // SAFETY: as in `dot`.
        return unsafe { avx2::exp_sub_sum(x, max) };
    }
    scalar::exp_sub_sum(x, max)
}

/// `exp(x[i] - max)` for 8 lanes with ggml's `ggml_v_expf` polynomial (bit-exact with
/// llama.cpp's softmax and SiLU); lanes at -inf give 0.
pub fn exp8(x: &[f32; 8], max: f32) -> [f32; 8] {
    #[cfg(target_arch = "x86_64")]
    if simd_level() >= SimdLevel::Avx2 {
        // SAFETY: as in `dot`.
        return unsafe { avx2::exp8(x, max) };
    }
    let mut out = [0f32; 8];
    for (o, &v) in out.iter_mut().zip(x) {
        *o = scalar::expf_ggml(v - max);
    }
    out
}

/// RMSNorm of each row of `x` (rows of `w.len()`), times the weight `w`, into `out`.
pub fn rmsnorm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    assert_eq!(x.len(), out.len());
    for (xr, or) in x.chunks_exact(w.len()).zip(out.chunks_exact_mut(w.len())) {
        scalar::rmsnorm_row(xr, w, eps, or);
    }
}

/// `out[i] = silu(gate[i]) * up[i]`, the SwiGLU activation.
pub fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert!(gate.len() == up.len() && up.len() == out.len());
    #[cfg(target_arch = "x86_64")]
    if simd_level() >= SimdLevel::Avx2 {
        // SAFETY: as in `dot`.
        return unsafe { avx2::silu_mul(gate, up, out) };
    }
    scalar::silu_mul(gate, up, out)
}

/// `Σ a[i]·b[i]` in a fixed order, the same bits on every machine: eight lanes, lane
/// `k` summing the products of elements `i ≡ k (mod 8)` of the whole 8-element chunks
/// (each product rounded, then added, never fused), reduced as
/// `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))`, then the tail added in order.
/// The float reference path's only dot product.
pub fn dot_lanes8(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let mut l = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ta, tb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for k in 0..8 {
            l[k] += x[k] * y[k];
        }
    }
    let mut s = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
    for (x, y) in ta.iter().zip(tb) {
        s += x * y;
    }
    s
}

/// `x += y`.
pub fn add_inplace(x: &mut [f32], y: &[f32]) {
    assert_eq!(x.len(), y.len());
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// Softmax in place (numerically stable).
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum = exp_sub_sum(x, max);
    scale(x, 1.0 / sum);
}

#[cfg(test)]
mod tests;

//! Quantization of f32 activations into [`BlockQ8`], scalar and AVX2.
//!
//! Same scheme as ggml's `quantize_row_q8_0` (`d = amax / 127`, `q = round(x / d)`),
//! but with an f32 scale and the per-16 integer sums that let the dot products fold a
//! weight format's offset or min in once per block. Both versions round half to even
//! on `x * (1 / d)` so that they agree bit for bit (ggml's scalar path rounds half away
//! from zero, its AVX path half to even; the difference is immaterial for accuracy but
//! would break scalar/SIMD equality).
//!
//! Inputs must be finite. A block whose `1 / d` would overflow (|x| < ~4e-37) is
//! quantized as all zeros with `d = 0`, like an all-zero block.

use super::BlockQ8;

/// Scale and reciprocal for a block of absolute maximum `amax`; `(0, 0)` when the
/// reciprocal is not finite (all-zero or subnormal-scale block).
#[inline(always)]
fn scale_of(amax: f32) -> (f32, f32) {
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    if id.is_finite() && id != 0.0 {
        (d, id)
    } else {
        (0.0, 0.0)
    }
}

/// Scalar reference: quantizes `x` (`out.len() * 32` values) into `out`.
pub fn quantize_row_q8_ref(x: &[f32], out: &mut [BlockQ8]) {
    assert_eq!(
        x.len(),
        out.len() * 32,
        "quantize_row_q8: x.len() must be 32 * out.len()"
    );
    for (x, y) in x.chunks_exact(32).zip(out.iter_mut()) {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let (d, id) = scale_of(amax);
        y.d = d;
        for (q, &v) in y.qs.iter_mut().zip(x) {
            // |v * id| <= 127 * (1 + 3 ulp), so the cast never saturates.
            *q = (v * id).round_ties_even() as i8;
        }
        for h in 0..2 {
            y.sums[h] = y.qs[16 * h..16 * h + 16].iter().map(|&q| q as i16).sum();
        }
    }
}

/// Quantizes `x` (`out.len() * 32` values) into `out` with the fastest available path;
/// bit-identical to [`quantize_row_q8_ref`].
pub fn quantize_row_q8(x: &[f32], out: &mut [BlockQ8]) {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::simd_level() == crate::cpu::SimdLevel::Avx2 {
        assert_eq!(
            x.len(),
            out.len() * 32,
            "quantize_row_q8: x.len() must be 32 * out.len()"
        );
        // SAFETY: `simd_level` reported AVX2 + FMA + F16C; lengths checked above.
        unsafe { avx2::quantize_row_q8(x, out) };
        return;
    }
    quantize_row_q8_ref(x, out)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{scale_of, BlockQ8};
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2")]
    #[inline]
    fn hsum_epi32(v: __m256i) -> i32 {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01>(s));
        _mm_cvtsi128_si32(s)
    }

    #[target_feature(enable = "avx2")]
    #[inline]
    fn round_to_i32(v: __m256, id: __m256) -> __m256i {
        _mm256_cvtps_epi32(_mm256_round_ps::<
            { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
        >(_mm256_mul_ps(v, id)))
    }

    /// # Safety
    /// Requires AVX2 and `x.len() == 32 * out.len()`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn quantize_row_q8(x: &[f32], out: &mut [BlockQ8]) {
        let sign_bit = _mm256_set1_ps(-0.0);
        // packs_epi32 / packs_epi16 interleave the 128-bit lanes; this restores order.
        let perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        for (i, y) in out.iter_mut().enumerate() {
            // SAFETY: block i reads x[32i..32i+32], in bounds by the caller's contract.
            let (v0, v1, v2, v3) = unsafe {
                let p = x.as_ptr().add(32 * i);
                (
                    _mm256_loadu_ps(p),
                    _mm256_loadu_ps(p.add(8)),
                    _mm256_loadu_ps(p.add(16)),
                    _mm256_loadu_ps(p.add(24)),
                )
            };
            let m01 = _mm256_max_ps(
                _mm256_andnot_ps(sign_bit, v0),
                _mm256_andnot_ps(sign_bit, v1),
            );
            let m23 = _mm256_max_ps(
                _mm256_andnot_ps(sign_bit, v2),
                _mm256_andnot_ps(sign_bit, v3),
            );
            let m = _mm256_max_ps(m01, m23);
            let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
            let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
            let m = _mm_max_ss(m, _mm_movehdup_ps(m));
            let (d, id) = scale_of(_mm_cvtss_f32(m));
            y.d = d;
            let idv = _mm256_set1_ps(id);
            let (q0, q1, q2, q3) = (
                round_to_i32(v0, idv),
                round_to_i32(v1, idv),
                round_to_i32(v2, idv),
                round_to_i32(v3, idv),
            );
            y.sums[0] = hsum_epi32(_mm256_add_epi32(q0, q1)) as i16;
            y.sums[1] = hsum_epi32(_mm256_add_epi32(q2, q3)) as i16;
            let b = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
            let b = _mm256_permutevar8x32_epi32(b, perm);
            // SAFETY: qs is 32 bytes; the store is unaligned.
            unsafe { _mm256_storeu_si256(y.qs.as_mut_ptr().cast(), b) };
        }
    }
}

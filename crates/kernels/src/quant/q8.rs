//! Quantization of f32 activations, exactly as llama.cpp quantizes them: scalar
//! references and bit-identical AVX2 twins.
//!
//! * [`quantize_row_q8`]: ggml's AVX2 `quantize_row_q8_1` (and `quantize_row_q8_0`, the
//!   same without `s`): per 32 values `d = amax / 127` rounded to f16, values
//!   `round_half_even(x * (127 / amax))` (note: `127 / amax`, not `1 / d`), and
//!   `s = f16(d * sum(q))` from the unrounded `d`. ggml's scalar reference rounds half
//!   away from zero instead; its AVX2 path, which we follow, rounds half to even.
//! * [`quantize_row_q8k`]: ggml's `quantize_row_q8_K_ref`, which llama.cpp uses on every
//!   x86 path (the AVX2 `quantize_mat_q8_K_4x8` of the repacked Q4_K gives the same
//!   values up to a joint sign flip of `d` and `qs` when `+amax` and `-amax` both
//!   occur, which leaves every dot product unchanged).
//!
//! Inputs must be finite. A block whose reciprocal scale would overflow (|x| < ~4e-37)
//! is quantized as all zeros, like an all-zero block (ggml produces garbage there; such
//! a block's f16 scale is 0 anyway).

use super::{BlockQ8, BlockQ8K};

/// Rounds to the nearest f16 (ties to even) and widens back.
#[inline(always)]
fn f16_round(v: f32) -> f32 {
    half::f16::from_f32(v).to_f32()
}

/// `127 / amax` for a 32-block, or `None` for a block quantized as zeros.
#[inline(always)]
fn inv_scale(amax: f32) -> Option<f32> {
    let id = 127.0 / amax;
    (amax != 0.0 && id.is_finite()).then_some(id)
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
        let Some(id) = inv_scale(amax) else {
            *y = BlockQ8::default();
            continue;
        };
        let d = amax / 127.0;
        let mut sum = 0i32;
        for (q, &v) in y.qs.iter_mut().zip(x) {
            // |v * id| <= 127 * (1 + 2 ulp), so the cast never saturates.
            *q = (v * id).round_ties_even() as i8;
            sum += *q as i32;
        }
        y.d = f16_round(d);
        y.s = f16_round(d * sum as f32);
    }
}

/// Quantizes `x` (`out.len() * 32` values) into `out` with the fastest available path;
/// bit-identical to [`quantize_row_q8_ref`].
pub fn quantize_row_q8(x: &[f32], out: &mut [BlockQ8]) {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::simd_level() >= crate::cpu::SimdLevel::Avx2 {
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

/// Scalar reference: quantizes `x` (`out.len() * 256` values) into `out`.
pub fn quantize_row_q8k_ref(x: &[f32], out: &mut [BlockQ8K]) {
    assert_eq!(
        x.len(),
        out.len() * 256,
        "quantize_row_q8k: x.len() must be 256 * out.len()"
    );
    for (x, y) in x.chunks_exact(256).zip(out.iter_mut()) {
        let mut amax = 0f32;
        let mut max = 0f32;
        for &v in x {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        let iscale = -127.0 / max;
        if amax == 0.0 || !iscale.is_finite() {
            *y = BlockQ8K::default();
            continue;
        }
        for (q, &v) in y.qs.iter_mut().zip(x) {
            // ggml's nearest_int (add 1.5 * 2^23) is round half to even.
            *q = ((iscale * v).round_ties_even() as i32).min(127) as i8;
        }
        for (s, q) in y.bsums.iter_mut().zip(y.qs.chunks_exact(16)) {
            *s = q.iter().map(|&v| v as i16).sum();
        }
        y.d = 1.0 / iscale;
    }
}

/// Quantizes `x` (`out.len() * 256` values) into `out` with the fastest available path;
/// bit-identical to [`quantize_row_q8k_ref`].
pub fn quantize_row_q8k(x: &[f32], out: &mut [BlockQ8K]) {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::simd_level() >= crate::cpu::SimdLevel::Avx2 {
        assert_eq!(
            x.len(),
            out.len() * 256,
            "quantize_row_q8k: x.len() must be 256 * out.len()"
        );
        // SAFETY: `simd_level` reported AVX2 + FMA + F16C; lengths checked above.
        unsafe { avx2::quantize_row_q8k(x, out) };
        return;
    }
    quantize_row_q8k_ref(x, out)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{inv_scale, BlockQ8, BlockQ8K};
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
    fn hmax_ps(m: __m256) -> f32 {
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let m = _mm_max_ss(m, _mm_movehdup_ps(m));
        _mm_cvtss_f32(m)
    }

    #[target_feature(enable = "avx2")]
    #[inline]
    fn round_to_i32(v: __m256, id: __m256) -> __m256i {
        _mm256_cvtps_epi32(_mm256_round_ps::<
            { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
        >(_mm256_mul_ps(v, id)))
    }

    /// Packs 32 i32 (in four vectors, element order) into 32 bytes in element order.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn pack32(q0: __m256i, q1: __m256i, q2: __m256i, q3: __m256i) -> __m256i {
        // packs_epi32 / packs_epi16 interleave the 128-bit lanes; the permute restores
        // the order.
        let b = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
        _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
    }

    /// # Safety
    /// Requires AVX2 + F16C and `x.len() == 32 * out.len()`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn quantize_row_q8(x: &[f32], out: &mut [BlockQ8]) {
        let sign_bit = _mm256_set1_ps(-0.0);
        for (i, y) in out.iter_mut().enumerate() {
            // SAFETY: block i reads x[32i..32i+32], in bounds by the caller's contract.
            let v: [__m256; 4] = unsafe {
                let p = x.as_ptr().add(32 * i);
                std::array::from_fn(|k| _mm256_loadu_ps(p.add(8 * k)))
            };
            let m01 = _mm256_max_ps(
                _mm256_andnot_ps(sign_bit, v[0]),
                _mm256_andnot_ps(sign_bit, v[1]),
            );
            let m23 = _mm256_max_ps(
                _mm256_andnot_ps(sign_bit, v[2]),
                _mm256_andnot_ps(sign_bit, v[3]),
            );
            let amax = hmax_ps(_mm256_max_ps(m01, m23));
            let Some(id) = inv_scale(amax) else {
                *y = BlockQ8::default();
                continue;
            };
            let d = amax / 127.0;
            let idv = _mm256_set1_ps(id);
            let q: [__m256i; 4] = std::array::from_fn(|k| round_to_i32(v[k], idv));
            let sum = hsum_epi32(_mm256_add_epi32(
                _mm256_add_epi32(q[0], q[1]),
                _mm256_add_epi32(q[2], q[3]),
            ));
            // Both f16 roundings in one conversion (round to nearest even).
            let ds = _mm_cvtph_ps(_mm_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT }>(_mm_setr_ps(
                d,
                d * sum as f32,
                0.0,
                0.0,
            )));
            y.d = _mm_cvtss_f32(ds);
            y.s = _mm_cvtss_f32(_mm_movehdup_ps(ds));
            let b = pack32(q[0], q[1], q[2], q[3]);
            // SAFETY: qs is 32 bytes; the store is unaligned.
            unsafe { _mm256_storeu_si256(y.qs.as_mut_ptr().cast(), b) };
        }
    }

    /// # Safety
    /// Requires AVX2 and `x.len() == 256 * out.len()`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn quantize_row_q8k(x: &[f32], out: &mut [BlockQ8K]) {
        let sign_bit = _mm256_set1_ps(-0.0);
        let max_q = _mm256_set1_epi32(127);
        for (i, y) in out.iter_mut().enumerate() {
            let xb = &x[256 * i..256 * i + 256];
            let mut m = _mm256_setzero_ps();
            for c in xb.chunks_exact(8) {
                // SAFETY: `c` holds 8 floats.
                let v = unsafe { _mm256_loadu_ps(c.as_ptr()) };
                m = _mm256_max_ps(m, _mm256_andnot_ps(sign_bit, v));
            }
            let amax = hmax_ps(m);
            // The first element of largest magnitude gives the sign, as in ggml.
            let max = xb.iter().copied().find(|v| v.abs() == amax).unwrap_or(0.0);
            let iscale = -127.0 / max;
            if amax == 0.0 || !iscale.is_finite() {
                *y = BlockQ8K::default();
                continue;
            }
            let isv = _mm256_set1_ps(iscale);
            for (j, (c, qs)) in xb
                .chunks_exact(32)
                .zip(y.qs.chunks_exact_mut(32))
                .enumerate()
            {
                // SAFETY: `c` holds 32 floats.
                let q: [__m256i; 4] = std::array::from_fn(|k| unsafe {
                    _mm256_min_epi32(
                        round_to_i32(_mm256_loadu_ps(c.as_ptr().add(8 * k)), isv),
                        max_q,
                    )
                });
                y.bsums[2 * j] = hsum_epi32(_mm256_add_epi32(q[0], q[1])) as i16;
                y.bsums[2 * j + 1] = hsum_epi32(_mm256_add_epi32(q[2], q[3])) as i16;
                // SAFETY: `qs` is 32 bytes; the store is unaligned.
                unsafe {
                    _mm256_storeu_si256(qs.as_mut_ptr().cast(), pack32(q[0], q[1], q[2], q[3]))
                };
            }
            y.d = 1.0 / iscale;
        }
    }
}

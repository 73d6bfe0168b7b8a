//! AVX2 + FMA versions of the `ops` kernels. Callers check the CPU features first.

use std::arch::x86_64::*;

#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps::<1>(v);
    let s = _mm_add_ps(lo, hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps::<0b01>(s, s));
    _mm_cvtss_f32(s)
}

#[target_feature(enable = "avx2,fma")]
pub unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len();
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc0 = _mm256_setzero_ps();
    let mut acc1 = _mm256_setzero_ps();
    let mut i = 0;
    while i + 16 <= n {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), acc0);
        acc1 = _mm256_fmadd_ps(
            _mm256_loadu_ps(pa.add(i + 8)),
            _mm256_loadu_ps(pb.add(i + 8)),
            acc1,
        );
        i += 16;
    }
    while i + 8 <= n {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), acc0);
        i += 8;
    }
    let mut s = hsum(_mm256_add_ps(acc0, acc1));
    while i < n {
        s += *pa.add(i) * *pb.add(i);
        i += 1;
    }
    s
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f16_bits_to_f32(src: &[u16], dst: &mut [f32]) {
    let n = src.len();
    let (ps, pd) = (src.as_ptr(), dst.as_mut_ptr());
    let mut i = 0;
    while i + 8 <= n {
        _mm256_storeu_ps(
            pd.add(i),
            _mm256_cvtph_ps(_mm_loadu_si128(ps.add(i) as *const __m128i)),
        );
        i += 8;
    }
    while i < n {
        *pd.add(i) = half::f16::from_bits(*ps.add(i)).to_f32();
        i += 1;
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_f16(a: &[f32], b: &[half::f16]) -> f32 {
    let n = a.len();
    let (pa, pb) = (a.as_ptr(), b.as_ptr() as *const u16);
    let mut acc0 = _mm256_setzero_ps();
    let mut acc1 = _mm256_setzero_ps();
    let mut i = 0;
    while i + 16 <= n {
        let b0 = _mm256_cvtph_ps(_mm_loadu_si128(pb.add(i) as *const __m128i));
        let b1 = _mm256_cvtph_ps(_mm_loadu_si128(pb.add(i + 8) as *const __m128i));
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), b0, acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i + 8)), b1, acc1);
        i += 16;
    }
    while i + 8 <= n {
        let b0 = _mm256_cvtph_ps(_mm_loadu_si128(pb.add(i) as *const __m128i));
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), b0, acc0);
        i += 8;
    }
    let mut s = hsum(_mm256_add_ps(acc0, acc1));
    while i < n {
        s += *pa.add(i) * b[i].to_f32();
        i += 1;
    }
    s
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn axpy_f16(y: &mut [f32], alpha: f32, x: &[half::f16]) {
    let n = y.len();
    let (py, px) = (y.as_mut_ptr(), x.as_ptr() as *const u16);
    let va = _mm256_set1_ps(alpha);
    let mut i = 0;
    while i + 8 <= n {
        let xv = _mm256_cvtph_ps(_mm_loadu_si128(px.add(i) as *const __m128i));
        _mm256_storeu_ps(
            py.add(i),
            _mm256_fmadd_ps(va, xv, _mm256_loadu_ps(py.add(i))),
        );
        i += 8;
    }
    while i < n {
        *py.add(i) += alpha * x[i].to_f32();
        i += 1;
    }
}

#[target_feature(enable = "avx2,fma")]
pub unsafe fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
    let n = y.len();
    let (py, px) = (y.as_mut_ptr(), x.as_ptr());
    let va = _mm256_set1_ps(alpha);
    let mut i = 0;
    while i + 8 <= n {
        let v = _mm256_fmadd_ps(va, _mm256_loadu_ps(px.add(i)), _mm256_loadu_ps(py.add(i)));
        _mm256_storeu_ps(py.add(i), v);
        i += 8;
    }
    while i < n {
        *py.add(i) += alpha * *px.add(i);
        i += 1;
    }
}

/// exp(x) for 8 lanes, ported operation for operation from ggml's `ggml_v_expf`
/// (ggml-cpu/vec.h, AVX2 branch) so that softmax and SiLU round exactly as llama.cpp's:
/// x = n·ln2 + b with n from the 1.5·2^23 trick, a degree-5 polynomial for e^b - 1,
/// and the scaled paths for |n| > 126 that keep overflow and underflow exact.
#[inline(always)]
pub unsafe fn exp256(x: __m256) -> __m256 {
    let c = |bits: u32| _mm256_set1_ps(f32::from_bits(bits));
    let r = c(0x4b40_0000);
    let z = _mm256_fmadd_ps(x, c(0x3fb8_aa3b), r);
    let n = _mm256_sub_ps(z, r);
    let b = _mm256_fnmadd_ps(n, c(0x35bf_be8e), _mm256_fnmadd_ps(n, c(0x3f31_7200), x));
    let e = _mm256_slli_epi32::<23>(_mm256_castps_si256(z));
    let k = _mm256_castsi256_ps(_mm256_add_epi32(
        e,
        _mm256_castps_si256(_mm256_set1_ps(1.0)),
    ));
    let absn = _mm256_andnot_ps(_mm256_set1_ps(-0.0), n);
    let cmask = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GT_OQ>(absn, _mm256_set1_ps(126.0)));
    let u = _mm256_mul_ps(b, b);
    let j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(
            _mm256_fmadd_ps(c(0x3c07_2010), b, c(0x3d2b_9f17)),
            u,
            _mm256_fmadd_ps(c(0x3e2a_af33), b, c(0x3eff_fedb)),
        ),
        u,
        _mm256_mul_ps(c(0x3f7f_fff6), b),
    );
    if _mm256_movemask_ps(_mm256_castsi256_ps(cmask)) == 0 {
        return _mm256_fmadd_ps(j, k, k);
    }
    let g = _mm256_and_si256(
        _mm256_castps_si256(_mm256_cmp_ps::<_CMP_LE_OQ>(n, _mm256_setzero_ps())),
        _mm256_set1_epi32(0x8200_0000u32 as i32),
    );
    let s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f00_0000)));
    let s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
    let d = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GT_OQ>(absn, _mm256_set1_ps(192.0)));
    _mm256_or_ps(
        _mm256_and_ps(_mm256_castsi256_ps(d), _mm256_mul_ps(s1, s1)),
        _mm256_andnot_ps(
            _mm256_castsi256_ps(d),
            _mm256_or_ps(
                _mm256_and_ps(
                    _mm256_castsi256_ps(cmask),
                    _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1),
                ),
                _mm256_andnot_ps(_mm256_castsi256_ps(cmask), _mm256_fmadd_ps(k, j, k)),
            ),
        ),
    )
}

#[target_feature(enable = "avx2,fma")]
pub unsafe fn exp8(x: &[f32; 8], max: f32) -> [f32; 8] {
    let e = exp256(_mm256_sub_ps(
        _mm256_loadu_ps(x.as_ptr()),
        _mm256_set1_ps(max),
    ));
    let mut out = [0f32; 8];
    _mm256_storeu_ps(out.as_mut_ptr(), e);
    out
}

#[target_feature(enable = "avx2,fma")]
pub unsafe fn exp_sub_sum(x: &mut [f32], max: f32) -> f32 {
    let n = x.len();
    let p = x.as_mut_ptr();
    let vm = _mm256_set1_ps(max);
    let mut acc = _mm256_setzero_ps();
    let mut i = 0;
    while i + 8 <= n {
        let e = exp256(_mm256_sub_ps(_mm256_loadu_ps(p.add(i)), vm));
        _mm256_storeu_ps(p.add(i), e);
        acc = _mm256_add_ps(acc, e);
        i += 8;
    }
    let mut s = hsum(acc);
    while i < n {
        let e = (*p.add(i) - max).exp();
        *p.add(i) = e;
        s += e;
        i += 1;
    }
    s
}

#[target_feature(enable = "avx2,fma")]
pub unsafe fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    let n = gate.len();
    let (pg, pu, po) = (gate.as_ptr(), up.as_ptr(), out.as_mut_ptr());
    let one = _mm256_set1_ps(1.0);
    let zero = _mm256_setzero_ps();
    let mut i = 0;
    while i + 8 <= n {
        let g = _mm256_loadu_ps(pg.add(i));
        let e = exp256(_mm256_sub_ps(zero, g));
        let s = _mm256_div_ps(g, _mm256_add_ps(one, e));
        _mm256_storeu_ps(po.add(i), _mm256_mul_ps(s, _mm256_loadu_ps(pu.add(i))));
        i += 8;
    }
    while i < n {
        *po.add(i) = super::scalar::silu(*pg.add(i)) * *pu.add(i);
        i += 1;
    }
}

/// The attention's `softmax_ggml` in one AVX2 function: the same max, the same
/// `exp256` per chunk of eight (missing lanes of the last chunk at -inf), the same
/// per-chunk sums added to an f64 total and the same scaling by the f32 rounding of
/// `1/total`; only the calls and copies between the steps are gone.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn softmax_ggml(x: &mut [f32]) {
    let n = x.len();
    let p = x.as_mut_ptr();
    let n8 = n / 8 * 8;
    // f32::max ignores NaN, as `maxps` does when the NaN is its first operand.
    let mut vmax = _mm256_set1_ps(f32::NEG_INFINITY);
    for i in (0..n8).step_by(8) {
        vmax = _mm256_max_ps(_mm256_loadu_ps(p.add(i)), vmax);
    }
    let mut max = f32::NEG_INFINITY;
    let mut lanes = [0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), vmax);
    for &v in lanes.iter().chain(&x[n8..]) {
        max = max.max(v);
    }
    let vm = _mm256_set1_ps(max);
    let chunk_sum = |e: __m256| {
        let t = _mm_add_ps(_mm256_castps256_ps128(e), _mm256_extractf128_ps::<1>(e));
        let u = _mm_add_ps(t, _mm_movehl_ps(t, t));
        _mm_cvtss_f32(_mm_add_ss(u, _mm_movehdup_ps(u))) as f64
    };
    let mut sum = 0f64;
    for i in (0..n8).step_by(8) {
        let e = exp256(_mm256_sub_ps(_mm256_loadu_ps(p.add(i)), vm));
        _mm256_storeu_ps(p.add(i), e);
        sum += chunk_sum(e);
    }
    if n8 < n {
        lanes = [f32::NEG_INFINITY; 8];
        lanes[..n - n8].copy_from_slice(&x[n8..]);
        let e = exp256(_mm256_sub_ps(_mm256_loadu_ps(lanes.as_ptr()), vm));
        _mm256_storeu_ps(lanes.as_mut_ptr(), e);
        x[n8..].copy_from_slice(&lanes[..n - n8]);
        sum += chunk_sum(e);
    }
    let inv = (1.0 / sum) as f32;
    let vi = _mm256_set1_ps(inv);
    let p = x.as_mut_ptr();
    for i in (0..n8).step_by(8) {
        _mm256_storeu_ps(p.add(i), _mm256_mul_ps(_mm256_loadu_ps(p.add(i)), vi));
    }
    for v in &mut x[n8..] {
        *v *= inv;
    }
}

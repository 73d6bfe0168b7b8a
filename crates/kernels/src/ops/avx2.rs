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

/// exp(x) for 8 lanes: range reduction to x = n·ln2 + r, |r| ≤ ln2/2, a degree-6
/// polynomial for e^r (Cephes `expf` coefficients), and 2^n built in the exponent
/// bits. Relative error below 2e-7 over the range softmax and SiLU use; inputs below
/// -87 flush to 0.
#[inline(always)]
#[allow(clippy::excessive_precision)] // Cephes' constants, kept digit for digit.
pub unsafe fn exp256(x: __m256) -> __m256 {
    let x = _mm256_min_ps(x, _mm256_set1_ps(88.3762626647949));
    let x = _mm256_max_ps(x, _mm256_set1_ps(-87.3365447504019));
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4), r);
    let mut p = _mm256_set1_ps(1.9875691500e-4);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1));
    let r2 = _mm256_mul_ps(r, r);
    p = _mm256_fmadd_ps(p, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0)));
    let e = _mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(n),
        _mm256_set1_epi32(127),
    ));
    _mm256_mul_ps(p, _mm256_castsi256_ps(e))
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

/// Attention of one query head over `scores.len()` keys and values stored as f32 rows
/// of `q.len()` (a multiple of 8): scores, softmax, probabilities rounded to f16 (as
/// llama.cpp does before weighting the values), then the weighted sum of values.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn attend_one(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    scale: f32,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let hd = q.len();
    let n = scores.len();
    debug_assert!(hd.is_multiple_of(8) && k.len() >= n * hd && v.len() >= n * hd && out.len() == hd);
    let (pq, pk, pv, ps) = (q.as_ptr(), k.as_ptr(), v.as_ptr(), scores.as_mut_ptr());
    // Scores, four keys at a time so one horizontal reduction serves four dot products.
    let mut j = 0;
    let mut vmax = _mm_set1_ps(f32::NEG_INFINITY);
    while j + 4 <= n {
        let mut a0 = _mm256_setzero_ps();
        let mut a1 = _mm256_setzero_ps();
        let mut a2 = _mm256_setzero_ps();
        let mut a3 = _mm256_setzero_ps();
        let kj = pk.add(j * hd);
        let mut d = 0;
        while d < hd {
            let qv = _mm256_loadu_ps(pq.add(d));
            a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kj.add(d)), a0);
            a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kj.add(hd + d)), a1);
            a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kj.add(2 * hd + d)), a2);
            a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kj.add(3 * hd + d)), a3);
            d += 8;
        }
        // hadd tree: lanes of (a0, a1, a2, a3) reduced to one 4-vector of sums.
        let h01 = _mm256_hadd_ps(a0, a1);
        let h23 = _mm256_hadd_ps(a2, a3);
        let h = _mm256_hadd_ps(h01, h23);
        let s4 = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps::<1>(h));
        let s4 = _mm_mul_ps(s4, _mm_set1_ps(scale));
        _mm_storeu_ps(ps.add(j), s4);
        vmax = _mm_max_ps(vmax, s4);
        j += 4;
    }
    let vmax = _mm_max_ps(vmax, _mm_movehl_ps(vmax, vmax));
    let vmax = _mm_max_ss(vmax, _mm_shuffle_ps::<0b01>(vmax, vmax));
    let mut max = _mm_cvtss_f32(vmax);
    while j < n {
        let s = dot(q, std::slice::from_raw_parts(pk.add(j * hd), hd)) * scale;
        *ps.add(j) = s;
        max = max.max(s);
        j += 1;
    }
    let sum = exp_sub_sum(scores, max);
    let inv = 1.0 / sum;
    // Normalize and round to f16 precision, 8 at a time.
    let vinv = _mm256_set1_ps(inv);
    let mut j = 0;
    while j + 8 <= n {
        let p = _mm256_mul_ps(_mm256_loadu_ps(ps.add(j)), vinv);
        let p = _mm256_cvtph_ps(_mm256_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT }>(p));
        _mm256_storeu_ps(ps.add(j), p);
        j += 8;
    }
    while j < n {
        *ps.add(j) = half::f16::from_f32(*ps.add(j) * inv).to_f32();
        j += 1;
    }
    // out = Σ p_j v_j, 32 dimensions at a time held in registers.
    let po = out.as_mut_ptr();
    let mut d0 = 0;
    while d0 < hd {
        let w = (hd - d0).min(32);
        let mut acc = [_mm256_setzero_ps(); 4];
        for j in 0..n {
            let p = _mm256_set1_ps(*ps.add(j));
            let vj = pv.add(j * hd + d0);
            for (c, a) in acc.iter_mut().enumerate().take(w / 8) {
                *a = _mm256_fmadd_ps(p, _mm256_loadu_ps(vj.add(c * 8)), *a);
            }
        }
        for (c, a) in acc.iter().enumerate().take(w / 8) {
            _mm256_storeu_ps(po.add(d0 + c * 8), *a);
        }
        d0 += w;
    }
}

//! The interleaved kernels on 512-bit registers: two neighbouring groups (sixteen weight
//! rows) per call, the low half of every register holding the first group's eight rows
//! and the high half the second's.
//!
//! One `vpdpbusd` on a 512-bit register does the work of two on 256-bit ones, and every
//! per-row step (the scale products, the conversion, the FMAs) covers sixteen rows at a
//! time. Each lane goes through exactly the operations of `interleave_x86`'s kernels (the
//! same exact integer per block, then the same float steps in the same order), so a
//! result is bit-identical whether it came from here, from one group at a time, or from
//! the portable twin: the layout and the arithmetic are `interleave`'s.

use super::interleave::{
    check_r16, check_r16k, R16Fn, R16KFn, SubSums, ACT_ROWS, Q4K_GROUP_BLOCK, Q4K_MINS,
    Q6K_GROUP_BLOCK, R16,
};
use super::interleave_x86::bsum_pair;
use super::{BlockQ8, BlockQ8K, GgmlType};
use std::arch::x86_64::*;

/// The 512-bit kernel for `ty` (an interleaved 32-wide type).
///
/// # Safety
/// The CPU must support AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI.
pub(super) unsafe fn kernel(ty: GgmlType) -> R16Fn {
    match ty {
        GgmlType::Q4_0 => r16_q4_0,
        GgmlType::Q4_1 => r16_q4_1,
        _ => r16_q8_0,
    }
}

/// The 512-bit kernel for K-quant `ty` (Q4_K or Q6_K).
///
/// # Safety
/// As [`kernel`].
pub(super) unsafe fn kernel_k(ty: GgmlType) -> R16KFn {
    match ty {
        GgmlType::Q4_K => r16_q4_k,
        _ => r16_q6_k,
    }
}

/// Four columns of sixteen rows: the 64 bytes at `p` (a unit of the first group, then
/// the same unit of the second; see `interleave`'s `pair_up`).
///
/// # Safety
/// `p..p + 64` must be readable.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn ld16(p: *const u8) -> __m512i {
    // SAFETY: the caller guarantees the range.
    unsafe { _mm512_loadu_si512(p.cast()) }
}

/// Sixteen rows' f16 scales at `p` as f32 lanes.
///
/// # Safety
/// `p..p + 32` must be readable.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn ld16_f16(p: *const u8) -> __m512 {
    // SAFETY: the caller guarantees the range.
    unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
}

/// Four activation bytes (columns `4k..4k + 4` of `a`) in every 32-bit lane.
///
/// # Safety
/// `a + 4k .. a + 4k + 4` must be readable.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn bcast4(a: *const i8, k: usize) -> __m512i {
    // SAFETY: the caller guarantees the four bytes are readable.
    unsafe { _mm512_set1_epi32(a.add(4 * k).cast::<i32>().read_unaligned()) }
}

/// `init + Σ w·a` per row over one 32-column block (`init` zero where `None`). One
/// activation row (`N == 1`) runs two chains of four steps, so that the `vpdpbusd`
/// latency does not bound a block, and adds `init` last; with more rows their chains
/// interleave, and one chain per row starting from `init` saves the additions.
/// (Integer sums: the same result either way.)
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn isum8<const N: usize>(w: &[__m512i; 8], a: *const i8, init: Option<__m512i>) -> __m512i {
    // SAFETY: `a` points at a block's 32 quants (the caller's contract).
    unsafe {
        if N > 1 {
            let mut s = init.unwrap_or(_mm512_setzero_si512());
            for (k, w) in w.iter().enumerate() {
                s = _mm512_dpbusd_epi32(s, *w, bcast4(a, k));
            }
            return s;
        }
        let mut s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], bcast4(a, 0));
        let mut s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[1], bcast4(a, 1));
        for k in (2..8).step_by(2) {
            s0 = _mm512_dpbusd_epi32(s0, w[k], bcast4(a, k));
            s1 = _mm512_dpbusd_epi32(s1, w[k + 1], bcast4(a, k + 1));
        }
        let s = _mm512_add_epi32(s0, s1);
        match init {
            Some(i) => _mm512_add_epi32(s, i),
            None => s,
        }
    }
}

/// Stores each activation row's sixteen results.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn store<const N: usize>(acc: &[__m512; N], out: &mut [[f32; R16]; ACT_ROWS]) {
    for (o, a) in out.iter_mut().zip(acc) {
        // SAFETY: `o` holds sixteen f32.
        unsafe { _mm512_storeu_ps(o.as_mut_ptr(), *a) };
    }
}

macro_rules! r16_wrapper {
    ($f:ident, $ty:expr, $call:ident, $min:literal) => {
        fn $f(
            pair: &[u8],
            acts: &[BlockQ8],
            isums: &[i32],
            na: usize,
            out: &mut [[f32; R16]; ACT_ROWS],
        ) {
            let nb = check_r16($ty, pair, acts, isums, na);
            let (a, s) = (acts.as_ptr(), isums.as_ptr());
            let p0 = pair.as_ptr();
            // SAFETY: lengths checked above; the fn pointer is only handed out on CPUs
            // with this family's features.
            unsafe {
                match na {
                    1 => $call::<1, $min>(p0, nb, a, s, out),
                    2 => $call::<2, $min>(p0, nb, a, s, out),
                    3 => $call::<3, $min>(p0, nb, a, s, out),
                    4 => $call::<4, $min>(p0, nb, a, s, out),
                    5 => $call::<5, $min>(p0, nb, a, s, out),
                    6 => $call::<6, $min>(p0, nb, a, s, out),
                    7 => $call::<7, $min>(p0, nb, a, s, out),
                    _ => $call::<8, $min>(p0, nb, a, s, out),
                }
            }
        }
    };
}

r16_wrapper!(r16_q4_0, GgmlType::Q4_0, q4, false);
r16_wrapper!(r16_q4_1, GgmlType::Q4_1, q4, true);
r16_wrapper!(r16_q8_0, GgmlType::Q8_0, q8, false);

/// Q4_0 (`MIN == false`, offset 8) and Q4_1 (`MIN == true`) over `N` activation rows.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q4<const N: usize, const MIN: bool>(
    pair: *const u8,
    nb: usize,
    acts: *const BlockQ8,
    isums: *const i32,
    out: &mut [[f32; R16]; ACT_ROWS],
) {
    let (gbb, sb) = if MIN { (160, 32) } else { (144, 16) };
    let m4 = _mm512_set1_epi8(0x0f);
    let mut acc = [_mm512_setzero_ps(); N];
    for b in 0..nb {
        // SAFETY: the wrapper checked that `nb` blocks of both groups and `N * nb`
        // activation blocks and sums are readable.
        unsafe {
            let p = pair.add(2 * b * gbb);
            let dw = ld16_f16(p);
            let mw = if MIN {
                Some(ld16_f16(p.add(2 * 16)))
            } else {
                None
            };
            let mut w = [_mm512_setzero_si512(); 8];
            for c in 0..4 {
                let v = ld16(p.add(2 * (sb + 32 * c)));
                w[c] = _mm512_and_si512(v, m4);
                w[c + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4);
            }
            for (m, acc) in acc.iter_mut().enumerate() {
                let a = &*acts.add(m * nb + b);
                // Q4_0's offset of 8 starts the sum: Σ (q − 8)·a = Σ q·a − 8 Σ a.
                let init = (!MIN).then(|| _mm512_set1_epi32(-8 * *isums.add(m * nb + b)));
                let isum = isum8::<N>(&w, a.qs.as_ptr(), init);
                *acc = _mm512_fmadd_ps(
                    _mm512_mul_ps(dw, _mm512_set1_ps(a.d)),
                    _mm512_cvtepi32_ps(isum),
                    *acc,
                );
                if let Some(mw) = mw {
                    *acc = _mm512_fmadd_ps(mw, _mm512_set1_ps(a.s), *acc);
                }
            }
        }
    }
    store(&acc, out);
}

/// Q8_0 over `N` activation rows (`_MIN` is unused; it keeps `q4`'s shape).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q8<const N: usize, const _MIN: bool>(
    pair: *const u8,
    nb: usize,
    acts: *const BlockQ8,
    isums: *const i32,
    out: &mut [[f32; R16]; ACT_ROWS],
) {
    let mut acc = [_mm512_setzero_ps(); N];
    for b in 0..nb {
        // SAFETY: as in `q4`.
        unsafe {
            let p = pair.add(2 * b * 272);
            let dw = ld16_f16(p);
            let mut w = [_mm512_setzero_si512(); 8];
            for (k, w) in w.iter_mut().enumerate() {
                *w = ld16(p.add(2 * (16 + 32 * k)));
            }
            for (m, acc) in acc.iter_mut().enumerate() {
                let a = &*acts.add(m * nb + b);
                let a_sum = *isums.add(m * nb + b);
                let init = Some(_mm512_set1_epi32(-128 * a_sum));
                let isum = isum8::<N>(&w, a.qs.as_ptr(), init);
                *acc = _mm512_fmadd_ps(
                    _mm512_mul_ps(dw, _mm512_set1_ps(a.d)),
                    _mm512_cvtepi32_ps(isum),
                    *acc,
                );
            }
        }
    }
    store(&acc, out);
}

macro_rules! r16k_wrapper {
    ($f:ident, $ty:expr, $call:ident) => {
        fn $f(
            pair: &[u8],
            acts: &[BlockQ8K],
            sums: &[SubSums],
            na: usize,
            out: &mut [[f32; R16]; ACT_ROWS],
        ) {
            let nb = check_r16k($ty, pair, acts, sums, na);
            let (a, s) = (acts.as_ptr(), sums.as_ptr());
            let p0 = pair.as_ptr();
            // SAFETY: as in `r16_wrapper!`.
            unsafe {
                match na {
                    1 => $call::<1>(p0, nb, a, s, out),
                    2 => $call::<2>(p0, nb, a, s, out),
                    3 => $call::<3>(p0, nb, a, s, out),
                    4 => $call::<4>(p0, nb, a, s, out),
                    5 => $call::<5>(p0, nb, a, s, out),
                    6 => $call::<6>(p0, nb, a, s, out),
                    7 => $call::<7>(p0, nb, a, s, out),
                    _ => $call::<8>(p0, nb, a, s, out),
                }
            }
        }
    };
}

r16k_wrapper!(r16_q4_k, GgmlType::Q4_K, q4k);
r16k_wrapper!(r16_q6_k, GgmlType::Q6_K, q6k);

/// Q4_K over `N` activation rows: per sub-block the exact `Σ q·a` times the rows' 6-bit
/// scales, per super-block the mins against the activation sums, then `interleave`'s two
/// FMAs.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q4k<const N: usize>(
    pair: *const u8,
    nb: usize,
    acts: *const BlockQ8K,
    sums: *const SubSums,
    out: &mut [[f32; R16]; ACT_ROWS],
) {
    let (m4, m4h) = (_mm512_set1_epi8(0x0f), _mm512_set1_epi8(0xf0u8 as i8));
    let mut acc = [_mm512_setzero_ps(); N];
    for b in 0..nb {
        // SAFETY: the wrapper checked that `nb` group blocks of both groups and `N * nb`
        // activation blocks are readable.
        unsafe {
            let p = pair.add(2 * b * Q4K_GROUP_BLOCK);
            let mut tot = [_mm512_setzero_si512(); N];
            for pair in 0..4 {
                let q = p.add(2 * (160 + 256 * pair));
                let mut raw = [_mm512_setzero_si512(); 8];
                for (c, raw) in raw.iter_mut().enumerate() {
                    *raw = ld16(q.add(2 * (32 * c)));
                }
                for hi in 0..2 {
                    let j = 2 * pair + hi;
                    // The high nibbles stay in place (16 q), which saves their shift;
                    // the low sub-block's scale is taken 16 times to match, and the
                    // total, 16 times the exact integer, is shifted back below.
                    let mask = if hi == 1 { m4h } else { m4 };
                    let w = raw.map(|r| _mm512_and_si512(r, mask));
                    let sc = sc16(p.add(2 * (32 + 8 * j)));
                    let sc = if hi == 1 {
                        sc
                    } else {
                        _mm512_slli_epi32::<4>(sc)
                    };
                    for (m, tot) in tot.iter_mut().enumerate() {
                        let a = &*acts.add(m * nb + b);
                        let isum = isum8::<N>(&w, a.qs.as_ptr().add(32 * j), None);
                        *tot = _mm512_add_epi32(*tot, _mm512_mullo_epi32(isum, sc));
                    }
                }
            }
            // Each lane's four mins of sub-blocks 4t..4t + 4 meet the activation's
            // sums in two parts (`SubSums`): Σ m·sum = Σ m·lo + 128·Σ m·hi, exactly.
            let mins = [0, 1].map(|t| ld16(p.add(2 * (Q4K_MINS + 32 * t))));
            let mut msum = [_mm512_setzero_si512(); N];
            for (m, ms) in msum.iter_mut().enumerate() {
                let s = &*sums.add(m * nb + b);
                let part = |acc: __m512i, i: usize| {
                    let x = _mm512_dpbusd_epi32(acc, mins[0], _mm512_set1_epi32(s[i]));
                    _mm512_dpbusd_epi32(x, mins[1], _mm512_set1_epi32(s[i + 1]))
                };
                let hi = part(_mm512_setzero_si512(), 2);
                *ms = part(_mm512_slli_epi32::<7>(hi), 0);
            }
            let dw = ld16_f16(p);
            let dmw = ld16_f16(p.add(2 * 16));
            for m in 0..N {
                let da = _mm512_set1_ps((*acts.add(m * nb + b)).d);
                // 16 · Σ fits i32 (at most 16 · 8 · 32 · 15 · 128 · 63 < 2^29) and is a
                // multiple of 16, so the arithmetic shift gives the exact sum back.
                let t = _mm512_srai_epi32::<4>(tot[m]);
                acc[m] = _mm512_fmadd_ps(_mm512_mul_ps(dw, da), _mm512_cvtepi32_ps(t), acc[m]);
                acc[m] =
                    _mm512_fnmadd_ps(_mm512_mul_ps(dmw, da), _mm512_cvtepi32_ps(msum[m]), acc[m]);
            }
        }
    }
    store(&acc, out);
}

/// Sixteen rows' u8 scales at `p` as i32 lanes.
///
/// # Safety
/// `p..p + 16` must be readable.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn sc16(p: *const u8) -> __m512i {
    // SAFETY: the caller guarantees the range.
    unsafe { _mm512_cvtepu8_epi32(_mm_loadu_si128(p.cast())) }
}

/// Q6_K over `N` activation rows (see `interleave_x86`'s `q6k`).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q6k<const N: usize>(
    pair: *const u8,
    nb: usize,
    acts: *const BlockQ8K,
    _sums: *const SubSums,
    out: &mut [[f32; R16]; ACT_ROWS],
) {
    let m4 = _mm512_set1_epi8(0x0f);
    let m30 = _mm512_set1_epi8(0x30);
    let mut acc = [_mm512_setzero_ps(); N];
    for b in 0..nb {
        // SAFETY: the wrapper checked that `nb` group blocks of both groups and `N * nb`
        // activation blocks are readable.
        unsafe {
            let p = pair.add(2 * b * Q6K_GROUP_BLOCK);
            let mut sc = [_mm512_setzero_si512(); 8];
            for (t, sc) in sc.iter_mut().enumerate() {
                let both = _mm256_loadu_si256(p.add(2 * (16 + 16 * t)).cast());
                *sc = _mm512_cvtepi8_epi16(both);
            }
            let mut tot = [_mm512_setzero_si512(); N];
            for (j, sc_j) in sc.iter().enumerate() {
                let q = p.add(2 * (144 + 192 * j));
                let qh = [ld16(q.add(2 * (128))), ld16(q.add(2 * (160)))];
                let mut w = [_mm512_setzero_si512(); 8];
                for c in 0..4 {
                    let raw = ld16(q.add(2 * (32 * c)));
                    let hi = _mm512_srli_epi16::<4>(raw);
                    w[c] = _mm512_ternarylogic_epi32::<0xF8>(top2(qh[0], c, m30), raw, m4);
                    w[c + 4] = _mm512_ternarylogic_epi32::<0xF8>(top2(qh[1], c, m30), hi, m4);
                }
                let sc_lo = _mm512_srai_epi32::<16>(_mm512_slli_epi32::<16>(*sc_j));
                let sc_hi = _mm512_srai_epi32::<16>(*sc_j);
                for (m, tot) in tot.iter_mut().enumerate() {
                    let a = (*acts.add(m * nb + b)).qs.as_ptr().add(32 * j);
                    let (mut lo, mut hi) = (_mm512_setzero_si512(), _mm512_setzero_si512());
                    for k in 0..4 {
                        lo = _mm512_dpbusd_epi32(lo, w[k], bcast4(a, k));
                        hi = _mm512_dpbusd_epi32(hi, w[k + 4], bcast4(a, k + 4));
                    }
                    let s = _mm512_add_epi32(
                        _mm512_mullo_epi32(lo, sc_lo),
                        _mm512_mullo_epi32(hi, sc_hi),
                    );
                    *tot = _mm512_add_epi32(*tot, s);
                }
            }
            let dw = ld16_f16(p);
            for m in 0..N {
                let a = &*acts.add(m * nb + b);
                let corr = scale_bsums(&sc, a);
                let tot = _mm512_sub_epi32(tot[m], _mm512_slli_epi32::<5>(corr));
                acc[m] = _mm512_fmadd_ps(
                    _mm512_mul_ps(dw, _mm512_set1_ps(a.d)),
                    _mm512_cvtepi32_ps(tot),
                    acc[m],
                );
            }
        }
    }
    store(&acc, out);
}

/// `Σ_t pair[t]·bsum_pair[t]` per row (`vpdpwssd`), as `interleave_x86`'s
/// `scale_bsums_vnni`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn scale_bsums(pairs: &[__m512i; 8], a: &BlockQ8K) -> __m512i {
    let mut s = _mm512_setzero_si512();
    for (t, p) in pairs.iter().enumerate() {
        s = _mm512_dpwssd_epi32(s, *p, _mm512_set1_epi32(bsum_pair(a, t)));
    }
    s
}

/// As `interleave_x86::top2` on 512-bit registers: the top two bits of vector `t` at
/// bits 4 and 5.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn top2(qh: __m512i, t: usize, m30: __m512i) -> __m512i {
    let v = match t {
        0 => _mm512_slli_epi16::<4>(qh),
        1 => _mm512_slli_epi16::<2>(qh),
        2 => qh,
        _ => _mm512_srli_epi16::<2>(qh),
    };
    _mm512_and_si512(v, m30)
}

//! The interleaved (R8) kernels for x86-64: one body per SIMD family, each giving the bits
//! of `interleave::r8_ref` (see `interleave` for the layout and the arithmetic).
//!
//! Per group block, the eight rows' quants are unpacked once into eight vectors of four
//! columns × eight rows; every activation row then takes eight broadcasts of four bytes
//! and eight integer dot steps into one exact `i32` per row. The AVX2 family forms those
//! with `vpmaddubsw` (Q4: the eight 16-bit partial sums stay below 2¹⁵, since nibbles
//! are at most 15 and activations at most 127 in magnitude) and one `vpmaddwd`; the VNNI
//! family with `vpdpbusd`.

use super::interleave::{
    check_r8, check_r8k, R8Fn, R8KFn, Q4K_GROUP_BLOCK, Q4K_MINS, Q6K_GROUP_BLOCK, R8,
};
use super::{BlockQ8, BlockQ8K, GgmlType};
use std::arch::x86_64::*;

/// The AVX2 kernel for `ty` (an interleaved type).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
pub(super) unsafe fn kernel(ty: GgmlType) -> R8Fn {
    match ty {
        GgmlType::Q4_0 => avx2::r8_q4_0,
        GgmlType::Q4_1 => avx2::r8_q4_1,
        _ => avx2::r8_q8_0,
    }
}

/// The AVX-512 VNNI kernel for `ty`, bit-identical to [`kernel`].
///
/// # Safety
/// The CPU must support AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI.
pub(super) unsafe fn kernel_vnni(ty: GgmlType) -> R8Fn {
    match ty {
        GgmlType::Q4_0 => vnni::r8_q4_0,
        GgmlType::Q4_1 => vnni::r8_q4_1,
        _ => vnni::r8_q8_0,
    }
}

/// The AVX2 kernel for K-quant `ty` (Q4_K or Q6_K).
///
/// # Safety
/// As [`kernel`].
pub(super) unsafe fn kernel_k(ty: GgmlType) -> R8KFn {
    match ty {
        GgmlType::Q4_K => avx2::r8_q4_k,
        _ => avx2::r8_q6_k,
    }
}

/// The AVX-512 VNNI kernel for K-quant `ty`, bit-identical to [`kernel_k`].
///
/// # Safety
/// As [`kernel_vnni`].
pub(super) unsafe fn kernel_k_vnni(ty: GgmlType) -> R8KFn {
    match ty {
        GgmlType::Q4_K => vnni::r8_q4_k,
        _ => vnni::r8_q6_k,
    }
}

/// Four activation bytes (columns `4k..4k + 4` of `a`) in every 32-bit lane.
///
/// # Safety
/// `a + 4k .. a + 4k + 4` must be readable.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn bcast4(a: *const i8, k: usize) -> __m256i {
    // SAFETY: the caller guarantees the four bytes are readable.
    unsafe { _mm256_set1_epi32(a.add(4 * k).cast::<i32>().read_unaligned()) }
}

/// Q4 `Σ q·a` per row with `vpmaddubsw`: eight 16-bit partial sums (each below 2¹⁵ in
/// magnitude, see the module docs), widened once.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn isum_u4_avx2(w: &[__m256i; 8], a: *const i8) -> __m256i {
    // SAFETY: `a` points at a block's 32 quants (the caller's contract).
    unsafe {
        let mut s = _mm256_maddubs_epi16(w[0], bcast4(a, 0));
        for (k, wk) in w.iter().enumerate().skip(1) {
            s = _mm256_add_epi16(s, _mm256_maddubs_epi16(*wk, bcast4(a, k)));
        }
        _mm256_madd_epi16(s, _mm256_set1_epi16(1))
    }
}

/// Q4 `Σ q·a` per row with `vpdpbusd`.
#[target_feature(enable = "avx2,avx512f,avx512vl,avx512vnni")]
#[inline]
unsafe fn isum_u4_vnni(w: &[__m256i; 8], a: *const i8) -> __m256i {
    // SAFETY: as above.
    unsafe {
        let mut s = _mm256_setzero_si256();
        for (k, wk) in w.iter().enumerate() {
            s = _mm256_dpbusd_epi32(s, *wk, bcast4(a, k));
        }
        s
    }
}

/// [`isum_u4_avx2`] of two sub-blocks (`lo` against `a_lo`, `hi` against `a_hi`).
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn isum2_u4_avx2(
    lo: &[__m256i; 8],
    hi: &[__m256i; 8],
    a_lo: *const i8,
    a_hi: *const i8,
) -> (__m256i, __m256i) {
    // SAFETY: the caller's contract, for each sub-block.
    unsafe { (isum_u4_avx2(lo, a_lo), isum_u4_avx2(hi, a_hi)) }
}

/// [`isum_u4_vnni`] of two sub-blocks in four interleaved chains of four `vpdpbusd`:
/// one chain of eight per sub-block left the decode kernels waiting on its latency.
#[target_feature(enable = "avx2,avx512f,avx512vl,avx512vnni")]
#[inline]
unsafe fn isum2_u4_vnni(
    lo: &[__m256i; 8],
    hi: &[__m256i; 8],
    a_lo: *const i8,
    a_hi: *const i8,
) -> (__m256i, __m256i) {
    // SAFETY: as above.
    unsafe {
        let mut s = [_mm256_setzero_si256(); 4];
        for k in (0..8).step_by(2) {
            s[0] = _mm256_dpbusd_epi32(s[0], lo[k], bcast4(a_lo, k));
            s[1] = _mm256_dpbusd_epi32(s[1], hi[k], bcast4(a_hi, k));
            s[2] = _mm256_dpbusd_epi32(s[2], lo[k + 1], bcast4(a_lo, k + 1));
            s[3] = _mm256_dpbusd_epi32(s[3], hi[k + 1], bcast4(a_hi, k + 1));
        }
        (_mm256_add_epi32(s[0], s[2]), _mm256_add_epi32(s[1], s[3]))
    }
}

/// Q6_K `Σ q·a` per row over columns 0..16 and 16..32 of a sub-block with
/// `vpmaddubsw`: two products of codes below 64 stay below 2¹⁵ in magnitude, so each
/// pair of them is added in 16 bits before widening.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn isum_u6_avx2(w: &[__m256i; 8], a: *const i8) -> (__m256i, __m256i) {
    // SAFETY: `a` points at a sub-block's 32 quants (the caller's contract).
    unsafe {
        let ones = _mm256_set1_epi16(1);
        let pair = |k: usize| {
            let p0 = _mm256_maddubs_epi16(w[k], bcast4(a, k));
            let p1 = _mm256_maddubs_epi16(w[k + 1], bcast4(a, k + 1));
            _mm256_madd_epi16(_mm256_add_epi16(p0, p1), ones)
        };
        (
            _mm256_add_epi32(pair(0), pair(2)),
            _mm256_add_epi32(pair(4), pair(6)),
        )
    }
}

/// Q6_K `Σ q·a` per row over columns 0..16 and 16..32 of a sub-block with `vpdpbusd`.
#[target_feature(enable = "avx2,avx512f,avx512vl,avx512vnni")]
#[inline]
unsafe fn isum_u6_vnni(w: &[__m256i; 8], a: *const i8) -> (__m256i, __m256i) {
    // SAFETY: as above.
    unsafe {
        let (mut lo, mut hi) = (_mm256_setzero_si256(), _mm256_setzero_si256());
        for k in 0..4 {
            lo = _mm256_dpbusd_epi32(lo, w[k], bcast4(a, k));
            hi = _mm256_dpbusd_epi32(hi, w[k + 4], bcast4(a, k + 4));
        }
        (lo, hi)
    }
}

/// `Σ_t sc_pair[t]·bsum_pair[t]` per row (`vpmaddwd`): i16 pairs of scales (or mins)
/// against pairs of the activation's 16-column sums, exact.
#[target_feature(enable = "avx2")]
#[inline]
fn scale_bsums_avx2(sc: &[__m256i; 8], a: &BlockQ8K) -> __m256i {
    let mut s = _mm256_setzero_si256();
    for (t, sc) in sc.iter().enumerate() {
        let b = _mm256_set1_epi32(bsum_pair(a, t));
        s = _mm256_add_epi32(s, _mm256_madd_epi16(*sc, b));
    }
    s
}

/// As [`scale_bsums_avx2`] with `vpdpwssd`.
#[target_feature(enable = "avx2,avx512f,avx512vl,avx512vnni")]
#[inline]
fn scale_bsums_vnni(sc: &[__m256i; 8], a: &BlockQ8K) -> __m256i {
    let mut s = _mm256_setzero_si256();
    for (t, sc) in sc.iter().enumerate() {
        s = _mm256_dpwssd_epi32(s, *sc, _mm256_set1_epi32(bsum_pair(a, t)));
    }
    s
}

/// Activation group sums `2t` (low half) and `2t + 1` (high half) as one `i32`.
#[inline(always)]
pub(super) fn bsum_pair(a: &BlockQ8K, t: usize) -> i32 {
    (a.bsums[2 * t] as u16 as u32 | (a.bsums[2 * t + 1] as u16 as u32) << 16) as i32
}

/// Q8_0 `Σ u·a` per row (`u` = weight + 128) with `vpdpbusd`; the caller subtracts
/// `128·Σa`.
#[target_feature(enable = "avx2,avx512f,avx512vl,avx512vnni")]
#[inline]
unsafe fn isum_u8_vnni(q: *const u8, a: *const i8, _a_sum: i32) -> __m256i {
    // SAFETY: `q` points at a group block's 256 quant bytes, `a` at 32 activations.
    unsafe {
        let mut s = _mm256_setzero_si256();
        for k in 0..8 {
            let u = _mm256_loadu_si256(q.add(32 * k).cast());
            s = _mm256_dpbusd_epi32(s, u, bcast4(a, k));
        }
        s
    }
}

/// Q8_0 `Σ u·a` per row with AVX2: the signed weights' magnitudes against the
/// activations carrying the weights' signs (`vpmaddubsw` cannot take 255 × 127 pairs),
/// plus `128·Σa` so that the caller's correction is the VNNI family's.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn isum_u8_avx2(q: *const u8, a: *const i8, a_sum: i32) -> __m256i {
    // SAFETY: as above.
    unsafe {
        let flip = _mm256_set1_epi8(0x80u8 as i8);
        let ones = _mm256_set1_epi16(1);
        let mut s = _mm256_set1_epi32(128 * a_sum);
        for k in 0..8 {
            let w = _mm256_xor_si256(_mm256_loadu_si256(q.add(32 * k).cast()), flip);
            let p = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(bcast4(a, k), w));
            s = _mm256_add_epi32(s, _mm256_madd_epi16(p, ones));
        }
        s
    }
}

/// `acc = fma(d_w · d_a, f32(isum), acc)`, then `fma(m_w, s_a, acc)` when `min` is given.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn finish_block(
    acc: __m256,
    isum: __m256i,
    dw: __m256,
    a: &BlockQ8,
    min: Option<__m256>,
) -> __m256 {
    let acc = _mm256_fmadd_ps(
        _mm256_mul_ps(dw, _mm256_set1_ps(a.d)),
        _mm256_cvtepi32_ps(isum),
        acc,
    );
    match min {
        Some(mw) => _mm256_fmadd_ps(mw, _mm256_set1_ps(a.s), acc),
        None => acc,
    }
}

/// Eight f16 at `p` as f32 lanes.
///
/// # Safety
/// `p..p + 16` must be readable.
#[target_feature(enable = "avx2,f16c")]
#[inline]
unsafe fn ld_f16x8(p: *const u8) -> __m256 {
    // SAFETY: the caller guarantees 16 readable bytes.
    unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
}

/// The safe entry point of one kernel: checks the lengths and picks the row count.
macro_rules! r8_wrapper {
    ($f:ident, $ty:expr, $call:ident, $min:literal) => {
        pub(super) fn $f(
            group: &[u8],
            acts: &[BlockQ8],
            isums: &[i32],
            na: usize,
            out: &mut [[f32; R8]; 4],
        ) {
            let nb = check_r8($ty, group, acts, isums, na);
            let (g, a, s) = (group.as_ptr(), acts.as_ptr(), isums.as_ptr());
            // SAFETY: lengths checked by `check_r8`; the fn pointer is only handed out
            // on CPUs with this family's features.
            unsafe {
                match na {
                    1 => $call::<1, $min>(g, nb, a, s, out),
                    2 => $call::<2, $min>(g, nb, a, s, out),
                    3 => $call::<3, $min>(g, nb, a, s, out),
                    _ => $call::<4, $min>(g, nb, a, s, out),
                }
            }
        }
    };
}

/// As `r8_wrapper!` for the K-quant kernels.
macro_rules! r8k_wrapper {
    ($f:ident, $ty:expr, $call:ident) => {
        pub(super) fn $f(group: &[u8], acts: &[BlockQ8K], na: usize, out: &mut [[f32; R8]; 4]) {
            let nb = check_r8k($ty, group, acts, na);
            let (g, a) = (group.as_ptr(), acts.as_ptr());
            // SAFETY: as in `r8_wrapper!`.
            unsafe {
                match na {
                    1 => $call::<1>(g, nb, a, out),
                    2 => $call::<2>(g, nb, a, out),
                    3 => $call::<3>(g, nb, a, out),
                    _ => $call::<4>(g, nb, a, out),
                }
            }
        }
    };
}

macro_rules! r8_family {
    ($feat:literal, $isum_u4:ident, $isum2_u4:ident, $isum_u8:ident, $isum_u6:ident, $scale_bsums:ident) => {
        /// Q4_0 (`MIN == false`, offset 8) and Q4_1 (`MIN == true`) over `N` activation
        /// rows.
        #[target_feature(enable = $feat)]
        unsafe fn q4<const N: usize, const MIN: bool>(
            g: *const u8,
            nb: usize,
            acts: *const BlockQ8,
            isums: *const i32,
            out: &mut [[f32; R8]; 4],
        ) {
            let (gbb, sb) = if MIN { (160, 32) } else { (144, 16) };
            let m4 = _mm256_set1_epi8(0x0f);
            let mut acc = [_mm256_setzero_ps(); N];
            for b in 0..nb {
                // SAFETY: the wrapper checked that `nb` group blocks and `N * nb`
                // activation blocks and sums are readable.
                unsafe {
                    let p = g.add(b * gbb);
                    let dw = ld_f16x8(p);
                    let mw = if MIN { Some(ld_f16x8(p.add(16))) } else { None };
                    let mut w = [_mm256_setzero_si256(); 8];
                    for c in 0..4 {
                        let v = _mm256_loadu_si256(p.add(sb + 32 * c).cast());
                        w[c] = _mm256_and_si256(v, m4);
                        w[c + 4] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
                    }
                    for (m, acc) in acc.iter_mut().enumerate() {
                        let a = &*acts.add(m * nb + b);
                        let mut isum = $isum_u4(&w, a.qs.as_ptr());
                        if !MIN {
                            let o = _mm256_set1_epi32(8 * *isums.add(m * nb + b));
                            isum = _mm256_sub_epi32(isum, o);
                        }
                        *acc = finish_block(*acc, isum, dw, a, mw);
                    }
                }
            }
            for (o, a) in out.iter_mut().zip(acc) {
                // SAFETY: `o` holds eight f32.
                unsafe { _mm256_storeu_ps(o.as_mut_ptr(), a) };
            }
        }

        /// Q8_0 over `N` activation rows (`_MIN` is unused; it keeps `q4`'s shape).
        #[target_feature(enable = $feat)]
        unsafe fn q8<const N: usize, const _MIN: bool>(
            g: *const u8,
            nb: usize,
            acts: *const BlockQ8,
            isums: *const i32,
            out: &mut [[f32; R8]; 4],
        ) {
            let mut acc = [_mm256_setzero_ps(); N];
            for b in 0..nb {
                // SAFETY: as in `q4`.
                unsafe {
                    let p = g.add(b * 272);
                    let dw = ld_f16x8(p);
                    for (m, acc) in acc.iter_mut().enumerate() {
                        let a = &*acts.add(m * nb + b);
                        let a_sum = *isums.add(m * nb + b);
                        let isum = $isum_u8(p.add(16), a.qs.as_ptr(), a_sum);
                        let isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(128 * a_sum));
                        *acc = finish_block(*acc, isum, dw, a, None);
                    }
                }
            }
            for (o, a) in out.iter_mut().zip(acc) {
                // SAFETY: `o` holds eight f32.
                unsafe { _mm256_storeu_ps(o.as_mut_ptr(), a) };
            }
        }

        /// Q4_K over `N` activation rows.
        #[target_feature(enable = $feat)]
        unsafe fn q4k<const N: usize>(
            g: *const u8,
            nb: usize,
            acts: *const BlockQ8K,
            out: &mut [[f32; R8]; 4],
        ) {
            let m4 = _mm256_set1_epi8(0x0f);
            let mut acc = [_mm256_setzero_ps(); N];
            for b in 0..nb {
                // SAFETY: the wrapper checked that `nb` group blocks and `N * nb`
                // activation blocks are readable.
                unsafe {
                    let p = g.add(b * Q4K_GROUP_BLOCK);
                    let mut tot = [_mm256_setzero_si256(); N];
                    for pair in 0..4 {
                        // Sub-blocks 2·pair (low nibbles) and 2·pair + 1 (high).
                        let q = p.add(160 + 256 * pair);
                        let mut lo = [_mm256_setzero_si256(); 8];
                        let mut hi = [_mm256_setzero_si256(); 8];
                        for c in 0..8 {
                            let v = _mm256_loadu_si256(q.add(32 * c).cast());
                            lo[c] = _mm256_and_si256(v, m4);
                            hi[c] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
                        }
                        let sc = |j: usize| {
                            _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(32 + 8 * j).cast()))
                        };
                        let (sc_lo, sc_hi) = (sc(2 * pair), sc(2 * pair + 1));
                        for (m, tot) in tot.iter_mut().enumerate() {
                            let a = (*acts.add(m * nb + b)).qs.as_ptr().add(64 * pair);
                            let (s_lo, s_hi) = $isum2_u4(&lo, &hi, a, a.add(32));
                            let s = _mm256_add_epi32(
                                _mm256_mullo_epi32(s_lo, sc_lo),
                                _mm256_mullo_epi32(s_hi, sc_hi),
                            );
                            *tot = _mm256_add_epi32(*tot, s);
                        }
                    }
                    // Each sub-block's min twice, as the i16 pair that meets the
                    // activation's two 16-column sums in one `vpmaddwd`.
                    // (A row's mins are four to a lane; byte `i` of each lane, zero
                    // extended, twice.)
                    let mins4 = [0, 1].map(|t| _mm256_loadu_si256(p.add(Q4K_MINS + 32 * t).cast()));
                    let mins: [__m256i; 8] = std::array::from_fn(|j| {
                        let i = (j % 4) as i8;
                        // Even bytes pick byte `i` of their own 32-bit lane, odd ones zero.
                        let ctl: [i8; 32] = std::array::from_fn(|b| {
                            if b % 2 == 1 {
                                -1
                            } else {
                                4 * ((b % 16) / 4) as i8 + i
                            }
                        });
                        let ctl = _mm256_loadu_si256(ctl.as_ptr().cast());
                        _mm256_shuffle_epi8(mins4[j / 4], ctl)
                    });
                    let mut msum = [_mm256_setzero_si256(); N];
                    for (m, ms) in msum.iter_mut().enumerate() {
                        *ms = $scale_bsums(&mins, &*acts.add(m * nb + b));
                    }
                    let dw = ld_f16x8(p);
                    let dmw = ld_f16x8(p.add(16));
                    for m in 0..N {
                        let da = _mm256_set1_ps((*acts.add(m * nb + b)).d);
                        acc[m] = _mm256_fmadd_ps(
                            _mm256_mul_ps(dw, da),
                            _mm256_cvtepi32_ps(tot[m]),
                            acc[m],
                        );
                        acc[m] = _mm256_fnmadd_ps(
                            _mm256_mul_ps(dmw, da),
                            _mm256_cvtepi32_ps(msum[m]),
                            acc[m],
                        );
                    }
                }
            }
            for (o, a) in out.iter_mut().zip(acc) {
                // SAFETY: `o` holds eight f32.
                unsafe { _mm256_storeu_ps(o.as_mut_ptr(), a) };
            }
        }

        r8_wrapper!(r8_q4_0, GgmlType::Q4_0, q4, false);
        r8_wrapper!(r8_q4_1, GgmlType::Q4_1, q4, true);
        r8_wrapper!(r8_q8_0, GgmlType::Q8_0, q8, false);

        /// Q6_K over `N` activation rows: per sub-block the exact `Σ q·a` of each
        /// 16-column group times its scale, less `32·Σ_g sc_g·Σa_g` per super-block, then
        /// one FMA.
        #[target_feature(enable = $feat)]
        unsafe fn q6k<const N: usize>(
            g: *const u8,
            nb: usize,
            acts: *const BlockQ8K,
            out: &mut [[f32; R8]; 4],
        ) {
            let m4 = _mm256_set1_epi8(0x0f);
            let m30 = _mm256_set1_epi8(0x30);
            let mut acc = [_mm256_setzero_ps(); N];
            for b in 0..nb {
                // SAFETY: the wrapper checked that `nb` group blocks and `N * nb`
                // activation blocks are readable.
                unsafe {
                    let p = g.add(b * Q6K_GROUP_BLOCK);
                    let mut sc = [_mm256_setzero_si256(); 8];
                    for (t, sc) in sc.iter_mut().enumerate() {
                        *sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(16 + 16 * t).cast()));
                    }
                    let mut tot = [_mm256_setzero_si256(); N];
                    for j in 0..8 {
                        let q = p.add(144 + 192 * j);
                        let qh = [
                            _mm256_loadu_si256(q.add(128).cast()),
                            _mm256_loadu_si256(q.add(160).cast()),
                        ];
                        let mut w = [_mm256_setzero_si256(); 8];
                        for c in 0..4 {
                            let raw = _mm256_loadu_si256(q.add(32 * c).cast());
                            let lo = _mm256_and_si256(raw, m4);
                            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), m4);
                            w[c] = _mm256_or_si256(lo, top2(qh[0], c, m30));
                            w[c + 4] = _mm256_or_si256(hi, top2(qh[1], c, m30));
                        }
                        // Scales 2j and 2j + 1 of each row as i32 lanes.
                        let sc_lo = _mm256_srai_epi32::<16>(_mm256_slli_epi32::<16>(sc[j]));
                        let sc_hi = _mm256_srai_epi32::<16>(sc[j]);
                        for (m, tot) in tot.iter_mut().enumerate() {
                            let a = &*acts.add(m * nb + b);
                            let (lo, hi) = $isum_u6(&w, a.qs.as_ptr().add(32 * j));
                            let s = _mm256_add_epi32(
                                _mm256_mullo_epi32(lo, sc_lo),
                                _mm256_mullo_epi32(hi, sc_hi),
                            );
                            *tot = _mm256_add_epi32(*tot, s);
                        }
                    }
                    let dw = ld_f16x8(p);
                    for m in 0..N {
                        let a = &*acts.add(m * nb + b);
                        let corr = _mm256_slli_epi32::<5>($scale_bsums(&sc, a));
                        let tot = _mm256_sub_epi32(tot[m], corr);
                        acc[m] = _mm256_fmadd_ps(
                            _mm256_mul_ps(dw, _mm256_set1_ps(a.d)),
                            _mm256_cvtepi32_ps(tot),
                            acc[m],
                        );
                    }
                }
            }
            for (o, a) in out.iter_mut().zip(acc) {
                // SAFETY: `o` holds eight f32.
                unsafe { _mm256_storeu_ps(o.as_mut_ptr(), a) };
            }
        }

        r8k_wrapper!(r8_q4_k, GgmlType::Q4_K, q4k);
        r8k_wrapper!(r8_q6_k, GgmlType::Q6_K, q6k);
    };
}

/// The top two bits of vector `t` of a Q6_K top-bit chunk `qh` (bits `2t..2t + 2` of
/// each byte), moved to bits 4 and 5. Sixteen-bit shifts are enough: the mask drops
/// what crosses a byte boundary.
#[target_feature(enable = "avx2")]
#[inline]
fn top2(qh: __m256i, t: usize, m30: __m256i) -> __m256i {
    let v = match t {
        0 => _mm256_slli_epi16::<4>(qh),
        1 => _mm256_slli_epi16::<2>(qh),
        2 => qh,
        _ => _mm256_srli_epi16::<2>(qh),
    };
    _mm256_and_si256(v, m30)
}

/// The AVX2 family.
mod avx2 {
    use super::*;
    r8_family!(
        "avx2,fma,f16c",
        isum_u4_avx2,
        isum2_u4_avx2,
        isum_u8_avx2,
        isum_u6_avx2,
        scale_bsums_avx2
    );
}

/// The AVX-512 VNNI family (256-bit `vpdpbusd`, which needs AVX512VL).
mod vnni {
    use super::*;
    r8_family!(
        "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
        isum_u4_vnni,
        isum2_u4_vnni,
        isum_u8_vnni,
        isum_u6_vnni,
        scale_bsums_vnni
    );
}

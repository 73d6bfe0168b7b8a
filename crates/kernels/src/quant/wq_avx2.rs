//! AVX2 twins of the checkpoint-format kernels of `wq`, bit for bit.

use super::dot_avx2::{act, dot_ss, dot_us, fma_block, hsum_epi32, hsum_ps, ld256};
use super::dot_scalar::{check_f32, check_q};
use super::wq::{check_i8_tok, check_u4};
use super::{BlockQ8, GgmlType};
use std::arch::x86_64::*;

#[target_feature(enable = "avx2,fma")]
unsafe fn i8_imp<const N: usize>(w: *const u8, a: *const BlockQ8, nb: usize, out: &mut [f32; 4]) {
    let mut acc = [_mm256_setzero_ps(); N];
    for b in 0..nb {
        // SAFETY: the wrapper checked that the row holds `nb` chunks of 32 bytes and
        // `a` holds N rows of `nb` blocks.
        let wq = unsafe { ld256(w.add(32 * b)) };
        let wa = _mm256_sign_epi8(wq, wq);
        for (i, acc) in acc.iter_mut().enumerate() {
            // SAFETY: as above.
            let y = unsafe { &*a.add(i * nb + b) };
            *acc = fma_block(dot_ss(wa, wq, act(y)), y.d, *acc);
        }
    }
    for (o, acc) in out.iter_mut().zip(acc) {
        *o = hsum_ps(acc);
    }
}

pub(super) fn dot_i8(w_row: &[u8], acts: &[BlockQ8], n_act: usize, out: &mut [f32; 4]) {
    let nb = check_q(GgmlType::I8, w_row, acts.len(), 32, n_act);
    let (w, a) = (w_row.as_ptr(), acts.as_ptr());
    // SAFETY: shapes checked above; handed out only when AVX2 + FMA were detected.
    unsafe {
        match n_act {
            1 => i8_imp::<1>(w, a, nb, out),
            2 => i8_imp::<2>(w, a, nb, out),
            3 => i8_imp::<3>(w, a, nb, out),
            _ => i8_imp::<4>(w, a, nb, out),
        }
    }
}

/// The 32 nibbles of 16 `U4` bytes at `p` in element order (element `2j` is the low
/// nibble of byte `j`): each byte widened to a 16-bit lane `0x00hl` becomes `0x0h0l`.
///
/// # Safety
/// `p..p+16` must be readable.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn u4_nibbles(p: *const u8) -> __m256i {
    // SAFETY: caller guarantees 16 readable bytes.
    let x = _mm256_cvtepu8_epi16(unsafe { _mm_loadu_si128(p.cast()) });
    _mm256_and_si256(
        _mm256_or_si256(x, _mm256_slli_epi16::<4>(x)),
        _mm256_set1_epi16(0x0F0F),
    )
}

/// # Safety
/// AVX2 and FMA available; `w` holds `nb` chunks of 16 bytes, `a` and `sums` hold `N`
/// rows of `nb` blocks, `scales` (and `zeros`) one entry per `per_group` chunks.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
unsafe fn u4_imp<const N: usize>(
    w: *const u8,
    scales: &[f32],
    zeros: Option<&[u8]>,
    per_group: usize,
    a: *const BlockQ8,
    sums: *const f32,
    nb: usize,
    out: &mut [f32; 4],
) {
    let mut acc = [_mm256_setzero_ps(); N];
    let mut corr = [0f32; N];
    for (g, &s) in scales.iter().enumerate().take(nb / per_group) {
        let b0 = g * per_group;
        let mut acc_g = [_mm256_setzero_ps(); N];
        for b in b0..b0 + per_group {
            // SAFETY: the row holds `nb` chunks of 16 bytes (checked by the wrapper).
            let q = unsafe { u4_nibbles(w.add(16 * b)) };
            for (i, acc_g) in acc_g.iter_mut().enumerate() {
                // SAFETY: `a` holds N rows of `nb` blocks.
                let y = unsafe { &*a.add(i * nb + b) };
                let p = _mm256_cvtepi32_ps(dot_us(q, act(y)));
                *acc_g = _mm256_fmadd_ps(p, _mm256_set1_ps(y.d), *acc_g);
            }
        }
        let zs = s * zeros.map_or(8, |z| z[g]) as f32;
        for i in 0..N {
            acc[i] = _mm256_fmadd_ps(acc_g[i], _mm256_set1_ps(s), acc[i]);
            let mut m = 0f32;
            for b in b0..b0 + per_group {
                // SAFETY: `sums` holds N rows of `nb` values.
                m += unsafe { *sums.add(i * nb + b) };
            }
            corr[i] = zs.mul_add(m, corr[i]);
        }
    }
    for ((o, acc), c) in out.iter_mut().zip(acc).zip(corr) {
        *o = hsum_ps(acc) - c;
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn dot_u4(
    w_row: &[u8],
    scales: &[f32],
    zeros: Option<&[u8]>,
    group: usize,
    acts: &[BlockQ8],
    sums: &[f32],
    n_act: usize,
    out: &mut [f32; 4],
) {
    let nb = check_u4(w_row, scales, zeros, group, acts, sums, n_act);
    let (w, a, sm, pg) = (w_row.as_ptr(), acts.as_ptr(), sums.as_ptr(), group / 32);
    // SAFETY: shapes checked above; handed out only when AVX2 + FMA were detected.
    unsafe {
        match n_act {
            1 => u4_imp::<1>(w, scales, zeros, pg, a, sm, nb, out),
            2 => u4_imp::<2>(w, scales, zeros, pg, a, sm, nb, out),
            3 => u4_imp::<3>(w, scales, zeros, pg, a, sm, nb, out),
            _ => u4_imp::<4>(w, scales, zeros, pg, a, sm, nb, out),
        }
    }
}

#[target_feature(enable = "avx2")]
unsafe fn i8_tok_imp<const N: usize>(w: *const u8, a: *const i8, cols: usize, out: &mut [f32; 4]) {
    let mut acc = [_mm256_setzero_si256(); N];
    for c in (0..cols).step_by(32) {
        // SAFETY: the row has `cols` bytes, a multiple of 32 (checked by the wrapper).
        let wq = unsafe { ld256(w.add(c)) };
        let wa = _mm256_sign_epi8(wq, wq);
        for (i, acc) in acc.iter_mut().enumerate() {
            // SAFETY: `a` holds N rows of `cols` values.
            let x = unsafe { ld256(a.add(i * cols + c).cast()) };
            *acc = _mm256_add_epi32(*acc, dot_ss(wa, wq, x));
        }
    }
    for (o, acc) in out.iter_mut().zip(acc) {
        *o = hsum_epi32(acc) as f32;
    }
}

pub(super) fn dot_i8_tok(w_row: &[u8], acts: &[i8], n_act: usize, out: &mut [f32; 4]) {
    let cols = check_i8_tok(w_row, acts, n_act);
    let (w, a) = (w_row.as_ptr(), acts.as_ptr());
    // SAFETY: shapes checked above; handed out only when AVX2 was detected.
    unsafe {
        match n_act {
            1 => i8_tok_imp::<1>(w, a, cols, out),
            2 => i8_tok_imp::<2>(w, a, cols, out),
            3 => i8_tok_imp::<3>(w, a, cols, out),
            _ => i8_tok_imp::<4>(w, a, cols, out),
        }
    }
}

/// Eight E4M3 bytes at `p` as f32 (see `wq::e4m3_to_f32`).
///
/// # Safety
/// `p..p+8` must be readable.
#[target_feature(enable = "avx2,f16c")]
#[inline]
unsafe fn e4m3x8(p: *const u8) -> __m256 {
    // SAFETY: caller guarantees eight readable bytes.
    let h = _mm_cvtepu8_epi16(unsafe { _mm_loadl_epi64(p.cast()) });
    let sign = _mm_slli_epi16::<8>(_mm_and_si128(h, _mm_set1_epi16(0x80)));
    let mag = _mm_slli_epi16::<7>(_mm_and_si128(h, _mm_set1_epi16(0x7F)));
    _mm256_mul_ps(
        _mm256_cvtph_ps(_mm_or_si128(sign, mag)),
        _mm256_set1_ps(256.0),
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f8_imp<const N: usize>(w: *const u8, a: *const f32, cols: usize, out: &mut [f32; 4]) {
    let mut acc = [[_mm256_setzero_ps(); 4]; N];
    for c in (0..cols).step_by(32) {
        for k in 0..4 {
            // SAFETY: the row has `cols` bytes, a multiple of 32; `a` holds N rows of
            // `cols` floats (checked by the wrapper).
            let f = unsafe { e4m3x8(w.add(c + 8 * k)) };
            for (i, acc) in acc.iter_mut().enumerate() {
                // SAFETY: as above.
                let x = unsafe { _mm256_loadu_ps(a.add(i * cols + c + 8 * k)) };
                acc[k] = _mm256_fmadd_ps(f, x, acc[k]);
            }
        }
    }
    for (o, acc) in out.iter_mut().zip(acc) {
        let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        *o = hsum_ps(s);
    }
}

pub(super) fn dot_f8(w_row: &[u8], acts: &[f32], n_act: usize, out: &mut [f32; 4]) {
    let cols = check_f32(GgmlType::F8E4M3, w_row, acts, n_act);
    assert!(
        cols.is_multiple_of(32),
        "F8E4M3 rows need a multiple of 32 columns"
    );
    let (w, a) = (w_row.as_ptr(), acts.as_ptr());
    // SAFETY: shapes checked above; handed out only when AVX2, FMA and F16C were
    // detected.
    unsafe {
        match n_act {
            1 => f8_imp::<1>(w, a, cols, out),
            2 => f8_imp::<2>(w, a, cols, out),
            3 => f8_imp::<3>(w, a, cols, out),
            _ => f8_imp::<4>(w, a, cols, out),
        }
    }
}

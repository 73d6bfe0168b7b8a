//! The AVX2 bodies of the attention kernels (see the parent module): every addition
//! and fused multiply-add is the portable twin's, in the same order.

use std::arch::x86_64::*;

/// `scores[j] = (q · k_j) * scale`, the dot product summed in `8 * R` lanes (element
/// `i` in lane `i mod 8R`, register `r` holding lanes `8r..8r + 8`) and reduced as
/// `reduce32` (R = 4) or `reduce8` (R = 1) do.
///
/// # Safety
/// AVX2/FMA; `q.len()` a multiple of 8; `k` holds `scores.len()` rows of `q.len()`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn scores<const R: usize>(q: &[f32], k: &[f32], scale: f32, scores: &mut [f32]) {
    let hd = q.len();
    let w = 8 * R;
    let (full, rem) = (hd / w, (hd % w) / 8);
    // A prompt's keys eight at a time: eight independent chains, reduced together.
    // (A decode's four registers per key would not fit eight keys in registers.)
    let n8 = if R == 1 { scores.len() / 8 * 8 } else { 0 };
    for j0 in (0..n8).step_by(8) {
        // SAFETY: rows j0..j0 + 8 of `k` are in bounds (contract).
        unsafe { scores8(q, k.as_ptr().add(j0 * hd), scale, &mut scores[j0..j0 + 8]) };
    }
    let q = q.as_ptr();
    for (j, s) in scores.iter_mut().enumerate().skip(n8) {
        // SAFETY: row j of `k` and all of `q` are in bounds by the contract above.
        unsafe {
            let kj = k.as_ptr().add(j * hd);
            let mut acc = [_mm256_setzero_ps(); R];
            for c in 0..full {
                for (r, a) in acc.iter_mut().enumerate() {
                    let o = c * w + 8 * r;
                    *a = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(o)), _mm256_loadu_ps(kj.add(o)), *a);
                }
            }
            for (r, a) in acc.iter_mut().enumerate().take(rem) {
                let o = full * w + 8 * r;
                *a = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(o)), _mm256_loadu_ps(kj.add(o)), *a);
            }
            *s = reduce(&acc) * scale;
        }
    }
}

/// [`scores`]`::<1>` for eight consecutive rows of `k` from `k8`: the same lane sums
/// (each query chunk loaded once for the eight rows), and the same additions of
/// `reduce8` for each row, done for the eight rows side by side (lane-wise additions
/// of transposed halves instead of one shuffle chain per row).
///
/// # Safety
/// AVX2/FMA; `q.len()` a multiple of 8; `k8` points at 8 rows of `q.len()` values;
/// `out.len() == 8`.
#[target_feature(enable = "avx2,fma")]
unsafe fn scores8(q: &[f32], k8: *const f32, scale: f32, out: &mut [f32]) {
    let hd = q.len();
    let qp = q.as_ptr();
    // Each row's eight lanes, summed over the chunks in order.
    let mut x = [_mm256_setzero_ps(); 8];
    for c in 0..hd / 8 {
        // SAFETY: chunk c of `q` and of each of the eight rows is in bounds.
        unsafe {
            let qc = _mm256_loadu_ps(qp.add(8 * c));
            for (row, xr) in x.iter_mut().enumerate() {
                *xr = _mm256_fmadd_ps(qc, _mm256_loadu_ps(k8.add(row * hd + 8 * c)), *xr);
            }
        }
    }
    // SAFETY: `out` holds eight values (contract).
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), reduce_rows8(&x, scale)) };
}

/// [`scores`]`::<1>` of `G` queries (`qs`: `G` rows of `hd`) against the same keys,
/// into `outs[g][..n]`. Every key chunk loaded feeds the `G` queries, which is what
/// lets a grouped-query head group share its keys; each query's lane sums and
/// reductions are [`scores8`]'s, in the same order. The 8 × `G` accumulators need
/// AVX-512's 32 vector registers.
///
/// # Safety
/// AVX2/FMA/AVX-512 F+VL; `hd` a multiple of 8; `qs.len() == G * hd`; `outs` has at
/// least `G` rows of at least `n` values; `k` holds `n` rows of `hd`.
#[target_feature(enable = "avx2,fma,avx512f,avx512vl")]
#[allow(clippy::needless_range_loop)] // indices name the register tile's (head, row)
pub(super) unsafe fn scores_heads<const G: usize>(
    qs: &[f32],
    k: &[f32],
    scale: f32,
    n: usize,
    outs: &mut [Vec<f32>],
) {
    let hd = qs.len() / G;
    assert!(hd.is_multiple_of(8) && qs.len() == G * hd && k.len() >= n * hd && outs.len() >= G);
    assert!(outs[..G].iter().all(|o| o.len() >= n));
    let n8 = n / 8 * 8;
    for j0 in (0..n8).step_by(8) {
        let mut x = [[_mm256_setzero_ps(); 8]; G];
        for c in 0..hd / 8 {
            // SAFETY: chunk c of every query and of rows j0..j0 + 8 is in bounds.
            unsafe {
                let qc: [__m256; G] =
                    std::array::from_fn(|g| _mm256_loadu_ps(qs.as_ptr().add(g * hd + 8 * c)));
                for row in 0..8 {
                    let kc = _mm256_loadu_ps(k.as_ptr().add((j0 + row) * hd + 8 * c));
                    for g in 0..G {
                        x[g][row] = _mm256_fmadd_ps(qc[g], kc, x[g][row]);
                    }
                }
            }
        }
        for (x, o) in x.iter().zip(outs.iter_mut()) {
            // SAFETY: `o` holds at least n >= j0 + 8 values.
            unsafe { _mm256_storeu_ps(o.as_mut_ptr().add(j0), reduce_rows8(x, scale)) };
        }
    }
    for (g, o) in outs[..G].iter_mut().enumerate() {
        // SAFETY: rows n8..n of `k`; AVX2/FMA as above.
        unsafe {
            scores::<1>(
                &qs[g * hd..(g + 1) * hd],
                &k[n8 * hd..n * hd],
                scale,
                &mut o[n8..n],
            )
        };
    }
}

/// One decode token's attention for the query heads of one key/value head: `qs` holds
/// their queries (`group` rows of `hd`), `out` their outputs; keys and values of
/// positions `0..n` are read at `krow(j)` and `vrow(j)` (f16 when `F16`, else f32).
/// Scores three heads per key read, the softmax, then the values weighted three heads per
/// value read: for every head exactly the operations of [`scores`]`::<4>`,
/// `softmax_ggml` and [`weighted_sum`]`::<32>`. `ahead(j0)` is called before key rows
/// `j0..j0 + 8` are read.
///
/// # Safety
/// AVX2/FMA/F16C/AVX-512 F+VL; `hd` a multiple of 32; `qs.len() == out.len()`, a
/// multiple of `hd`; `krow(j)` and `vrow(j)` point at `hd` readable values for `j < n`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn decode_token<const F16: bool>(
    qs: &[f32],
    hd: usize,
    n: usize,
    krow: impl Fn(usize) -> *const u8 + Copy,
    vrow: impl Fn(usize) -> *const u8 + Copy,
    ahead: impl Fn(usize) + Copy,
    scale: f32,
    probs: &mut Vec<Vec<f32>>,
    lanes: &mut Vec<Vec<f32>>,
    out: &mut [f32],
) {
    assert!(hd > 0 && qs.len() == out.len() && qs.len().is_multiple_of(hd));
    let group = qs.len() / hd;
    probs.resize_with(group, Vec::new);
    lanes.resize_with(group, Vec::new);
    for p in probs.iter_mut() {
        p.resize(n, 0.0);
    }
    // SAFETY: the caller's contract; every sub-group's queries, probabilities and
    // outputs are in bounds.
    unsafe {
        let mut g = 0;
        while g < group {
            // Prefetching once per row is enough: the first sub-group asks for it.
            let first = g == 0;
            let ahead = |j0| {
                if first {
                    ahead(j0)
                }
            };
            let (qg, pg) = (&qs[g * hd..], &mut probs[g..]);
            match group - g {
                1 => scores_heads_decode::<1, F16>(&qg[..hd], krow, ahead, scale, n, pg),
                2 => scores_heads_decode::<2, F16>(&qg[..2 * hd], krow, ahead, scale, n, pg),
                _ => scores_heads_decode::<3, F16>(&qg[..3 * hd], krow, ahead, scale, n, pg),
            }
            g += (group - g).min(3);
        }
        for p in probs.iter_mut() {
            crate::ops::avx2::softmax_ggml(&mut p[..n]);
        }
        let mut outs = out.chunks_exact_mut(hd);
        let mut g = 0;
        while g < group {
            let (pg, ag) = (&probs[g..], &mut lanes[g..]);
            let mut o = || outs.next().expect("one output per head");
            match group - g {
                1 => weighted_sum_heads_decode::<1, F16>(pg, n, vrow, ag, [o()]),
                2 => weighted_sum_heads_decode::<2, F16>(pg, n, vrow, ag, [o(), o()]),
                _ => weighted_sum_heads_decode::<3, F16>(pg, n, vrow, ag, [o(), o(), o()]),
            }
            g += (group - g).min(3);
        }
    }
}

/// Sixteen values of a key or value row at `p` (f16 when `F16`, else f32) as f32.
///
/// # Safety
/// AVX-512 F; 16 values of the type readable at `p`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
#[inline]
unsafe fn ld16<const F16: bool>(p: *const u8) -> __m512 {
    // SAFETY: the caller's contract.
    unsafe {
        if F16 {
            _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()))
        } else {
            _mm512_loadu_ps(p.cast())
        }
    }
}

/// [`scores`]`::<4>` (a decode's 32 lanes) of `G` queries against the same `n` keys,
/// into `outs[g][..n]`, for head sizes that are a multiple of 32. Key row `j` is read
/// at `row(j)`, as f16 (`F16`, converted in registers, so a paged cache is read in
/// place) or f32. Every key row loaded feeds the `G` queries, the lanes live in 512-bit
/// registers (lanes 0–15 and 16–31 of each 32-element chunk), and eight rows'
/// `reduce32`s are done side by side. Each score gets exactly the fused multiply-adds
/// and additions of `scores::<4>`, in its order. `ahead(j0)` is called before the rows
/// `j0..j0 + 8` are read (for prefetching).
///
/// # Safety
/// AVX2/FMA/F16C/AVX-512 F+VL; `hd` a multiple of 32; `qs.len() == G * hd`; `outs` has
/// at least `G` rows of at least `n` values; `row(j)` points at `hd` readable values for
/// every `j < n`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
#[allow(clippy::needless_range_loop)] // indices name the register tile's (head, row)
pub(super) unsafe fn scores_heads_decode<const G: usize, const F16: bool>(
    qs: &[f32],
    row: impl Fn(usize) -> *const u8,
    ahead: impl Fn(usize),
    scale: f32,
    n: usize,
    outs: &mut [Vec<f32>],
) {
    let hd = qs.len() / G;
    let esize = if F16 { 2 } else { 4 };
    assert!(hd.is_multiple_of(32) && qs.len() == G * hd && outs.len() >= G);
    assert!(outs[..G].iter().all(|o| o.len() >= n));
    let q = qs.as_ptr();
    for j0 in (0..n).step_by(8) {
        ahead(j0);
        let rows = (n - j0).min(8);
        // Rows past `n` stay zero; their lanes are reduced but never stored.
        let mut s = [[_mm256_setzero_ps(); 8]; G];
        for r in 0..rows {
            // SAFETY: row j0 + r < n (contract) and every query's chunks are in bounds.
            unsafe {
                let kr = row(j0 + r);
                // a0 = lanes 0..16 (`scores`' acc[0], acc[1]), a1 = lanes 16..32.
                let mut a0 = [_mm512_setzero_ps(); G];
                let mut a1 = [_mm512_setzero_ps(); G];
                for c in (0..hd).step_by(32) {
                    let k0 = ld16::<F16>(kr.add(c * esize));
                    let k1 = ld16::<F16>(kr.add((c + 16) * esize));
                    for g in 0..G {
                        let qg = q.add(g * hd + c);
                        a0[g] = _mm512_fmadd_ps(_mm512_loadu_ps(qg), k0, a0[g]);
                        a1[g] = _mm512_fmadd_ps(_mm512_loadu_ps(qg.add(16)), k1, a1[g]);
                    }
                }
                for g in 0..G {
                    // (acc0 + acc2) + (acc1 + acc3), as `reduce::<4>` begins.
                    let z = _mm512_add_ps(a0[g], a1[g]);
                    s[g][r] = _mm256_add_ps(
                        _mm512_castps512_ps256(z),
                        _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(z))),
                    );
                }
            }
        }
        for (x, o) in s.iter().zip(outs.iter_mut()) {
            let mut eight = [0f32; 8];
            // SAFETY: `eight` holds eight f32.
            unsafe { _mm256_storeu_ps(eight.as_mut_ptr(), reduce_rows8_r4(x, scale)) };
            o[j0..j0 + rows].copy_from_slice(&eight[..rows]);
        }
    }
}

/// `out_h[d] = Σ_j p_h[j] v_j[d]` for `H` probability rows with a decode's 32 lanes,
/// value row `j` read at `row(j)` (f16 when `F16`, else f32): [`weighted_sum_heads`]`::<32,
/// H>`'s fused multiply-adds and reductions, in its order, with each lane's partial sums
/// for 64 dimensions (or the last 32) of all `H` heads in 512-bit registers, so every
/// value row is read once.
///
/// # Safety
/// AVX2/FMA/F16C/AVX-512 F+VL; the outputs' length `hd` a multiple of 32; `ps` and `accs`
/// have at least `H` rows, the rows of `ps` at least `n` values; `row(j)` points at
/// `hd` readable values for every `j < n`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
pub(super) unsafe fn weighted_sum_heads_decode<const H: usize, const F16: bool>(
    ps: &[Vec<f32>],
    n: usize,
    row: impl Fn(usize) -> *const u8,
    accs: &mut [Vec<f32>],
    outs: [&mut [f32]; H],
) {
    const L: usize = 32;
    let hd = outs[0].len();
    assert!(hd.is_multiple_of(32) && ps.len() >= H && accs.len() >= H);
    assert!(ps[..H].iter().all(|p| p.len() >= n) && outs.iter().all(|o| o.len() == hd));
    let p: [&[f32]; H] = std::array::from_fn(|h| &ps[h][..n]);
    for acc in &mut accs[..H] {
        acc.resize(L * hd, 0.0);
    }
    let mut d0 = 0;
    // SAFETY: columns d0.. of the rows and of every accumulator are in bounds.
    unsafe {
        while d0 + 64 <= hd {
            lane_sums_heads_decode::<4, H, F16>(&p, &row, d0, hd, accs);
            d0 += 64;
        }
        if d0 < hd {
            lane_sums_heads_decode::<2, H, F16>(&p, &row, d0, hd, accs);
        }
        for (acc, o) in accs.iter().zip(outs) {
            reduce_lanes::<L>(acc, o);
        }
    }
}

/// The lane sums of [`weighted_sum_heads_decode`] for columns `d0..d0 + 16M`.
///
/// # Safety
/// As for [`weighted_sum_heads_decode`], with `d0 + 16M <= hd`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
#[inline]
#[allow(clippy::needless_range_loop)] // indices name the register tile's (head, chunk)
unsafe fn lane_sums_heads_decode<const M: usize, const H: usize, const F16: bool>(
    p: &[&[f32]; H],
    row: &impl Fn(usize) -> *const u8,
    d0: usize,
    hd: usize,
    accs: &mut [Vec<f32>],
) {
    const L: usize = 32;
    let esize = if F16 { 2 } else { 4 };
    let n = p[0].len();
    // Lanes without positions get zeros.
    for l in 0..L {
        let mut a = [[_mm512_setzero_ps(); M]; H];
        for j in (l..n).step_by(L) {
            // SAFETY: row j < n, columns d0..d0 + 16M, by the contract.
            unsafe {
                let w: [__m512; H] =
                    std::array::from_fn(|h| _mm512_set1_ps(*p[h].get_unchecked(j)));
                let vj = row(j).add(d0 * esize);
                for m in 0..M {
                    let x = ld16::<F16>(vj.add(16 * m * esize));
                    for h in 0..H {
                        a[h][m] = _mm512_fmadd_ps(x, w[h], a[h][m]);
                    }
                }
            }
        }
        for (acc, a) in accs.iter_mut().zip(&a) {
            for (m, a) in a.iter().enumerate() {
                // SAFETY: row l of each accumulator has hd columns.
                unsafe { _mm512_storeu_ps(acc.as_mut_ptr().add(l * hd + d0 + 16 * m), *a) };
            }
        }
    }
}

/// The end of `reduce::<4>` (from its eight-lane sum `s`) for each of eight rows,
/// times `scale`, as one register of eight results: `t[l] = s[l] + s[l + 4]`, then
/// `(t0 + t1) + (t2 + t3)`.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn reduce_rows8_r4(x: &[__m256; 8], scale: f32) -> __m256 {
    // t = low half + high half of each row, two rows per register: [tA | tB].
    let t = |a: __m256, b: __m256| {
        _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(a, b),
            _mm256_permute2f128_ps::<0x31>(a, b),
        )
    };
    let (tab, tcd, tef, tgh) = (t(x[0], x[1]), t(x[2], x[3]), t(x[4], x[5]), t(x[6], x[7]));
    // Adjacent pairs twice: [A C E G | B D F H].
    let r = _mm256_hadd_ps(_mm256_hadd_ps(tab, tcd), _mm256_hadd_ps(tef, tgh));
    let r = _mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_mul_ps(r, _mm256_set1_ps(scale))
}

/// `reduce8` of each of eight rows' lanes, times `scale`, as one register of eight
/// results.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn reduce_rows8(x: &[__m256; 8], scale: f32) -> __m256 {
    // t = low half + high half of each row, two rows per register: [tA | tB].
    let t = |a: __m256, b: __m256| {
        _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(a, b),
            _mm256_permute2f128_ps::<0x31>(a, b),
        )
    };
    let (tab, tcd, tef, tgh) = (t(x[0], x[1]), t(x[2], x[3]), t(x[4], x[5]), t(x[6], x[7]));
    // (t0 + t2) + (t1 + t3): pairs (0, 2) and (1, 3) first, then adjacent ones, which
    // leaves the rows in the order [A C E G | B D F H].
    let u = _mm256_add_ps(
        _mm256_shuffle_ps::<0x44>(tab, tcd), // [A0 A1 C0 C1 | B0 B1 D0 D1]
        _mm256_shuffle_ps::<0xEE>(tab, tcd), // [A2 A3 C2 C3 | B2 B3 D2 D3]
    );
    let v = _mm256_add_ps(
        _mm256_shuffle_ps::<0x44>(tef, tgh),
        _mm256_shuffle_ps::<0xEE>(tef, tgh),
    );
    let r = _mm256_hadd_ps(u, v);
    // [A C E G | B D F H] -> [A B C D E F G H].
    let r = _mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_mul_ps(r, _mm256_set1_ps(scale))
}

/// `reduce32` (R = 4) or `reduce8` (R = 1) of the lanes in `acc`.
#[target_feature(enable = "avx2")]
#[inline]
fn reduce<const R: usize>(acc: &[__m256; R]) -> f32 {
    if R == 4 {
        // s[l] = (x[l] + x[16 + l]) + (x[8 + l] + x[24 + l]), t[l] = s[l] + s[l + 4],
        // then (t0 + t1) + (t2 + t3).
        let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]));
        let t = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s));
        let u = _mm_add_ps(t, _mm_movehdup_ps(t));
        _mm_cvtss_f32(_mm_add_ss(u, _mm_movehl_ps(u, u)))
    } else {
        // t[l] = x[l] + x[l + 4], then (t0 + t2) + (t1 + t3).
        let x = acc[0];
        let t = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps::<1>(x));
        let u = _mm_add_ps(t, _mm_movehl_ps(t, t));
        _mm_cvtss_f32(_mm_add_ss(u, _mm_movehdup_ps(u)))
    }
}

/// `out[d] = Σ_j p_j v_j[d]` with position `j` accumulated in lane `j mod L`
/// (`lanes_weighted_sum`): each lane's partial sums are kept in registers over its
/// positions, stored to `acc` (L × hd), and reduced across lanes eight dimensions at
/// a time.
///
/// # Safety
/// AVX2/FMA; `out.len()` a multiple of 8; `v` holds `p.len()` rows of `out.len()`.
#[target_feature(enable = "avx2,fma")]
unsafe fn weighted_sum<const L: usize>(p: &[f32], v: &[f32], acc: &mut Vec<f32>, out: &mut [f32]) {
    let hd = out.len();
    // Every value is written below (lanes without positions get zeros).
    acc.resize(L * hd, 0.0);
    let mut d0 = 0;
    // SAFETY: columns d0.. of the rows of `v` and `acc` are in bounds (contract).
    unsafe {
        while d0 + 64 <= hd {
            lane_sums::<L, 8>(p, v, hd, d0, acc);
            d0 += 64;
        }
        while d0 < hd {
            lane_sums::<L, 1>(p, v, hd, d0, acc);
            d0 += 8;
        }
    }
    // SAFETY: `acc` holds L rows of hd (filled above); `out` has hd values.
    unsafe { reduce_lanes::<L>(acc, out) };
}

/// `out[d]` = the reduction of lane sums `acc[l * hd + d]` over the L lanes, in
/// `reduce32`'s (L = 32) or `reduce8`'s (L = 8) order, eight dimensions at a time.
///
/// # Safety
/// AVX2; `acc` holds `L * out.len()` values; `out.len()` a multiple of 8.
#[target_feature(enable = "avx2,fma")]
unsafe fn reduce_lanes<const L: usize>(acc: &[f32], out: &mut [f32]) {
    let hd = out.len();
    for (c, o) in out.chunks_exact_mut(8).enumerate() {
        // SAFETY: lane l's row of `acc` has `hd` values; `o` eight.
        unsafe {
            let x = |l: usize| _mm256_loadu_ps(acc.as_ptr().add(l * hd + 8 * c));
            let r = if L == 32 {
                let s: [__m256; 8] = std::array::from_fn(|l| {
                    _mm256_add_ps(
                        _mm256_add_ps(x(l), x(16 + l)),
                        _mm256_add_ps(x(8 + l), x(24 + l)),
                    )
                });
                let t: [__m256; 4] = std::array::from_fn(|l| _mm256_add_ps(s[l], s[l + 4]));
                _mm256_add_ps(_mm256_add_ps(t[0], t[1]), _mm256_add_ps(t[2], t[3]))
            } else {
                let t: [__m256; 4] = std::array::from_fn(|l| _mm256_add_ps(x(l), x(l + 4)));
                _mm256_add_ps(_mm256_add_ps(t[0], t[2]), _mm256_add_ps(t[1], t[3]))
            };
            _mm256_storeu_ps(o.as_mut_ptr(), r);
        }
    }
}

/// [`weighted_sum`] with a decode's 32 lanes or a prompt's 8.
///
/// # Safety
/// As for [`weighted_sum`].
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn weighted_sum_for(
    decode: bool,
    p: &[f32],
    v: &[f32],
    acc: &mut Vec<f32>,
    out: &mut [f32],
) {
    // SAFETY: the caller's contract.
    unsafe {
        if decode {
            weighted_sum::<32>(p, v, acc, out)
        } else {
            weighted_sum::<8>(p, v, acc, out)
        }
    }
}

/// [`weighted_sum_heads`] with a decode's 32 lanes or a prompt's 8.
///
/// # Safety
/// As for [`weighted_sum_heads`].
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn weighted_sum_heads_for<const H: usize>(
    decode: bool,
    ps: &[Vec<f32>],
    n: usize,
    v: &[f32],
    accs: &mut [Vec<f32>],
    outs: [&mut [f32]; H],
) {
    // SAFETY: the caller's contract.
    unsafe {
        if decode {
            weighted_sum_heads::<32, H>(ps, n, v, accs, outs)
        } else {
            weighted_sum_heads::<8, H>(ps, n, v, accs, outs)
        }
    }
}

/// [`weighted_sum`] of `H` probability rows (`ps[h][..n]`) over the same values: each
/// value register loaded once feeds all of them, and each output gets exactly the
/// operations [`weighted_sum`] would give it alone.
///
/// # Safety
/// As for [`weighted_sum`], for every row; `ps` and `accs` have at least `H` rows, the
/// rows of `ps` at least `n` values; the outputs are `hd` long.
#[target_feature(enable = "avx2,fma")]
unsafe fn weighted_sum_heads<const L: usize, const H: usize>(
    ps: &[Vec<f32>],
    n: usize,
    v: &[f32],
    accs: &mut [Vec<f32>],
    outs: [&mut [f32]; H],
) {
    let hd = outs[0].len();
    assert!(ps.len() >= H && accs.len() >= H && v.len() >= n * hd);
    assert!(ps[..H].iter().all(|p| p.len() >= n) && outs.iter().all(|o| o.len() == hd));
    let p: [&[f32]; H] = std::array::from_fn(|h| &ps[h][..n]);
    for acc in &mut accs[..H] {
        acc.resize(L * hd, 0.0);
    }
    let mut d0 = 0;
    // SAFETY: columns d0.. of the rows of `v` and of every accumulator are in bounds.
    unsafe {
        while d0 + 32 <= hd {
            lane_sums_heads::<L, 4, H>(&p, v, hd, d0, accs);
            d0 += 32;
        }
        while d0 < hd {
            lane_sums_heads::<L, 1, H>(&p, v, hd, d0, accs);
            d0 += 8;
        }
        for (acc, o) in accs.iter().zip(outs) {
            reduce_lanes::<L>(acc, o);
        }
    }
}

/// [`lane_sums`] for `H` probability rows at once.
///
/// # Safety
/// As for [`lane_sums`], for every row; `accs` has `H` rows of `L * hd`.
#[target_feature(enable = "avx2,fma")]
#[inline]
#[allow(clippy::needless_range_loop)] // indices name the register tile's (head, chunk)
unsafe fn lane_sums_heads<const L: usize, const M: usize, const H: usize>(
    p: &[&[f32]; H],
    v: &[f32],
    hd: usize,
    d0: usize,
    accs: &mut [Vec<f32>],
) {
    let n = p[0].len();
    for l in 0..L {
        let mut a = [[_mm256_setzero_ps(); M]; H];
        for j in (l..n).step_by(L) {
            // SAFETY: row j of `v`, columns d0..d0 + 8M, by the contract.
            unsafe {
                let w: [__m256; H] =
                    std::array::from_fn(|h| _mm256_set1_ps(*p[h].get_unchecked(j)));
                let vj = v.as_ptr().add(j * hd + d0);
                for m in 0..M {
                    let x = _mm256_loadu_ps(vj.add(8 * m));
                    for h in 0..H {
                        a[h][m] = _mm256_fmadd_ps(x, w[h], a[h][m]);
                    }
                }
            }
        }
        for (acc, a) in accs.iter_mut().zip(&a) {
            for (m, a) in a.iter().enumerate() {
                // SAFETY: row l of each accumulator has hd columns.
                unsafe { _mm256_storeu_ps(acc.as_mut_ptr().add(l * hd + d0 + 8 * m), *a) };
            }
        }
    }
}

/// Columns `d0..d0 + 8M` of every lane's partial sums, in `M` registers.
///
/// # Safety
/// As for [`weighted_sum`], with `d0 + 8M <= hd`.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn lane_sums<const L: usize, const M: usize>(
    p: &[f32],
    v: &[f32],
    hd: usize,
    d0: usize,
    acc: &mut [f32],
) {
    for l in 0..L {
        let mut a = [_mm256_setzero_ps(); M];
        for j in (l..p.len()).step_by(L) {
            // SAFETY: row j of `v`, columns d0..d0 + 8M, by the contract.
            unsafe {
                let pj = _mm256_set1_ps(*p.get_unchecked(j));
                let vj = v.as_ptr().add(j * hd + d0);
                for (m, a) in a.iter_mut().enumerate() {
                    *a = _mm256_fmadd_ps(_mm256_loadu_ps(vj.add(8 * m)), pj, *a);
                }
            }
        }
        for (m, a) in a.iter().enumerate() {
            // SAFETY: row l of `acc` has hd columns.
            unsafe { _mm256_storeu_ps(acc.as_mut_ptr().add(l * hd + d0 + 8 * m), *a) };
        }
    }
}

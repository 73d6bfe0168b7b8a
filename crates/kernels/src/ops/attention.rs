//! Causal scaled-dot-product attention with grouped-query heads.
//!
//! The key/value store is abstracted by [`KvView`] so the same kernel serves a
//! contiguous cache and paged block tables; one call covers a ragged batch of
//! sequences (prefill chunks and decodes mixed).
//!
//! Keys and values are stored in f16; the query, the scores, the softmax and the
//! probabilities stay in f32. (llama.cpp's CPU path without flash attention also rounds
//! the query and the probabilities to f16; against the float reference path that
//! measured worse on qwen2.5-coder-1.5b, so pagellm does not.) The sums keep llama.cpp's
//! lane structure: 32 lanes for a decode, 8 for a prompt, chosen by a query's position,
//! never by its batch.

use half::f16;

use crate::cpu::Numerics;
use crate::pool::{SyncPtr, ThreadPool};

/// Head layout of one attention call.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

/// Read access to cached keys and values by (position, kv head). Implementations
/// convert one head's row to f32 into `dst` (`head_dim` values); the store may hold
/// f16, bf16 or f32.
pub trait KvView: Sync {
    fn load_key(&self, pos: usize, kv_head: usize, dst: &mut [f32]);
    fn load_value(&self, pos: usize, kv_head: usize, dst: &mut [f32]);
    /// Keys and values of positions `0..n` of `kv_head` into `k` and `v` (`n` rows of
    /// `head_dim` each). Stores override it to walk their layout once instead of
    /// locating every row.
    fn load_rows(&self, n: usize, kv_head: usize, k: &mut [f32], v: &mut [f32]) {
        let hd = k.len() / n.max(1);
        for j in 0..n {
            self.load_key(j, kv_head, &mut k[j * hd..(j + 1) * hd]);
            self.load_value(j, kv_head, &mut v[j * hd..(j + 1) * hd]);
        }
    }
    /// Where a store that holds f16 keeps the keys and values of positions `0..n` of
    /// `kv_head`, for the kernels to read in place: fills `keys` and `values` with runs
    /// of `1 << shift` consecutive rows (`head_dim` values each; the last run may be
    /// shorter but holds every row below `n`), run `b` starting at position `b << shift`,
    /// and returns `shift`. `None` (the default) where the store holds another type or
    /// another layout; the kernels then use [`KvView::load_rows`].
    fn f16_runs<'s>(
        &'s self,
        n: usize,
        kv_head: usize,
        keys: &mut Vec<&'s [u16]>,
        values: &mut Vec<&'s [u16]>,
    ) -> Option<u32> {
        let _ = (n, kv_head, keys, values);
        None
    }
}

/// Keys and values stored contiguously in f16: (positions, n_kv_heads, head_dim) each.
pub struct ContiguousKv<'a> {
    pub k: &'a [f16],
    pub v: &'a [f16],
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

impl KvView for ContiguousKv<'_> {
    #[inline]
    fn load_key(&self, pos: usize, h: usize, dst: &mut [f32]) {
        let o = (pos * self.n_kv_heads + h) * self.head_dim;
        f16_to_f32(&self.k[o..o + self.head_dim], dst);
    }
    #[inline]
    fn load_value(&self, pos: usize, h: usize, dst: &mut [f32]) {
        let o = (pos * self.n_kv_heads + h) * self.head_dim;
        f16_to_f32(&self.v[o..o + self.head_dim], dst);
    }
    /// One row per run: rows of one head are `n_kv_heads * head_dim` apart.
    fn f16_runs<'s>(
        &'s self,
        n: usize,
        h: usize,
        keys: &mut Vec<&'s [u16]>,
        values: &mut Vec<&'s [u16]>,
    ) -> Option<u32> {
        use half::slice::HalfFloatSliceExt;
        let hd = self.head_dim;
        let row = |x: &'s [f16], j: usize| {
            let o = (j * self.n_kv_heads + h) * hd;
            x[o..o + hd].reinterpret_cast()
        };
        keys.clear();
        values.clear();
        keys.extend((0..n).map(|j| row(self.k, j)));
        values.extend((0..n).map(|j| row(self.v, j)));
        Some(0)
    }
}

/// One sequence's share of a batched attention call: its queries are rows
/// `token0..token0 + n_tokens` of the flattened batch, at positions `pos0..`, and query
/// `i` attends to positions `0..=pos0 + i` of `kv` (causal within a chunk, everything
/// cached before it).
pub struct AttnSeq<V> {
    pub token0: usize,
    pub pos0: usize,
    pub n_tokens: usize,
    /// Queries at positions `>= decode_from` sum in the order llama.cpp uses for a
    /// one-token (decode) batch, earlier ones in its prompt order. Making the order a
    /// function of the position, not of the batch, keeps results batch-invariant.
    pub decode_from: usize,
    pub kv: V,
}

/// `out` (n_tokens, n_heads, head_dim) = softmax(q·Kᵀ/√d)·V for every sequence of a
/// ragged batch; `q` is (n_tokens, n_heads, head_dim) over all sequences.
pub fn attention<V: KvView>(
    pool: &ThreadPool,
    shape: AttnShape,
    q: &[f32],
    seqs: &[AttnSeq<V>],
    out: &mut [f32],
) {
    run_attention(pool, shape, q, seqs, out, Numerics::Fast)
}

/// [`attention`] on the float reference path ([`Numerics::Reference`]): `q·k` and the
/// weighted sum of the values in f32 by [`super::dot_lanes8`]'s fixed order, the
/// softmax in f32. The same bits on every machine.
pub fn attention_reference<V: KvView>(
    pool: &ThreadPool,
    shape: AttnShape,
    q: &[f32],
    seqs: &[AttnSeq<V>],
    out: &mut [f32],
) {
    run_attention(pool, shape, q, seqs, out, Numerics::Reference)
}

fn run_attention<V: KvView>(
    pool: &ThreadPool,
    shape: AttnShape,
    q: &[f32],
    seqs: &[AttnSeq<V>],
    out: &mut [f32],
    numerics: Numerics,
) {
    let AttnShape {
        n_heads,
        n_kv_heads,
        head_dim,
    } = shape;
    let n_total: usize = seqs.iter().map(|s| s.n_tokens).sum();
    assert_eq!(q.len(), n_total * n_heads * head_dim);
    assert_eq!(out.len(), q.len());
    for s in seqs {
        assert!(
            s.token0 + s.n_tokens <= n_total,
            "sequence rows out of range"
        );
    }
    let group = n_heads / n_kv_heads;
    let scale = 1.0 / (head_dim as f32).sqrt();
    // Tasks are (sequence, kv head, run of query tokens): a task converts the keys and
    // values its queries can see to f32 once, then every query head of the group reuses
    // them. Threads take tasks from a shared counter, so long and short sequences mix.
    let tasks: Vec<(usize, usize, std::ops::Range<usize>)> = seqs
        .iter()
        .enumerate()
        .flat_map(|(si, s)| {
            (0..n_kv_heads).flat_map(move |kvh| {
                (0..s.n_tokens)
                    .step_by(TOKENS_PER_TASK)
                    .map(move |t0| (si, kvh, t0..(t0 + TOKENS_PER_TASK).min(s.n_tokens)))
            })
        })
        .collect();
    // Decode tokens on AVX-512, head sizes in whole 32-lane chunks: the fused kernel.
    let decode512 = cfg!(target_arch = "x86_64")
        && numerics == Numerics::Fast
        && head_dim.is_multiple_of(32)
        && crate::cpu::simd_level() >= crate::cpu::SimdLevel::Avx512Vnni;
    let next = std::sync::atomic::AtomicUsize::new(0);
    let outp = SyncPtr(out.as_mut_ptr());
    pool.run(&|_, _| {
        let mut kf = Vec::new();
        let mut vf = Vec::new();
        let mut scores = Vec::new();
        let mut lanes: Vec<Vec<f32>> = Vec::new();
        let mut probs: Vec<Vec<f32>> = Vec::new();
        let mut lanes1 = Vec::new();
        let (mut kruns, mut vruns) = (Vec::new(), Vec::new());
        loop {
            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let Some((si, kvh, toks)) = tasks.get(i) else {
                break;
            };
            let s = &seqs[*si];
            let ctx = s.pos0 + toks.end;
            // Decode tokens on AVX-512 read an f16 store in place (`decode512`);
            // everything else converts the rows its queries can see to f32 first.
            let decode_only = s.pos0 + toks.start >= s.decode_from;
            let in_place = (decode512 && decode_only)
                .then(|| s.kv.f16_runs(ctx, *kvh, &mut kruns, &mut vruns))
                .flatten();
            if in_place.is_none() {
                kf.resize(ctx * head_dim, 0.0);
                vf.resize(ctx * head_dim, 0.0);
                s.kv.load_rows(ctx, *kvh, &mut kf, &mut vf);
            }
            scores.resize(ctx, 0.0);
            for t in toks.clone() {
                let pos = s.pos0 + t;
                #[cfg(target_arch = "x86_64")]
                if decode512 && pos >= s.decode_from {
                    let n = pos + 1;
                    let item0 = (s.token0 + t) * n_heads + kvh * group;
                    let qs = &q[item0 * head_dim..(item0 + group) * head_dim];
                    // SAFETY: each (token, head) slice of `out` belongs to exactly one
                    // task, and a token's heads of one group are contiguous.
                    let o = unsafe {
                        std::slice::from_raw_parts_mut(
                            outp.get().add(item0 * head_dim),
                            group * head_dim,
                        )
                    };
                    let (p, l) = (&mut probs, &mut lanes);
                    if let Some(shift) = in_place {
                        let mask = (1usize << shift) - 1;
                        let at = |runs: &[&[u16]], j: usize| {
                            runs[j >> shift][(j & mask) * head_dim..]
                                .as_ptr()
                                .cast::<u8>()
                        };
                        let krow = |j| at(&kruns, j);
                        let vrow = |j| at(&vruns, j);
                        // Runs sit at scattered addresses: keys are fetched 64 rows
                        // ahead, values while the keys are scored, eight rows (from a
                        // multiple of eight, so within one run) per range where runs
                        // hold eight rows or more.
                        let step = if shift >= 3 { 8 } else { 1 };
                        let fetch =
                            |row: &dyn Fn(usize) -> *const u8, rows: std::ops::Range<usize>| {
                                for j in rows.clone().step_by(step) {
                                    let len = step.min(rows.end - j);
                                    super::prefetch_range(row(j), len * 2 * head_dim);
                                }
                            };
                        let ahead = |j0: usize| {
                            let from = if j0 == 0 { 0 } else { j0 + 56 };
                            fetch(&krow, from.min(n)..(j0 + 64).min(n));
                            fetch(&vrow, j0..(j0 + 8).min(n));
                        };
                        // SAFETY: AVX-512 checked (`decode512`); `f16_runs` gave runs
                        // holding every row below `ctx >= n`.
                        unsafe {
                            x86::decode_token::<true>(
                                qs, head_dim, n, krow, vrow, ahead, scale, p, l, o,
                            )
                        };
                    } else {
                        let (kp, vp) = (kf.as_ptr(), vf.as_ptr());
                        // SAFETY: `kf`/`vf` hold the first `ctx >= n` rows of f32.
                        let krow = |j| unsafe { kp.add(j * head_dim).cast::<u8>() };
                        let vrow = |j| unsafe { vp.add(j * head_dim).cast::<u8>() };
                        // SAFETY: AVX-512 checked (`decode512`); rows as above.
                        unsafe {
                            x86::decode_token::<false>(
                                qs,
                                head_dim,
                                n,
                                krow,
                                vrow,
                                |_| {},
                                scale,
                                p,
                                l,
                                o,
                            )
                        };
                    }
                    continue;
                }
                #[cfg(target_arch = "x86_64")]
                if numerics == Numerics::Fast
                    && head_dim.is_multiple_of(8)
                    && crate::cpu::simd_level() >= crate::cpu::SimdLevel::Avx2
                {
                    let n = pos + 1;
                    let decode = pos >= s.decode_from;
                    let h0 = kvh * group;
                    // Every head's probabilities first, then the weighted sums of the
                    // values three (or two) heads at a time, so each value row read
                    // serves all of them.
                    let item0 = (s.token0 + t) * n_heads + h0;
                    let qs = &q[item0 * head_dim..(item0 + group) * head_dim];
                    probs.resize_with(group, Vec::new);
                    lanes.resize_with(group, Vec::new);
                    for p in probs.iter_mut() {
                        p.resize(n, 0.0);
                    }
                    // A prompt's keys are shared by the group's heads where the CPU has
                    // the registers for it (same bits as one head at a time).
                    let wide =
                        !decode && crate::cpu::simd_level() >= crate::cpu::SimdLevel::Avx512Vnni;
                    let kn = &kf[..n * head_dim];
                    let mut g = 0;
                    while g < group {
                        let qg = |w: usize| &qs[g * head_dim..(g + w) * head_dim];
                        // SAFETY: AVX2/FMA (and AVX-512 F/VL where `wide`) checked;
                        // `kn` holds n rows; `probs` rows hold n values.
                        unsafe {
                            if wide && group - g >= 3 {
                                x86::scores_heads::<3>(qg(3), kn, scale, n, &mut probs[g..]);
                                g += 3;
                            } else if wide && group - g == 2 {
                                x86::scores_heads::<2>(qg(2), kn, scale, n, &mut probs[g..]);
                                g += 2;
                            } else {
                                scores_avx2(qg(1), kn, scale, &mut probs[g][..n], decode);
                                g += 1;
                            }
                        }
                    }
                    for p in probs.iter_mut() {
                        // SAFETY: AVX2/FMA checked (the `Avx2` level).
                        unsafe { super::avx2::softmax_ggml(&mut p[..n]) };
                    }
                    // SAFETY: each (token, head) slice of `out` belongs to exactly one task.
                    let out_of = |g: usize| unsafe {
                        std::slice::from_raw_parts_mut(
                            outp.get().add((item0 + g) * head_dim),
                            head_dim,
                        )
                    };
                    let vn = &vf[..n * head_dim];
                    let mut g = 0;
                    while g < group {
                        let (ps, accs) = (&probs[g..], &mut lanes[g..]);
                        // SAFETY: AVX2/FMA checked; `vn` holds n rows, outputs head_dim.
                        unsafe {
                            if group - g >= 3 {
                                let o = [out_of(g), out_of(g + 1), out_of(g + 2)];
                                x86::weighted_sum_heads_for::<3>(decode, ps, n, vn, accs, o);
                                g += 3;
                            } else if group - g == 2 {
                                let o = [out_of(g), out_of(g + 1)];
                                x86::weighted_sum_heads_for::<2>(decode, ps, n, vn, accs, o);
                                g += 2;
                            } else {
                                x86::weighted_sum_for(
                                    decode,
                                    &ps[0][..n],
                                    vn,
                                    &mut accs[0],
                                    out_of(g),
                                );
                                g += 1;
                            }
                        }
                    }
                    continue;
                }
                for h in kvh * group..(kvh + 1) * group {
                    let item = (s.token0 + t) * n_heads + h;
                    let qh = &q[item * head_dim..(item + 1) * head_dim];
                    // SAFETY: each (token, head) slice of `out` belongs to exactly one task.
                    let oh = unsafe {
                        std::slice::from_raw_parts_mut(outp.get().add(item * head_dim), head_dim)
                    };
                    let n = pos + 1;
                    if numerics == Numerics::Reference {
                        attend_one_reference(
                            qh,
                            &kf[..n * head_dim],
                            &vf[..n * head_dim],
                            scale,
                            &mut scores[..n],
                            oh,
                        );
                        continue;
                    }
                    attend_one(
                        qh,
                        &kf[..n * head_dim],
                        &vf[..n * head_dim],
                        scale,
                        &mut scores[..n],
                        &mut lanes1,
                        oh,
                        pos >= s.decode_from,
                    );
                }
            }
        }
    });
}

/// Query tokens per attention task: enough to amortize converting the keys and values.
const TOKENS_PER_TASK: usize = 32;

fn f16_to_f32(src: &[f16], dst: &mut [f32]) {
    use half::slice::HalfFloatSliceExt;
    super::f16_bits_to_f32(src.reinterpret_cast(), dst);
}

/// One query head against keys and values held as
/// f32 rows, `scores.len()` of them. `decode` selects the summation order llama.cpp uses
/// for a batch of one token (`ggml_vec_dot_f16`: 32 lanes) instead of the one it uses for
/// prompt batches (llamafile's tinyBLAS: 8 lanes).
#[allow(clippy::too_many_arguments)]
fn attend_one(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    scale: f32,
    scores: &mut [f32],
    lanes: &mut Vec<f32>,
    out: &mut [f32],
    decode: bool,
) {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::simd_level() >= crate::cpu::SimdLevel::Avx2 {
        // SAFETY: AVX2+FMA are available.
        return unsafe { attend_one_avx2(q, k, v, scale, scores, lanes, out, decode) };
    }
    attend_one_portable(q, k, v, scale, scores, lanes, out, decode)
}

/// One query head on the float reference path (see [`attention_reference`]).
fn attend_one_reference(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    scale: f32,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let hd = q.len();
    for (j, s) in scores.iter_mut().enumerate() {
        *s = super::dot_lanes8(q, &k[j * hd..(j + 1) * hd]) * scale;
    }
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f32;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        sum += *s;
    }
    // out[d] = Σ_j p_j v_j[d] / sum, lane t of dimension d summing the positions
    // j ≡ t (mod 8) of the whole groups of eight, reduced as `dot_lanes8` reduces.
    let mut lanes = vec![[0f32; 8]; hd];
    let n8 = scores.len() / 8 * 8;
    for j in (0..n8).step_by(8) {
        for t in 0..8 {
            let p = scores[j + t];
            for (l, x) in lanes.iter_mut().zip(&v[(j + t) * hd..(j + t + 1) * hd]) {
                l[t] += p * x;
            }
        }
    }
    for (d, (o, l)) in out.iter_mut().zip(&lanes).enumerate() {
        let mut acc = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
        for j in n8..scores.len() {
            acc += scores[j] * v[j * hd + d];
        }
        *o = acc / sum;
    }
}

/// The portable attention of one query head; the reference the AVX2 kernel matches.
#[allow(clippy::too_many_arguments)]
fn attend_one_portable(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    scale: f32,
    scores: &mut [f32],
    lanes: &mut Vec<f32>,
    out: &mut [f32],
    decode: bool,
) {
    let hd = q.len();
    let n = scores.len();
    assert!(k.len() >= n * hd && v.len() >= n * hd && out.len() == hd);
    // Scores: q·k_j with the reference's lane structure, then the scale.
    for (j, s) in scores.iter_mut().enumerate() {
        let kj = &k[j * hd..(j + 1) * hd];
        *s = if decode {
            lanes_dot::<32>(q, kj, reduce32)
        } else {
            lanes_dot::<8>(q, kj, reduce8)
        } * scale;
    }
    softmax_ggml(scores);
    // out[d] = Σ_j p_j v_j[d], lanes by position as the reference's dot over positions.
    if decode {
        lanes_weighted_sum::<32>(scores, v, lanes, out, reduce32);
    } else {
        lanes_weighted_sum::<8>(scores, v, lanes, out, reduce8);
    }
}

/// [`attend_one_portable`] with the lane sums written out in AVX2 registers (one
/// register per 8 lanes), the softmax in one AVX2 function, and the output's
/// lane reduction done across eight dimensions at once instead of one scalar chain each.
/// Every addition and fused multiply-add is the portable twin's, in the same order, so
/// the results are bit-identical. Head sizes that are not a multiple of 8 take the twin.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn attend_one_avx2(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    scale: f32,
    scores: &mut [f32],
    lanes: &mut Vec<f32>,
    out: &mut [f32],
    decode: bool,
) {
    let hd = q.len();
    let n = scores.len();
    if !hd.is_multiple_of(8) {
        return attend_one_portable(q, k, v, scale, scores, lanes, out, decode);
    }
    assert!(k.len() >= n * hd && v.len() >= n * hd && out.len() == hd);
    // SAFETY: AVX2/FMA are the caller's contract; the slice lengths were checked above.
    unsafe {
        probs_avx2(q, k, scale, scores, decode);
        x86::weighted_sum_for(decode, scores, v, lanes, out);
    }
}

/// The first half of [`attend_one_avx2`]: `scores` becomes the softmax of
/// the scaled scores of `q` against the rows of `k`.
///
/// # Safety
/// The CPU must support AVX2 and FMA; `q.len()` a multiple of 8; `k` holds
/// `scores.len()` rows of `q.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn probs_avx2(q: &[f32], k: &[f32], scale: f32, scores: &mut [f32], decode: bool) {
    // SAFETY: the caller's contract.
    unsafe {
        scores_avx2(q, k, scale, scores, decode);
        super::avx2::softmax_ggml(scores);
    }
}

/// The scores of [`probs_avx2`], before the softmax: a decode's 32 lanes or a prompt's 8.
///
/// # Safety
/// As for [`probs_avx2`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn scores_avx2(q: &[f32], k: &[f32], scale: f32, scores: &mut [f32], decode: bool) {
    assert!(q.len().is_multiple_of(8) && k.len() >= scores.len() * q.len());
    // SAFETY: checked above; AVX2/FMA are the caller's contract.
    unsafe {
        if decode {
            x86::scores::<4>(q, k, scale, scores);
        } else {
            x86::scores::<1>(q, k, scale, scores);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[path = "attention_x86.rs"]
mod x86;

/// `Σ a_i b_i` accumulated in `L` lanes (`i mod L`) by fused multiply-add, then reduced.
#[inline(always)]
fn lanes_dot<const L: usize>(a: &[f32], b: &[f32], reduce: fn(&[f32; L]) -> f32) -> f32 {
    let mut acc = [0f32; L];
    let mut ca = a.chunks_exact(L);
    let mut cb = b.chunks_exact(L);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for l in 0..L {
            acc[l] = x[l].mul_add(y[l], acc[l]);
        }
    }
    // Positions past the end count as zeros, which leave every lane unchanged.
    for (l, (x, y)) in ca.remainder().iter().zip(cb.remainder()).enumerate() {
        acc[l] = x.mul_add(*y, acc[l]);
    }
    reduce(&acc)
}

/// `out[d] = Σ_j p_j v_j[d]` with position `j` accumulated in lane `j mod L`.
#[inline(always)]
fn lanes_weighted_sum<const L: usize>(
    p: &[f32],
    v: &[f32],
    acc: &mut Vec<f32>,
    out: &mut [f32],
    reduce: fn(&[f32; L]) -> f32,
) {
    let hd = out.len();
    // (lane, dim) accumulators; lanes past the number of positions stay zero.
    acc.clear();
    acc.resize(L * hd, 0.0);
    for (j, &pj) in p.iter().enumerate() {
        let lane = &mut acc[(j % L) * hd..(j % L + 1) * hd];
        for (a, &x) in lane.iter_mut().zip(&v[j * hd..(j + 1) * hd]) {
            *a = x.mul_add(pj, *a);
        }
    }
    let mut lanes = [0f32; L];
    for (d, o) in out.iter_mut().enumerate() {
        for (l, x) in lanes.iter_mut().enumerate() {
            *x = acc[l * hd + d];
        }
        *o = reduce(&lanes);
    }
}

/// The horizontal sum of one 8-lane register as tinyBLAS does it (`hsum`).
#[inline(always)]
fn reduce8(x: &[f32; 8]) -> f32 {
    let t = [x[0] + x[4], x[1] + x[5], x[2] + x[6], x[3] + x[7]];
    (t[0] + t[2]) + (t[1] + t[3])
}

/// The reduction of four 8-lane accumulators in `ggml_vec_dot_f16` (`GGML_F32x8_REDUCE`).
#[inline(always)]
fn reduce32(x: &[f32; 32]) -> f32 {
    let mut s = [0f32; 8];
    for l in 0..8 {
        s[l] = (x[l] + x[16 + l]) + (x[8 + l] + x[24 + l]);
    }
    let t = [s[0] + s[4], s[1] + s[5], s[2] + s[6], s[3] + s[7]];
    (t[0] + t[1]) + (t[2] + t[3])
}

/// Softmax as `ggml_compute_forward_soft_max_f32` computes it: exp by ggml's polynomial
/// in chunks of 8, each chunk summed in f32 and added to an f64 total, then every value
/// scaled by the f32 rounding of `1/total`.
fn softmax_ggml(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f64;
    for chunk in x.chunks_mut(8) {
        let mut lanes = [f32::NEG_INFINITY; 8];
        lanes[..chunk.len()].copy_from_slice(chunk);
        let e = super::exp8(&lanes, max);
        chunk.copy_from_slice(&e[..chunk.len()]);
        let t = [e[0] + e[4], e[1] + e[5], e[2] + e[6], e[3] + e[7]];
        sum += ((t[0] + t[2]) + (t[1] + t[3])) as f64;
    }
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// Plain f64 reference for tests: one sequence at positions `pos0..pos0 + n`.
pub fn attention_ref(shape: AttnShape, q: &[f32], pos0: usize, kv: &impl KvView, out: &mut [f32]) {
    let AttnShape {
        n_heads,
        n_kv_heads,
        head_dim,
    } = shape;
    let scale = 1.0 / (head_dim as f32).sqrt();
    let n_tokens = q.len() / (n_heads * head_dim);
    let (mut kr, mut vr) = (vec![0f32; head_dim], vec![0f32; head_dim]);
    for t in 0..n_tokens {
        let pos = pos0 + t;
        for h in 0..n_heads {
            let kvh = h / (n_heads / n_kv_heads);
            let qh = &q[(t * n_heads + h) * head_dim..][..head_dim];
            let s: Vec<f64> = (0..=pos)
                .map(|j| {
                    kv.load_key(j, kvh, &mut kr);
                    qh.iter()
                        .zip(&kr)
                        .map(|(a, b)| (*a as f64) * (*b as f64))
                        .sum::<f64>()
                        * scale as f64
                })
                .collect();
            let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = e.iter().sum();
            let oh = &mut out[(t * n_heads + h) * head_dim..][..head_dim];
            let mut acc = vec![0f64; head_dim];
            for (j, ej) in e.iter().enumerate() {
                kv.load_value(j, kvh, &mut vr);
                for (a, x) in acc.iter_mut().zip(&vr) {
                    *a += ej * *x as f64;
                }
            }
            for (o, a) in oh.iter_mut().zip(&acc) {
                *o = (a / z) as f32;
            }
        }
    }
}

#[cfg(test)]
#[path = "attention_tests.rs"]
mod twin_tests;

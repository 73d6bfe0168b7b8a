//! Causal scaled-dot-product attention with grouped-query heads.
//!
//! The key/value store is abstracted by [`KvView`] so the same kernel serves a
//! contiguous per-sequence cache and, later, paged block tables.
//!
//! Keys and values are stored in f16, and the arithmetic follows llama.cpp's CPU path
//! (without flash attention): the query is rounded to f16 before `q·k`, the softmax runs
//! in f32, and the probabilities are rounded to f16 before weighting the values. Keeping
//! the same roundings is what lets greedy decoding agree with the reference token for
//! token.

use half::f16;

use crate::pool::{SyncPtr, ThreadPool};

/// Head layout of one attention call.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

/// Read access to cached keys and values by (position, kv head).
pub trait KvView: Sync {
    fn key(&self, pos: usize, kv_head: usize) -> &[f16];
    fn value(&self, pos: usize, kv_head: usize) -> &[f16];
}

/// Keys and values stored contiguously: (positions, n_kv_heads, head_dim) each.
pub struct ContiguousKv<'a> {
    pub k: &'a [f16],
    pub v: &'a [f16],
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

impl KvView for ContiguousKv<'_> {
    #[inline]
    fn key(&self, pos: usize, h: usize) -> &[f16] {
        let o = (pos * self.n_kv_heads + h) * self.head_dim;
        &self.k[o..o + self.head_dim]
    }
    #[inline]
    fn value(&self, pos: usize, h: usize) -> &[f16] {
        let o = (pos * self.n_kv_heads + h) * self.head_dim;
        &self.v[o..o + self.head_dim]
    }
}

/// `out` (n_tokens, n_heads, head_dim) = softmax(q·Kᵀ/√d)·V where query token `t`
/// attends to cached positions `0..=positions[t]`.
pub fn attention(
    pool: &ThreadPool,
    shape: AttnShape,
    q: &[f32],
    positions: &[usize],
    kv: &impl KvView,
    out: &mut [f32],
) {
    let AttnShape {
        n_heads,
        n_kv_heads,
        head_dim,
    } = shape;
    let n_tokens = positions.len();
    assert_eq!(q.len(), n_tokens * n_heads * head_dim);
    assert_eq!(out.len(), q.len());
    let group = n_heads / n_kv_heads;
    let scale = 1.0 / (head_dim as f32).sqrt();
    // Tasks are (kv head, run of query tokens): a task converts the f16 keys and values
    // its queries can see to f32 once, then every query head of the group reuses them.
    let tasks: Vec<(usize, std::ops::Range<usize>)> = (0..n_kv_heads)
        .flat_map(|kvh| {
            (0..n_tokens)
                .step_by(TOKENS_PER_TASK)
                .map(move |t0| (kvh, t0..(t0 + TOKENS_PER_TASK).min(n_tokens)))
        })
        .collect();
    let outp = SyncPtr(out.as_mut_ptr());
    pool.run(&|tid, nt| {
        let mine = crate::pool::split_range(tasks.len(), tid, nt);
        if mine.is_empty() {
            return;
        }
        let mut kf = Vec::new();
        let mut vf = Vec::new();
        let mut scores = Vec::new();
        let mut q16 = vec![0f32; head_dim];
        for (kvh, toks) in &tasks[mine] {
            let ctx = toks.clone().map(|t| positions[t] + 1).max().unwrap_or(0);
            kf.resize(ctx * head_dim, 0.0);
            vf.resize(ctx * head_dim, 0.0);
            for j in 0..ctx {
                f16_to_f32(kv.key(j, *kvh), &mut kf[j * head_dim..(j + 1) * head_dim]);
                f16_to_f32(kv.value(j, *kvh), &mut vf[j * head_dim..(j + 1) * head_dim]);
            }
            scores.resize(ctx, 0.0);
            for t in toks.clone() {
                for h in kvh * group..(kvh + 1) * group {
                    let item = t * n_heads + h;
                    let qh = &q[item * head_dim..(item + 1) * head_dim];
                    for (a, &b) in q16.iter_mut().zip(qh) {
                        *a = f16::from_f32(b).to_f32();
                    }
                    // SAFETY: each (token, head) slice of `out` belongs to exactly one task.
                    let oh = unsafe {
                        std::slice::from_raw_parts_mut(outp.get().add(item * head_dim), head_dim)
                    };
                    let n = positions[t] + 1;
                    attend_one(
                        &q16,
                        &kf[..n * head_dim],
                        &vf[..n * head_dim],
                        scale,
                        &mut scores[..n],
                        oh,
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
    src.convert_to_f32_slice(dst);
}

/// One query head (already rounded to f16 precision) against keys and values held as
/// f32 rows, `scores.len()` of them.
fn attend_one(q: &[f32], k: &[f32], v: &[f32], scale: f32, scores: &mut [f32], out: &mut [f32]) {
    let hd = q.len();
    assert!(k.len() >= scores.len() * hd && v.len() >= scores.len() * hd && out.len() == hd);
    #[cfg(target_arch = "x86_64")]
    if hd.is_multiple_of(8) && crate::cpu::simd_level() >= crate::cpu::SimdLevel::Avx2 {
        // SAFETY: AVX2+FMA+F16C are available and the lengths were checked above.
        return unsafe { super::avx2::attend_one(q, k, v, scale, scores, out) };
    }
    let mut max = f32::NEG_INFINITY;
    for (s, kj) in scores.iter_mut().zip(k.chunks_exact(hd)) {
        *s = super::dot(q, kj) * scale;
        max = max.max(*s);
    }
    let sum = super::exp_sub_sum(scores, max);
    let inv = 1.0 / sum;
    out.fill(0.0);
    for (&p, vj) in scores.iter().zip(v.chunks_exact(hd)) {
        super::axpy(out, f16::from_f32(p * inv).to_f32(), vj);
    }
}

/// Plain reference for tests.
pub fn attention_ref(
    shape: AttnShape,
    q: &[f32],
    positions: &[usize],
    kv: &impl KvView,
    out: &mut [f32],
) {
    let AttnShape {
        n_heads,
        n_kv_heads,
        head_dim,
    } = shape;
    let scale = 1.0 / (head_dim as f32).sqrt();
    for (t, &pos) in positions.iter().enumerate() {
        for h in 0..n_heads {
            let kvh = h / (n_heads / n_kv_heads);
            let qh = &q[(t * n_heads + h) * head_dim..][..head_dim];
            let s: Vec<f64> = (0..=pos)
                .map(|j| {
                    qh.iter()
                        .zip(kv.key(j, kvh))
                        .map(|(a, b)| (*a as f64) * b.to_f64())
                        .sum::<f64>()
                        * scale as f64
                })
                .collect();
            let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = e.iter().sum();
            let oh = &mut out[(t * n_heads + h) * head_dim..][..head_dim];
            for (d, o) in oh.iter_mut().enumerate() {
                *o = ((0..=pos)
                    .map(|j| e[j] * kv.value(j, kvh)[d].to_f64())
                    .sum::<f64>()
                    / z) as f32;
            }
        }
    }
}

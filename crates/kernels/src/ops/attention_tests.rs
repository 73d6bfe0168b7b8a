//! The attention kernels' properties: the AVX2 and AVX-512 paths against the portable
//! twin and against one head at a time, bit for bit.

use super::*;
use proptest::prelude::*;

proptest! {
    /// The AVX2 build of the attention kernel and its portable twin are bit-identical
    /// (same operation order; fused multiply-adds round the same everywhere).
    #[test]
    fn avx2_and_portable_attention_are_bit_identical(seed in 0u64..1000, n in 1usize..70, hd in prop::sample::select(vec![8usize, 12, 64, 72, 128]), decode: bool) {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let q: Vec<f32> = (0..hd).map(|_| f16::from_f32(rng.gen_range(-2.0..2.0)).to_f32()).collect();
        let k: Vec<f32> = (0..n * hd).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let v: Vec<f32> = (0..n * hd).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let (mut s1, mut s2) = (vec![0f32; n], vec![0f32; n]);
        let (mut o1, mut o2) = (vec![0f32; hd], vec![0f32; hd]);
        attend_one_portable(&q, &k, &v, 0.125, &mut s1, &mut Vec::new(), &mut o1, decode);
        #[cfg(target_arch = "x86_64")]
        if crate::cpu::simd_level() >= crate::cpu::SimdLevel::Avx2 {
            // SAFETY: features checked.
            unsafe { attend_one_avx2(&q, &k, &v, 0.125, &mut s2, &mut Vec::new(), &mut o2, decode) };
            prop_assert_eq!(&o1, &o2);
            prop_assert_eq!(&s1, &s2);
        }
        let sum: f32 = s1.iter().sum();
        prop_assert!((sum - 1.0).abs() < 1e-2, "probabilities sum to {}", sum);
    }
}

proptest! {
    /// The batched call (a prompt's scores for up to three heads per key load, then
    /// the values weighted up to three heads at a time) gives every (token, head)
    /// exactly what `attend_one` gives it alone, for prompt and decode positions and
    /// every way a group splits into threes, twos and ones.
    #[test]
    fn grouped_heads_match_one_head_at_a_time(seed in 0u64..1000, pos0 in 0usize..40, n_tokens in 1usize..40, hd in prop::sample::select(vec![8usize, 24, 64, 72, 128]), decode_from in 0usize..80, heads in prop::sample::select(vec![(6usize, 2usize), (4, 2), (8, 2), (5, 1), (3, 3)])) {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        // Groups of 3, 2, 4 (3 + 1), 5 (3 + 2) and 1 query heads per key/value head.
        let (n_heads, n_kv_heads) = heads;
        let ctx = pos0 + n_tokens;
        let kv16 = |rng: &mut rand::rngs::StdRng| -> Vec<f16> {
            (0..ctx * n_kv_heads * hd).map(|_| f16::from_f32(rng.gen_range(-1.0..1.0))).collect()
        };
        let (k, v) = (kv16(&mut rng), kv16(&mut rng));
        let q: Vec<f32> = (0..n_tokens * n_heads * hd).map(|_| rng.gen_range(-2.0..2.0)).collect();
        let shape = AttnShape { n_heads, n_kv_heads, head_dim: hd };
        let kv = ContiguousKv { k: &k, v: &v, n_kv_heads, head_dim: hd };
        let seqs = [AttnSeq { token0: 0, pos0, n_tokens, decode_from, kv }];
        let mut got = vec![0f32; q.len()];
        attention(&ThreadPool::new(2), shape, &q, &seqs, &mut got);
        // The same store without its f16 runs: decode tokens then read f32 copies.
        let seqs_f32 = [AttnSeq { token0: 0, pos0, n_tokens, decode_from, kv: NoRuns(&seqs[0].kv) }];
        let mut got_f32 = vec![0f32; q.len()];
        attention(&ThreadPool::new(2), shape, &q, &seqs_f32, &mut got_f32);
        prop_assert_eq!(&got, &got_f32);
        let kv = &seqs[0].kv;
        let (mut kf, mut vf) = (vec![0f32; ctx * hd], vec![0f32; ctx * hd]);
        for t in 0..n_tokens {
            let pos = pos0 + t;
            for h in 0..n_heads {
                let kvh = h / (n_heads / n_kv_heads);
                for j in 0..=pos {
                    kv.load_key(j, kvh, &mut kf[j * hd..(j + 1) * hd]);
                    kv.load_value(j, kvh, &mut vf[j * hd..(j + 1) * hd]);
                }
                let item = t * n_heads + h;
                let mut want = vec![0f32; hd];
                let n = pos + 1;
                attend_one(&q[item * hd..(item + 1) * hd], &kf[..n * hd], &vf[..n * hd], 1.0 / (hd as f32).sqrt(), &mut vec![0f32; n], &mut Vec::new(), &mut want, pos >= decode_from);
                prop_assert_eq!(&got[item * hd..(item + 1) * hd], &want[..], "token {} head {}", t, h);
            }
        }
    }
}

/// Which attention kernels the properties above ran here, by name; on AVX-512 a
/// decode reads an f16 store in place (no row is converted), elsewhere it converts.
#[test]
fn attention_paths_run_here() {
    use crate::cpu::{simd_level, SimdLevel};
    use std::sync::atomic::{AtomicUsize, Ordering};
    struct Counting<'a>(ContiguousKv<'a>, AtomicUsize);
    impl KvView for Counting<'_> {
        fn load_key(&self, pos: usize, h: usize, dst: &mut [f32]) {
            self.0.load_key(pos, h, dst)
        }
        fn load_value(&self, pos: usize, h: usize, dst: &mut [f32]) {
            self.0.load_value(pos, h, dst)
        }
        fn load_rows(&self, n: usize, h: usize, k: &mut [f32], v: &mut [f32]) {
            self.1.fetch_add(n, Ordering::Relaxed);
            self.0.load_rows(n, h, k, v)
        }
        fn f16_runs<'s>(
            &'s self,
            n: usize,
            h: usize,
            keys: &mut Vec<&'s [u16]>,
            values: &mut Vec<&'s [u16]>,
        ) -> Option<u32> {
            self.0.f16_runs(n, h, keys, values)
        }
    }
    let (hd, ctx) = (64, 40);
    let k: Vec<f16> = (0..ctx * hd)
        .map(|i| f16::from_f32((i % 7) as f32 / 7.0))
        .collect();
    let kv = ContiguousKv {
        k: &k,
        v: &k,
        n_kv_heads: 1,
        head_dim: hd,
    };
    let seqs = [AttnSeq {
        token0: 0,
        pos0: ctx - 1,
        n_tokens: 1,
        decode_from: 0,
        kv: Counting(kv, AtomicUsize::new(0)),
    }];
    let shape = AttnShape {
        n_heads: 3,
        n_kv_heads: 1,
        head_dim: hd,
    };
    let q = vec![0.5f32; 3 * hd];
    attention(
        &ThreadPool::new(1),
        shape,
        &q,
        &seqs,
        &mut vec![0f32; 3 * hd],
    );
    let converted = seqs[0].kv.1.load(Ordering::Relaxed);
    let avx512 = cfg!(target_arch = "x86_64") && simd_level() >= SimdLevel::Avx512Vnni;
    assert_eq!(
        converted,
        if avx512 { 0 } else { ctx },
        "rows converted for one decode"
    );
    let run = |yes: bool| {
        if yes {
            "run"
        } else {
            "NOT RUN (this CPU lacks it)"
        }
    };
    eprintln!("attention, portable: run");
    eprintln!(
        "attention, AVX2: {}",
        run(cfg!(target_arch = "x86_64") && simd_level() >= SimdLevel::Avx2)
    );
    eprintln!(
        "attention, AVX-512 (prompt key sharing, decode in place): {}",
        run(avx512)
    );
}

/// A store that only converts rows (the default [`KvView::f16_runs`]).
struct NoRuns<'a, V>(&'a V);

impl<V: KvView> KvView for NoRuns<'_, V> {
    fn load_key(&self, pos: usize, kv_head: usize, dst: &mut [f32]) {
        self.0.load_key(pos, kv_head, dst)
    }
    fn load_value(&self, pos: usize, kv_head: usize, dst: &mut [f32]) {
        self.0.load_value(pos, kv_head, dst)
    }
}

#[test]
fn ggml_exp_matches_std_exp_closely_and_handles_extremes() {
    for &x in &[
        -200.0f32, -100.0, -87.0, -10.0, -1.0, -1e-3, 0.0, 1e-3, 1.0, 10.0, 80.0,
    ] {
        let e = crate::ops::scalar::expf_ggml(x);
        let want = x.exp();
        assert!(
            (e - want).abs() <= 2e-6 * want + 1e-38,
            "exp({x}) = {e}, want {want}"
        );
    }
    assert_eq!(crate::ops::scalar::expf_ggml(f32::NEG_INFINITY), 0.0);
}

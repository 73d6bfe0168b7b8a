//! Fast kernels against their scalar twins.

use super::attention::{
    attention, attention_ref, attention_reference, AttnSeq, AttnShape, ContiguousKv,
};
use super::*;
use crate::pool::ThreadPool;
use proptest::prelude::*;

fn close(a: f32, b: f32, tol: f32) -> bool {
    (a - b).abs() <= tol * (1.0 + a.abs().max(b.abs()))
}

proptest! {
    #[test]
    fn dot_matches_scalar(v in prop::collection::vec((-4f32..4.0, -4f32..4.0), 0..200)) {
        let (a, b): (Vec<f32>, Vec<f32>) = v.into_iter().unzip();
        let tol = 1e-5 * a.iter().zip(&b).map(|(x, y)| (x * y).abs()).sum::<f32>() + 1e-6;
        prop_assert!((dot(&a, &b) - scalar::dot(&a, &b)).abs() <= tol);
    }

    #[test]
    fn exp_matches_std(v in prop::collection::vec(-100f32..20.0, 1..100)) {
        let max = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut fast = v.clone();
        let mut slow = v.clone();
        let sf = exp_sub_sum(&mut fast, max);
        let ss = scalar::exp_sub_sum(&mut slow, max);
        prop_assert!(close(sf, ss, 1e-5));
        for (a, b) in fast.iter().zip(&slow) {
            prop_assert!((a - b).abs() <= 1e-6 * b.abs() + 1e-30, "{a} vs {b}");
        }
    }

    #[test]
    fn silu_mul_matches_scalar(v in prop::collection::vec((-30f32..30.0, -3f32..3.0), 1..100)) {
        let (g, u): (Vec<f32>, Vec<f32>) = v.into_iter().unzip();
        let mut fast = vec![0.0; g.len()];
        let mut slow = vec![0.0; g.len()];
        silu_mul(&g, &u, &mut fast);
        scalar::silu_mul(&g, &u, &mut slow);
        for (a, b) in fast.iter().zip(&slow) {
            prop_assert!(close(*a, *b, 1e-5), "{a} vs {b}");
        }
    }

    #[test]
    fn f16_dot_and_axpy_match_scalar(v in prop::collection::vec((-4f32..4.0, -4f32..4.0), 0..100), alpha in -2f32..2.0) {
        let (a, b): (Vec<f32>, Vec<f32>) = v.into_iter().unzip();
        let b16: Vec<half::f16> = b.iter().map(|&x| half::f16::from_f32(x)).collect();
        let tol = 1e-5 * a.iter().zip(&b).map(|(x, y)| (x * y).abs()).sum::<f32>() + 1e-5;
        prop_assert!((dot_f16(&a, &b16) - scalar::dot_f16(&a, &b16)).abs() <= tol);
        let mut y1 = a.clone();
        let mut y2 = a.clone();
        axpy_f16(&mut y1, alpha, &b16);
        scalar::axpy_f16(&mut y2, alpha, &b16);
        for (x, y) in y1.iter().zip(&y2) {
            prop_assert!(close(*x, *y, 1e-6));
        }
    }

    #[test]
    fn axpy_matches_scalar(v in prop::collection::vec((-4f32..4.0, -4f32..4.0), 0..100), alpha in -2f32..2.0) {
        let (mut y, x): (Vec<f32>, Vec<f32>) = v.into_iter().unzip();
        let mut y2 = y.clone();
        axpy(&mut y, alpha, &x);
        scalar::axpy(&mut y2, alpha, &x);
        for (a, b) in y.iter().zip(&y2) {
            prop_assert!(close(*a, *b, 1e-6));
        }
    }

    #[test]
    fn attention_matches_reference(seed in 0u64..1000, n_tokens in 1usize..6, past in 0usize..40, head_dim in prop::sample::select(vec![8usize, 12, 64, 72])) {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let shape = AttnShape { n_heads: 4, n_kv_heads: 2, head_dim };
        let ctx = past + n_tokens;
        let kvlen = ctx * shape.n_kv_heads * shape.head_dim;
        let k: Vec<half::f16> = (0..kvlen).map(|_| half::f16::from_f32(rng.gen_range(-1.0..1.0))).collect();
        let v: Vec<half::f16> = (0..kvlen).map(|_| half::f16::from_f32(rng.gen_range(-1.0..1.0))).collect();
        let q: Vec<f32> = (0..n_tokens * 4 * head_dim).map(|_| rng.gen_range(-2.0..2.0)).collect();
        let kv = ContiguousKv { k: &k, v: &v, n_kv_heads: 2, head_dim };
        let seq = AttnSeq { token0: 0, pos0: past, n_tokens, decode_from: usize::MAX, kv };
        let mut fast = vec![0.0; q.len()];
        let mut slow = vec![0.0; q.len()];
        attention(&ThreadPool::new(2), shape, &q, std::slice::from_ref(&seq), &mut fast);
        attention_ref(shape, &q, past, &seq.kv, &mut slow);
        for (a, b) in fast.iter().zip(&slow) {
            // The fast path rounds q and the probabilities to f16 as llama.cpp does.
            prop_assert!((a - b).abs() < 5e-3, "{a} vs {b}");
        }
        // The float reference path rounds nothing to f16: f32 close to the f64 result,
        // and the same bits on one thread or two.
        let mut reference = vec![0.0; q.len()];
        attention_reference(&ThreadPool::new(2), shape, &q, std::slice::from_ref(&seq), &mut reference);
        for (a, b) in reference.iter().zip(&slow) {
            prop_assert!((a - b).abs() < 2e-5, "{a} vs {b}");
        }
        let mut one = vec![0.0; q.len()];
        attention_reference(&ThreadPool::new(1), shape, &q, std::slice::from_ref(&seq), &mut one);
        prop_assert_eq!(
            reference.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            one.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }

    #[test]
    fn dot_lanes8_is_a_fixed_order_sum(v in prop::collection::vec((-4f32..4.0, -4f32..4.0), 0..200)) {
        let (a, b): (Vec<f32>, Vec<f32>) = v.into_iter().unzip();
        let n8 = a.len() / 8 * 8;
        let mut l = [0f32; 8];
        for i in 0..n8 {
            l[i % 8] += a[i] * b[i];
        }
        let mut want = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
        for i in n8..a.len() {
            want += a[i] * b[i];
        }
        prop_assert_eq!(super::dot_lanes8(&a, &b).to_bits(), want.to_bits());
    }
}

#[test]
fn rmsnorm_unit_rows() {
    let x = [3.0f32, 4.0, 0.0, 0.0];
    let w = [1.0f32, 2.0, 1.0, 1.0];
    let mut out = [0.0; 4];
    rmsnorm(&x, &w, 0.0, &mut out);
    // mean square = 25/4, rms = 2.5
    assert_eq!(out, [1.2, 3.2, 0.0, 0.0]);
}

#[test]
fn rope_rotates_by_position_and_preserves_norm() {
    use super::rope::{RopeStyle, RopeTable};
    for style in [RopeStyle::Interleaved, RopeStyle::Neox] {
        let mut t = RopeTable::new(4, 10000.0, style);
        t.ensure(3);
        // One head of dim 4 at positions 0 and 2; the first pair's frequency is 1.
        let mut x = vec![1.0f32, 0.5, 0.25, 2.0, 1.0, 0.5, 0.25, 2.0];
        t.apply(&mut x, 1, &[0, 2]);
        assert_eq!(
            &x[..4],
            &[1.0, 0.5, 0.25, 2.0],
            "position 0 is the identity"
        );
        let (s, c) = 2f32.sin_cos();
        // The partner of element 0 is element 1 (interleaved) or element 2 (neox).
        let p = if style == RopeStyle::Interleaved {
            1
        } else {
            2
        };
        let x1 = [1.0f32, 0.5, 0.25, 2.0][p];
        assert!((x[4] - (c - x1 * s)).abs() < 1e-6, "{style:?}: {}", x[4]);
        assert!(
            (x[4 + p] - (s + x1 * c)).abs() < 1e-6,
            "{style:?}: {}",
            x[4 + p]
        );
        let norm = |v: &[f32]| v.iter().map(|a| a * a).sum::<f32>();
        assert!((norm(&x[4..]) - norm(&x[..4])).abs() < 1e-5);
    }
}

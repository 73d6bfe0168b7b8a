//! The checkpoint-format kernels (`I8`, `U4`, `F8E4M3`, W8A8): the SIMD path gives the
//! scalar definition's bits, both are close to the f64 product of the dequantized
//! weights, and a row's result does not depend on its batch or thread split.

use pagellm_kernels::matmul::{matmul, matmul_ref, Activations, WeightRef};
use pagellm_kernels::pool::ThreadPool;
use pagellm_kernels::quant::wq::{self, dequantize_row_wq, quantize_row_i8_tok};
use pagellm_kernels::quant::{
    dot_kernel, dot_kernel_i8_tok, dot_kernel_ref, quantize_row_q8_ref, ActQuant, BlockQ8,
    DotKernel, GgmlType, QuantParams,
};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};

#[derive(Debug, Clone, Copy)]
enum Fmt {
    I8,
    W8A8,
    U4Sym,
    U4Zero,
    /// With zero points and an act order (GPTQ `desc_act`).
    U4Act,
    F8,
}

const FMTS: [Fmt; 6] = [
    Fmt::I8,
    Fmt::W8A8,
    Fmt::U4Sym,
    Fmt::U4Zero,
    Fmt::U4Act,
    Fmt::F8,
];

fn ty(f: Fmt) -> GgmlType {
    match f {
        Fmt::I8 | Fmt::W8A8 => GgmlType::I8,
        Fmt::U4Sym | Fmt::U4Zero | Fmt::U4Act => GgmlType::U4,
        Fmt::F8 => GgmlType::F8E4M3,
    }
}

/// Random weight data and params of `rows × cols`, groups of `group` for U4.
fn weight(
    f: Fmt,
    rng: &mut impl Rng,
    rows: usize,
    cols: usize,
    group: usize,
) -> (Vec<u8>, QuantParams) {
    let t = ty(f);
    let rb = t.row_bytes(cols).unwrap();
    let mut data: Vec<u8> = (0..rows * rb).map(|_| rng.gen()).collect();
    if t == GgmlType::F8E4M3 {
        // No NaN encodings.
        for b in &mut data {
            if *b & 0x7F == 0x7F {
                *b &= 0xFE;
            }
        }
    }
    let group = if t == GgmlType::U4 { group } else { cols };
    let n = rows * cols / group;
    let scales = (0..n).map(|_| rng.gen_range(0.001f32..0.05)).collect();
    let zeros = matches!(f, Fmt::U4Zero | Fmt::U4Act)
        .then(|| (0..n).map(|_| rng.gen_range(0..16u8)).collect());
    let act = if matches!(f, Fmt::W8A8) {
        ActQuant::PerToken
    } else {
        ActQuant::Block32
    };
    let perm = matches!(f, Fmt::U4Act).then(|| {
        let mut p: Vec<u32> = (0..cols as u32).collect();
        for i in (1..cols).rev() {
            p.swap(i, rng.gen_range(0..=i));
        }
        p
    });
    let p = QuantParams {
        group,
        scales,
        zeros,
        act,
        perm,
    };
    p.check(t, rows, cols).unwrap();
    (data, p)
}

/// Row `r`'s products with `n` activation rows through the production kernel and the
/// scalar twin, before the driver's row scale.
fn both(
    f: Fmt,
    w: &[u8],
    p: &QuantParams,
    r: usize,
    cols: usize,
    x: &[f32],
    n: usize,
) -> ([f32; 4], [f32; 4]) {
    let t = ty(f);
    let mut fast = [f32::NAN; 4];
    let mut slow = [f32::NAN; 4];
    let nb = cols / 32;
    let mut q8 = vec![BlockQ8::default(); n * nb];
    for (x, q) in x.chunks_exact(cols).zip(q8.chunks_exact_mut(nb)) {
        quantize_row_q8_ref(x, q);
    }
    let mut sums = vec![0f32; n * nb];
    wq::u4_act_sums(&q8, &mut sums);
    match f {
        Fmt::W8A8 => {
            let mut q = vec![0i8; n * cols];
            for (x, q) in x.chunks_exact(cols).zip(q.chunks_exact_mut(cols)) {
                quantize_row_i8_tok(x, q);
            }
            dot_kernel_i8_tok()(w, &q, n, &mut fast);
            wq::dot_i8_tok(w, &q, n, &mut slow);
        }
        _ => {
            let k = [dot_kernel(t), dot_kernel_ref(t)];
            for (k, out) in k.into_iter().zip([&mut fast, &mut slow]) {
                match k {
                    DotKernel::Q8(g) => g(w, &q8, n, out),
                    DotKernel::F32(g) => g(w, x, n, out),
                    DotKernel::U4(g) => g(
                        w,
                        p.row_scales(r, cols),
                        p.row_zeros(r, cols),
                        p.group,
                        &q8,
                        &sums,
                        n,
                        out,
                    ),
                    DotKernel::Q8K(_) => unreachable!(),
                }
            }
        }
    }
    (fast, slow)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// SIMD equals scalar to the bit, and both are within the activation rounding bound
    /// of the exact product of the dequantized weights.
    #[test]
    fn kernels_match_scalar_and_the_exact_product(
        seed in 0u64..1_000_000,
        fi in 0usize..FMTS.len(),
        chunks in 1usize..=12,
        gsel in 0usize..3,
        n in 1usize..=4,
    ) {
        let f = FMTS[fi];
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        // U4 groups of 32, 64 or 128 that divide the width.
        let group = [32, 64, 128][gsel];
        let cols = if ty(f) == GgmlType::U4 { chunks.div_ceil(group / 32) * group } else { chunks * 32 };
        let (w, p) = weight(f, &mut rng, 1, cols, group);
        // The dot kernels work in stored order; the act order is the driver's (below).
        let p = QuantParams { perm: None, ..p };
        let x: Vec<f32> = (0..n * cols).map(|_| rng.gen_range(-3f32..3.0)).collect();
        let (fast, slow) = both(f, &w, &p, 0, cols, &x, n);
        for i in 0..n {
            prop_assert_eq!(fast[i].to_bits(), slow[i].to_bits(), "{:?} row {}: {} vs {}", f, i, fast[i], slow[i]);
        }
        let mut wf = vec![0f32; cols];
        dequantize_row_wq(ty(f), &p, 0, &w, &mut wf);
        let s = p.row_scales(0, cols)[0];
        for i in 0..n {
            let xi = &x[i * cols..(i + 1) * cols];
            let exact: f64 = wf.iter().zip(xi).map(|(&a, &b)| a as f64 * b as f64).sum();
            let mag: f64 = wf.iter().zip(xi).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
            let got = match f {
                Fmt::I8 | Fmt::F8 => slow[i] as f64 * s as f64,
                Fmt::W8A8 => {
                    let amax = xi.iter().fold(0f32, |m, v| m.max(v.abs()));
                    slow[i] as f64 * s as f64 * (amax / 127.0) as f64
                }
                _ => slow[i] as f64,
            };
            // Activations are rounded by at most half a step of amax/127 (per block or
            // per token), plus f32 accumulation.
            let amax = xi.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
            let wsum: f64 = wf.iter().map(|v| v.abs() as f64).sum();
            let tol = if matches!(f, Fmt::F8) { 1e-5 * mag + 1e-6 } else { wsum * amax / 254.0 * 1.01 + 1e-5 * mag + 1e-6 };
            prop_assert!((got - exact).abs() <= tol, "{:?}: {} vs exact {} (tol {})", f, got, exact, tol);
        }
    }

    /// Through the matmul driver (tiles, threads, row scales): close to the dequantized
    /// reference, and a row alone gets the bits it gets inside any batch.
    #[test]
    fn matmul_is_batch_invariant(
        seed in 0u64..1_000_000,
        fi in 0usize..FMTS.len(),
        n in 1usize..=11,
        rows in 1usize..=37,
        pick in 0usize..11,
    ) {
        let f = FMTS[fi];
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let cols = 128;
        let (data, p) = weight(f, &mut rng, rows, cols, 64);
        let w = WeightRef { params: Some(&p), ..WeightRef::plain(ty(f), &data, rows, cols) };
        let x: Vec<f32> = (0..n * cols).map(|_| rng.gen_range(-2f32..2.0)).collect();
        let pool = ThreadPool::new(3);
        let mut act = Activations::new();
        act.reset(n, cols).copy_from_slice(&x);
        let mut out = vec![0f32; n * rows];
        matmul(&pool, &mut act, w, &mut out);
        let mut want = vec![0f32; n * rows];
        matmul_ref(&x, n, w, &mut want);
        let mut wf = vec![0f32; cols];
        for r in 0..rows {
            dequantize_row_wq(ty(f), &p, r, &data[r * w.ty.row_bytes(cols).unwrap()..][..w.ty.row_bytes(cols).unwrap()], &mut wf);
            let wsum: f32 = wf.iter().map(|v| v.abs()).sum();
            for i in 0..n {
                let amax = x[i * cols..(i + 1) * cols].iter().fold(0f32, |m, v| m.max(v.abs()));
                let tol = if matches!(f, Fmt::F8) { 1e-3 } else { wsum * amax / 254.0 * 1.01 + 1e-3 };
                let (a, b) = (out[i * rows + r], want[i * rows + r]);
                prop_assert!((a - b).abs() <= tol, "{:?} row {} token {}: {} vs {} (tol {})", f, r, i, a, b, tol);
            }
        }
        let i = pick % n;
        let mut one = Activations::new();
        one.reset(1, cols).copy_from_slice(&x[i * cols..(i + 1) * cols]);
        let mut out1 = vec![0f32; rows];
        matmul(&pool, &mut one, w, &mut out1);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        prop_assert_eq!(bits(&out1), bits(&out[i * rows..(i + 1) * rows]));
    }
}

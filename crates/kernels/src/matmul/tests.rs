use super::*;
use proptest::prelude::*;
use rand::{Rng, SeedableRng};

/// Random Q8_0 rows: an f16 scale then 32 int8 values per block.
fn q8_0_rows(rng: &mut impl Rng, rows: usize, cols: usize) -> Vec<u8> {
    let mut v = Vec::new();
    for _ in 0..rows * cols / 32 {
        v.extend_from_slice(&half::f16::from_f32(rng.gen_range(0.001..0.05)).to_le_bytes());
        v.extend((0..32).map(|_| rng.gen::<u8>()));
    }
    v
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]
    /// Tiling, threading and the multi-job split give the plain definition's result,
    /// for any batch size and any number of rows (including partial tiles).
    #[test]
    fn matmul_many_matches_reference(seed in 0u64..10_000, n in 1usize..10, rows in 1usize..50, blocks in 1usize..4) {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let cols = blocks * 32;
        let wq = q8_0_rows(&mut rng, rows, cols);
        let wf: Vec<u8> = (0..rows * cols).flat_map(|_| rng.gen_range(-1f32..1.0).to_le_bytes()).collect();
        let x: Vec<f32> = (0..n * cols).map(|_| rng.gen_range(-2f32..2.0)).collect();
        let pool = ThreadPool::new(3);
        let mut act = Activations::new();
        act.reset(n, cols).copy_from_slice(&x);
        let w_q = WeightRef::plain(GgmlType::Q8_0, &wq, rows, cols);
        let w_f = WeightRef::plain(GgmlType::F32, &wf, rows.div_ceil(2), cols);
        let mut out_q = vec![0f32; n * rows];
        let mut out_f = vec![0f32; n * w_f.rows];
        matmul_many(&pool, &mut act, &mut [MatmulJob { w: w_q, out: &mut out_q }, MatmulJob { w: w_f, out: &mut out_f }]);
        for (w, out) in [(w_q, &out_q), (w_f, &out_f)] {
            let mut want = vec![0f32; n * w.rows];
            matmul_ref(&x, n, w, &mut want);
            let rb = w.ty.row_bytes(cols).unwrap();
            for (i, (a, b)) in out.iter().zip(&want).enumerate() {
                // Q8 activations round each element by at most half a step (amax/127/2).
                let mut wrow = vec![0f32; cols];
                crate::quant::dequantize_row(w.ty, &w.data[(i % w.rows) * rb..][..rb], &mut wrow);
                let amax = x[(i / w.rows) * cols..][..cols].iter().fold(0f32, |m, v| m.max(v.abs()));
                let bound = wrow.iter().map(|v| v.abs()).sum::<f32>() * amax / 254.0;
                let tol = if w.ty == GgmlType::F32 { 1e-4 } else { bound * 1.01 + 1e-4 };
                prop_assert!((a - b).abs() <= tol, "{:?} cell {i}: {a} vs {b} (tol {tol})", w.ty);
            }
        }
        // Batch invariance: row 0 alone gives bit-identical results.
        let mut one = Activations::new();
        one.reset(1, cols).copy_from_slice(&x[..cols]);
        let mut out1 = vec![0f32; rows];
        matmul(&pool, &mut one, w_q, &mut out1);
        prop_assert_eq!(&out1[..], &out_q[..rows]);
    }
}

/// Random rows of a 32-wide weight type: random bytes with finite small f16 scales
/// (and mins) in the leading fields of each block.
fn rows_of(ty: GgmlType, rng: &mut impl Rng, rows: usize, cols: usize) -> Vec<u8> {
    let bb = ty.block_bytes();
    let mut v: Vec<u8> = (0..rows * cols / 32 * bb).map(|_| rng.gen()).collect();
    let fields: &[usize] = match ty {
        GgmlType::Q4_1 | GgmlType::Q5_1 => &[0, 2],
        _ => &[0],
    };
    for blk in v.chunks_exact_mut(bb) {
        for &f in fields {
            let h = half::f16::from_f32(rng.gen_range(-0.05..0.05));
            blk[f..f + 2].copy_from_slice(&h.to_le_bytes());
        }
    }
    v
}

/// Random weights of `ty` (`rows` × `blocks` blocks) and `n` activation rows.
fn random_product(
    seed: u64,
    ty: GgmlType,
    n: usize,
    rows: usize,
    blocks: usize,
) -> (Vec<u8>, Vec<f32>, usize) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let cols = blocks * 32;
    let data = rows_of(ty, &mut rng, rows, cols);
    let x = (0..n * cols).map(|_| rng.gen_range(-2f32..2.0)).collect();
    (data, x, cols)
}

const TILED_TYPES: [GgmlType; 5] = [
    GgmlType::Q4_1,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q5_0,
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// The tiled matmul gives every cell the bits of the per-pair kernel, and a row's
    /// outputs do not depend on the batch it is computed in (alone or among up to 70
    /// rows, whatever tile or remainder it lands in).
    #[test]
    fn tiled_matmul_is_pair_kernel_bit_for_bit(
        seed in 0u64..1_000_000,
        ty_i in 0usize..TILED_TYPES.len(),
        n in 1usize..=70,
        rows in 1usize..=40,
        blocks in 1usize..=6,
        pick in 0usize..70,
    ) {
        let ty = TILED_TYPES[ty_i];
        let (data, x, cols) = random_product(seed, ty, n, rows, blocks);
        let w = WeightRef::plain(ty, &data, rows, cols);
        let pool = ThreadPool::new(2);
        let mut act = Activations::new();
        act.reset(n, cols).copy_from_slice(&x);
        let mut out = vec![0f32; n * rows];
        matmul(&pool, &mut act, w, &mut out);
        // Pair by pair with the per-row kernel.
        let DotKernel::Q8(f) = dot_kernel(ty) else { unreachable!() };
        let rb = ty.row_bytes(cols).unwrap();
        let mut q = vec![BlockQ8::default(); blocks];
        for i in 0..n {
            quantize_row_q8(&x[i * cols..(i + 1) * cols], &mut q);
            for r in 0..rows {
                let mut o = [0f32; 4];
                f(&data[r * rb..(r + 1) * rb], &q, 1, &mut o);
                prop_assert_eq!(
                    out[i * rows + r].to_bits(), o[0].to_bits(),
                    "{:?} act row {} weight row {}: {} vs {}", ty, i, r, out[i * rows + r], o[0]
                );
            }
        }
        // Batch invariance: one row alone gives the bits it got in the batch.
        let i = pick % n;
        let mut one = Activations::new();
        one.reset(1, cols).copy_from_slice(&x[i * cols..(i + 1) * cols]);
        let mut out1 = vec![0f32; rows];
        matmul(&pool, &mut one, w, &mut out1);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        prop_assert_eq!(bits(&out1), bits(&out[i * rows..(i + 1) * rows]));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]
    /// The float reference path gives the same bits whatever the thread split and
    /// whichever rows share the batch, and is the dequantized weights' dot product
    /// with the unquantized activations to f32 rounding.
    #[test]
    fn reference_path_is_invariant_and_unquantized(
        seed in 0u64..1_000_000,
        ty_i in 0usize..TILED_TYPES.len(),
        n in 1usize..=9,
        rows in 1usize..=20,
        blocks in 1usize..=5,
        pick in 0usize..9,
    ) {
        let ty = TILED_TYPES[ty_i];
        let (data, x, cols) = random_product(seed, ty, n, rows, blocks);
        let w = WeightRef::plain(ty, &data, rows, cols);
        let run = |threads: usize, x: &[f32]| {
            let mut act = Activations::new();
            act.set_numerics(Numerics::Reference);
            let m = x.len() / cols;
            act.reset(m, cols).copy_from_slice(x);
            let mut out = vec![0f32; m * rows];
            matmul(&ThreadPool::new(threads), &mut act, w, &mut out);
            out.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        };
        let two = run(2, &x);
        prop_assert_eq!(&two, &run(1, &x));
        let i = pick % n;
        prop_assert_eq!(&two[i * rows..(i + 1) * rows], &run(2, &x[i * cols..(i + 1) * cols])[..]);
        let rb = ty.row_bytes(cols).unwrap();
        let mut wf = vec![0f32; cols];
        for r in 0..rows {
            crate::quant::dequantize_row(ty, &data[r * rb..(r + 1) * rb], &mut wf);
            for i in 0..n {
                let xi = &x[i * cols..(i + 1) * cols];
                let exact: f64 = wf.iter().zip(xi).map(|(a, b)| *a as f64 * *b as f64).sum();
                let mass: f64 = wf.iter().zip(xi).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
                let got = f32::from_bits(two[i * rows + r]) as f64;
                prop_assert!((got - exact).abs() <= 1e-6 * mass + 1e-9, "{} vs {}", got, exact);
            }
        }
    }
}

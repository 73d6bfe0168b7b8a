//! Properties of the interleaved (R8) weights: repacking loses nothing, every SIMD family
//! this CPU runs gives its scalar twin's bits for every activation row count, the twin is
//! the exact integer product of the dequantized weights and quantized activations (to
//! f32 rounding), and a matmul through repacked weights gives a row the same bits alone
//! as in any batch.

// Weight rows and activation rows index several arrays at once.
#![allow(clippy::needless_range_loop)]

use half::f16;
use pagellm_kernels::cpu::{level_name, supported, LEVELS};
use pagellm_kernels::matmul::{matmul, Activations, WeightRef};
use pagellm_kernels::pool::ThreadPool;
use pagellm_kernels::quant::blocks::scales_mins_k4;
use pagellm_kernels::quant::interleave::{
    block_isums, block_sub_sums, r16_kernel_at, r16k_kernel_at, r8_kernel_at, r8k_kernel_at,
    Interleaved, SubSums, ACT_ROWS, R16, R8,
};
use pagellm_kernels::quant::{
    dequantize_row, quantize_row_q8_ref, quantize_row_q8k_ref, BlockQ8, BlockQ8K, GgmlType,
    SimdLevel,
};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};

const TYPES: [GgmlType; 5] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
];

/// Random GGML rows of `ty`: random quant bytes, finite scales (and mins) of either sign.
fn rows_of(ty: GgmlType, rng: &mut impl Rng, rows: usize, cols: usize) -> Vec<u8> {
    let bb = ty.block_bytes();
    let mut v: Vec<u8> = (0..rows * ty.row_bytes(cols).unwrap())
        .map(|_| rng.gen())
        .collect();
    // Where each f16 scale (or min) lies in a block.
    let fields: &[usize] = match ty {
        GgmlType::Q4_1 | GgmlType::Q4_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        _ => &[0],
    };
    for blk in v.chunks_exact_mut(bb) {
        for &f in fields {
            let h = f16::from_f32(rng.gen_range(-0.05..0.05));
            blk[f..f + 2].copy_from_slice(&h.to_le_bytes());
        }
    }
    v
}

struct Case {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    w: Vec<u8>,
    x: Vec<f32>,
    n: usize,
}

fn case(seed: u64, ty_i: usize, groups: usize, blocks: usize, n: usize) -> Case {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let ty = TYPES[ty_i % TYPES.len()];
    let (rows, cols) = (groups * R8, blocks * ty.block_elems());
    let w = rows_of(ty, &mut rng, rows, cols);
    // Some activation rows are extreme (one huge value), so blocks reach ±127.
    let x = (0..n * cols)
        .map(|i| {
            if i % 97 == 5 {
                40.0
            } else {
                rng.gen_range(-2f32..2.0)
            }
        })
        .collect();
    Case {
        ty,
        rows,
        cols,
        w,
        x,
        n,
    }
}

fn quantized(c: &Case) -> (Vec<BlockQ8>, Vec<i32>) {
    let nb = c.cols / 32;
    let mut q = vec![BlockQ8::default(); c.n * nb];
    for (x, q) in c.x.chunks_exact(c.cols).zip(q.chunks_exact_mut(nb)) {
        quantize_row_q8_ref(x, q);
    }
    let mut s = vec![0; q.len()];
    block_isums(&q, &mut s);
    (q, s)
}

fn quantized_k(c: &Case) -> Vec<BlockQ8K> {
    let nb = c.cols / 256;
    let mut q = vec![BlockQ8K::default(); c.n * nb];
    for (x, q) in c.x.chunks_exact(c.cols).zip(q.chunks_exact_mut(nb)) {
        quantize_row_q8k_ref(x, q);
    }
    q
}

/// `Σ w·a` of K-quant row `r` with activation row `m`, in f64 from the GGML blocks, and
/// the sum of the terms' magnitudes.
fn exact_k(c: &Case, q: &[BlockQ8K], r: usize, m: usize) -> (f64, f64) {
    if c.ty == GgmlType::Q4_K {
        return exact_q4_k(c, q, r, m);
    }
    // Q6_K's dequantized weights `d·sc·(q − 32)` are exact in f32.
    let rb = c.ty.row_bytes(c.cols).unwrap();
    let mut wf = vec![0f32; c.cols];
    dequantize_row(c.ty, &c.w[r * rb..(r + 1) * rb], &mut wf);
    let nb = c.cols / 256;
    let (mut exact, mut mass) = (0f64, 0f64);
    for (e, &w) in wf.iter().enumerate() {
        let a = &q[m * nb + e / 256];
        let v = w as f64 * a.d as f64 * a.qs[e % 256] as f64;
        exact += v;
        mass += v.abs();
    }
    (exact, mass)
}

fn exact_q4_k(c: &Case, q: &[BlockQ8K], r: usize, m: usize) -> (f64, f64) {
    let nb = c.cols / 256;
    let (mut exact, mut mass) = (0f64, 0f64);
    for b in 0..nb {
        let blk = &c.w[(r * nb + b) * 144..][..144];
        let d = f16::from_le_bytes([blk[0], blk[1]]).to_f64();
        let dmin = f16::from_le_bytes([blk[2], blk[3]]).to_f64();
        let (sc, mn) = scales_mins_k4(blk[4..16].try_into().unwrap());
        let a = &q[m * nb + b];
        for e in 0..256 {
            let (j, l) = (e / 32, e % 32);
            let byte = blk[16 + 32 * (j / 2) + l];
            let qv = if j % 2 == 1 { byte >> 4 } else { byte & 15 } as f64;
            let av = a.d as f64 * a.qs[e] as f64;
            let (pos, neg) = (d * sc[j] as f64 * qv, dmin * mn[j] as f64);
            exact += (pos - neg) * av;
            mass += (pos.abs() + neg.abs()) * av.abs();
        }
    }
    (exact, mass)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// The K-quant families give the twin's bits for 1 to 4 activation rows, alone or
    /// together, and the twin is the exact product to f32 rounding.
    #[test]
    fn k_quant_families_match_the_twin(seed in 0u64..1_000_000, ty_i in 3usize..5, blocks in 1usize..4, n in 1usize..=4) {
        let c = case(seed, ty_i, 1, blocks, n);
        let p = Interleaved::repack(c.ty, &c.w, c.rows, c.cols).expect("repackable");
        let q = quantized_k(&c);
        let twin = r8k_kernel_at(SimdLevel::Scalar, c.ty).expect("every K type has a twin");
        let mut want = [[f32::NAN; R8]; 4];
        twin(p.group(0), &q, n, &mut want);
        for level in LEVELS {
            let Some(f) = r8k_kernel_at(level, c.ty) else { continue };
            let mut got = [[f32::NAN; R8]; 4];
            f(p.group(0), &q, n, &mut got);
            for m in 0..n {
                let mut alone = [[f32::NAN; R8]; 4];
                f(p.group(0), &q[m * blocks..], 1, &mut alone);
                for r in 0..R8 {
                    prop_assert_eq!(got[m][r].to_bits(), want[m][r].to_bits(),
                        "{} {} act {} row {}: {} vs {}", level_name(level), c.ty.name(), m, r, got[m][r], want[m][r]);
                    prop_assert_eq!(alone[0][r].to_bits(), want[m][r].to_bits());
                }
            }
        }
        for r in 0..R8 {
            for m in 0..n {
                let (exact, mass) = exact_k(&c, &q, r, m);
                prop_assert!((want[m][r] as f64 - exact).abs() <= 1e-5 * mass + 1e-6,
                    "act {} row {}: {} vs {}", m, r, want[m][r], exact);
            }
        }
    }

    /// The two-group kernels give each group's rows the twin's bits, for 1 to 8
    /// activation rows in one call.
    #[test]
    fn two_group_kernels_match_the_twin(seed in 0u64..1_000_000, ty_i in 0usize..5, blocks in 1usize..4, n in 1usize..=ACT_ROWS) {
        let c = case(seed, ty_i, 2, blocks, n);
        // The twin reads each group whole, the two-group kernels the pair stored together.
        let p = Interleaved::repack_as(c.ty, &c.w, c.rows, c.cols, false).expect("repackable");
        let pp = Interleaved::repack_as(c.ty, &c.w, c.rows, c.cols, true).expect("repackable");
        prop_assert!(!p.paired() && pp.paired());
        let nb = c.cols / c.ty.block_elems();
        let (q, s) = quantized(&c);
        let qk = if c.ty.block_elems() == 256 { quantized_k(&c) } else { Vec::new() };
        // The twin, one group and one activation row at a time.
        let mut want = vec![[f32::NAN; R16]; n];
        for (m, want) in want.iter_mut().enumerate() {
            for g in 0..2 {
                let mut o = [[f32::NAN; R8]; 4];
                if c.ty.block_elems() == 256 {
                    r8k_kernel_at(SimdLevel::Scalar, c.ty).unwrap()(p.group(g), &qk[m * nb..], 1, &mut o);
                } else {
                    r8_kernel_at(SimdLevel::Scalar, c.ty).unwrap()(p.group(g), &q[m * nb..], &s[m * nb..], 1, &mut o);
                }
                want[g * R8..(g + 1) * R8].copy_from_slice(&o[0]);
            }
        }
        for level in LEVELS {
            let mut got = [[f32::NAN; R16]; ACT_ROWS];
            if c.ty.block_elems() == 256 {
                let Some(f) = r16k_kernel_at(level, c.ty) else { continue };
                let mut sums = vec![SubSums::default(); qk.len()];
                block_sub_sums(&qk, &mut sums);
                f(pp.pair(0), &qk, &sums, n, &mut got);
            } else {
                let Some(f) = r16_kernel_at(level, c.ty) else { continue };
                f(pp.pair(0), &q, &s, n, &mut got);
            }
            for m in 0..n {
                for r in 0..R16 {
                    prop_assert_eq!(got[m][r].to_bits(), want[m][r].to_bits(),
                        "{} {} act {} row {}: {} vs {}", level_name(level), c.ty.name(), m, r, got[m][r], want[m][r]);
                }
            }
        }
    }

    /// Repacking keeps every byte, groups paired or not: each row comes back as it was.
    #[test]
    fn repack_round_trips(seed in 0u64..1_000_000, ty_i in 0usize..3, groups in 1usize..6, blocks in 1usize..5, paired: bool) {
        let c = case(seed, ty_i, groups, blocks, 1);
        let p = Interleaved::repack_as(c.ty, &c.w, c.rows, c.cols, paired).expect("repackable");
        prop_assert_eq!(p.bytes().len(), c.w.len());
        let rb = c.ty.row_bytes(c.cols).unwrap();
        for r in 0..c.rows {
            prop_assert_eq!(&p.ggml_row(r)[..], &c.w[r * rb..(r + 1) * rb], "row {}", r);
        }
        // Paired, every group block reads back as the whole group's, and an odd last
        // group is stored whole.
        let unpaired = Interleaved::repack_as(c.ty, &c.w, c.rows, c.cols, false).unwrap();
        let gbb = p.group_bytes() / blocks;
        for g in 0..groups {
            prop_assert_eq!(p.whole(g), !paired || g == groups / 2 * 2);
            for b in 0..blocks {
                prop_assert_eq!(p.group_block(g, b), &unpaired.group(g)[b * gbb..][..gbb], "group {} block {}", g, b);
            }
        }
    }

    /// Every family gives the scalar twin's bits for 1 to 4 activation rows, a row's
    /// result does not depend on how many rows share the call, and the twin is the
    /// dequantized weight against the quantized activations.
    #[test]
    fn families_match_the_twin(seed in 0u64..1_000_000, ty_i in 0usize..3, blocks in 1usize..7, n in 1usize..=4) {
        let c = case(seed, ty_i, 1, blocks, n);
        let p = Interleaved::repack(c.ty, &c.w, c.rows, c.cols).expect("repackable");
        let (q, s) = quantized(&c);
        let twin = r8_kernel_at(SimdLevel::Scalar, c.ty).expect("every type has a twin");
        let mut want = [[f32::NAN; R8]; 4];
        twin(p.group(0), &q, &s, n, &mut want);
        let nb = blocks;
        for level in LEVELS {
            let Some(f) = r8_kernel_at(level, c.ty) else { continue };
            let mut got = [[f32::NAN; R8]; 4];
            f(p.group(0), &q, &s, n, &mut got);
            for m in 0..n {
                let mut alone = [[f32::NAN; R8]; 4];
                f(p.group(0), &q[m * nb..], &s[m * nb..], 1, &mut alone);
                for r in 0..R8 {
                    prop_assert_eq!(got[m][r].to_bits(), want[m][r].to_bits(),
                        "{} {} act {} row {}: {} vs {}", level_name(level), c.ty.name(), m, r, got[m][r], want[m][r]);
                    prop_assert_eq!(alone[0][r].to_bits(), want[m][r].to_bits());
                }
            }
        }
        // The twin against the f64 product of the dequantized weight and activations.
        let rb = c.ty.row_bytes(c.cols).unwrap();
        let mut wf = vec![0f32; c.cols];
        for r in 0..R8 {
            dequantize_row(c.ty, &c.w[r * rb..(r + 1) * rb], &mut wf);
            for m in 0..n {
                let (mut exact, mut mass) = (0f64, 0f64);
                for b in 0..nb {
                    let a = &q[m * nb + b];
                    for j in 0..32 {
                        let v = wf[32 * b + j] as f64 * (a.d as f64 * a.qs[j] as f64);
                        exact += v;
                        mass += v.abs();
                    }
                }
                // Q4_1's minimum meets the activations through their f16 sum `s`.
                let tol = if c.ty == GgmlType::Q4_1 {
                    let mins: f64 = (0..nb).map(|b| {
                        let blk = &c.w[r * rb + b * 20..];
                        f16::from_le_bytes([blk[2], blk[3]]).to_f64().abs() * (q[m * nb + b].s as f64).abs()
                    }).sum();
                    1e-5 * mass + 2e-3 * mins + 1e-6
                } else {
                    1e-5 * mass + 1e-6
                };
                prop_assert!((want[m][r] as f64 - exact).abs() <= tol,
                    "{} act {} row {}: {} vs {}", c.ty.name(), m, r, want[m][r], exact);
            }
        }
    }

    /// A matmul through repacked weights: each cell is the kernel's result for its pair,
    /// and a row alone gets the bits it got in the batch, for any batch size and split.
    #[test]
    fn repacked_matmul_is_batch_invariant(seed in 0u64..1_000_000, ty_i in 0usize..5, groups in 1usize..6, blocks in 1usize..4, n in 1usize..=11, pick in 0usize..11) {
        let c = case(seed, ty_i, groups, blocks, n);
        let p = Interleaved::repack(c.ty, &c.w, c.rows, c.cols).expect("repackable");
        let w = WeightRef { packed: Some(&p), ..WeightRef::plain(c.ty, &c.w, c.rows, c.cols) };
        let run = |threads: usize, x: &[f32]| {
            let m = x.len() / c.cols;
            let mut act = Activations::new();
            act.reset(m, c.cols).copy_from_slice(x);
            let mut out = vec![0f32; m * c.rows];
            matmul(&ThreadPool::new(threads), &mut act, w, &mut out);
            out.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        };
        let all = run(2, &c.x);
        prop_assert_eq!(&all, &run(1, &c.x));
        let i = pick % n;
        prop_assert_eq!(&all[i * c.rows..(i + 1) * c.rows], &run(3, &c.x[i * c.cols..(i + 1) * c.cols])[..]);
        let level = pagellm_kernels::cpu::simd_level();
        let nb = c.cols / c.ty.block_elems();
        // The one-group kernel reads groups stored whole.
        let p = Interleaved::repack_as(c.ty, &c.w, c.rows, c.cols, false).expect("repackable");
        for g in 0..groups {
            let mut o = [[0f32; R8]; 4];
            if c.ty.block_elems() == 256 {
                r8k_kernel_at(level, c.ty).unwrap()(p.group(g), &quantized_k(&c)[i * nb..], 1, &mut o);
            } else {
                let (q, s) = quantized(&c);
                r8_kernel_at(level, c.ty).unwrap()(p.group(g), &q[i * nb..], &s[i * nb..], 1, &mut o);
            }
            for r in 0..R8 {
                prop_assert_eq!(all[i * c.rows + g * R8 + r], o[0][r].to_bits());
            }
        }
    }
}

/// Which families the properties above ran here, and which they could not, by name.
#[test]
fn interleaved_families_run_here() {
    for level in LEVELS {
        let offered = r8_kernel_at(level, GgmlType::Q4_1).is_some();
        assert_eq!(offered, level <= supported(), "{}", level_name(level));
        assert_eq!(r8k_kernel_at(level, GgmlType::Q4_K).is_some(), offered);
        assert_eq!(r8k_kernel_at(level, GgmlType::Q6_K).is_some(), offered);
        let two = r16_kernel_at(level, GgmlType::Q4_1).is_some();
        assert_eq!(r16k_kernel_at(level, GgmlType::Q4_K).is_some(), two);
        assert_eq!(r16k_kernel_at(level, GgmlType::Q6_K).is_some(), two);
        assert_eq!(two, offered && level == SimdLevel::Avx512Vnni);
        eprintln!(
            "interleaved family {}: {}",
            level_name(level),
            match (offered, two) {
                (true, true) => "run, with its two-group (512-bit) kernels",
                (true, false) => "run",
                _ => "NOT RUN (this CPU lacks it)",
            }
        );
    }
}

/// Types without a layout, and row counts that are not whole groups, are not repacked.
#[test]
fn repack_refuses_what_it_cannot_hold() {
    let w = vec![0u8; 12 * 20];
    assert!(Interleaved::repack(GgmlType::Q4_1, &w, 12, 32).is_none());
    assert!(Interleaved::repack(GgmlType::Q5_0, &w, 8, 32).is_none());
    assert!(Interleaved::repack(GgmlType::Q5_K, &[0; 8 * 176], 8, 256).is_none());
    assert!(Interleaved::repack(GgmlType::Q6_K, &[0; 8 * 210], 8, 256).is_some());
    assert!(Interleaved::repack(GgmlType::Q4_1, &w[..100], 8, 32).is_none());
    assert!(Interleaved::repack(GgmlType::Q4_1, &w[..160], 8, 32).is_some());
}

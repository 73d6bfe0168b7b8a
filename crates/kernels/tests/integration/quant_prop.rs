//! Properties of the GGML quant formats: SIMD dot products (and tiles) of every kernel
//! family this CPU runs against their scalar twins (bit for bit), scalar dot products against the dequantized
//! f32 dot product, activation quantization (SIMD vs scalar bit for bit, and the exact
//! definition of ggml's quantizers), the float arithmetic of each kernel on crafted
//! blocks, and hand-built blocks whose values are computed from the format description
//! (packing transcribed from ggml's `quantize_row_*_ref`), independently of the decoder
//! under test.

use half::{bf16, f16};
use pagellm_kernels::cpu::{level_name, supported, LEVELS};
use pagellm_kernels::quant::{
    dequantize_row, dot_kernel, dot_kernel_at, dot_kernel_ref, pack_scales4, quantize_row_q8,
    quantize_row_q8_ref, quantize_row_q8k, quantize_row_q8k_ref, tile_kernel_at, BlockQ8, BlockQ8K,
    DotKernel, GgmlType, TILE_W,
};
use proptest::collection::vec;
use proptest::prelude::*;
const ALL: [GgmlType; 11] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// The formats with tile kernels.
const TILE_TYPES: [GgmlType; 5] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
];

/// Byte offsets of the f16 scale fields inside one block (from ggml-common.h); every
/// other byte of a quantized block is valid whatever its value.
fn f16_fields(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => &[],
        GgmlType::I8 | GgmlType::U4 | GgmlType::F8E4M3 => {
            unreachable!("checkpoint formats are tested in wq_prop.rs")
        }
    }
}

fn h(v: f32) -> [u8; 2] {
    f16::from_f32(v).to_le_bytes()
}

/// One weight row plus `n_act` rows of f32 activations.
#[derive(Debug, Clone)]
struct Case {
    ty: GgmlType,
    cols: usize,
    n_act: usize,
    w: Vec<u8>,
    x: Vec<f32>,
}

fn activation() -> impl Strategy<Value = f32> {
    prop_oneof![6 => -4.0f32..4.0, 1 => Just(0.0f32), 1 => -1e-3f32..1e-3, 1 => -300.0f32..300.0]
}

fn scale() -> impl Strategy<Value = f32> {
    prop_oneof![6 => -0.05f32..0.05, 1 => Just(0.0f32), 1 => -4.0f32..4.0]
}

/// Random rows of `ty`: random bytes with finite f16 scales for quantized types, random
/// finite values for float types. Column counts cover tails for float types.
fn case(ty: GgmlType) -> impl Strategy<Value = Case> {
    let (unit, max_units) = match ty {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => (1, 700),
        GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => (256, 6),
        _ => (32, 48),
    };
    (1usize..=max_units, 1usize..=4).prop_flat_map(move |(units, n_act)| {
        let cols = units * unit;
        let n_blocks = cols / ty.block_elems();
        let n_scales = n_blocks * f16_fields(ty).len();
        let bytes = ty.row_bytes(cols).unwrap();
        (
            vec(any::<u8>(), bytes),
            vec(scale(), n_scales),
            vec(-3.0f32..3.0, if ty.is_quantized() { 0 } else { cols }),
            vec(activation(), n_act * cols),
        )
            .prop_map(move |(mut w, scales, floats, x)| {
                let fields = f16_fields(ty);
                for (k, s) in scales.iter().enumerate() {
                    let off = (k / fields.len()) * ty.block_bytes() + fields[k % fields.len()];
                    w[off..off + 2].copy_from_slice(&h(*s));
                }
                match ty {
                    GgmlType::F32 => w = floats.iter().flat_map(|v| v.to_le_bytes()).collect(),
                    GgmlType::F16 => w = floats.iter().flat_map(|v| h(*v)).collect(),
                    GgmlType::BF16 => {
                        w = floats
                            .iter()
                            .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
                            .collect()
                    }
                    _ => {}
                }
                Case {
                    ty,
                    cols,
                    n_act,
                    w,
                    x,
                }
            })
    })
}

fn any_case() -> impl Strategy<Value = Case> {
    proptest::sample::select(ALL.to_vec()).prop_flat_map(case)
}

/// Both quantized copies of some activation rows, as the matmul makes them.
struct Quantized {
    q8: Vec<BlockQ8>,
    q8k: Vec<BlockQ8K>,
}

fn quantize(x: &[f32]) -> Vec<BlockQ8> {
    let mut q = vec![BlockQ8::default(); x.len() / 32];
    quantize_row_q8_ref(x, &mut q);
    q
}

fn quantize_k(x: &[f32]) -> Vec<BlockQ8K> {
    let mut q = vec![BlockQ8K::default(); x.len() / 256];
    quantize_row_q8k_ref(x, &mut q);
    q
}

fn quantize_both(c: &Case) -> Quantized {
    let k = c.cols.is_multiple_of(256) && c.ty.is_quantized();
    Quantized {
        q8: if c.ty.is_quantized() {
            quantize(&c.x)
        } else {
            Vec::new()
        },
        q8k: if k { quantize_k(&c.x) } else { Vec::new() },
    }
}

/// The activations a kernel actually sees, dequantized: f32 for float weights.
fn seen_activations(k: DotKernel, c: &Case, q: &Quantized) -> Vec<f32> {
    match k {
        DotKernel::Q8(_) => {
            q.q8.iter()
                .flat_map(|b| b.qs.map(|v| b.d * v as f32))
                .collect()
        }
        DotKernel::Q8K(_) => q
            .q8k
            .iter()
            .flat_map(|b| b.qs.map(|v| b.d * v as f32))
            .collect(),
        DotKernel::F32(_) => c.x.clone(),
        DotKernel::U4(_) => unreachable!("checkpoint formats are tested in wq_prop.rs"),
    }
}

fn run(k: DotKernel, c: &Case, q: &Quantized, n_act: usize, first_row: usize) -> [f32; 4] {
    let mut out = [f32::NAN; 4];
    match k {
        DotKernel::Q8(f) => {
            let nb = c.cols / 32;
            f(
                &c.w,
                &q.q8[first_row * nb..(first_row + n_act) * nb],
                n_act,
                &mut out,
            )
        }
        DotKernel::Q8K(f) => {
            let nb = c.cols / 256;
            f(
                &c.w,
                &q.q8k[first_row * nb..(first_row + n_act) * nb],
                n_act,
                &mut out,
            )
        }
        DotKernel::F32(f) => f(
            &c.w,
            &c.x[first_row * c.cols..(first_row + n_act) * c.cols],
            n_act,
            &mut out,
        ),
        DotKernel::U4(_) => unreachable!("checkpoint formats are tested in wq_prop.rs"),
    }
    out
}

/// Exact-ish f64 dot product and the magnitude sum that bounds rounding errors.
fn f64_dot(w: &[f32], a: &[f32]) -> (f64, f64) {
    w.iter().zip(a).fold((0.0, 0.0), |(s, m), (&w, &a)| {
        (s + w as f64 * a as f64, m + (w as f64 * a as f64).abs())
    })
}

/// For the weight-plus-min formats (Q8_1 activations) the min term uses the block's
/// `s = f16(d_unrounded * sum(q))` rather than the dequantized activations' sum
/// `d * sum(q)`; this bounds the difference for activation row `r`.
fn q8_1_min_slack(c: &Case, q: &Quantized, r: usize) -> f64 {
    if !matches!(c.ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
        return 0.0;
    }
    let nb = c.cols / 32;
    let bb = c.ty.block_bytes();
    (0..nb)
        .map(|b| {
            let m = f16::from_le_bytes([c.w[b * bb + 2], c.w[b * bb + 3]]).to_f32() as f64;
            let y = &q.q8[r * nb + b];
            let sum: i32 = y.qs.iter().map(|&v| v as i32).sum();
            m.abs() * (y.s as f64 - y.d as f64 * sum as f64).abs()
        })
        .sum()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1500, ..ProptestConfig::default() })]

    /// (1) The kernel of every SIMD family this CPU runs equals the scalar twin bit for
    /// bit, for every n_act, and a row's result does not depend on n_act (batch
    /// invariance, every format).
    #[test]
    fn fast_kernel_matches_reference(c in any_case()) {
        let q = quantize_both(&c);
        for level in LEVELS {
            let Some(fk) = dot_kernel_at(level, c.ty) else { continue };
            let rk = dot_kernel_ref(c.ty);
            if matches!(fk, DotKernel::Q8K(_)) && q.q8k.is_empty() {
                return Ok(());
            }
            let fast = run(fk, &c, &q, c.n_act, 0);
            let reference = run(rk, &c, &q, c.n_act, 0);
            for r in 0..4 {
                if r >= c.n_act {
                    prop_assert!(fast[r].is_nan() && reference[r].is_nan(), "out[{}] written", r);
                    continue;
                }
                if c.ty.is_quantized() {
                    prop_assert_eq!(
                        fast[r].to_bits(), reference[r].to_bits(),
                        "{} {} cols={} row {}: fast {} ref {}", level_name(level), c.ty.name(), c.cols, r, fast[r], reference[r]
                    );
                } else {
                    let mut wf = vec![0f32; c.cols];
                    dequantize_row(c.ty, &c.w, &mut wf);
                    let (_, mass) = f64_dot(&wf, &c.x[r * c.cols..(r + 1) * c.cols]);
                    let tol = 1e-4 * mass + 1e-5;
                    prop_assert!(((fast[r] - reference[r]) as f64).abs() <= tol,
                        "{} row {}: fast {} ref {}", c.ty.name(), r, fast[r], reference[r]);
                }
                let alone = run(fk, &c, &q, 1, r);
                prop_assert_eq!(alone[0].to_bits(), fast[r].to_bits(), "batch variance in row {}", r);
                let alone = run(rk, &c, &q, 1, r);
                prop_assert_eq!(alone[0].to_bits(), reference[r].to_bits(), "batch variance in ref row {}", r);
            }
        }
    }

    /// (1b) Every tile kernel (two weight rows by four activation rows) of every SIMD
    /// family this CPU runs gives each pair the scalar twin's bits.
    #[test]
    fn tile_kernels_match_reference(
        ty in proptest::sample::select(TILE_TYPES.to_vec()),
        rows in vec(any::<u8>(), TILE_W * 48 * 34),
        scales in vec(scale(), TILE_W * 48 * 2),
        x in vec(activation(), 4 * 48 * 32),
        blocks in 1usize..=48,
    ) {
        let (rb, cols) = (ty.row_bytes(blocks * 32).unwrap(), blocks * 32);
        let mut w = rows[..TILE_W * rb].to_vec();
        let fields = f16_fields(ty);
        for (k, s) in scales.iter().take(TILE_W * blocks * fields.len()).enumerate() {
            let off = (k / fields.len()) * ty.block_bytes() + fields[k % fields.len()];
            w[off..off + 2].copy_from_slice(&h(*s));
        }
        let x: Vec<f32> = x[..4 * cols].to_vec();
        let q = quantize(&x);
        let mut packed = vec![Default::default(); blocks];
        pack_scales4(&q, &mut packed);
        let DotKernel::Q8(pair) = dot_kernel_ref(ty) else { unreachable!() };
        for level in LEVELS {
            let Some(tile) = tile_kernel_at(level, ty) else { continue };
            let mut out = [[f32::NAN; 4]; TILE_W];
            tile(&w, &q, &packed, &mut out);
            for (j, out) in out.iter().enumerate() {
                for (r, got) in out.iter().enumerate() {
                    let mut want = [0f32; 4];
                    pair(&w[j * rb..(j + 1) * rb], &q[r * blocks..(r + 1) * blocks], 1, &mut want);
                    prop_assert_eq!(got.to_bits(), want[0].to_bits(),
                        "{} {} weight row {} act row {}: {} vs {}", level_name(level), ty.name(), j, r, got, want[0]);
                }
            }
        }
    }

    /// (2) On every path, the scalar reference computes the dot product of the
    /// dequantized weights with the dequantized activations.
    #[test]
    fn reference_kernel_is_the_dequantized_dot(c in any_case()) {
        let q = quantize_both(&c);
        let mut wf = vec![0f32; c.cols];
        dequantize_row(c.ty, &c.w, &mut wf);
        {
            let k = dot_kernel_ref(c.ty);
            if matches!(k, DotKernel::Q8K(_)) && q.q8k.is_empty() {
                return Ok(());
            }
            let a = seen_activations(k, &c, &q);
            let got = run(k, &c, &q, c.n_act, 0);
            for (r, got) in got.iter().enumerate().take(c.n_act) {
                let (want, mass) = f64_dot(&wf, &a[r * c.cols..(r + 1) * c.cols]);
                let tol = 2e-5 * mass + 1e-6 + q8_1_min_slack(&c, &q, r);
                prop_assert!(
                    (*got as f64 - want).abs() <= tol,
                    "{} cols={} row {}: got {} want {} tol {}", c.ty.name(), c.cols, r, got, want, tol
                );
            }
        }
    }

    /// (3) Q8 (Q8_0 / Q8_1) quantization: SIMD and scalar agree bit for bit, and the
    /// result is ggml's AVX2 definition.
    #[test]
    fn q8_quantization(
        x in prop_oneof![
            vec(-4.0f32..4.0, 32..=32 * 20),
            vec(prop_oneof![-1e4f32..1e4, Just(0.0), -1e-20f32..1e-20, (-254i32..=254).prop_map(|v| v as f32 * 0.5)], 32..=32 * 20),
        ]
    ) {
        let n = x.len() / 32;
        let x = &x[..32 * n];
        let mut fast = vec![BlockQ8::default(); n];
        let mut reference = vec![BlockQ8::default(); n];
        quantize_row_q8(x, &mut fast);
        quantize_row_q8_ref(x, &mut reference);
        for (i, (f, r)) in fast.iter().zip(&reference).enumerate() {
            prop_assert_eq!(f.d.to_bits(), r.d.to_bits(), "block {} d", i);
            prop_assert_eq!(f.s.to_bits(), r.s.to_bits(), "block {} s", i);
            prop_assert_eq!(f.qs, r.qs, "block {} qs", i);
            let xb = &x[32 * i..32 * i + 32];
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
            if amax < 1e-30 {
                prop_assert_eq!(r, &BlockQ8::default());
                continue;
            }
            let d = amax / 127.0;
            prop_assert_eq!(r.d, f16::from_f32(d).to_f32());
            let id = 127.0 / amax;
            for (&v, &q) in xb.iter().zip(&r.qs) {
                prop_assert_eq!(q as f32, (v * id).round_ties_even());
            }
            let sum: i32 = r.qs.iter().map(|&v| v as i32).sum();
            prop_assert_eq!(r.s, f16::from_f32(d * sum as f32).to_f32());
        }
    }

    /// (4) Q8_K quantization: SIMD and scalar agree bit for bit, and the result is
    /// ggml's `quantize_row_q8_K_ref`.
    #[test]
    fn q8k_quantization(
        x in prop_oneof![
            vec(-4.0f32..4.0, 256..=256 * 4),
            vec(prop_oneof![-1e4f32..1e4, Just(0.0), -1e-20f32..1e-20, (-6i32..=6).prop_map(|v| v as f32 * 0.5)], 256..=256 * 4),
        ]
    ) {
        let n = x.len() / 256;
        let x = &x[..256 * n];
        let mut fast = vec![BlockQ8K::default(); n];
        let mut reference = vec![BlockQ8K::default(); n];
        quantize_row_q8k(x, &mut fast);
        quantize_row_q8k_ref(x, &mut reference);
        for (i, (f, r)) in fast.iter().zip(&reference).enumerate() {
            prop_assert_eq!(f.d.to_bits(), r.d.to_bits(), "block {} d", i);
            prop_assert_eq!(f.qs, r.qs, "block {} qs", i);
            prop_assert_eq!(f.bsums, r.bsums, "block {} bsums", i);
            let xb = &x[256 * i..256 * i + 256];
            // The first element of largest magnitude, with its sign.
            let max = xb.iter().fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
            if max.abs() < 1e-30 {
                prop_assert_eq!(r, &BlockQ8K::default());
                continue;
            }
            let iscale = -127.0 / max;
            prop_assert_eq!(r.d, 1.0 / iscale);
            for (&v, &q) in xb.iter().zip(&r.qs) {
                prop_assert_eq!(q as f32, (iscale * v).round_ties_even().min(127.0));
            }
            for (j, s) in r.bsums.iter().enumerate() {
                prop_assert_eq!(*s as i32, r.qs[16 * j..16 * j + 16].iter().map(|&v| v as i32).sum::<i32>());
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// Hand-built blocks. Values are chosen so that every product is exact in f32.

fn deq(ty: GgmlType, w: &[u8], n: usize) -> Vec<f32> {
    let mut y = vec![0f32; n];
    dequantize_row(ty, w, &mut y);
    y
}

#[test]
fn q4_0_all_nines_is_all_ones() {
    let mut b = h(1.0).to_vec();
    b.extend([0x99u8; 16]);
    assert_eq!(deq(GgmlType::Q4_0, &b, 32), vec![1.0; 32]);
}

#[test]
fn q4_0_nibble_order() {
    // Byte j holds element j (low nibble) and element j + 16 (high nibble).
    let mut b = h(0.5).to_vec();
    b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    let y = deq(GgmlType::Q4_0, &b, 32);
    for j in 0..16 {
        assert_eq!(y[j], 0.5 * (j as f32 - 8.0));
        assert_eq!(y[j + 16], 0.5 * ((15 - j) as f32 - 8.0));
    }
}

#[test]
fn q4_1_scale_and_min() {
    let mut b = h(0.25).to_vec();
    b.extend(h(-1.5));
    b.extend((0..16u8).map(|j| j | (j << 4)));
    let y = deq(GgmlType::Q4_1, &b, 32);
    for j in 0..16 {
        assert_eq!(y[j], 0.25 * j as f32 - 1.5);
        assert_eq!(y[j + 16], 0.25 * j as f32 - 1.5);
    }
}

/// Packs 32 five-bit values as ggml's quantize_row_q5_{0,1}_ref does.
fn pack_q5(q: &[u8; 32]) -> ([u8; 4], [u8; 16]) {
    let mut qh = 0u32;
    let mut qs = [0u8; 16];
    for j in 0..16 {
        qs[j] = (q[j] & 0xF) | ((q[j + 16] & 0xF) << 4);
        qh |= ((q[j] as u32 & 0x10) >> 4) << j;
        qh |= ((q[j + 16] as u32 & 0x10) >> 4) << (j + 16);
    }
    (qh.to_le_bytes(), qs)
}

#[test]
fn q5_0_and_q5_1_known_values() {
    let q: [u8; 32] = std::array::from_fn(|e| ((e * 7 + 3) % 32) as u8);
    let (qh, qs) = pack_q5(&q);
    let mut b0 = h(2.0).to_vec();
    b0.extend(qh);
    b0.extend(qs);
    let y = deq(GgmlType::Q5_0, &b0, 32);
    for e in 0..32 {
        assert_eq!(y[e], 2.0 * (q[e] as f32 - 16.0), "element {e}");
    }
    let mut b1 = h(0.5).to_vec();
    b1.extend(h(3.0));
    b1.extend(qh);
    b1.extend(qs);
    let y = deq(GgmlType::Q5_1, &b1, 32);
    for e in 0..32 {
        assert_eq!(y[e], 0.5 * q[e] as f32 + 3.0, "element {e}");
    }
}

#[test]
fn q8_0_round_trip() {
    let x: Vec<f32> = (0..64).map(|i| (i as f32 - 31.5) * 0.37).collect();
    let mut row = Vec::new();
    for xb in x.chunks(32) {
        // ggml's quantize_row_q8_0_ref: d = amax / 127 stored as f16, q = round(x / d).
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = f16::from_f32(amax / 127.0).to_f32();
        row.extend(h(d));
        row.extend(xb.iter().map(|v| (v / d).round() as i8 as u8));
    }
    let y = deq(GgmlType::Q8_0, &row, 64);
    for (a, b) in x.iter().zip(&y) {
        assert!((a - b).abs() <= 0.5 * 11.7 / 127.0 + 1e-3, "{a} vs {b}");
    }
    // And exactly d * q.
    for (e, v) in y.iter().enumerate() {
        let blk = &row[34 * (e / 32)..];
        let d = f16::from_le_bytes([blk[0], blk[1]]).to_f32();
        assert_eq!(*v, d * (blk[2 + e % 32] as i8) as f32);
    }
}

/// Packs 8 six-bit scales and mins as ggml's quantize_row_q4_K_ref does.
fn pack_k4_scales(sc: [u8; 8], m: [u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..8 {
        if j < 4 {
            s[j] = sc[j];
            s[j + 4] = m[j];
        } else {
            s[j + 4] = (sc[j] & 0xF) | ((m[j] & 0xF) << 4);
            s[j - 4] |= (sc[j] >> 4) << 6;
            s[j] |= (m[j] >> 4) << 6;
        }
    }
    s
}

const K_SC: [u8; 8] = [1, 17, 33, 63, 5, 40, 60, 2];
const K_M: [u8; 8] = [0, 63, 9, 48, 31, 16, 1, 57];

#[test]
fn q4_k_known_values() {
    let q: Vec<u8> = (0..256).map(|e| ((e * 5 + e / 32) % 16) as u8).collect();
    let mut b = h(0.5).to_vec();
    b.extend(h(0.25));
    b.extend(pack_k4_scales(K_SC, K_M));
    // quantize_row_q4_K_ref: for each 64 elements, q[l] = L[j + l] | (L[j + l + 32] << 4).
    for j in (0..256).step_by(64) {
        b.extend((0..32).map(|l| q[j + l] | (q[j + l + 32] << 4)));
    }
    assert_eq!(b.len(), 144);
    let y = deq(GgmlType::Q4_K, &b, 256);
    for e in 0..256 {
        let s = e / 32;
        assert_eq!(
            y[e],
            0.5 * K_SC[s] as f32 * q[e] as f32 - 0.25 * K_M[s] as f32,
            "element {e}"
        );
    }
}

#[test]
fn q5_k_known_values() {
    let q: Vec<u8> = (0..256).map(|e| ((e * 11 + e / 64) % 32) as u8).collect();
    let mut b = h(0.125).to_vec();
    b.extend(h(2.0));
    b.extend(pack_k4_scales(K_SC, K_M));
    // quantize_row_q5_K_ref: fifth bits go to qh with masks m1 = 1, m2 = 2, shifted by
    // 2 per 64 elements; low nibbles as in Q4_K.
    let mut qh = [0u8; 32];
    let mut ql = Vec::new();
    let (mut m1, mut m2) = (1u8, 2u8);
    for n in (0..256).step_by(64) {
        for j in 0..32 {
            let mut l1 = q[n + j];
            if l1 > 15 {
                l1 -= 16;
                qh[j] |= m1;
            }
            let mut l2 = q[n + j + 32];
            if l2 > 15 {
                l2 -= 16;
                qh[j] |= m2;
            }
            ql.push(l1 | (l2 << 4));
        }
        m1 <<= 2;
        m2 <<= 2;
    }
    b.extend(qh);
    b.extend(ql);
    assert_eq!(b.len(), 176);
    let y = deq(GgmlType::Q5_K, &b, 256);
    for e in 0..256 {
        let s = e / 32;
        assert_eq!(
            y[e],
            0.125 * K_SC[s] as f32 * q[e] as f32 - 2.0 * K_M[s] as f32,
            "element {e}"
        );
    }
}

#[test]
fn q6_k_known_values() {
    let q: Vec<u8> = (0..256).map(|e| ((e * 13 + e / 16) % 64) as u8).collect();
    let scales: [i8; 16] = [
        1, -2, 3, -4, 127, -128, 7, 0, 9, -10, 11, -12, 13, -14, 15, -16,
    ];
    // quantize_row_q6_K_ref packing, per 128 elements.
    let mut ql = vec![0u8; 128];
    let mut qh = vec![0u8; 64];
    for (half, j) in (0..256).step_by(128).enumerate() {
        for l in 0..32 {
            let (q1, q2, q3, q4) = (q[j + l], q[j + l + 32], q[j + l + 64], q[j + l + 96]);
            ql[64 * half + l] = (q1 & 0xF) | ((q3 & 0xF) << 4);
            ql[64 * half + l + 32] = (q2 & 0xF) | ((q4 & 0xF) << 4);
            qh[32 * half + l] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
        }
    }
    let mut b = ql;
    b.extend(qh);
    b.extend(scales.map(|s| s as u8));
    b.extend(h(0.5));
    assert_eq!(b.len(), 210);
    let y = deq(GgmlType::Q6_K, &b, 256);
    for e in 0..256 {
        assert_eq!(
            y[e],
            0.5 * scales[e / 16] as f32 * (q[e] as f32 - 32.0),
            "element {e}"
        );
    }
    // The dot with one-hot activations picks single elements, through both kernels.
    for e in [0, 15, 16, 31, 40, 77, 100, 127, 128, 150, 200, 255] {
        let mut x = vec![0f32; 256];
        x[e] = 1.0;
        let q8 = quantize_k(&x);
        for k in [dot_kernel(GgmlType::Q6_K), dot_kernel_ref(GgmlType::Q6_K)] {
            let DotKernel::Q8K(f) = k else {
                panic!("Q6_K must use Q8_K activations")
            };
            let mut out = [0f32; 4];
            f(&b, &q8, 1, &mut out);
            assert!(
                (out[0] - y[e]).abs() <= 1e-6 * y[e].abs(),
                "element {e}: {} vs {}",
                out[0],
                y[e]
            );
        }
    }
}

#[test]
fn float_types_decode() {
    let x = [1.0f32, -2.5, 3.25e-3, 65504.0, -0.0, 1e-7];
    let f32b: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(deq(GgmlType::F32, &f32b, 6), x.to_vec());
    let f16b: Vec<u8> = x.iter().flat_map(|v| h(*v)).collect();
    let want: Vec<f32> = x.iter().map(|v| f16::from_f32(*v).to_f32()).collect();
    assert_eq!(deq(GgmlType::F16, &f16b, 6), want);
    // bf16 is the top half of the f32 bit pattern.
    let bfb: Vec<u8> = x
        .iter()
        .flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes())
        .collect();
    let want: Vec<f32> = x
        .iter()
        .map(|v| f32::from_bits(v.to_bits() & 0xFFFF_0000))
        .collect();
    assert_eq!(deq(GgmlType::BF16, &bfb, 6), want);
}

#[test]
fn q8_ties_round_to_even_in_both_paths() {
    // amax = 127 gives d = 1 and 1/d = 1, so k + 0.5 is an exact tie.
    let mut x = vec![0f32; 32];
    x[0] = 127.0;
    for (i, v) in x.iter_mut().enumerate().skip(1) {
        *v = (i as f32 - 16.0) + 0.5;
    }
    let mut a = [BlockQ8::default()];
    let mut b = [BlockQ8::default()];
    quantize_row_q8(&x, &mut a);
    quantize_row_q8_ref(&x, &mut b);
    assert_eq!(a[0].d, 1.0);
    for (&q, &v) in a[0].qs.iter().zip(&x).skip(1) {
        assert_eq!(q as f32, v.round_ties_even(), "x = {v}");
    }
    assert_eq!(a[0], b[0]);
}

#[test]
fn q8_zero_and_tiny_blocks_quantize_to_zero() {
    let mut x = vec![0f32; 64];
    x[40] = 1e-39; // subnormal: 127 / amax overflows
    for f in [
        quantize_row_q8 as fn(&[f32], &mut [BlockQ8]),
        quantize_row_q8_ref,
    ] {
        let mut q = [BlockQ8::default(); 2];
        f(&x, &mut q);
        assert_eq!(q, [BlockQ8::default(); 2]);
    }
    let mut x = vec![0f32; 512];
    x[300] = -1e-39;
    for f in [
        quantize_row_q8k as fn(&[f32], &mut [BlockQ8K]),
        quantize_row_q8k_ref,
    ] {
        let mut q = [BlockQ8K::default(); 2];
        f(&x, &mut q);
        assert_eq!(q, [BlockQ8K::default(); 2]);
    }
}

#[test]
fn dot_of_known_rows() {
    // Q4_0 row of all 1.0 against x: the sum of the quantized x.
    let mut row = Vec::new();
    for _ in 0..4 {
        row.extend(h(1.0));
        row.extend([0x99u8; 16]);
    }
    let x: Vec<f32> = (0..128).map(|i| ((i * 37) % 50) as f32 - 20.0).collect();
    let q = quantize(&x);
    let want: f32 = q
        .iter()
        .map(|b| b.d * b.qs.iter().map(|&v| v as i32).sum::<i32>() as f32)
        .sum();
    for k in [dot_kernel(GgmlType::Q4_0), dot_kernel_ref(GgmlType::Q4_0)] {
        let DotKernel::Q8(f) = k else { panic!() };
        let mut out = [0f32; 4];
        f(&row, &q, 1, &mut out);
        assert!(
            (out[0] - want).abs() <= 1e-4 * want.abs(),
            "{} vs {want}",
            out[0]
        );
    }
    // Q8_0 with extreme weights (-128 and 127) and activations +-127: no i16 saturation.
    let mut row = h(1.0).to_vec();
    row.extend((0..32).map(|i| if i % 2 == 0 { 0x80u8 } else { 0x7F }));
    let x: Vec<f32> = (0..32)
        .map(|i| if i % 4 < 2 { -1.0 } else { 1.0 })
        .collect();
    let q = quantize(&x);
    let want: f32 = (0..32)
        .map(|i| (if i % 2 == 0 { -128.0 } else { 127.0 }) * x[i] * q[0].d * 127.0)
        .sum();
    for k in [dot_kernel(GgmlType::Q8_0), dot_kernel_ref(GgmlType::Q8_0)] {
        let DotKernel::Q8(f) = k else { panic!() };
        let mut out = [0f32; 4];
        f(&row, &q, 1, &mut out);
        assert_eq!(out[0], want);
    }
}

/// Which SIMD families the property tests above ran here, and which they could not
/// (the CPU lacks them), by name; the families a CPU has are all offered.
#[test]
fn simd_families_run_here() {
    for level in LEVELS {
        let offered = dot_kernel_at(level, GgmlType::Q4_0).is_some();
        assert_eq!(offered, level <= supported(), "{}", level_name(level));
        if offered {
            eprintln!("kernel family {}: run", level_name(level));
        } else {
            eprintln!(
                "kernel family {}: NOT RUN (this CPU lacks it)",
                level_name(level)
            );
        }
    }
}

#[test]
fn kernel_families() {
    for ty in ALL {
        for k in [dot_kernel(ty), dot_kernel_ref(ty)] {
            let family = match k {
                DotKernel::Q8(_) => 32,
                DotKernel::Q8K(_) => 256,
                DotKernel::F32(_) => 1,
                DotKernel::U4(_) => unreachable!("not in ALL"),
            };
            assert_eq!(family, ty.block_elems(), "{}", ty.name());
        }
    }
}

#[test]
#[should_panic(expected = "does not match")]
fn mismatched_row_length_panics() {
    let DotKernel::Q8(f) = dot_kernel(GgmlType::Q4_1) else {
        panic!()
    };
    let acts = vec![BlockQ8::default(); 2];
    f(&[0u8; 20 * 3], &acts, 1, &mut [0.0; 4]);
}

#[test]
#[should_panic(expected = "n_act")]
fn too_many_rows_panics() {
    let DotKernel::Q8(f) = dot_kernel(GgmlType::Q8_0) else {
        panic!()
    };
    let acts = vec![BlockQ8::default(); 5];
    f(&[0u8; 34], &acts, 5, &mut [0.0; 4]);
}

#[test]
#[should_panic]
fn k_quant_needs_whole_super_blocks() {
    let DotKernel::Q8K(f) = dot_kernel(GgmlType::Q4_K) else {
        panic!()
    };
    let acts = vec![BlockQ8K::default(); 2];
    f(&[0u8; 144], &acts, 1, &mut [0.0; 4]);
}

//! Portable reference dot products: one weight row against up to four activation rows.
//!
//! These define the bits every SIMD twin must reproduce. Each weight type has one
//! arithmetic, whatever the batch size, that of llama.cpp's x86 AVX2 `ggml_vec_dot_*`
//! kernel for the type: the same exact integer partial sums grouped the same way (llama.cpp keeps
//! eight i32 "lanes" per block, lane `k` holding elements `4k..4k+4` of each 32-element
//! chunk), the same float operations on them in the same order, with fused
//! multiply-adds exactly where llama.cpp's compiled code has them (`f32::mul_add`),
//! and the same horizontal reduction ([`hsum8`]). They are also the production path on
//! CPUs without AVX2, where `mul_add` is a libm call: slower, but the same bits.

use super::blocks::*;
use super::{BlockQ8, BlockQ8K, GgmlType};

/// Validates the shapes shared by every quantized kernel; returns activation blocks per
/// row (`act_elems` values each).
#[inline(always)]
pub(super) fn check_q(
    ty: GgmlType,
    w_row: &[u8],
    n_blocks: usize,
    act_elems: usize,
    n_act: usize,
) -> usize {
    assert!((1..=4).contains(&n_act), "n_act must be 1..=4, got {n_act}");
    assert!(
        n_blocks.is_multiple_of(n_act),
        "{n_blocks} activation blocks do not split into {n_act} rows"
    );
    let nb = n_blocks / n_act;
    assert!(
        ty.row_bytes(nb * act_elems) == Some(w_row.len()),
        "{} weight row of {} bytes does not match {} activation columns",
        ty.name(),
        w_row.len(),
        nb * act_elems
    );
    nb
}

/// Validates the shapes shared by every float kernel; returns columns per row.
#[inline(always)]
pub(super) fn check_f32(ty: GgmlType, w_row: &[u8], acts: &[f32], n_act: usize) -> usize {
    assert!((1..=4).contains(&n_act), "n_act must be 1..=4, got {n_act}");
    assert!(
        acts.len().is_multiple_of(n_act),
        "{} activations do not split into {n_act} rows",
        acts.len()
    );
    let cols = acts.len() / n_act;
    assert!(
        w_row.len() == cols * ty.block_bytes(),
        "{} weight row of {} bytes does not match {cols} activation columns",
        ty.name(),
        w_row.len()
    );
    cols
}

/// Runs a one-row kernel over each activation row.
#[inline(always)]
fn each_row<B: RawBlock, A>(
    w_row: &[u8],
    acts: &[A],
    act_elems: usize,
    n_act: usize,
    out: &mut [f32; 4],
    row: impl Fn(&[B], &[A]) -> f32,
) {
    let nb = check_q(B::TYPE, w_row, acts.len(), act_elems, n_act);
    let w = as_blocks::<B>(w_row);
    for (r, o) in out.iter_mut().take(n_act).enumerate() {
        *o = row(w, &acts[r * nb..(r + 1) * nb]);
    }
}

/// ggml's `hsum_float_8`: `((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))`.
#[inline(always)]
pub(super) fn hsum8(a: [f32; 8]) -> f32 {
    let s: [f32; 4] = std::array::from_fn(|i| a[i + 4] + a[i]);
    (s[0] + s[2]) + (s[1] + s[3])
}

/// The four-lane reduction of ggml's K-quant kernels: `(a0 + a2) + (a1 + a3)`.
#[inline(always)]
fn hsum4(a: [f32; 4]) -> f32 {
    (a[0] + a[2]) + (a[1] + a[3])
}

/// The eight lanes `sum(w[e] * a[e] for e in 4k..4k+4)` of a 32-element chunk, as
/// `maddubs` + `madd(1)` leave them. Weights are unpacked to bytes first because a sum
/// of widened byte products is a shape LLVM vectorizes on any baseline.
#[inline(always)]
pub(super) fn lanes(w: &[i8; 32], a: &[i8]) -> [i32; 8] {
    let a = &a[..32];
    let mut l = [0i32; 8];
    for (k, l) in l.iter_mut().enumerate() {
        for e in 4 * k..4 * k + 4 {
            *l += w[e] as i32 * a[e] as i32;
        }
    }
    l
}

/// `acc[k] = fma(l[k], s, acc[k])` on each lane.
#[inline(always)]
pub(super) fn fma_lanes(acc: &mut [f32; 8], l: [i32; 8], s: f32) {
    for (acc, l) in acc.iter_mut().zip(l) {
        *acc = (l as f32).mul_add(s, *acc);
    }
}

/// The 32 nibbles of a Q4_0 / Q4_1 block in element order.
#[inline(always)]
fn nibbles(qs: &[u8; 16]) -> [i8; 32] {
    let mut q = [0i8; 32];
    for j in 0..16 {
        q[j] = (qs[j] & 0xF) as i8;
        q[j + 16] = (qs[j] >> 4) as i8;
    }
    q
}

/// The 32 five-bit values of a Q5_0 / Q5_1 block in element order.
#[inline(always)]
fn fives(qs: &[u8; 16], qh: [u8; 4]) -> [i8; 32] {
    let qh = u32::from_le_bytes(qh);
    let mut q = nibbles(qs);
    for (e, q) in q.iter_mut().enumerate() {
        *q |= (((qh >> e) & 1) << 4) as i8;
    }
    q
}

#[inline(always)]
fn minus(mut q: [i8; 32], off: i8) -> [i8; 32] {
    for q in q.iter_mut() {
        *q -= off;
    }
    q
}

// ---------------------------------------------------------------------------------
// 32-wide formats. `ggml_vec_dot_{q4_0,q5_0,q8_0}_q8_0` and the llamafile sgemm
// (`tinyBLAS_Q0_AVX`) agree: per block `acc = fma(d_w * d_a, lanes, acc)`, then
// `hsum8(acc)`. The Q8_1 pair adds `summs = fma(m, s_a, summs)` per block and returns
// `hsum8(acc) + summs`.

/// The signed-weight kernels: `q` gives a block's 32 weights (offset removed).
#[inline(always)]
fn signed_row<B>(w: &[B], a: &[BlockQ8], d: impl Fn(&B) -> f32, q: impl Fn(&B) -> [i8; 32]) -> f32 {
    let mut acc = [0f32; 8];
    for (x, y) in w.iter().zip(a) {
        fma_lanes(&mut acc, lanes(&q(x), &y.qs), d(x) * y.d);
    }
    hsum8(acc)
}

/// The weight-plus-min kernels: `q` gives a block's 32 unsigned weights.
#[inline(always)]
fn min_row<B>(
    w: &[B],
    a: &[BlockQ8],
    dm: impl Fn(&B) -> (f32, f32),
    q: impl Fn(&B) -> [i8; 32],
) -> f32 {
    let mut acc = [0f32; 8];
    let mut summs = 0f32;
    for (x, y) in w.iter().zip(a) {
        let (d, m) = dm(x);
        summs = m.mul_add(y.s, summs);
        fma_lanes(&mut acc, lanes(&q(x), &y.qs), d * y.d);
    }
    hsum8(acc) + summs
}

pub fn dot_q4_0(w_row: &[u8], acts: &[BlockQ8], n_act: usize, out: &mut [f32; 4]) {
    each_row(w_row, acts, 32, n_act, out, |w: &[BlockQ4_0], a| {
        signed_row(w, a, |x| f16_le(x.d), |x| minus(nibbles(&x.qs), 8))
    })
}

pub fn dot_q4_1(w_row: &[u8], acts: &[BlockQ8], n_act: usize, out: &mut [f32; 4]) {
    each_row(w_row, acts, 32, n_act, out, |w: &[BlockQ4_1], a| {
        min_row(w, a, |x| (f16_le(x.d), f16_le(x.m)), |x| nibbles(&x.qs))
    })
}

pub fn dot_q5_0(w_row: &[u8], acts: &[BlockQ8], n_act: usize, out: &mut [f32; 4]) {
    each_row(w_row, acts, 32, n_act, out, |w: &[BlockQ5_0], a| {
        signed_row(w, a, |x| f16_le(x.d), |x| minus(fives(&x.qs, x.qh), 16))
    })
}

pub fn dot_q5_1(w_row: &[u8], acts: &[BlockQ8], n_act: usize, out: &mut [f32; 4]) {
    each_row(w_row, acts, 32, n_act, out, |w: &[BlockQ5_1], a| {
        min_row(w, a, |x| (f16_le(x.d), f16_le(x.m)), |x| fives(&x.qs, x.qh))
    })
}

pub fn dot_q8_0(w_row: &[u8], acts: &[BlockQ8], n_act: usize, out: &mut [f32; 4]) {
    each_row(w_row, acts, 32, n_act, out, |w: &[BlockQ8_0], a| {
        signed_row(w, a, |x| f16_le(x.d), |x| x.qs)
    })
}

// ---------------------------------------------------------------------------------
// K-quants. `D[j]` is the exact dot product of 32-element sub-block j, `B[j]` the sum
// of its activations (`bsums[2j] + bsums[2j + 1]`).

/// Sub-block `j` (32 values) of a Q4_K / Q5_K block, low 4 bits only.
#[inline(always)]
fn k4_nibbles(qs: &[u8; 128], j: usize) -> [i8; 32] {
    let chunk = &qs[32 * (j / 2)..32 * (j / 2) + 32];
    let shift = 4 * (j % 2);
    let mut q = [0i8; 32];
    for (q, &c) in q.iter_mut().zip(chunk) {
        *q = ((c >> shift) & 0xF) as i8;
    }
    q
}

/// Sub-block `j` of a Q5_K block.
#[inline(always)]
fn k5_values(x: &BlockQ5K, j: usize) -> [i8; 32] {
    let mut q = k4_nibbles(&x.qs, j);
    for (q, &h) in q.iter_mut().zip(&x.qh) {
        *q |= (((h >> j) & 1) << 4) as i8;
    }
    q
}

/// Sub-block `b` (32 values, 0..64 before the -32 offset) of a Q6_K block.
#[inline(always)]
fn k6_values(x: &BlockQ6K, b: usize) -> [i8; 32] {
    std::array::from_fn(|l| super::dequant::q6_value(x, b / 4, b % 4, l) as i8)
}

#[inline(always)]
fn sub_block_sums(y: &BlockQ8K) -> [i32; 8] {
    std::array::from_fn(|j| y.bsums[2 * j] as i32 + y.bsums[2 * j + 1] as i32)
}

/// Per-super-block integer pieces of a Q4_K / Q5_K product, shared by the kernels
/// below: eight lanes of `sum_j sc[j] * lanes(sub-block j)` as ggml's vec_dot keeps
/// them, and the mins.
struct KMin {
    lanes: [i32; 8],
    m: [u8; 8],
}

#[inline(always)]
fn k_min_parts(scales: &[u8; 12], y: &BlockQ8K, q: impl Fn(usize) -> [i8; 32]) -> KMin {
    let (sc, m) = scales_mins_k4(scales);
    let mut acc = [0i32; 8];
    for (j, &scale) in sc.iter().enumerate() {
        let l = lanes(&q(j), &y.qs[32 * j..]);
        for k in 0..8 {
            acc[k] += scale as i32 * l[k];
        }
    }
    KMin { lanes: acc, m }
}

/// `ggml_vec_dot_q4_K_q8_K` (AVX2): lanes scaled by `y.d * d` per super-block; the mins
/// in four lanes `m[2t] * B[2t] + m[2t + 1] * B[2t + 1]` scaled by `-y.d * dmin`.
#[inline(always)]
fn q4_k_vec_dot_row(w: &[BlockQ4K], a: &[BlockQ8K]) -> f32 {
    let mut acc = [0f32; 8];
    let mut acc_m = [0f32; 4];
    for (x, y) in w.iter().zip(a) {
        let d = y.d * f16_le(x.d);
        let dmin = -y.d * f16_le(x.dmin);
        let p = k_min_parts(&x.scales, y, |j| k4_nibbles(&x.qs, j));
        let bs = sub_block_sums(y);
        for (t, acc_m) in acc_m.iter_mut().enumerate() {
            let prod = p.m[2 * t] as i32 * bs[2 * t] + p.m[2 * t + 1] as i32 * bs[2 * t + 1];
            *acc_m = dmin.mul_add(prod as f32, *acc_m);
        }
        fma_lanes(&mut acc, p.lanes, d);
    }
    hsum8(acc) + hsum4(acc_m)
}

/// `ggml_vec_dot_q5_K_q8_K` (AVX2): as Q4_K but the mins are reduced to one integer per
/// super-block and accumulated in a scalar.
#[inline(always)]
fn q5_k_vec_dot_row(w: &[BlockQ5K], a: &[BlockQ8K]) -> f32 {
    let mut acc = [0f32; 8];
    let mut summs = 0f32;
    for (x, y) in w.iter().zip(a) {
        let d = y.d * f16_le(x.d);
        let dmin = -y.d * f16_le(x.dmin);
        let p = k_min_parts(&x.scales, y, |j| k5_values(x, j));
        let bs = sub_block_sums(y);
        let mins: i32 = (0..8).map(|j| p.m[j] as i32 * bs[j]).sum();
        summs = (mins as f32).mul_add(dmin, summs);
        fma_lanes(&mut acc, p.lanes, d);
    }
    hsum8(acc) + summs
}

pub fn dot_q4_k(w_row: &[u8], acts: &[BlockQ8K], n_act: usize, out: &mut [f32; 4]) {
    each_row(w_row, acts, 256, n_act, out, q4_k_vec_dot_row)
}

pub fn dot_q5_k(w_row: &[u8], acts: &[BlockQ8K], n_act: usize, out: &mut [f32; 4]) {
    each_row(w_row, acts, 256, n_act, out, q5_k_vec_dot_row)
}

/// The eight integer lanes of `ggml_vec_dot_q6_K_q8_K` for one super-block: lane `k`
/// sums, over the eight 32-element sub-blocks `b`, `sc[2b + k / 4]` times the products
/// of elements `4k..4k+4` (unsigned 6-bit weights), minus the offset correction
/// `32 * (bsums[2k] * sc[2k] + bsums[2k + 1] * sc[2k + 1])`, which ggml lays out over
/// the lanes that way although it belongs to other elements. The lanes' total is the
/// exact dot product with the -32 offset applied.
#[inline(always)]
fn q6_k_lanes(x: &BlockQ6K, y: &BlockQ8K) -> [i32; 8] {
    let mut acc = [0i32; 8];
    for b in 0..8 {
        let l = lanes(&k6_values(x, b), &y.qs[32 * b..]);
        for k in 0..8 {
            acc[k] += x.scales[2 * b + k / 4] as i32 * l[k];
        }
    }
    for (k, acc) in acc.iter_mut().enumerate() {
        let corr = y.bsums[2 * k] as i32 * x.scales[2 * k] as i32
            + y.bsums[2 * k + 1] as i32 * x.scales[2 * k + 1] as i32;
        *acc -= corr << 5;
    }
    acc
}

/// `ggml_vec_dot_q6_K_q8_K` (AVX2): `acc = fma(y.d * d, lanes, acc)`, then `hsum8`.
pub fn dot_q6_k(w_row: &[u8], acts: &[BlockQ8K], n_act: usize, out: &mut [f32; 4]) {
    each_row(w_row, acts, 256, n_act, out, |w: &[BlockQ6K], a| {
        let mut acc = [0f32; 8];
        for (x, y) in w.iter().zip(a) {
            fma_lanes(&mut acc, q6_k_lanes(x, y), y.d * f16_le(x.d));
        }
        hsum8(acc)
    })
}

// ---------------------------------------------------------------------------------
// Float weights (not matched to llama.cpp bit for bit).

/// Runs a one-row float kernel over each activation row.
#[inline(always)]
fn each_row_f32(
    ty: GgmlType,
    w_row: &[u8],
    acts: &[f32],
    n_act: usize,
    out: &mut [f32; 4],
    load: impl Fn(&[u8]) -> f32,
) {
    let cols = check_f32(ty, w_row, acts, n_act);
    let eb = ty.block_bytes();
    for (r, o) in out.iter_mut().take(n_act).enumerate() {
        let a = &acts[r * cols..(r + 1) * cols];
        *o = w_row
            .chunks_exact(eb)
            .zip(a)
            .map(|(w, &a)| load(w) * a)
            .sum();
    }
}

pub fn dot_f32(w_row: &[u8], acts: &[f32], n_act: usize, out: &mut [f32; 4]) {
    each_row_f32(GgmlType::F32, w_row, acts, n_act, out, |b| {
        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
    })
}

pub fn dot_f16(w_row: &[u8], acts: &[f32], n_act: usize, out: &mut [f32; 4]) {
    each_row_f32(GgmlType::F16, w_row, acts, n_act, out, |b| {
        f16_le([b[0], b[1]])
    })
}

pub fn dot_bf16(w_row: &[u8], acts: &[f32], n_act: usize, out: &mut [f32; 4]) {
    each_row_f32(GgmlType::BF16, w_row, acts, n_act, out, |b| {
        bf16_le([b[0], b[1]])
    })
}

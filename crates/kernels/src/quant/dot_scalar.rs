//! Portable reference dot products: one weight row against up to four activation rows.
//!
//! These define the numbers every SIMD twin must reproduce (up to float summation
//! order) and are the production path on CPUs without AVX2. For each 32-element
//! activation block the integer dot product is formed exactly, the weight format's
//! integer offset or float min is folded in through [`BlockQ8::sums`], and only then
//! is the block scaled and summed in f32. The arithmetic follows the scalar
//! `ggml_vec_dot_*_q8_*` functions of ggml-cpu/quants.c, with ggml's Q8_1 / Q8_K
//! activation blocks replaced by [`BlockQ8`] (one scale per 32 values).

use super::blocks::*;
use super::{BlockQ8, GgmlType};

/// Validates the shapes shared by every Q8 kernel; returns activation blocks per row.
#[inline(always)]
pub(super) fn check_q8(ty: GgmlType, w_row: &[u8], acts: &[BlockQ8], n_act: usize) -> usize {
    assert!((1..=4).contains(&n_act), "n_act must be 1..=4, got {n_act}");
    assert!(
        acts.len().is_multiple_of(n_act),
        "{} activation blocks do not split into {n_act} rows",
        acts.len()
    );
    let nb = acts.len() / n_act;
    assert!(
        ty.row_bytes(nb * 32) == Some(w_row.len()),
        "{} weight row of {} bytes does not match {} activation columns",
        ty.name(),
        w_row.len(),
        nb * 32
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
fn each_row<B: RawBlock>(
    w_row: &[u8],
    acts: &[BlockQ8],
    n_act: usize,
    out: &mut [f32; 4],
    row: impl Fn(&[B], &[BlockQ8]) -> f32,
) {
    let nb = check_q8(B::TYPE, w_row, acts, n_act);
    let w = as_blocks::<B>(w_row);
    for (r, o) in out.iter_mut().take(n_act).enumerate() {
        *o = row(w, &acts[r * nb..(r + 1) * nb]);
    }
}

/// Exact integer dot product of 16 weights with 16 activations. Weights are unpacked
/// to bytes first (all formats fit in `i8` once their offset is left out) because a
/// plain sum of widened byte products is a shape LLVM vectorizes on any baseline;
/// unpacking inside the sum left it scalar and ~5x slower.
#[inline(always)]
fn dot16(w: &[i8], a: &[i8]) -> i32 {
    let (w, a) = (&w[..16], &a[..16]);
    let mut s = 0i32;
    for i in 0..16 {
        s += (w[i] as i16 * a[i] as i16) as i32;
    }
    s
}

/// The integer dot products of the two 16-element halves of a block.
#[inline(always)]
fn dot_halves(w: &[i8; 32], a: &[i8; 32]) -> [i32; 2] {
    [dot16(&w[..16], &a[..16]), dot16(&w[16..], &a[16..])]
}

#[inline(always)]
fn dot32(w: &[i8; 32], a: &[i8; 32]) -> i32 {
    let [lo, hi] = dot_halves(w, a);
    lo + hi
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
fn block_sum(y: &BlockQ8) -> i32 {
    y.sums[0] as i32 + y.sums[1] as i32
}

pub fn dot_q4_0(w_row: &[u8], acts: &[BlockQ8], n_act: usize, out: &mut [f32; 4]) {
    each_row(w_row, acts, n_act, out, |w: &[BlockQ4_0], a| {
        let mut sum = 0f32;
        for (x, y) in w.iter().zip(a) {
            let q = dot32(&nibbles(&x.qs), &y.qs) - 8 * block_sum(y);
            sum += f16_le(x.d) * y.d * q as f32;
        }
        sum
    })
}

pub fn dot_q4_1(w_row: &[u8], acts: &[BlockQ8], n_act: usize, out: &mut [f32; 4]) {
    each_row(w_row, acts, n_act, out, |w: &[BlockQ4_1], a| {
        let mut sum = 0f32;
        for (x, y) in w.iter().zip(a) {
            let q = dot32(&nibbles(&x.qs), &y.qs);
            sum += f16_le(x.d) * y.d * q as f32 + f16_le(x.m) * (y.d * block_sum(y) as f32);
        }
        sum
    })
}

pub fn dot_q5_0(w_row: &[u8], acts: &[BlockQ8], n_act: usize, out: &mut [f32; 4]) {
    each_row(w_row, acts, n_act, out, |w: &[BlockQ5_0], a| {
        let mut sum = 0f32;
        for (x, y) in w.iter().zip(a) {
            let q = dot32(&fives(&x.qs, x.qh), &y.qs) - 16 * block_sum(y);
            sum += f16_le(x.d) * y.d * q as f32;
        }
        sum
    })
}

pub fn dot_q5_1(w_row: &[u8], acts: &[BlockQ8], n_act: usize, out: &mut [f32; 4]) {
    each_row(w_row, acts, n_act, out, |w: &[BlockQ5_1], a| {
        let mut sum = 0f32;
        for (x, y) in w.iter().zip(a) {
            let q = dot32(&fives(&x.qs, x.qh), &y.qs);
            sum += f16_le(x.d) * y.d * q as f32 + f16_le(x.m) * (y.d * block_sum(y) as f32);
        }
        sum
    })
}

pub fn dot_q8_0(w_row: &[u8], acts: &[BlockQ8], n_act: usize, out: &mut [f32; 4]) {
    each_row(w_row, acts, n_act, out, |w: &[BlockQ8_0], a| {
        let mut sum = 0f32;
        for (x, y) in w.iter().zip(a) {
            sum += f16_le(x.d) * y.d * dot32(&x.qs, &y.qs) as f32;
        }
        sum
    })
}

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

pub fn dot_q4_k(w_row: &[u8], acts: &[BlockQ8], n_act: usize, out: &mut [f32; 4]) {
    each_row(w_row, acts, n_act, out, |w: &[BlockQ4K], a| {
        let mut sum = 0f32;
        for (x, ys) in w.iter().zip(a.chunks_exact(8)) {
            let (d, dmin) = (f16_le(x.d), f16_le(x.dmin));
            for (j, y) in ys.iter().enumerate() {
                let (sc, m) = scale_min_k4(j, &x.scales);
                let q = dot32(&k4_nibbles(&x.qs, j), &y.qs);
                sum +=
                    d * sc as f32 * y.d * q as f32 - dmin * m as f32 * (y.d * block_sum(y) as f32);
            }
        }
        sum
    })
}

pub fn dot_q5_k(w_row: &[u8], acts: &[BlockQ8], n_act: usize, out: &mut [f32; 4]) {
    each_row(w_row, acts, n_act, out, |w: &[BlockQ5K], a| {
        let mut sum = 0f32;
        for (x, ys) in w.iter().zip(a.chunks_exact(8)) {
            let (d, dmin) = (f16_le(x.d), f16_le(x.dmin));
            for (j, y) in ys.iter().enumerate() {
                let (sc, m) = scale_min_k4(j, &x.scales);
                let mut q = k4_nibbles(&x.qs, j);
                for (q, &h) in q.iter_mut().zip(&x.qh) {
                    *q |= (((h >> j) & 1) << 4) as i8;
                }
                let q = dot32(&q, &y.qs);
                sum +=
                    d * sc as f32 * y.d * q as f32 - dmin * m as f32 * (y.d * block_sum(y) as f32);
            }
        }
        sum
    })
}

pub fn dot_q6_k(w_row: &[u8], acts: &[BlockQ8], n_act: usize, out: &mut [f32; 4]) {
    each_row(w_row, acts, n_act, out, |w: &[BlockQ6K], a| {
        let mut sum = 0f32;
        for (x, ys) in w.iter().zip(a.chunks_exact(8)) {
            let d = f16_le(x.d);
            for (k, y) in ys.iter().enumerate() {
                let mut q = [0i8; 32];
                for (l, q) in q.iter_mut().enumerate() {
                    *q = super::dequant::q6_value(x, k / 4, k % 4, l) as i8;
                }
                let h = dot_halves(&q, &y.qs);
                // Scales apply per 16 elements, so the -32 offset is folded per half.
                let q = x.scales[2 * k] as i32 * (h[0] - 32 * y.sums[0] as i32)
                    + x.scales[2 * k + 1] as i32 * (h[1] - 32 * y.sums[1] as i32);
                sum += d * y.d * q as f32;
            }
        }
        sum
    })
}

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

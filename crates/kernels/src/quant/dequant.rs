//! Reference dequantization of one weight row to f32, for every supported type.
//!
//! Straight transcriptions of the `dequantize_row_*` functions of ggml-quants.c; used
//! by tests, by the reference matmul, and wherever a weight is needed as plain floats
//! (embedding lookups). Not performance critical.

use super::blocks::*;
use super::GgmlType;

/// Dequantizes one row of `ty` (`src` in GGML layout) into `dst`; panics unless
/// `src.len() == ty.row_bytes(dst.len())`.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    let expected = ty.row_bytes(dst.len());
    assert!(
        expected == Some(src.len()),
        "{} row of {} elements needs {:?} bytes, got {}",
        ty.name(),
        dst.len(),
        expected,
        src.len()
    );
    match ty {
        GgmlType::F32 => {
            for (y, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *y = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        GgmlType::F16 => {
            for (y, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *y = f16_le([b[0], b[1]]);
            }
        }
        GgmlType::BF16 => {
            for (y, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *y = bf16_le([b[0], b[1]]);
            }
        }
        GgmlType::Q4_0 => q4_0(as_blocks(src), dst),
        GgmlType::Q4_1 => q4_1(as_blocks(src), dst),
        GgmlType::Q5_0 => q5_0(as_blocks(src), dst),
        GgmlType::Q5_1 => q5_1(as_blocks(src), dst),
        GgmlType::Q8_0 => q8_0(as_blocks(src), dst),
        GgmlType::Q4_K => q4_k(as_blocks(src), dst),
        GgmlType::Q5_K => q5_k(as_blocks(src), dst),
        GgmlType::Q6_K => q6_k(as_blocks(src), dst),
        GgmlType::I8 | GgmlType::U4 | GgmlType::F8E4M3 => panic!(
            "{} rows need their scales: use wq::dequantize_row_wq",
            ty.name()
        ),
    }
}

fn q4_0(blocks: &[BlockQ4_0], dst: &mut [f32]) {
    for (x, y) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
        let d = f16_le(x.d);
        for j in 0..QK / 2 {
            y[j] = ((x.qs[j] & 0xF) as i32 - 8) as f32 * d;
            y[j + QK / 2] = ((x.qs[j] >> 4) as i32 - 8) as f32 * d;
        }
    }
}

fn q4_1(blocks: &[BlockQ4_1], dst: &mut [f32]) {
    for (x, y) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
        let (d, m) = (f16_le(x.d), f16_le(x.m));
        for j in 0..QK / 2 {
            y[j] = (x.qs[j] & 0xF) as f32 * d + m;
            y[j + QK / 2] = (x.qs[j] >> 4) as f32 * d + m;
        }
    }
}

/// The two 5-bit values of byte `j` of a Q5_0 / Q5_1 block: elements `j` and `j + 16`.
#[inline(always)]
pub(super) fn q5_pair(qs: &[u8; QK / 2], qh: [u8; 4], j: usize) -> (u8, u8) {
    let qh = u32::from_le_bytes(qh);
    let h0 = ((qh >> j) & 1) as u8;
    let h1 = ((qh >> (j + 16)) & 1) as u8;
    ((qs[j] & 0xF) | (h0 << 4), (qs[j] >> 4) | (h1 << 4))
}

fn q5_0(blocks: &[BlockQ5_0], dst: &mut [f32]) {
    for (x, y) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
        let d = f16_le(x.d);
        for j in 0..QK / 2 {
            let (a, b) = q5_pair(&x.qs, x.qh, j);
            y[j] = (a as i32 - 16) as f32 * d;
            y[j + QK / 2] = (b as i32 - 16) as f32 * d;
        }
    }
}

fn q5_1(blocks: &[BlockQ5_1], dst: &mut [f32]) {
    for (x, y) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
        let (d, m) = (f16_le(x.d), f16_le(x.m));
        for j in 0..QK / 2 {
            let (a, b) = q5_pair(&x.qs, x.qh, j);
            y[j] = a as f32 * d + m;
            y[j + QK / 2] = b as f32 * d + m;
        }
    }
}

fn q8_0(blocks: &[BlockQ8_0], dst: &mut [f32]) {
    for (x, y) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
        let d = f16_le(x.d);
        for (y, &q) in y.iter_mut().zip(&x.qs) {
            *y = q as f32 * d;
        }
    }
}

fn q4_k(blocks: &[BlockQ4K], dst: &mut [f32]) {
    for (x, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (f16_le(x.d), f16_le(x.dmin));
        for (j, y) in y.chunks_exact_mut(32).enumerate() {
            let (sc, m) = scale_min_k4(j, &x.scales);
            let (d1, m1) = (d * sc as f32, dmin * m as f32);
            let qs = &x.qs[32 * (j / 2)..32 * (j / 2) + 32];
            let shift = 4 * (j % 2);
            for (y, &q) in y.iter_mut().zip(qs) {
                *y = d1 * ((q >> shift) & 0xF) as f32 - m1;
            }
        }
    }
}

fn q5_k(blocks: &[BlockQ5K], dst: &mut [f32]) {
    for (x, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (f16_le(x.d), f16_le(x.dmin));
        for (j, y) in y.chunks_exact_mut(32).enumerate() {
            let (sc, m) = scale_min_k4(j, &x.scales);
            let (d1, m1) = (d * sc as f32, dmin * m as f32);
            let qs = &x.qs[32 * (j / 2)..32 * (j / 2) + 32];
            let shift = 4 * (j % 2);
            for l in 0..32 {
                let q = ((qs[l] >> shift) & 0xF) | (((x.qh[l] >> j) & 1) << 4);
                y[l] = d1 * q as f32 - m1;
            }
        }
    }
}

/// The 6-bit value (0..64, before the -32 offset) of element `32 * p + l` of half `n`
/// of a Q6_K block.
#[inline(always)]
pub(super) fn q6_value(x: &BlockQ6K, n: usize, p: usize, l: usize) -> u8 {
    let ql = x.ql[64 * n + l + 32 * (p & 1)];
    let lo = if p < 2 { ql & 0xF } else { ql >> 4 };
    let hi = (x.qh[32 * n + l] >> (2 * p)) & 3;
    lo | (hi << 4)
}

fn q6_k(blocks: &[BlockQ6K], dst: &mut [f32]) {
    for (x, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_le(x.d);
        for (e, y) in y.iter_mut().enumerate() {
            let (n, p, l) = (e / 128, (e % 128) / 32, e % 32);
            let q = q6_value(x, n, p, l) as i32 - 32;
            *y = d * x.scales[e / 16] as f32 * q as f32;
        }
    }
}

//! Byte-exact mirrors of ggml's weight block structs (`ggml/src/ggml-common.h`).
//!
//! Every field is a byte array, so each struct has alignment 1 and no padding: a row
//! of a memory-mapped GGUF tensor, whatever its address, can be viewed as a slice of
//! blocks without copying ([`as_blocks`]). `f16` fields are kept as their two
//! little-endian bytes and decoded with [`f16_le`].

use super::GgmlType;
use std::mem::{align_of, size_of};

/// Elements per block of the 32-wide formats (`QK4_0`, `QK8_0`, ... in ggml).
pub const QK: usize = 32;
/// Elements per super-block of the K-quants (`QK_K`).
pub const QK_K: usize = 256;
/// Bytes of the packed 6-bit scales and mins of Q4_K / Q5_K (`K_SCALE_SIZE`).
pub const K_SCALE_SIZE: usize = 12;

/// `block_q4_0`: `x = d * (q - 8)`, q in 0..16. Element `j` is the low nibble of
/// `qs[j]`, element `j + 16` its high nibble.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockQ4_0 {
    pub d: [u8; 2],
    pub qs: [u8; QK / 2],
}

/// `block_q4_1`: `x = d * q + m`, nibbles packed as in Q4_0.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockQ4_1 {
    pub d: [u8; 2],
    pub m: [u8; 2],
    pub qs: [u8; QK / 2],
}

/// `block_q5_0`: `x = d * (q - 16)`; the low 4 bits of q as in Q4_0, bit 4 of element
/// `j` is bit `j` of the little-endian `u32` `qh`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockQ5_0 {
    pub d: [u8; 2],
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}

/// `block_q5_1`: `x = d * q + m`, q packed as in Q5_0.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockQ5_1 {
    pub d: [u8; 2],
    pub m: [u8; 2],
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}

/// `block_q8_0`: `x = d * q`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockQ8_0 {
    pub d: [u8; 2],
    pub qs: [i8; QK],
}

/// `block_q4_K`: 8 sub-blocks of 32, `x = d * sc[j] * q - dmin * m[j]` with 6-bit
/// `sc`/`m` packed in `scales` (see [`scale_min_k4`]). The 128 `qs` bytes are four
/// chunks of 32: chunk `c` holds sub-block `2c` in its low nibbles, `2c + 1` in its
/// high nibbles.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockQ4K {
    pub d: [u8; 2],
    pub dmin: [u8; 2],
    pub scales: [u8; K_SCALE_SIZE],
    pub qs: [u8; QK_K / 2],
}

/// `block_q5_K`: as Q4_K plus a fifth bit: bit 4 of element `l` of sub-block `j` is
/// bit `j` of `qh[l]`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockQ5K {
    pub d: [u8; 2],
    pub dmin: [u8; 2],
    pub scales: [u8; K_SCALE_SIZE],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}

/// `block_q6_K`: 16 sub-blocks of 16, `x = d * scales[e / 16] * (q - 32)`, q 6-bit.
/// Each 128-element half `n` uses `ql[64n..64n+64]` and `qh[32n..32n+32]`; within it,
/// element `l + 32p` (p in 0..4, l in 0..32) takes its low 4 bits from
/// `ql[64n + l + 32 * (p & 1)]` (low nibble for p < 2, high for p >= 2) and its top
/// 2 bits from bits `2p..2p+2` of `qh[32n + l]`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: [u8; 2],
}

const _: () = assert!(size_of::<BlockQ4_0>() == 18);
const _: () = assert!(size_of::<BlockQ4_1>() == 20);
const _: () = assert!(size_of::<BlockQ5_0>() == 22);
const _: () = assert!(size_of::<BlockQ5_1>() == 24);
const _: () = assert!(size_of::<BlockQ8_0>() == 34);
const _: () = assert!(size_of::<BlockQ4K>() == 144);
const _: () = assert!(size_of::<BlockQ5K>() == 176);
const _: () = assert!(size_of::<BlockQ6K>() == 210);

/// A weight block struct that may be viewed directly over GGUF bytes.
///
/// # Safety
/// Implementors must be `#[repr(C)]`, made only of `u8`/`i8` arrays (so alignment 1,
/// no padding, every bit pattern valid), and `size_of` must equal `TYPE.block_bytes()`.
pub unsafe trait RawBlock: Copy {
    const TYPE: GgmlType;
}

// SAFETY: all of these are repr(C) structs of byte arrays; sizes are asserted above
// and against `GgmlType::block_bytes` in `as_blocks`.
unsafe impl RawBlock for BlockQ4_0 {
    const TYPE: GgmlType = GgmlType::Q4_0;
}
unsafe impl RawBlock for BlockQ4_1 {
    const TYPE: GgmlType = GgmlType::Q4_1;
}
unsafe impl RawBlock for BlockQ5_0 {
    const TYPE: GgmlType = GgmlType::Q5_0;
}
unsafe impl RawBlock for BlockQ5_1 {
    const TYPE: GgmlType = GgmlType::Q5_1;
}
unsafe impl RawBlock for BlockQ8_0 {
    const TYPE: GgmlType = GgmlType::Q8_0;
}
unsafe impl RawBlock for BlockQ4K {
    const TYPE: GgmlType = GgmlType::Q4_K;
}
unsafe impl RawBlock for BlockQ5K {
    const TYPE: GgmlType = GgmlType::Q5_K;
}
unsafe impl RawBlock for BlockQ6K {
    const TYPE: GgmlType = GgmlType::Q6_K;
}

/// Views `bytes` (any address) as whole blocks. Panics if the length is not a
/// multiple of the block size.
#[inline]
pub fn as_blocks<B: RawBlock>(bytes: &[u8]) -> &[B] {
    let size = size_of::<B>();
    assert!(align_of::<B>() == 1 && size == B::TYPE.block_bytes());
    assert!(
        bytes.len().is_multiple_of(size),
        "{} row of {} bytes is not a whole number of {size}-byte blocks",
        B::TYPE.name(),
        bytes.len()
    );
    // SAFETY: `RawBlock` guarantees alignment 1 and that any bytes are a valid `B`;
    // the length is a whole number of blocks, and the lifetime is carried over.
    unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<B>(), bytes.len() / size) }
}

/// Decodes a little-endian IEEE half. Uses half's portable conversion: its F16C path
/// is an out-of-line call behind a run-time feature check, which costs more than the
/// bit manipulation and keeps the scalar kernels' loops from vectorizing.
#[inline(always)]
pub fn f16_le(b: [u8; 2]) -> f32 {
    half::f16::from_le_bytes(b).to_f32_const()
}

/// Decodes a little-endian bfloat16: the top half of an f32.
#[inline(always)]
pub fn bf16_le(b: [u8; 2]) -> f32 {
    f32::from_bits((u16::from_le_bytes(b) as u32) << 16)
}

/// The 6-bit scale and min of sub-block `j` (0..8) of a Q4_K / Q5_K block
/// (`get_scale_min_k4` in ggml-quants.c). Bytes 0..4 hold scales 0..4 in their low
/// 6 bits, bytes 4..8 mins 0..4; scales/mins 4..8 keep their low 4 bits in bytes 8..12
/// (scale low nibble, min high nibble) and their top 2 bits in the spare top bits of
/// bytes 0..4 (scales) and 4..8 (mins).
#[inline(always)]
pub fn scale_min_k4(j: usize, q: &[u8; K_SCALE_SIZE]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// All 8 scales and 8 mins of a Q4_K / Q5_K block at once, with the word-level bit
/// manipulation of ggml's SIMD paths (`kmask1..3` in `ggml_vec_dot_q4_K_q8_K`).
#[inline(always)]
pub fn scales_mins_k4(q: &[u8; K_SCALE_SIZE]) -> ([u8; 8], [u8; 8]) {
    const KMASK1: u32 = 0x3f3f_3f3f;
    const KMASK2: u32 = 0x0f0f_0f0f;
    const KMASK3: u32 = 0x0303_0303;
    let w = |i: usize| u32::from_le_bytes([q[4 * i], q[4 * i + 1], q[4 * i + 2], q[4 * i + 3]]);
    let (u0, u1, u2) = (w(0), w(1), w(2));
    let sc_lo = u0 & KMASK1;
    let sc_hi = (u2 & KMASK2) | (((u0 >> 6) & KMASK3) << 4);
    let m_lo = u1 & KMASK1;
    let m_hi = ((u2 >> 4) & KMASK2) | (((u1 >> 6) & KMASK3) << 4);
    let mut sc = [0u8; 8];
    let mut m = [0u8; 8];
    sc[..4].copy_from_slice(&sc_lo.to_le_bytes());
    sc[4..].copy_from_slice(&sc_hi.to_le_bytes());
    m[..4].copy_from_slice(&m_lo.to_le_bytes());
    m[4..].copy_from_slice(&m_hi.to_le_bytes());
    (sc, m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn word_unpack_matches_bytewise_unpack() {
        let mut state = 0x1234_5678u32;
        for _ in 0..1000 {
            let mut q = [0u8; K_SCALE_SIZE];
            for b in q.iter_mut() {
                state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                *b = (state >> 24) as u8;
            }
            let (sc, m) = scales_mins_k4(&q);
            for j in 0..8 {
                assert_eq!(scale_min_k4(j, &q), (sc[j], m[j]), "j={j} q={q:?}");
            }
        }
    }
}

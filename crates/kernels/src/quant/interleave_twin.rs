//! The interleaved kernels' portable twins: the arithmetic of `interleave`'s module docs,
//! one (weight row, activation row) pair at a time, which every SIMD family reproduces
//! bit for bit.

use super::interleave::{
    check_r8, check_r8k, group_block_bytes, Q4K_GROUP_BLOCK, Q4K_MINS, Q6K_GROUP_BLOCK, R8,
};
use super::{BlockQ8, BlockQ8K, GgmlType};
use half::f16;

/// The Q4_K twin: per super-block the exact integers `Σ_j sc_j·Σ q·a` and
/// `Σ_j m_j·Σa`, then `acc = fma(d_w·d_a, tot, acc)` and `acc = fma(−dmin_w·d_a, msum, acc)`.
pub(super) fn r8k_q4_k_ref(group: &[u8], acts: &[BlockQ8K], na: usize, out: &mut [[f32; R8]; 4]) {
    let nb = check_r8k(GgmlType::Q4_K, group, acts, na);
    for m in 0..na {
        for r in 0..R8 {
            let mut acc = 0f32;
            for b in 0..nb {
                let blk = &group[b * Q4K_GROUP_BLOCK..][..Q4K_GROUP_BLOCK];
                let a = &acts[m * nb + b];
                let (mut tot, mut msum) = (0i32, 0i32);
                for j in 0..8 {
                    let (p, hi) = (j / 2, j % 2 == 1);
                    let mut isum = 0i32;
                    for e in 0..32 {
                        let byte = blk[160 + 256 * p + 32 * (e / 4) + 4 * r + e % 4];
                        let q = if hi { byte >> 4 } else { byte & 15 };
                        isum += q as i32 * a.qs[32 * j + e] as i32;
                    }
                    tot += blk[32 + 8 * j + r] as i32 * isum;
                    let bsum = a.bsums[2 * j] as i32 + a.bsums[2 * j + 1] as i32;
                    msum += blk[Q4K_MINS + 32 * (j / 4) + 4 * r + j % 4] as i32 * bsum;
                }
                acc = (ld_f16(blk, r) * a.d).mul_add(tot as f32, acc);
                acc = (-(ld_f16(&blk[16..], r) * a.d)).mul_add(msum as f32, acc);
            }
            out[m][r] = acc;
        }
    }
}

/// The Q6_K twin: per super-block the exact integer
/// `Σ_g sc_g·(Σ q·a − 32·Σa)` over the sixteen 16-column groups `g` (`q` the 6-bit
/// codes, `Σa` the activation block's exact `bsums`), then `acc = fma(d_w·d_a, tot, acc)`.
pub(super) fn r8k_q6_k_ref(group: &[u8], acts: &[BlockQ8K], na: usize, out: &mut [[f32; R8]; 4]) {
    let nb = check_r8k(GgmlType::Q6_K, group, acts, na);
    for m in 0..na {
        for r in 0..R8 {
            let mut acc = 0f32;
            for b in 0..nb {
                let blk = &group[b * Q6K_GROUP_BLOCK..][..Q6K_GROUP_BLOCK];
                let a = &acts[m * nb + b];
                let mut tot = 0i32;
                for g in 0..16 {
                    let sc = blk[16 + 16 * (g / 2) + 2 * r + g % 2] as i8 as i32;
                    let mut isum = 0i32;
                    for e in 16 * g..16 * g + 16 {
                        let (j, col) = (e / 32, e % 32);
                        let q = &blk[144 + 192 * j..];
                        let (c, hi, jj) = (col % 16 / 4, col >= 16, col % 4);
                        let nib = q[32 * c + 4 * r + jj];
                        let low = if hi { nib >> 4 } else { nib & 15 };
                        let (h, t) = (col / 16, col % 16 / 4);
                        let top = (q[128 + 32 * h + 4 * r + jj] >> (2 * t)) & 3;
                        isum += (low | top << 4) as i32 * a.qs[e] as i32;
                    }
                    tot += sc * (isum - 32 * a.bsums[g] as i32);
                }
                acc = (ld_f16(blk, r) * a.d).mul_add(tot as f32, acc);
            }
            out[m][r] = acc;
        }
    }
}

fn ld_f16(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[2 * i], b[2 * i + 1]]).to_f32()
}

/// The portable twin: the module docs' arithmetic, one pair at a time.
fn r8_ref(
    ty: GgmlType,
    group: &[u8],
    acts: &[BlockQ8],
    isums: &[i32],
    na: usize,
    out: &mut [[f32; R8]; 4],
) {
    let nb = check_r8(ty, group, acts, isums, na);
    let gbb = group_block_bytes(ty).expect("checked");
    let (sf, offset) = match ty {
        GgmlType::Q4_0 => (1, 8),
        GgmlType::Q4_1 => (2, 0),
        _ => (1, 128),
    };
    for m in 0..na {
        for r in 0..R8 {
            let mut acc = 0f32;
            for b in 0..nb {
                let blk = &group[b * gbb..(b + 1) * gbb];
                let a = &acts[m * nb + b];
                let q = &blk[16 * sf..];
                let mut isum = 0i32;
                for col in 0..32 {
                    let w = match ty {
                        GgmlType::Q8_0 => q[32 * (col / 4) + 4 * r + col % 4] as i32,
                        _ => {
                            let (c, hi) = ((col % 16) / 4, col >= 16);
                            let byte = q[32 * c + 4 * r + col % 4];
                            (if hi { byte >> 4 } else { byte & 15 }) as i32
                        }
                    };
                    isum += w * a.qs[col] as i32;
                }
                isum -= offset * isums[m * nb + b];
                acc = (ld_f16(blk, r) * a.d).mul_add(isum as f32, acc);
                if ty == GgmlType::Q4_1 {
                    acc = ld_f16(&blk[16..], r).mul_add(a.s, acc);
                }
            }
            out[m][r] = acc;
        }
    }
}

pub(super) fn r8_q4_0_ref(g: &[u8], a: &[BlockQ8], s: &[i32], na: usize, o: &mut [[f32; R8]; 4]) {
    r8_ref(GgmlType::Q4_0, g, a, s, na, o)
}

pub(super) fn r8_q4_1_ref(g: &[u8], a: &[BlockQ8], s: &[i32], na: usize, o: &mut [[f32; R8]; 4]) {
    r8_ref(GgmlType::Q4_1, g, a, s, na, o)
}

pub(super) fn r8_q8_0_ref(g: &[u8], a: &[BlockQ8], s: &[i32], na: usize, o: &mut [[f32; R8]; 4]) {
    r8_ref(GgmlType::Q8_0, g, a, s, na, o)
}

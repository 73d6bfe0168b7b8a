//! AVX2 + FMA + F16C dot products, twins of `dot_scalar`.
//!
//! Shape of every quantized kernel (after ggml-cpu/arch/x86/quants.c): per weight
//! block, unpack the weights once into 32 bytes, then for each of the `N` activation
//! rows multiply unsigned weight bytes by signed activation bytes with
//! `_mm256_maddubs_epi16`, widen pairwise to i32 with `_mm256_madd_epi16`, convert to
//! f32 and FMA with the combined scale into that row's accumulator. Formats whose
//! values are signed (Q4_0, Q5_0, Q8_0, Q6_K) move the sign onto the activations with
//! `_mm256_sign_epi8` so the integer block sums are exact without a correction term;
//! formats with a float min (Q4_1, Q5_1, Q4_K, Q5_K) add `m * d_a * sum(a)` from
//! [`BlockQ8::sums`] into a scalar accumulator.
//!
//! No product overflows i16 in `maddubs` because activations stay within [-127, 127]
//! (guaranteed by `quantize_row_q8`): the largest pair is 2 * 128 * 127 for Q8_0.
//!
//! Batch invariance: each row's result goes through the same instruction sequence
//! whatever `n_act` is, so a token's output does not depend on its batch neighbours.
//!
//! Soundness: the `unsafe fn`s need AVX2/FMA/F16C and in-bounds pointers. The safe
//! wrappers (the fn-pointer types need safe fns) check every length up front; they are
//! private to this module and handed out only by the `unsafe` [`kernel`], which
//! `quant::dot_kernel` calls only after `cpu::simd_level()` reported those features.

use super::blocks::scales_mins_k4;
use super::dot_scalar::{check_f32, check_q8};
use super::{BlockQ8, DotKernel, GgmlType};
use std::arch::x86_64::*;

/// The AVX2 kernel for `ty`.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C: the returned safe fn pointers execute
/// those instructions unconditionally.
pub(super) unsafe fn kernel(ty: GgmlType) -> DotKernel {
    match ty {
        GgmlType::F32 => DotKernel::F32(dot_f32),
        GgmlType::F16 => DotKernel::F32(dot_f16),
        GgmlType::BF16 => DotKernel::F32(dot_bf16),
        GgmlType::Q4_0 => DotKernel::Q8(dot_q4_0),
        GgmlType::Q4_1 => DotKernel::Q8(dot_q4_1),
        GgmlType::Q5_0 => DotKernel::Q8(dot_q5_0),
        GgmlType::Q5_1 => DotKernel::Q8(dot_q5_1),
        GgmlType::Q8_0 => DotKernel::Q8(dot_q8_0),
        GgmlType::Q4_K => DotKernel::Q8(dot_q4_k),
        GgmlType::Q5_K => DotKernel::Q8(dot_q5_k),
        GgmlType::Q6_K => DotKernel::Q8(dot_q6_k),
    }
}

// ---------------------------------------------------------------------------------
// Helpers. `#[inline]` + the same target features as the kernels, so they inline.

/// Horizontal sum of eight f32 lanes.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn hsum_ps(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Converts the two halves packed in `h` (low half in lane 0) to f32 lanes 0 and 1.
///
/// Written in asm because with intrinsics LLVM shrinks the conversion input to a
/// 16-bit `vpinsrw` whenever only lane 0 is used, merging into whatever register it
/// likes, often a live accumulator; that chains every block's scale behind the
/// previous block's FMA (Q8_0 ran at ~10 cycles per block instead of ~3.5). `vmovd`
/// from a general register has no such false dependency.
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn cvt_f16x2(h: u32) -> __m128 {
    let r: __m128;
    // SAFETY: register-only instructions; F16C is enabled for this function.
    unsafe {
        std::arch::asm!(
            "vmovd {r}, {h:e}",
            "vcvtph2ps {r}, {r}",
            h = in(reg) h,
            r = out(xmm_reg) r,
            options(pure, nomem, nostack, preserves_flags)
        )
    };
    r
}

/// Reads the little-endian f16 at `p` (any alignment).
///
/// # Safety
/// `p..p+2` must be readable.
#[target_feature(enable = "avx2,f16c")]
#[inline]
unsafe fn ld_f16(p: *const u8) -> f32 {
    // SAFETY: caller guarantees two readable bytes.
    let h = unsafe { p.cast::<u16>().read_unaligned() };
    _mm_cvtss_f32(cvt_f16x2(h as u32))
}

/// The two little-endian f16 at `p` and `p + 2` in lanes 0 and 1. Callers use both
/// lanes, so the load stays a plain `vmovd` from memory (see [`cvt_f16x2`]).
///
/// # Safety
/// `p..p+4` must be readable.
#[target_feature(enable = "avx2,f16c")]
#[inline]
unsafe fn ld_f16x2(p: *const u8) -> __m128 {
    // SAFETY: caller guarantees four readable bytes.
    let h = unsafe { p.cast::<i32>().read_unaligned() };
    _mm_cvtph_ps(_mm_cvtsi32_si128(h))
}

/// Loads 32 bytes at `p` (any alignment).
///
/// # Safety
/// `p..p+32` must be readable.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn ld256(p: *const u8) -> __m256i {
    // SAFETY: caller guarantees 32 readable bytes; loadu has no alignment need.
    unsafe { _mm256_loadu_si256(p.cast()) }
}

/// Expands 16 bytes of packed nibbles into 32 bytes: low nibbles first (elements
/// 0..16), then high nibbles (elements 16..32), matching the Q4_0/Q4_1/Q5_x order.
///
/// # Safety
/// `p..p+16` must be readable.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn nibbles32(p: *const u8) -> __m256i {
    // SAFETY: caller guarantees 16 readable bytes.
    let t = unsafe { _mm_loadu_si128(p.cast()) };
    let v = _mm256_set_m128i(_mm_srli_epi16::<4>(t), t);
    _mm256_and_si256(v, _mm256_set1_epi8(0x0F))
}

/// 0xFF in byte `e` where bit `e` of `bits` is set (`bytes_from_bits_32` in ggml).
#[target_feature(enable = "avx2")]
#[inline]
fn bits_to_bytes(bits: u32) -> __m256i {
    let shuf = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(bits as i32), shuf);
    let bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe));
    _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1))
}

/// Eight i32 partial sums of `w[i] * a[i]`, `w` unsigned bytes, `a` signed bytes.
#[target_feature(enable = "avx2")]
#[inline]
fn dot_us(w: __m256i, a: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), _mm256_set1_epi16(1))
}

/// Eight i32 partial sums of `w[i] * a[i]` for signed `w` given as `|w|` and `w`.
#[target_feature(enable = "avx2")]
#[inline]
fn dot_ss(w_abs: __m256i, w: __m256i, a: __m256i) -> __m256i {
    dot_us(w_abs, _mm256_sign_epi8(a, w))
}

/// `acc + p * scale`, `p` the i32 partial sums of one block.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn fma_block(p: __m256i, scale: f32, acc: __m256) -> __m256 {
    _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(scale), acc)
}

/// The 32 activation bytes of a block.
#[target_feature(enable = "avx2")]
#[inline]
fn act(y: &BlockQ8) -> __m256i {
    // SAFETY: `qs` is 32 readable bytes.
    unsafe { ld256(y.qs.as_ptr().cast()) }
}

#[inline(always)]
fn block_sum(y: &BlockQ8) -> f32 {
    (y.sums[0] as i32 + y.sums[1] as i32) as f32
}

/// Calls `$f::<N>(args)` with `N = n_act` as a constant, so each activation-row count
/// gets its own fully unrolled register-blocked loop.
macro_rules! by_rows {
    ($f:ident, $n:expr, $($arg:expr),*) => {
        match $n {
            1 => $f::<1>($($arg),*),
            2 => $f::<2>($($arg),*),
            3 => $f::<3>($($arg),*),
            _ => $f::<4>($($arg),*),
        }
    };
}

/// Defines the safe fn-pointer wrapper `$name` around the row-blocked `$imp`.
macro_rules! q8_wrapper {
    ($name:ident, $imp:ident, $ty:expr) => {
        fn $name(w_row: &[u8], acts: &[BlockQ8], n_act: usize, out: &mut [f32; 4]) {
            let nb = check_q8($ty, w_row, acts, n_act);
            // SAFETY: shapes were checked above (the weight row holds exactly the blocks
            // matching `nb` activation blocks, `acts` holds `n_act * nb` blocks), and
            // this wrapper is only handed out by `kernel`, whose contract is that the
            // CPU supports AVX2, FMA and F16C (see the module docs).
            unsafe { by_rows!($imp, n_act, w_row.as_ptr(), acts.as_ptr(), nb, out) }
        }
    };
}

macro_rules! f32_wrapper {
    ($name:ident, $imp:ident, $ty:expr) => {
        fn $name(w_row: &[u8], acts: &[f32], n_act: usize, out: &mut [f32; 4]) {
            let cols = check_f32($ty, w_row, acts, n_act);
            // SAFETY: as for the Q8 wrappers: lengths checked, CPU features checked by
            // the only caller of `kernel`.
            unsafe { by_rows!($imp, n_act, w_row.as_ptr(), acts.as_ptr(), cols, out) }
        }
    };
}

q8_wrapper!(dot_q4_0, q4_0, GgmlType::Q4_0);
q8_wrapper!(dot_q4_1, q4_1, GgmlType::Q4_1);
q8_wrapper!(dot_q5_0, q5_0, GgmlType::Q5_0);
q8_wrapper!(dot_q5_1, q5_1, GgmlType::Q5_1);
q8_wrapper!(dot_q8_0, q8_0, GgmlType::Q8_0);
q8_wrapper!(dot_q4_k, q4_k, GgmlType::Q4_K);
q8_wrapper!(dot_q5_k, q5_k, GgmlType::Q5_K);
q8_wrapper!(dot_q6_k, q6_k, GgmlType::Q6_K);
f32_wrapper!(dot_f32, f32_rows, GgmlType::F32);
f32_wrapper!(dot_f16, f16_rows, GgmlType::F16);
f32_wrapper!(dot_bf16, bf16_rows, GgmlType::BF16);

// ---------------------------------------------------------------------------------
// Kernels. Safety contract shared by all: AVX2/FMA/F16C available; `w` points to the
// `nb`-block (or `cols`-element) weight row; `a` points to `N * nb` activation blocks
// (or `N * cols` floats), row `r` starting at `a + r * nb`; `out.len() >= N`.

/// Per-row accumulators: the scaled integer dot products (8 lanes) and the float min
/// terms of Q4_1/Q5_1/Q4_K/Q5_K. One chain per row is enough: a second one (even/odd
/// blocks) measured no faster for one row and slower for four (register pressure).
#[derive(Clone, Copy)]
struct Acc<const N: usize> {
    v: [__m256; N],
    m: [f32; N],
}

impl<const N: usize> Acc<N> {
    #[target_feature(enable = "avx2")]
    #[inline]
    fn new() -> Self {
        Self {
            v: [_mm256_setzero_ps(); N],
            m: [0.0; N],
        }
    }
}

/// Writes `sum(v) + m` for each row.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn finish<const N: usize>(acc: &Acc<N>, out: &mut [f32; 4]) {
    for (r, o) in out.iter_mut().take(N).enumerate() {
        *o = hsum_ps(acc.v[r]) + acc.m[r];
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0<const N: usize>(w: *const u8, a: *const BlockQ8, nb: usize, out: &mut [f32; 4]) {
    let mut acc = Acc::<N>::new();
    for b in 0..nb {
        // SAFETY: block b of a 34-byte-block row and activation block b of each row are
        // in bounds by the contract above.
        unsafe {
            let x = w.add(34 * b);
            let d = ld_f16(x);
            let q = ld256(x.add(2));
            let q_abs = _mm256_sign_epi8(q, q);
            for r in 0..N {
                let y = &*a.add(r * nb + b);
                acc.v[r] = fma_block(dot_ss(q_abs, q, act(y)), d * y.d, acc.v[r]);
            }
        }
    }
    finish(&acc, out);
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_0<const N: usize>(w: *const u8, a: *const BlockQ8, nb: usize, out: &mut [f32; 4]) {
    let mut acc = Acc::<N>::new();
    for b in 0..nb {
        // SAFETY: block b (18 bytes) and activation block b of each row are in bounds.
        unsafe {
            let x = w.add(18 * b);
            let d = ld_f16(x);
            let q = _mm256_sub_epi8(nibbles32(x.add(2)), _mm256_set1_epi8(8));
            let q_abs = _mm256_sign_epi8(q, q);
            for r in 0..N {
                let y = &*a.add(r * nb + b);
                acc.v[r] = fma_block(dot_ss(q_abs, q, act(y)), d * y.d, acc.v[r]);
            }
        }
    }
    finish(&acc, out);
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_1<const N: usize>(w: *const u8, a: *const BlockQ8, nb: usize, out: &mut [f32; 4]) {
    let mut acc = Acc::<N>::new();
    for b in 0..nb {
        // SAFETY: block b (20 bytes) and activation block b of each row are in bounds.
        unsafe {
            let x = w.add(20 * b);
            let dm = ld_f16x2(x);
            let (d, m) = (_mm_cvtss_f32(dm), _mm_cvtss_f32(_mm_movehdup_ps(dm)));
            let q = nibbles32(x.add(4));
            for r in 0..N {
                let y = &*a.add(r * nb + b);
                acc.v[r] = fma_block(dot_us(q, act(y)), d * y.d, acc.v[r]);
                acc.m[r] += m * (y.d * block_sum(y));
            }
        }
    }
    finish(&acc, out);
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_0<const N: usize>(w: *const u8, a: *const BlockQ8, nb: usize, out: &mut [f32; 4]) {
    let mut acc = Acc::<N>::new();
    for b in 0..nb {
        // SAFETY: block b (22 bytes) and activation block b of each row are in bounds.
        unsafe {
            let x = w.add(22 * b);
            let d = ld_f16(x);
            let qh = u32::from_le(x.add(2).cast::<u32>().read_unaligned());
            // q - 16 as a signed byte: where the fifth bit is clear, set the top four
            // bits (nibble - 16 in two's complement); where it is set, the nibble alone
            // is q - 16.
            let hi = _mm256_andnot_si256(bits_to_bytes(qh), _mm256_set1_epi8(0xF0u8 as i8));
            let q = _mm256_or_si256(nibbles32(x.add(6)), hi);
            let q_abs = _mm256_sign_epi8(q, q);
            for r in 0..N {
                let y = &*a.add(r * nb + b);
                acc.v[r] = fma_block(dot_ss(q_abs, q, act(y)), d * y.d, acc.v[r]);
            }
        }
    }
    finish(&acc, out);
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_1<const N: usize>(w: *const u8, a: *const BlockQ8, nb: usize, out: &mut [f32; 4]) {
    let mut acc = Acc::<N>::new();
    for b in 0..nb {
        // SAFETY: block b (24 bytes) and activation block b of each row are in bounds.
        unsafe {
            let x = w.add(24 * b);
            let dm = ld_f16x2(x);
            let (d, m) = (_mm_cvtss_f32(dm), _mm_cvtss_f32(_mm_movehdup_ps(dm)));
            let qh = u32::from_le(x.add(4).cast::<u32>().read_unaligned());
            let hi = _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(0x10));
            let q = _mm256_or_si256(nibbles32(x.add(8)), hi);
            for r in 0..N {
                let y = &*a.add(r * nb + b);
                acc.v[r] = fma_block(dot_us(q, act(y)), d * y.d, acc.v[r]);
                acc.m[r] += m * (y.d * block_sum(y));
            }
        }
    }
    finish(&acc, out);
}

/// `s * v[j]` for eight small unsigned integers.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn scale8(v: [u8; 8], s: f32) -> [f32; 8] {
    let v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(i64::from_le_bytes(
        v,
    ))));
    let mut o = [0f32; 8];
    // SAFETY: `o` holds 8 floats; the store is unaligned.
    unsafe { _mm256_storeu_ps(o.as_mut_ptr(), _mm256_mul_ps(v, _mm256_set1_ps(s))) };
    o
}

/// `d * sc[j]` and `dmin * m[j]` for the 8 sub-blocks of a Q4_K / Q5_K block.
///
/// # Safety
/// `x` must point to a readable Q4_K / Q5_K block (header of 16 bytes).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn k4_scales(x: *const u8) -> ([f32; 8], [f32; 8]) {
    // SAFETY: d, dmin and the 12 scale bytes are the first 16 bytes of the block.
    let (dm, packed) = unsafe { (ld_f16x2(x), x.add(4).cast::<[u8; 12]>().read()) };
    let (sc, m) = scales_mins_k4(&packed);
    (
        scale8(sc, _mm_cvtss_f32(dm)),
        scale8(m, _mm_cvtss_f32(_mm_movehdup_ps(dm))),
    )
}

/// One 32-element sub-block `j` of a Q4_K / Q5_K super-block against activation block
/// `b` of each row: `dsc * d_a * dot(q, a) - dm * d_a * sum(a)`.
///
/// # Safety
/// Activation block `b` of each of the `N` rows (stride `nb`) must be in bounds.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn k4_sub_block<const N: usize>(
    q: __m256i,
    dsc: f32,
    dm: f32,
    a: *const BlockQ8,
    nb: usize,
    b: usize,
    acc: &mut Acc<N>,
) {
    for r in 0..N {
        // SAFETY: in bounds by the caller's contract.
        let y = unsafe { &*a.add(r * nb + b) };
        acc.v[r] = fma_block(dot_us(q, act(y)), dsc * y.d, acc.v[r]);
        acc.m[r] -= dm * (y.d * block_sum(y));
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k<const N: usize>(w: *const u8, a: *const BlockQ8, nb: usize, out: &mut [f32; 4]) {
    let mut acc = Acc::<N>::new();
    let low = _mm256_set1_epi8(0x0F);
    for sb in 0..nb / 8 {
        // SAFETY: super-block sb (144 bytes) and activation blocks 8sb..8sb+8 of each
        // row are in bounds.
        unsafe {
            let x = w.add(144 * sb);
            let (dsc, dm) = k4_scales(x);
            for c in 0..4 {
                let raw = ld256(x.add(16 + 32 * c));
                let lo = _mm256_and_si256(raw, low);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), low);
                let j = 2 * c;
                k4_sub_block(lo, dsc[j], dm[j], a, nb, 8 * sb + j, &mut acc);
                k4_sub_block(hi, dsc[j + 1], dm[j + 1], a, nb, 8 * sb + j + 1, &mut acc);
            }
        }
    }
    finish(&acc, out);
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_k<const N: usize>(w: *const u8, a: *const BlockQ8, nb: usize, out: &mut [f32; 4]) {
    let mut acc = Acc::<N>::new();
    let low = _mm256_set1_epi8(0x0F);
    let one = _mm256_set1_epi8(1);
    let two = _mm256_set1_epi8(2);
    for sb in 0..nb / 8 {
        // SAFETY: super-block sb (176 bytes) and activation blocks 8sb..8sb+8 of each
        // row are in bounds.
        unsafe {
            let x = w.add(176 * sb);
            let (dsc, dm) = k4_scales(x);
            // Sub-block j's fifth bits are bit j of each qh byte; shifting by 2 per chunk
            // keeps the pair for chunk c in bits 0 and 1.
            let mut qh = ld256(x.add(16));
            for c in 0..4 {
                let raw = ld256(x.add(48 + 32 * c));
                let lo = _mm256_or_si256(
                    _mm256_and_si256(raw, low),
                    _mm256_slli_epi16::<4>(_mm256_and_si256(qh, one)),
                );
                let hi = _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(raw), low),
                    _mm256_slli_epi16::<3>(_mm256_and_si256(qh, two)),
                );
                qh = _mm256_srli_epi16::<2>(qh);
                let j = 2 * c;
                k4_sub_block(lo, dsc[j], dm[j], a, nb, 8 * sb + j, &mut acc);
                k4_sub_block(hi, dsc[j + 1], dm[j + 1], a, nb, 8 * sb + j + 1, &mut acc);
            }
        }
    }
    finish(&acc, out);
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k<const N: usize>(w: *const u8, a: *const BlockQ8, nb: usize, out: &mut [f32; 4]) {
    let mut acc = Acc::<N>::new();
    let low = _mm256_set1_epi8(0x0F);
    let m32 = _mm256_set1_epi8(32);
    for sb in 0..nb / 8 {
        // SAFETY: super-block sb (210 bytes) and activation blocks 8sb..8sb+8 of each
        // row are in bounds.
        unsafe {
            let x = w.add(210 * sb);
            let d = ld_f16(x.add(208));
            let scales = _mm_loadu_si128(x.add(192).cast());
            for n in 0..2 {
                let ql0 = ld256(x.add(64 * n));
                let ql1 = ld256(x.add(64 * n + 32));
                let qh = ld256(x.add(128 + 32 * n));
                // The four 32-element sub-blocks of this half, 6-bit unsigned; the
                // qh masks keep shifted bits inside their byte.
                let q = [
                    _mm256_or_si256(
                        _mm256_and_si256(ql0, low),
                        _mm256_slli_epi16::<4>(_mm256_and_si256(qh, _mm256_set1_epi8(0x03))),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(ql1, low),
                        _mm256_slli_epi16::<2>(_mm256_and_si256(qh, _mm256_set1_epi8(0x0C))),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), low),
                        _mm256_and_si256(qh, _mm256_set1_epi8(0x30)),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), low),
                        _mm256_srli_epi16::<2>(_mm256_and_si256(
                            qh,
                            _mm256_set1_epi8(0xC0u8 as i8),
                        )),
                    ),
                ];
                for (p, &q) in q.iter().enumerate() {
                    let k = 4 * n + p;
                    let q = _mm256_sub_epi8(q, m32);
                    let q_abs = _mm256_sign_epi8(q, q);
                    // i16 scales: sc[2k] for the first 16 elements, sc[2k+1] for the rest.
                    let shuf = _mm_set_epi64x(
                        0x0101_0101_0101_0101 * (2 * k as i64 + 1),
                        0x0101_0101_0101_0101 * (2 * k as i64),
                    );
                    let sc = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, shuf));
                    for r in 0..N {
                        let y = &*a.add(r * nb + 8 * sb + k);
                        let s16 = _mm256_maddubs_epi16(q_abs, _mm256_sign_epi8(act(y), q));
                        acc.v[r] = fma_block(_mm256_madd_epi16(s16, sc), d * y.d, acc.v[r]);
                    }
                }
            }
        }
    }
    finish(&acc, out);
}

/// Shared body of the float kernels: `$load` yields weights `$i..$i+8` as f32 from
/// row pointer `$w`, `$one` the single weight at byte pointer `$p`.
macro_rules! float_rows {
    ($name:ident, $bytes:expr, |$w:ident, $i:ident| $load:expr, |$p:ident| $one:expr) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $name<const N: usize>(
            $w: *const u8,
            a: *const f32,
            cols: usize,
            out: &mut [f32; 4],
        ) {
            let mut acc0 = [_mm256_setzero_ps(); N];
            let mut acc1 = [_mm256_setzero_ps(); N];
            let mut i = 0;
            // SAFETY (whole body): every index is < cols for the weights and for each of
            // the N activation rows, by the contract above.
            unsafe {
                while i + 16 <= cols {
                    let w0 = {
                        let $i = i;
                        $load
                    };
                    let w1 = {
                        let $i = i + 8;
                        $load
                    };
                    for r in 0..N {
                        let ar = a.add(r * cols + i);
                        acc0[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(ar), acc0[r]);
                        acc1[r] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(ar.add(8)), acc1[r]);
                    }
                    i += 16;
                }
                if i + 8 <= cols {
                    let w0 = {
                        let $i = i;
                        $load
                    };
                    for r in 0..N {
                        acc0[r] =
                            _mm256_fmadd_ps(w0, _mm256_loadu_ps(a.add(r * cols + i)), acc0[r]);
                    }
                    i += 8;
                }
                for r in 0..N {
                    let mut s = hsum_ps(_mm256_add_ps(acc0[r], acc1[r]));
                    for j in i..cols {
                        let wj = {
                            let $p = $w.add($bytes * j);
                            $one
                        };
                        s += wj * *a.add(r * cols + j);
                    }
                    out[r] = s;
                }
            }
        }
    };
}

float_rows!(
    f32_rows,
    4,
    |w, i| _mm256_loadu_ps(w.add(4 * i).cast()),
    |p| p.cast::<f32>().read_unaligned()
);
float_rows!(
    f16_rows,
    2,
    |w, i| _mm256_cvtph_ps(_mm_loadu_si128(w.add(2 * i).cast())),
    |p| ld_f16(p)
);
float_rows!(
    bf16_rows,
    2,
    |w, i| _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(
        _mm_loadu_si128(w.add(2 * i).cast())
    ))),
    |p| f32::from_bits((p.cast::<u16>().read_unaligned() as u32) << 16)
);

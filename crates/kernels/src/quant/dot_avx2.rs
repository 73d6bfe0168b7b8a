use super::blocks::scales_mins_k4;
use super::dot_scalar::{check_f32, check_q};
use super::{ActScales4, BlockQ8, BlockQ8K, DotKernel, GgmlType, TileQ8Fn, TILE_W};
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
        GgmlType::Q4_0 => DotKernel::Q8(avx2::dot_q4_0),
        GgmlType::Q4_1 => DotKernel::Q8(avx2::dot_q4_1),
        GgmlType::Q5_0 => DotKernel::Q8(avx2::dot_q5_0),
        GgmlType::Q5_1 => DotKernel::Q8(avx2::dot_q5_1),
        GgmlType::Q8_0 => DotKernel::Q8(avx2::dot_q8_0),
        GgmlType::Q4_K => DotKernel::Q8K(dot_q4_k),
        GgmlType::Q5_K => DotKernel::Q8K(dot_q5_k),
        GgmlType::Q6_K => DotKernel::Q8K(dot_q6_k),
        GgmlType::I8 => DotKernel::Q8(super::wq_avx2::dot_i8),
        GgmlType::U4 => DotKernel::U4(super::wq_avx2::dot_u4),
        GgmlType::F8E4M3 => DotKernel::F32(super::wq_avx2::dot_f8),
    }
}

/// The AVX-512 VNNI kernel for `ty`: the VNNI family for the 32-wide formats, the AVX2
/// kernels for the rest. Bit-identical to [`kernel`].
///
/// # Safety
/// The CPU must support AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI.
pub(super) unsafe fn kernel_vnni(ty: GgmlType) -> DotKernel {
    match ty {
        GgmlType::Q4_0 => DotKernel::Q8(vnni::dot_q4_0),
        GgmlType::Q4_1 => DotKernel::Q8(vnni::dot_q4_1),
        GgmlType::Q5_0 => DotKernel::Q8(vnni::dot_q5_0),
        GgmlType::Q5_1 => DotKernel::Q8(vnni::dot_q5_1),
        GgmlType::Q8_0 => DotKernel::Q8(vnni::dot_q8_0),
        // SAFETY: AVX-512 VNNI machines have AVX2, FMA and F16C (the contract above).
        _ => unsafe { kernel(ty) },
    }
}

// ---------------------------------------------------------------------------------
// Helpers. `#[inline]` + the same target features as the kernels, so they inline.

/// Horizontal sum of eight f32 lanes.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) fn hsum_ps(v: __m256) -> f32 {
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
pub(super) unsafe fn ld256(p: *const u8) -> __m256i {
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
pub(super) fn dot_us(w: __m256i, a: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), _mm256_set1_epi16(1))
}

/// Eight i32 partial sums of `w[i] * a[i]` for signed `w` given as `|w|` and `w`.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn dot_ss(w_abs: __m256i, w: __m256i, a: __m256i) -> __m256i {
    dot_us(w_abs, _mm256_sign_epi8(a, w))
}

/// [`dot_us`] in one `vpdpbusd`. The same lanes: `maddubs` saturates its i16 pair sums,
/// but no pair of these kernels reaches the limit (weights at most 128 in magnitude
/// times activations in -127..=127 gives at most 32,512 per pair).
#[target_feature(enable = "avx2,avx512f,avx512vl,avx512vnni")]
#[inline]
fn dot_us_vnni(w: __m256i, a: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, a)
}

/// [`dot_ss`] on [`dot_us_vnni`].
#[target_feature(enable = "avx2,avx512f,avx512vl,avx512vnni")]
#[inline]
fn dot_ss_vnni(w_abs: __m256i, w: __m256i, a: __m256i) -> __m256i {
    dot_us_vnni(w_abs, _mm256_sign_epi8(a, w))
}

/// `acc + p * scale`, `p` the i32 lanes of one block.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) fn fma_block(p: __m256i, scale: f32, acc: __m256) -> __m256 {
    _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(scale), acc)
}

/// The 32 activation bytes of a block.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn act(y: &BlockQ8) -> __m256i {
    // SAFETY: `qs` is 32 readable bytes.
    unsafe { ld256(y.qs.as_ptr().cast()) }
}

/// Activation bytes `32j..32j+32` of a K block.
#[target_feature(enable = "avx2")]
#[inline]
fn act_k(y: &BlockQ8K, j: usize) -> __m256i {
    assert!(j < 8);
    // SAFETY: `qs` is 256 readable bytes and j < 8.
    unsafe { ld256(y.qs.as_ptr().add(32 * j).cast()) }
}

/// Sum of the eight i32 lanes.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn hsum_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01>(s));
    _mm_cvtsi128_si32(s)
}

/// ggml's `(a0 + a2) + (a1 + a3)` over four float lanes.
#[target_feature(enable = "avx2")]
#[inline]
fn hsum_ps4(v: __m128) -> f32 {
    let s = _mm_add_ps(v, _mm_movehl_ps(v, v));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
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

/// Defines the safe fn-pointer wrapper `$name` around the row-blocked `$imp`
/// (`$imp::<N>(w, a, nb, out)`, extra const generics after `N` in `$gen`).
macro_rules! q_wrapper {
    ($name:ident, $act:ty, $elems:expr, $imp:ident $(, $gen:expr)*; $ty:expr) => {
        pub(super) fn $name(w_row: &[u8], acts: &[$act], n_act: usize, out: &mut [f32; 4]) {
            let nb = check_q($ty, w_row, acts.len(), $elems, n_act);
            let (w, a) = (w_row.as_ptr(), acts.as_ptr());
            // SAFETY: shapes were checked above (the weight row holds exactly the blocks
            // matching `nb` activation blocks, `acts` holds `n_act * nb` blocks), and
            // this wrapper is only handed out by `kernel` or `kernel_vnni`, whose
            // contracts are that the CPU supports the features it was compiled for.
            unsafe {
                match n_act {
                    1 => $imp::<1 $(, $gen)*>(w, a, nb, out),
                    2 => $imp::<2 $(, $gen)*>(w, a, nb, out),
                    3 => $imp::<3 $(, $gen)*>(w, a, nb, out),
                    _ => $imp::<4 $(, $gen)*>(w, a, nb, out),
                }
            }
        }
    };
}

macro_rules! f32_wrapper {
    ($name:ident, $imp:ident, $ty:expr) => {
        fn $name(w_row: &[u8], acts: &[f32], n_act: usize, out: &mut [f32; 4]) {
            let cols = check_f32($ty, w_row, acts, n_act);
            // SAFETY: as for the quantized wrappers: lengths checked, CPU features checked
            // by the only caller of `kernel`.
            unsafe { by_rows!($imp, n_act, w_row.as_ptr(), acts.as_ptr(), cols, out) }
        }
    };
}

q_wrapper!(dot_q4_k, BlockQ8K, 256, k_min, false; GgmlType::Q4_K);
q_wrapper!(dot_q5_k, BlockQ8K, 256, k_min, true; GgmlType::Q5_K);
q_wrapper!(dot_q6_k, BlockQ8K, 256, q6_k; GgmlType::Q6_K);
f32_wrapper!(dot_f32, f32_rows, GgmlType::F32);
f32_wrapper!(dot_f16, f16_rows, GgmlType::F16);
f32_wrapper!(dot_bf16, bf16_rows, GgmlType::BF16);

// ---------------------------------------------------------------------------------
// 32-wide kernels. Safety contract shared by all kernels: AVX2/FMA/F16C available; `w`
// points to the `nb`-block (or `cols`-element) weight row; `a` points to `N * nb`
// activation blocks (or `N * cols` floats), row `r` starting at `a + r * nb`;
// `out.len() >= N`.

/// `hsum8(acc[r])` for each row.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn finish<const N: usize>(acc: &[__m256; N], out: &mut [f32; 4]) {
    for (o, acc) in out.iter_mut().zip(acc) {
        *o = hsum_ps(*acc);
    }
}

/// `hsum8(acc[r]) + summs[r]` for each row (the Q8_1 formats).
#[target_feature(enable = "avx2,fma")]
#[inline]
fn finish_min<const N: usize>(acc: &[__m256; N], summs: &[f32; N], out: &mut [f32; 4]) {
    for ((o, acc), m) in out.iter_mut().zip(acc).zip(summs) {
        *o = hsum_ps(*acc) + m;
    }
}

/// Signed-weight formats: `$load(x)` yields the block's weight scale and 32 signed
/// weight bytes from block pointer `x`.
macro_rules! signed_kernel {
    ($feat:literal, $name:ident, $bytes:expr, |$x:ident| $load:expr) => {
        #[target_feature(enable = $feat)]
        unsafe fn $name<const N: usize>(
            w: *const u8,
            a: *const BlockQ8,
            nb: usize,
            out: &mut [f32; 4],
        ) {
            let mut acc = [_mm256_setzero_ps(); N];
            for b in 0..nb {
                // SAFETY: weight block b and activation block b of each row are in
                // bounds by the contract above.
                unsafe {
                    let $x = w.add($bytes * b);
                    let (d, q): (f32, __m256i) = $load;
                    let q_abs = _mm256_sign_epi8(q, q);
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let y = &*a.add(r * nb + b);
                        *acc = fma_block(dot_ss(q_abs, q, act(y)), d * y.d, *acc);
                    }
                }
            }
            finish(&acc, out);
        }
    };
}

/// Weight-plus-min formats (Q8_1 activations): `$load(x)` yields `(d, m)` and the 32
/// unsigned weight bytes.
macro_rules! min_kernel {
    ($feat:literal, $name:ident, $bytes:expr, |$x:ident| $load:expr) => {
        #[target_feature(enable = $feat)]
        unsafe fn $name<const N: usize>(
            w: *const u8,
            a: *const BlockQ8,
            nb: usize,
            out: &mut [f32; 4],
        ) {
            let mut acc = [_mm256_setzero_ps(); N];
            let mut summs = [0f32; N];
            for b in 0..nb {
                // SAFETY: weight block b and activation block b of each row are in
                // bounds by the contract above.
                unsafe {
                    let $x = w.add($bytes * b);
                    let dm = ld_f16x2($x);
                    let (d, m) = (_mm_cvtss_f32(dm), _mm_cvtss_f32(_mm_movehdup_ps(dm)));
                    let q: __m256i = $load;
                    for r in 0..N {
                        let y = &*a.add(r * nb + b);
                        summs[r] = m.mul_add(y.s, summs[r]);
                        acc[r] = fma_block(dot_us(q, act(y)), d * y.d, acc[r]);
                    }
                }
            }
            finish_min(&acc, &summs, out);
        }
    };
}

// ---------------------------------------------------------------------------------
// Tiles: two weight rows x four activation rows per pass over the blocks. Each weight
// block is unpacked once for the four activation rows and each activation block loaded
// once for both weight rows; every (weight row, activation row) pair goes through
// exactly the float operations of the per-pair kernels above, in the same order
// (`acc = fma(float(p), d_w * d_a, acc)` per block, `summs = fma(m_w, s_a, summs)`, then
// `hsum8(acc) + summs`), so a result does not depend on whether it came from a tile.
// Only the bookkeeping differs: `d_w * d_a` is a vector multiply of two broadcasts (the
// activation scales come packed, see `ActScales4`), and the eight `summs` of a tile
// advance in one vector FMA.

const _: () = assert!(
    TILE_W == 2,
    "the tile kernels are written for two weight rows"
);

/// The tile kernel for `ty`, where one exists.
///
/// # Safety
/// As for [`kernel`]: the CPU must support AVX2, FMA and F16C.
pub(super) unsafe fn tile_kernel(ty: GgmlType) -> Option<TileQ8Fn> {
    match ty {
        GgmlType::Q4_0 => Some(avx2::tile_q4_0),
        GgmlType::Q4_1 => Some(avx2::tile_q4_1),
        GgmlType::Q5_0 => Some(avx2::tile_q5_0),
        GgmlType::Q5_1 => Some(avx2::tile_q5_1),
        GgmlType::Q8_0 => Some(avx2::tile_q8_0),
        _ => None,
    }
}

/// The AVX-512 VNNI tile kernel for `ty`, where one exists; bit-identical to
/// [`tile_kernel`]'s.
///
/// # Safety
/// As for [`kernel_vnni`].
pub(super) unsafe fn tile_kernel_vnni(ty: GgmlType) -> Option<TileQ8Fn> {
    match ty {
        GgmlType::Q4_0 => Some(vnni::tile_q4_0),
        GgmlType::Q4_1 => Some(vnni::tile_q4_1),
        GgmlType::Q5_0 => Some(vnni::tile_q5_0),
        GgmlType::Q5_1 => Some(vnni::tile_q5_1),
        GgmlType::Q8_0 => Some(vnni::tile_q8_0),
        _ => None,
    }
}

/// Validates the shapes of a tile call; returns blocks per row.
#[inline(always)]
fn check_tile(ty: GgmlType, w_rows: &[u8], n_blocks: usize, n_scales: usize) -> usize {
    assert!(
        n_blocks.is_multiple_of(4),
        "{n_blocks} activation blocks do not split into 4 rows"
    );
    let nb = n_blocks / 4;
    assert_eq!(n_scales, nb, "one ActScales4 per block expected");
    assert!(
        ty.row_bytes(nb * 32).map(|rb| rb * TILE_W) == Some(w_rows.len()),
        "{} weight tile of {} bytes does not match {} activation columns",
        ty.name(),
        w_rows.len(),
        nb * 32
    );
    nb
}

macro_rules! tile_wrapper {
    ($name:ident, $imp:ident, $ty:expr) => {
        pub(super) fn $name(
            w_rows: &[u8],
            acts: &[BlockQ8],
            scales: &[ActScales4],
            out: &mut [[f32; 4]; TILE_W],
        ) {
            let nb = check_tile($ty, w_rows, acts.len(), scales.len());
            let rb = w_rows.len() / TILE_W;
            // SAFETY: shapes checked above (TILE_W weight rows of `rb` bytes holding `nb`
            // blocks each, four activation rows of `nb` blocks, `nb` scale groups); CPU
            // features are the contract of `tile_kernel` / `tile_kernel_vnni`, the only
            // places handing this out.
            unsafe { $imp(w_rows.as_ptr(), rb, acts.as_ptr(), scales.as_ptr(), nb, out) }
        }
    };
}

/// The `f32` at `$p`, broadcast to eight lanes. In asm so that the value is read back
/// from memory (a pure load) rather than turned into shuffles, and not hoisted away
/// from its use. Expands to an unsafe operation: `$p` must be a readable f32.
macro_rules! bcast_at {
    ($p:expr) => {{
        let r: __m256;
        std::arch::asm!(
            "vbroadcastss {r}, dword ptr [{p}]",
            p = in(reg) $p,
            r = out(ymm_reg) r,
            options(readonly, nostack, preserves_flags)
        );
        r
    }};
}

/// Tile twin of `min_kernel!`: `$load(x)` yields the 32 unsigned weight bytes of the
/// block at `x`, whose first four bytes are the f16 `d` and `m`.
macro_rules! min_tile {
    ($feat:literal, $name:ident, $bytes:expr, |$x:ident| $load:expr) => {
        /// # Safety
        /// AVX2/FMA/F16C available; `w` points to two rows of `rb` bytes (`nb` blocks
        /// each), `a` to four activation rows of `nb` blocks back to back, `sc` to their
        /// `nb` packed scales.
        #[target_feature(enable = $feat)]
        unsafe fn $name(
            w: *const u8,
            rb: usize,
            a: *const BlockQ8,
            sc: *const ActScales4,
            nb: usize,
            out: &mut [[f32; 4]; TILE_W],
        ) {
            let mut acc = [[_mm256_setzero_ps(); 4]; TILE_W];
            // Lane 4j + r: `summs` of weight row j with activation row r.
            let mut summs = _mm256_setzero_ps();
            // Lanes 4j..4j+4 take lane 2j (d of row j), resp. 2j + 1 (m of row j).
            let pick_d1 = _mm256_set1_epi32(2);
            let pick_m = _mm256_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3);
            for b in 0..nb {
                // SAFETY: block b of both weight rows, of the four activation rows and
                // of the scales is in bounds by the contract above.
                unsafe {
                    let x0 = w.add($bytes * b);
                    let x1 = x0.add(rb);
                    let s4 = &*sc.add(b);
                    // [d0, m0, d1, m1] of the two weight blocks.
                    let h0 = x0.cast::<i32>().read_unaligned();
                    let h1 = x1.cast::<i32>().read_unaligned();
                    let dm = _mm256_castps128_ps256(_mm_cvtph_ps(_mm_set_epi32(0, 0, h1, h0)));
                    let s_a = _mm256_broadcast_ps(&*s4.s.as_ptr().cast::<__m128>());
                    summs = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(dm, pick_m), s_a, summs);
                    // d_w of row j in all lanes.
                    let d_w = [
                        _mm256_broadcastss_ps(_mm256_castps256_ps128(dm)),
                        _mm256_permutevar8x32_ps(dm, pick_d1),
                    ];
                    let q = [
                        {
                            let $x = x0;
                            $load
                        },
                        {
                            let $x = x1;
                            $load
                        },
                    ];
                    for r in 0..4 {
                        let y = act(&*a.add(r * nb + b));
                        // d_a of row r in all lanes, loaded from the packed scales.
                        let d_a = bcast_at!(s4.d.as_ptr().add(r));
                        for j in 0..TILE_W {
                            let p = _mm256_cvtepi32_ps(dot_us(q[j], y));
                            // d_w * d_a rounded once, as the pair kernel's scalar product.
                            let scale = _mm256_mul_ps(d_w[j], d_a);
                            acc[j][r] = _mm256_fmadd_ps(p, scale, acc[j][r]);
                        }
                    }
                }
            }
            let mut m = [0f32; 8];
            // SAFETY: `m` holds eight floats.
            unsafe { _mm256_storeu_ps(m.as_mut_ptr(), summs) };
            for j in 0..TILE_W {
                for r in 0..4 {
                    out[j][r] = hsum_ps(acc[j][r]) + m[4 * j + r];
                }
            }
        }
    };
}

/// Tile twin of `signed_kernel!`: `$load(x)` yields the f32 weight scale and the 32
/// signed weight bytes of the block at `x`.
macro_rules! signed_tile {
    ($feat:literal, $name:ident, $bytes:expr, |$x:ident| $load:expr) => {
        /// # Safety
        /// As for the `min_tile!` kernels (`sc` only needs the `d` scales).
        #[target_feature(enable = $feat)]
        unsafe fn $name(
            w: *const u8,
            rb: usize,
            a: *const BlockQ8,
            sc: *const ActScales4,
            nb: usize,
            out: &mut [[f32; 4]; TILE_W],
        ) {
            let mut acc = [[_mm256_setzero_ps(); 4]; TILE_W];
            for b in 0..nb {
                // SAFETY: block b of both weight rows, of the four activation rows and
                // of the scales is in bounds by the contract above.
                unsafe {
                    let x0 = w.add($bytes * b);
                    let s4 = &*sc.add(b);
                    let (d0, q0): (f32, __m256i) = {
                        let $x = x0;
                        $load
                    };
                    let (d1, q1): (f32, __m256i) = {
                        let $x = x0.add(rb);
                        $load
                    };
                    let d_w = [_mm256_set1_ps(d0), _mm256_set1_ps(d1)];
                    let q = [q0, q1];
                    let q_abs = [_mm256_sign_epi8(q0, q0), _mm256_sign_epi8(q1, q1)];
                    for r in 0..4 {
                        let y = act(&*a.add(r * nb + b));
                        let d_a = bcast_at!(s4.d.as_ptr().add(r));
                        for j in 0..TILE_W {
                            let p = _mm256_cvtepi32_ps(dot_ss(q_abs[j], q[j], y));
                            let scale = _mm256_mul_ps(d_w[j], d_a);
                            acc[j][r] = _mm256_fmadd_ps(p, scale, acc[j][r]);
                        }
                    }
                }
            }
            for j in 0..TILE_W {
                for r in 0..4 {
                    out[j][r] = hsum_ps(acc[j][r]);
                }
            }
        }
    };
}

// ---------------------------------------------------------------------------------
// The 32-wide kernel family, instantiated once per instruction set: the AVX2 one and
// the AVX-512 VNNI one differ only in `dot_us` (`maddubs` + `madd` against one
// `vpdpbusd`), which give the same exact integer lanes, so both give the same bits.

/// The dot and tile kernels of the 32-wide formats, compiled for target features
/// `$feat`, with whatever `dot_us` / `dot_ss` the invoking module has in scope.
/// The f32 scale and the 32 signed weights of the Q8_0 block at `x`.
///
/// # Safety
/// `x..x+34` must be readable.
#[target_feature(enable = "avx2,f16c")]
#[inline]
unsafe fn q8_0_block(x: *const u8) -> (f32, __m256i) {
    // SAFETY: the caller guarantees the block is readable.
    unsafe { (ld_f16(x), ld256(x.add(2))) }
}

/// As [`q8_0_block`] for Q4_0 (18 bytes): the nibbles minus 8.
#[target_feature(enable = "avx2,f16c")]
#[inline]
unsafe fn q4_0_block(x: *const u8) -> (f32, __m256i) {
    // SAFETY: as above.
    unsafe {
        (
            ld_f16(x),
            _mm256_sub_epi8(nibbles32(x.add(2)), _mm256_set1_epi8(8)),
        )
    }
}

/// As [`q8_0_block`] for Q5_0 (22 bytes): q - 16 as a signed byte. Where the fifth bit is
/// clear, the top four bits are set (nibble - 16 in two's complement); where it is set,
/// the nibble alone is q - 16.
#[target_feature(enable = "avx2,f16c")]
#[inline]
unsafe fn q5_0_block(x: *const u8) -> (f32, __m256i) {
    // SAFETY: as above.
    unsafe {
        let bits = u32::from_le(x.add(2).cast::<u32>().read_unaligned());
        let high = _mm256_andnot_si256(bits_to_bytes(bits), _mm256_set1_epi8(0xF0u8 as i8));
        (ld_f16(x), _mm256_or_si256(nibbles32(x.add(6)), high))
    }
}

/// The 32 unsigned five-bit weights of the Q5_1 block at `x` (24 bytes).
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn q5_1_quants(x: *const u8) -> __m256i {
    // SAFETY: as above.
    unsafe {
        let bits = u32::from_le(x.add(4).cast::<u32>().read_unaligned());
        let high = _mm256_and_si256(bits_to_bytes(bits), _mm256_set1_epi8(0x10));
        _mm256_or_si256(nibbles32(x.add(8)), high)
    }
}

macro_rules! block32_family {
    ($feat:literal) => {
        q_wrapper!(dot_q4_0, BlockQ8, 32, q4_0; GgmlType::Q4_0);
        q_wrapper!(dot_q4_1, BlockQ8, 32, q4_1; GgmlType::Q4_1);
        q_wrapper!(dot_q5_0, BlockQ8, 32, q5_0; GgmlType::Q5_0);
        q_wrapper!(dot_q5_1, BlockQ8, 32, q5_1; GgmlType::Q5_1);
        q_wrapper!(dot_q8_0, BlockQ8, 32, q8_0; GgmlType::Q8_0);
        signed_kernel!($feat, q8_0, 34, |x| q8_0_block(x));
        signed_kernel!($feat, q4_0, 18, |x| q4_0_block(x));
        signed_kernel!($feat, q5_0, 22, |x| q5_0_block(x));

        min_kernel!($feat, q4_1, 20, |x| nibbles32(x.add(4)));
        min_kernel!($feat, q5_1, 24, |x| q5_1_quants(x));

        min_tile!($feat, q4_1_t, 20, |x| nibbles32(x.add(4)));
        min_tile!($feat, q5_1_t, 24, |x| q5_1_quants(x));
        signed_tile!($feat, q8_0_t, 34, |x| q8_0_block(x));
        signed_tile!($feat, q4_0_t, 18, |x| q4_0_block(x));
        signed_tile!($feat, q5_0_t, 22, |x| q5_0_block(x));
        tile_wrapper!(tile_q8_0, q8_0_t, GgmlType::Q8_0);
        tile_wrapper!(tile_q4_0, q4_0_t, GgmlType::Q4_0);
        tile_wrapper!(tile_q5_0, q5_0_t, GgmlType::Q5_0);
        tile_wrapper!(tile_q4_1, q4_1_t, GgmlType::Q4_1);
        tile_wrapper!(tile_q5_1, q5_1_t, GgmlType::Q5_1);
    };
}

/// The AVX2 family.
mod avx2 {
    use super::*;
    block32_family!("avx2,fma,f16c");
}

/// The AVX-512 VNNI family (256-bit `vpdpbusd`, which needs AVX512VL).
mod vnni {
    use super::*;
    use super::{dot_ss_vnni as dot_ss, dot_us_vnni as dot_us};
    block32_family!("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni");
}

// ---------------------------------------------------------------------------------
// K-quants.

/// Q4_K (`FIVE == false`) and Q5_K (`FIVE == true`): scale-and-min K-quants.
///
/// Per super-block and row it forms, in integers, the four pair vectors
/// `P[c] = madd(maddubs(q[2c], a[2c]), sc[2c]) + madd(maddubs(q[2c+1], a[2c+1]), sc[2c+1])`
/// and the four min lanes `M[t] = m[2t] * B[2t] + m[2t+1] * B[2t+1]`, then applies
/// ggml's vec_dot float arithmetic (see `dot_scalar`) to the eight lanes of `sum(P)`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn k_min<const N: usize, const FIVE: bool>(
    w: *const u8,
    a: *const BlockQ8K,
    nb: usize,
    out: &mut [f32; 4],
) {
    let bb = if FIVE { 176 } else { 144 };
    let qs_off = if FIVE { 48 } else { 16 };
    let low = _mm256_set1_epi8(0x0F);
    let mut acc = [_mm256_setzero_ps(); N];
    let mut acc_m = [_mm_setzero_ps(); N];
    let mut summs = [0f32; N];
    for sb in 0..nb {
        // SAFETY: super-block sb of the weight row and activation block sb of each row
        // are in bounds by the contract above.
        unsafe {
            let x = w.add(bb * sb);
            let dm = ld_f16x2(x);
            let (d_x, dmin_x) = (_mm_cvtss_f32(dm), _mm_cvtss_f32(_mm_movehdup_ps(dm)));
            let (sc, m) = scales_mins_k4(&x.add(4).cast::<[u8; 12]>().read());
            let mins16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(i64::from_le_bytes(m)));
            let mut qh = if FIVE {
                ld256(x.add(16))
            } else {
                _mm256_setzero_si256()
            };
            let mut pairs = [[_mm256_setzero_si256(); 4]; N];
            for c in 0..4 {
                let raw = ld256(x.add(qs_off + 32 * c));
                let mut lo = _mm256_and_si256(raw, low);
                let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), low);
                if FIVE {
                    // Sub-block j's fifth bits are bit j of each qh byte; shifting by 2
                    // per chunk keeps the pair for chunk c in bits 0 and 1.
                    let one = _mm256_set1_epi8(1);
                    lo = _mm256_or_si256(lo, _mm256_slli_epi16::<4>(_mm256_and_si256(qh, one)));
                    let two = _mm256_set1_epi8(2);
                    hi = _mm256_or_si256(hi, _mm256_slli_epi16::<3>(_mm256_and_si256(qh, two)));
                    qh = _mm256_srli_epi16::<2>(qh);
                }
                let sc_lo = _mm256_set1_epi16(sc[2 * c] as i16);
                let sc_hi = _mm256_set1_epi16(sc[2 * c + 1] as i16);
                for (r, pairs) in pairs.iter_mut().enumerate() {
                    let y = &*a.add(r * nb + sb);
                    let p_lo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, act_k(y, 2 * c)), sc_lo);
                    let p_hi =
                        _mm256_madd_epi16(_mm256_maddubs_epi16(hi, act_k(y, 2 * c + 1)), sc_hi);
                    pairs[c] = _mm256_add_epi32(p_lo, p_hi);
                }
            }
            for r in 0..N {
                let y = &*a.add(r * nb + sb);
                let bsums = _mm256_loadu_si256(y.bsums.as_ptr().cast());
                let q8s = _mm_hadd_epi16(
                    _mm256_castsi256_si128(bsums),
                    _mm256_extracti128_si256::<1>(bsums),
                );
                let prod = _mm_madd_epi16(mins16, q8s);
                let p = &pairs[r];
                let sumi =
                    _mm256_add_epi32(_mm256_add_epi32(p[0], p[1]), _mm256_add_epi32(p[2], p[3]));
                let d = y.d * d_x;
                let dmin = -y.d * dmin_x;
                if FIVE {
                    let s = _mm_add_epi32(prod, _mm_unpackhi_epi64(prod, prod));
                    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01>(s));
                    summs[r] = (_mm_cvtsi128_si32(s) as f32).mul_add(dmin, summs[r]);
                } else {
                    acc_m[r] = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_m[r]);
                }
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc[r]);
            }
        }
    }
    for r in 0..N {
        out[r] = if FIVE {
            hsum_ps(acc[r]) + summs[r]
        } else {
            hsum_ps(acc[r]) + hsum_ps4(acc_m[r])
        };
    }
}

/// Q6_K: ggml's vec_dot lanes (unsigned 6-bit weights, scales per 16, the -32 offset
/// subtracted as `32 * madd(bsums, scales)`) and its float arithmetic.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k<const N: usize>(w: *const u8, a: *const BlockQ8K, nb: usize, out: &mut [f32; 4]) {
    let low = _mm256_set1_epi8(0x0F);
    let mut acc = [_mm256_setzero_ps(); N];
    for sb in 0..nb {
        // SAFETY: super-block sb (210 bytes) and activation block sb of each row are in
        // bounds by the contract above.
        unsafe {
            let x = w.add(210 * sb);
            let d_x = ld_f16(x.add(208));
            let scales = _mm_loadu_si128(x.add(192).cast());
            let mut sumi = [_mm256_setzero_si256(); N];
            for n in 0..2 {
                let ql0 = ld256(x.add(64 * n));
                let ql1 = ld256(x.add(64 * n + 32));
                let qh = ld256(x.add(128 + 32 * n));
                // The four 32-element sub-blocks of this half, 6-bit unsigned; the qh
                // masks keep shifted bits inside their byte.
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
                    let b = 4 * n + p;
                    // i16 scales: sc[2b] for the first 16 elements, sc[2b+1] for the rest.
                    let shuf = _mm_set_epi64x(
                        0x0101_0101_0101_0101 * (2 * b as i64 + 1),
                        0x0101_0101_0101_0101 * (2 * b as i64),
                    );
                    let sc = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, shuf));
                    for (r, sumi) in sumi.iter_mut().enumerate() {
                        let y = &*a.add(r * nb + sb);
                        let p16 = _mm256_maddubs_epi16(q, act_k(y, b));
                        *sumi = _mm256_add_epi32(*sumi, _mm256_madd_epi16(sc, p16));
                    }
                }
            }
            let scales16 = _mm256_cvtepi8_epi16(scales);
            for (r, sumi) in sumi.iter().enumerate() {
                let y = &*a.add(r * nb + sb);
                let bsums = _mm256_loadu_si256(y.bsums.as_ptr().cast());
                let corr = _mm256_slli_epi32::<5>(_mm256_madd_epi16(bsums, scales16));
                let lanes = _mm256_sub_epi32(*sumi, corr);
                acc[r] =
                    _mm256_fmadd_ps(_mm256_set1_ps(y.d * d_x), _mm256_cvtepi32_ps(lanes), acc[r]);
            }
        }
    }
    for r in 0..N {
        out[r] = hsum_ps(acc[r]);
    }
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

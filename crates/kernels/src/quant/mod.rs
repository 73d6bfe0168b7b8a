//! GGML quantized block formats, activation quantization and quantized dot products.
//!
//! Weight rows stay in their on-disk GGML layout (memory-mapped) or are repacked once at
//! load into an eight-row interleaved layout (`interleave`); activations are quantized
//! on the fly as llama.cpp quantizes them. Each weight type has one dot product
//! arithmetic per layout, used whatever the batch size: in the file layout that of
//! llama.cpp's AVX2 `ggml_vec_dot_*` for the type, in the interleaved layout its own
//! (see `interleave`). A request's logits never depend on its neighbours, its chunking
//! or the thread split (batch invariance). Two activation formats exist, chosen by the
//! weight type:
//!
//! * [`BlockQ8`] (32 values, ggml's `block_q8_0` / `block_q8_1`) for the 32-wide formats;
//! * [`BlockQ8K`] (256 values, ggml's `block_q8_K`) for the K-quants.
//!
//! llama.cpp itself does not keep one arithmetic per weight type: depending on the
//! batch size and on whether the weight was repacked at load time it runs
//! `ggml_vec_dot_*`, the llamafile sgemm, the repacked gemv/gemm (`repack.cpp`) or the
//! tiled K-quant matmul (`tiled/`), whose float arithmetic differs, so its K-quant
//! logits change with the batch. pagellm does not follow it there.
//!
//! Files: `blocks` (byte-exact weight block structs), `dequant` (reference
//! dequantization), `q8` (activation quantization), `dot_scalar` (reference dot
//! products, the definition of every result), `dot_avx2` (their bit-identical AVX2
//! twins), `interleave` (weights repacked eight rows at a time at load, with their own
//! arithmetic and kernels in `interleave_x86`). Dispatch happens here.

/// A weight element type: the GGUF types (`ggml_type`) and the element formats of
/// quantized checkpoints (`I8`, `U4`, `F8E4M3`, whose scales live beside the weight in
/// a [`QuantParams`]; see `wq`).
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4_K,
    Q5_K,
    Q6_K,
    /// Signed bytes, one scale per row (INT8 checkpoints).
    I8,
    /// Unsigned nibbles, two per byte, scale and zero point per group (INT4).
    U4,
    /// OCP FP8 E4M3 bytes, one scale per row.
    F8E4M3,
}

impl GgmlType {
    /// Maps a GGUF `ggml_type` id; `None` for types pagellm does not support.
    pub fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            6 => Self::Q5_0,
            7 => Self::Q5_1,
            8 => Self::Q8_0,
            12 => Self::Q4_K,
            13 => Self::Q5_K,
            14 => Self::Q6_K,
            30 => Self::BF16,
            _ => return None,
        })
    }

    /// The GGUF id; `None` for the checkpoint formats, which GGUF cannot hold.
    pub fn id(self) -> Option<u32> {
        Some(match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q4_0 => 2,
            Self::Q4_1 => 3,
            Self::Q5_0 => 6,
            Self::Q5_1 => 7,
            Self::Q8_0 => 8,
            Self::Q4_K => 12,
            Self::Q5_K => 13,
            Self::Q6_K => 14,
            Self::BF16 => 30,
            Self::I8 | Self::U4 | Self::F8E4M3 => return None,
        })
    }

    /// The name ggml uses ("Q4_K", "F16", ...).
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::BF16 => "BF16",
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q8_0 => "Q8_0",
            Self::Q4_K => "Q4_K",
            Self::Q5_K => "Q5_K",
            Self::Q6_K => "Q6_K",
            Self::I8 => "I8",
            Self::U4 => "U4",
            Self::F8E4M3 => "F8_E4M3",
        }
    }

    /// Elements per block.
    pub fn block_elems(self) -> usize {
        match self {
            Self::F32 | Self::F16 | Self::BF16 | Self::I8 | Self::F8E4M3 => 1,
            Self::U4 => 2,
            Self::Q4_0 | Self::Q4_1 | Self::Q5_0 | Self::Q5_1 | Self::Q8_0 => 32,
            Self::Q4_K | Self::Q5_K | Self::Q6_K => 256,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
            Self::I8 | Self::U4 | Self::F8E4M3 => 1,
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q5_0 => 22,
            Self::Q5_1 => 24,
            Self::Q8_0 => 34,
            Self::Q4_K => 144,
            Self::Q5_K => 176,
            Self::Q6_K => 210,
        }
    }

    /// A GGML block format (scales inside the blocks).
    pub fn is_quantized(self) -> bool {
        self.block_elems() > 1 && !self.has_params()
    }

    /// A checkpoint format: the weight needs its [`QuantParams`].
    pub fn has_params(self) -> bool {
        matches!(self, Self::I8 | Self::U4 | Self::F8E4M3)
    }

    /// Bytes of a row of `n` elements; `None` when `n` is not a whole number of blocks
    /// or the size overflows `usize`.
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        if !n.is_multiple_of(self.block_elems()) {
            return None;
        }
        (n / self.block_elems()).checked_mul(self.block_bytes())
    }
}

/// 32 quantized activations as llama.cpp's `quantize_row_q8_1` (AVX2) makes them:
/// `x[i] ≈ d * qs[i]` with `d = f16(amax / 127)` and `qs[i] = round_half_even(x[i] *
/// (127 / amax))`; `s = f16(amax / 127 * sum(qs))` (computed with the unrounded scale,
/// as ggml does). The same block serves as ggml's `block_q8_0` (which is this without
/// `s`). Both f16 values are stored already widened to f32.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BlockQ8 {
    pub d: f32,
    pub s: f32,
    pub qs: [i8; 32],
}
const _: () = assert!(std::mem::size_of::<BlockQ8>() == 40);

/// 256 quantized activations as ggml's `quantize_row_q8_K_ref` makes them, for the
/// K-quant weights: `x[i] ≈ d * qs[i]` with one f32 scale `d = max / -127` where `max`
/// is the first element of largest magnitude (so `d` carries its sign), and
/// `bsums[j] = sum(qs[16j..16j+16])`. Layout of ggml's `block_q8_K`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; 256],
    pub bsums: [i16; 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ8K>() == 292);

impl Default for BlockQ8K {
    fn default() -> Self {
        Self {
            d: 0.0,
            qs: [0; 256],
            bsums: [0; 16],
        }
    }
}

pub use crate::cpu::SimdLevel;

pub mod blocks;
mod dequant;
mod dot_scalar;
mod q8;
pub mod wq;

#[cfg(target_arch = "x86_64")]
mod dot_avx2;
pub mod interleave;
mod interleave_twin;
#[cfg(target_arch = "x86_64")]
mod interleave_x512;
#[cfg(target_arch = "x86_64")]
mod interleave_x86;
#[cfg(target_arch = "x86_64")]
mod wq_avx2;

pub use wq::{ActQuant, DotI8TokFn, DotU4Fn, QuantParams};

pub use dequant::dequantize_row;
pub use q8::{quantize_row_q8, quantize_row_q8_ref, quantize_row_q8k, quantize_row_q8k_ref};

/// Dot products of ONE weight row (GGML bytes, any alignment) with `n_act` (1..=4)
/// activation rows stored back to back in `acts`, each `cols / 32` blocks:
/// `out[i] = dot(w_row, row i)` for `i < n_act`; `out[n_act..]` is left untouched.
/// Register blocking over the activation rows lets prefill unpack each weight block
/// once for four tokens. Activations must come from [`quantize_row_q8`]: the SIMD
/// kernels rely on values in -127..=127. Panics on inconsistent lengths.
pub type DotQ8Fn = fn(w_row: &[u8], acts: &[BlockQ8], n_act: usize, out: &mut [f32; 4]);

/// As [`DotQ8Fn`] for the K-quants, whose activations come from [`quantize_row_q8k`]
/// (`cols / 256` blocks per row).
pub type DotQ8KFn = fn(w_row: &[u8], acts: &[BlockQ8K], n_act: usize, out: &mut [f32; 4]);

/// As [`DotQ8Fn`] for float weights (F32/F16/BF16) against f32 activations: `acts`
/// holds `n_act` rows of `cols` floats.
pub type DotF32Fn = fn(w_row: &[u8], acts: &[f32], n_act: usize, out: &mut [f32; 4]);

/// Weight rows per call of a [`TileQ8Fn`].
pub const TILE_W: usize = 2;

/// The scales `d` and `s` of block `b` of four activation rows side by side, as the
/// tile kernels read them: `d[i]` and `s[i]` of row `i`. See [`pack_scales4`].
#[repr(C, align(32))]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ActScales4 {
    pub d: [f32; 4],
    pub s: [f32; 4],
}

/// Packs the scales of four activation rows of `nb = out.len()` blocks each, stored back
/// to back in `acts`.
pub fn pack_scales4(acts: &[BlockQ8], out: &mut [ActScales4]) {
    let nb = out.len();
    assert_eq!(acts.len(), 4 * nb, "four rows of {nb} blocks expected");
    for (b, o) in out.iter_mut().enumerate() {
        for i in 0..4 {
            o.d[i] = acts[i * nb + b].d;
            o.s[i] = acts[i * nb + b].s;
        }
    }
}

/// Dot products of `TILE_W` consecutive weight rows (`w_rows`, GGML bytes, any
/// alignment) with four activation rows stored back to back in `acts` (each `cols / 32`
/// blocks, their scales packed in `scales` by [`pack_scales4`]):
/// `out[j][i] = dot(weight row j, activation row i)`. Each weight block is unpacked
/// once per tile and each activation block loaded once. Every result is bit for bit
/// what the [`DotQ8Fn`] of the same weight type gives for that pair, so which products
/// go through a tile never changes an output. Panics on inconsistent lengths.
pub type TileQ8Fn =
    fn(w_rows: &[u8], acts: &[BlockQ8], scales: &[ActScales4], out: &mut [[f32; 4]; TILE_W]);

/// A dot-product kernel and the activation format it consumes.
#[derive(Debug, Clone, Copy)]
pub enum DotKernel {
    /// 32-wide quantized weights; activations quantized with [`quantize_row_q8`].
    Q8(DotQ8Fn),
    /// K-quant weights; activations quantized with [`quantize_row_q8k`].
    Q8K(DotQ8KFn),
    /// Float weights (and FP8, before its row scale); f32 activations.
    F32(DotF32Fn),
    /// `U4` weights with their group scales; activations from [`quantize_row_q8`].
    U4(DotU4Fn),
}

/// The dot-product kernel for weights of type `ty` on this CPU (`PAGELLM_SIMD=scalar`
/// forces the scalar twin, which gives the same bits). One kernel per type, whatever
/// the batch: every kernel gives a pair (weight row, activation row) the same result
/// whatever `n_act` is and whichever rows share the call.
pub fn dot_kernel(ty: GgmlType) -> DotKernel {
    dot_kernel_at(crate::cpu::simd_level(), ty).unwrap_or_else(|| dot_kernel_ref(ty))
}

/// The kernel for `ty` of SIMD family `level`, if this CPU can run it: tests and
/// benchmarks compare the families through this. Every family gives the same bits.
pub fn dot_kernel_at(level: SimdLevel, ty: GgmlType) -> Option<DotKernel> {
    if level > crate::cpu::supported() {
        return None;
    }
    match level {
        SimdLevel::Scalar => Some(dot_kernel_ref(ty)),
        // SAFETY: the CPU supports `level` (checked above).
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => Some(unsafe { dot_avx2::kernel(ty) }),
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512Vnni => Some(unsafe { dot_avx2::kernel_vnni(ty) }),
        #[cfg(not(target_arch = "x86_64"))]
        _ => None,
    }
}

/// The register-tiled kernel for weights of type `ty` on this CPU, if there is one
/// (only SIMD builds have them; the scalar path computes pair by pair). Its results
/// equal those of [`dot_kernel`] for every pair.
pub fn tile_kernel_for(ty: GgmlType) -> Option<TileQ8Fn> {
    tile_kernel_at(crate::cpu::simd_level(), ty)
}

/// The tile kernel for `ty` of SIMD family `level`, if there is one and this CPU can
/// run it.
pub fn tile_kernel_at(level: SimdLevel, ty: GgmlType) -> Option<TileQ8Fn> {
    if level > crate::cpu::supported() {
        return None;
    }
    match level {
        SimdLevel::Scalar => None,
        // SAFETY: the CPU supports `level` (checked above).
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => unsafe { dot_avx2::tile_kernel(ty) },
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512Vnni => unsafe { dot_avx2::tile_kernel_vnni(ty) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => None,
    }
}

/// The portable twin of [`dot_kernel`]; the SIMD kernels are tested against it.
pub fn dot_kernel_ref(ty: GgmlType) -> DotKernel {
    use dot_scalar::*;
    match ty {
        GgmlType::F32 => DotKernel::F32(dot_f32),
        GgmlType::F16 => DotKernel::F32(dot_f16),
        GgmlType::BF16 => DotKernel::F32(dot_bf16),
        GgmlType::Q4_0 => DotKernel::Q8(dot_q4_0),
        GgmlType::Q4_1 => DotKernel::Q8(dot_q4_1),
        GgmlType::Q5_0 => DotKernel::Q8(dot_q5_0),
        GgmlType::Q5_1 => DotKernel::Q8(dot_q5_1),
        GgmlType::Q8_0 => DotKernel::Q8(dot_q8_0),
        GgmlType::Q4_K => DotKernel::Q8K(dot_q4_k),
        GgmlType::Q5_K => DotKernel::Q8K(dot_q5_k),
        GgmlType::Q6_K => DotKernel::Q8K(dot_q6_k),
        GgmlType::I8 => DotKernel::Q8(wq::dot_i8),
        GgmlType::U4 => DotKernel::U4(wq::dot_u4),
        GgmlType::F8E4M3 => DotKernel::F32(wq::dot_f8),
    }
}

/// The kernel for `I8` weights against activations quantized per token (W8A8) on this
/// CPU; bit-identical to [`wq::dot_i8_tok`].
pub fn dot_kernel_i8_tok() -> DotI8TokFn {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::simd_level() >= crate::cpu::SimdLevel::Avx2 {
        return wq_avx2::dot_i8_tok;
    }
    wq::dot_i8_tok
}

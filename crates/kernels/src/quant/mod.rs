//! GGML quantized block formats, activation quantization and quantized dot products.
//!
//! Weight rows stay in their on-disk GGML layout (memory-mapped); activations are
//! quantized on the fly to [`BlockQ8`] (32 int8 values, one f32 scale, per-16 sums)
//! and multiplied with integer dot products, scales applied per block.
//! Layouts follow ggml's `ggml-common.h` / `ggml-quants.c`.
//!
//! Files: `blocks` (byte-exact weight block structs), `dequant` (reference
//! dequantization), `q8` (activation quantization), `dot_scalar` (reference dot
//! products), `dot_avx2` (their AVX2 twins). Dispatch happens here, in [`dot_kernel`].

/// A tensor element type as numbered in GGUF (`ggml_type`).
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

    pub fn id(self) -> u32 {
        match self {
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
        }
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
        }
    }

    /// Elements per block.
    pub fn block_elems(self) -> usize {
        match self {
            Self::F32 | Self::F16 | Self::BF16 => 1,
            Self::Q4_0 | Self::Q4_1 | Self::Q5_0 | Self::Q5_1 | Self::Q8_0 => 32,
            Self::Q4_K | Self::Q5_K | Self::Q6_K => 256,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
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

    pub fn is_quantized(self) -> bool {
        self.block_elems() > 1
    }

    /// Bytes of a row of `n` elements; `None` when `n` is not a whole number of blocks.
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        n.is_multiple_of(self.block_elems())
            .then(|| n / self.block_elems() * self.block_bytes())
    }
}

/// One block of 32 quantized activations: `x[i] ≈ d * qs[i]`.
/// `sums[h]` is the exact integer sum of `qs[16h..16h+16]`, used by formats with a
/// zero point or offset (Q4_0/Q4_1/Q5_x/K-quants) to fold the offset in once per block.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct BlockQ8 {
    pub d: f32,
    pub sums: [i16; 2],
    pub qs: [i8; 32],
}
const _: () = assert!(std::mem::size_of::<BlockQ8>() == 40);

pub mod blocks;
mod dequant;
mod dot_scalar;
mod q8;

#[cfg(target_arch = "x86_64")]
mod dot_avx2;

pub use dequant::dequantize_row;
pub use q8::{quantize_row_q8, quantize_row_q8_ref};

/// Dot products of ONE weight row (GGML bytes, any alignment) with `n_act` (1..=4)
/// activation rows stored back to back in `acts`, each `cols / 32` blocks:
/// `out[i] = dot(w_row, row i)` for `i < n_act`; `out[n_act..]` is left untouched.
/// Register blocking over the activation rows lets prefill unpack each weight block
/// once for four tokens. Activations must come from [`quantize_row_q8`]: the SIMD
/// kernels rely on values in -127..=127 and the scalar ones on consistent `sums`.
/// Panics on inconsistent lengths.
pub type DotQ8Fn = fn(w_row: &[u8], acts: &[BlockQ8], n_act: usize, out: &mut [f32; 4]);

/// As [`DotQ8Fn`] for float weights (F32/F16/BF16) against f32 activations: `acts`
/// holds `n_act` rows of `cols` floats.
pub type DotF32Fn = fn(w_row: &[u8], acts: &[f32], n_act: usize, out: &mut [f32; 4]);

/// A dot-product kernel and the activation format it consumes.
#[derive(Debug, Clone, Copy)]
pub enum DotKernel {
    /// Quantized weights; activations quantized with [`quantize_row_q8`].
    Q8(DotQ8Fn),
    /// Float weights; f32 activations.
    F32(DotF32Fn),
}

/// The fastest kernel for `ty` on this CPU (`PAGELLM_SIMD=scalar` forces the scalar
/// one). A row's result does not depend on `n_act` or on the other rows.
pub fn dot_kernel(ty: GgmlType) -> DotKernel {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::simd_level() == crate::cpu::SimdLevel::Avx2 {
        // SAFETY: `simd_level` reports Avx2 only when AVX2, FMA and F16C were detected.
        return unsafe { dot_avx2::kernel(ty) };
    }
    dot_kernel_ref(ty)
}

/// The portable reference kernel for `ty`, which the SIMD kernels are tested against.
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
        GgmlType::Q4_K => DotKernel::Q8(dot_q4_k),
        GgmlType::Q5_K => DotKernel::Q8(dot_q5_k),
        GgmlType::Q6_K => DotKernel::Q8(dot_q6_k),
    }
}

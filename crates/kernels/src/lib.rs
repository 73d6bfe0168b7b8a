//! Pure CPU math for pagellm.
//!
//! Owns: quantized block formats and their dot products (`quant`), the persistent
//! thread pool (`pool`), matrix multiplication drivers (`matmul`), and the small
//! element-wise kernels of a transformer layer (`ops`). Knows nothing about models,
//! files or requests.
//!
//! Architecture invariant: every SIMD kernel has a scalar reference twin in the same
//! module and a property test comparing the two; dispatch happens in one place per
//! kernel family, chosen once at run time from the CPU's features (`cpu`).

pub mod cpu;
pub mod matmul;
pub mod mem;
pub mod ops;
pub mod pool;
pub mod quant;

//! Offline quantization and its measurement.
//!
//! Owns: the quantizers (`rtn`: INT8, FP8 and INT4 round-to-nearest; `awq`; `gptq`), the checkpoint
//! writers for the formats other tools read, and `eval` (perplexity and KL divergence
//! against a base model, as llama.cpp's `llama-perplexity` computes them). Loading the
//! written formats back lives in `pagellm-model` (`hf::quant`), next to every other
//! checkpoint reader; the kernels that run them live in `pagellm-kernels`
//! (`quant::wq`).

pub mod attn;
pub mod awq;
pub mod calib;
pub mod ct;
pub mod error;
pub mod eval;
pub mod gptq;
pub mod packed;
pub mod quantize;
pub mod rtn;
pub mod smooth;

pub use error::{QuantError, Result};

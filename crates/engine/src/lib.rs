//! The serving core. Today: sampling (`sampler`) and the single-sequence generation
//! loop (`generate`). The paged KV cache and the scheduler come next and will own the
//! model on their own thread.

pub mod generate;
pub mod sampler;

pub use sampler::{Sampler, SamplingError, SamplingParams};

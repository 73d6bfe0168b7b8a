//! The qwen2 architecture (Qwen2, Qwen2.5, Qwen2.5-Coder): llama's block with biases on
//! the Q, K and V projections and NEOX-style RoPE.

use crate::config::ModelConfig;
use crate::error::Result;
use crate::tensor::TensorSet;
use crate::transformer::Transformer;

pub fn load(config: ModelConfig, tensors: &TensorSet) -> Result<Transformer> {
    Transformer::from_tensors(config, tensors, true)
}

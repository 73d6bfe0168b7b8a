//! The llama architecture (Llama 2/3, SmolLM2, Mistral-style checkpoints): no biases,
//! tied or separate LM head, RoPE in the checkpoint's pairing.

use crate::config::ModelConfig;
use crate::error::Result;
use crate::tensor::TensorSet;
use crate::transformer::Transformer;

pub fn load(config: ModelConfig, tensors: &TensorSet) -> Result<Transformer> {
    Transformer::from_tensors(config, tensors, false)
}

//! Model loading and execution for pagellm.
//!
//! Owns: file formats (`gguf`, `safetensors` directories), the typed [`ModelConfig`],
//! tensors backed by memory maps (`tensor`), the tokenizer and chat template, the model
//! registry (`registry`), and one file per architecture with `load()` and `forward()`.
//! Leaves scheduling, sampling and HTTP to the crates above it.

pub mod chat;
pub mod config;
mod config_gguf;
pub mod error;
pub mod gguf;
pub mod hf;
pub mod kv;
pub mod llama;
pub mod loader;
pub mod qwen2;
pub mod registry;
pub mod tensor;
pub mod tokenizer;
pub mod transformer;

pub use config::{Arch, ModelConfig, RopeStyle};
pub use error::ModelError;
pub use kv::{KvDtype, PagedKvCache, SeqKvCache};
pub use tensor::{Storage, Tensor, TensorSet};
pub use transformer::{Batch, Logits, SeqSlice, Site, Transformer, Workspace};

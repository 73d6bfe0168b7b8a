//! The model crate's one error type.

use std::path::PathBuf;

/// Everything that can go wrong loading or running a model. Every variant names the
/// thing at fault (file, key, tensor) so the message alone is enough to act on.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a valid GGUF file: {reason}")]
    Gguf { path: PathBuf, reason: String },
    #[error("metadata key `{key}` is missing")]
    MissingKey { key: String },
    #[error("metadata key `{key}` has type {found}, expected {expected}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: String,
    },
    #[error("unsupported architecture `{0}` (supported: llama, qwen2)")]
    UnsupportedArch(String),
    #[error("tensor `{name}` has unsupported type {ty}")]
    UnsupportedTensorType { name: String, ty: String },
    #[error("tensor `{name}` is missing")]
    MissingTensor { name: String },
    #[error("tensor `{name}` has shape {found:?}, expected {expected:?}")]
    BadShape {
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("invalid model config: {0}")]
    Config(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    ChatTemplate(String),
    #[error("{0}")]
    Other(String),
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum QuantError {
    #[error(transparent)]
    Model(#[from] pagellm_model::ModelError),
    /// A flag, file or tensor that cannot be used; the message names it.
    #[error("{0}")]
    Invalid(String),
    #[error("{path}: {source}")]
    Io {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

pub type Result<T> = std::result::Result<T, QuantError>;

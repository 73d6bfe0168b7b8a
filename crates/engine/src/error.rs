use pagellm_model::ModelError;

use crate::sampler::SamplingError;

/// Why the engine refused a request or a configuration.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    // vLLM's wording, which clients match on.
    #[error("The prompt is empty. Either prompt or prompt_embeds must be provided and non-empty.")]
    EmptyPrompt,
    #[error(
        "prompt token id {token} is out of vocabulary (the vocabulary has {vocab_size} tokens)"
    )]
    TokenOutOfVocab { token: u32, vocab_size: usize },
    #[error(
        "this request needs {prompt_tokens} prompt tokens plus max_tokens {max_tokens}, \
         more than the maximum context length of {max_model_len}; shorten the prompt or \
         lower max_tokens"
    )]
    ContextLength {
        prompt_tokens: usize,
        max_tokens: usize,
        max_model_len: usize,
    },
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    #[error("{0}")]
    InvalidParam(String),
    #[error(transparent)]
    Structured(#[from] pagellm_structured::Error),
    #[error("invalid engine configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("the engine has shut down")]
    ShutDown,
    #[error(
        "the server is overloaded: {limit} requests are already waiting (--max-waiting-requests); retry later"
    )]
    QueueFull { limit: usize },
}

//! The limits a request is checked against before it is queued.

use crate::error::EngineError;
use crate::request::RequestParams;

/// Limits a request is checked against before it is queued.
#[derive(Debug, Clone, Copy)]
pub struct EngineLimits {
    pub max_model_len: usize,
    pub vocab_size: usize,
    pub num_blocks: usize,
    pub block_size: usize,
    /// The most alternatives per token a request may ask for (at most the vocabulary).
    pub max_logprobs: usize,
}

impl EngineLimits {
    /// Checks a request and returns its effective output limit. A request that could
    /// never run is rejected here rather than left waiting.
    pub fn validate(&self, prompt: &[u32], params: &RequestParams) -> Result<usize, EngineError> {
        if prompt.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        if let Some(&t) = prompt.iter().find(|&&t| t as usize >= self.vocab_size) {
            return Err(EngineError::TokenOutOfVocab {
                token: t,
                vocab_size: self.vocab_size,
            });
        }
        params.sampling.validate()?;
        for (name, k) in [
            ("logprobs", params.logprobs),
            ("prompt_logprobs", params.prompt_logprobs),
        ] {
            if let Some(k) = k.filter(|&k| k > self.max_logprobs) {
                return Err(EngineError::InvalidParam(format!(
                    "{name}: at most {} alternatives per token, got {k}",
                    self.max_logprobs
                )));
            }
        }
        if let Some(&(t, _)) = params
            .sampling
            .logit_bias
            .iter()
            .find(|&&(t, _)| t as usize >= self.vocab_size)
        {
            return Err(EngineError::InvalidParam(format!(
                "logit_bias: token id {t} is outside the vocabulary of {}",
                self.vocab_size
            )));
        }
        match &params.sampling.allowed_token_ids {
            Some(a) if a.is_empty() => {
                return Err(EngineError::InvalidParam(
                    "allowed_token_ids: the list is empty".into(),
                ))
            }
            Some(a) => {
                if let Some(&t) = a.iter().find(|&&t| t as usize >= self.vocab_size) {
                    return Err(EngineError::InvalidParam(format!(
                        "allowed_token_ids: token id {t} is outside the vocabulary of {}",
                        self.vocab_size
                    )));
                }
            }
            None => {}
        }
        if let Some(&t) = params
            .logprob_token_ids
            .iter()
            .flatten()
            .find(|&&t| t as usize >= self.vocab_size)
        {
            return Err(EngineError::InvalidParam(format!(
                "logprob_token_ids: token id {t} is outside the vocabulary of {}",
                self.vocab_size
            )));
        }
        if let Some(&t) = params
            .stop_token_ids
            .iter()
            .find(|&&t| t as usize >= self.vocab_size)
        {
            return Err(EngineError::InvalidParam(format!(
                "stop_token_ids: token id {t} is outside the vocabulary of {}",
                self.vocab_size
            )));
        }
        if prompt.len() >= self.max_model_len {
            return Err(EngineError::ContextLength {
                prompt_tokens: prompt.len(),
                max_tokens: params.max_tokens.unwrap_or(1),
                max_model_len: self.max_model_len,
            });
        }
        let room = self.max_model_len - prompt.len();
        let max_tokens = match params.max_tokens {
            Some(0) => {
                return Err(EngineError::InvalidParam(
                    "max_tokens must be at least 1".into(),
                ))
            }
            Some(m) => m,
            None => room,
        };
        if prompt.len() + max_tokens > self.max_model_len {
            return Err(EngineError::ContextLength {
                prompt_tokens: prompt.len(),
                max_tokens,
                max_model_len: self.max_model_len,
            });
        }
        if let Some(r) = &params.resume {
            if let Some(&t) = r
                .output_token_ids
                .iter()
                .find(|&&t| t as usize >= self.vocab_size)
            {
                return Err(EngineError::InvalidParam(format!(
                    "pagellm_resume.output_token_ids: token id {t} is outside the vocabulary of {}",
                    self.vocab_size
                )));
            }
            if r.output_token_ids.len() >= max_tokens {
                return Err(EngineError::InvalidParam(format!(
                    "pagellm_resume.output_token_ids: {} tokens leave no room under max_tokens {max_tokens}",
                    r.output_token_ids.len()
                )));
            }
        }
        Ok(max_tokens)
    }
}

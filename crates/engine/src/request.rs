//! A request as the engine tracks it.
//!
//! There is no prefill or decode phase: a request is its tokens (prompt, then output)
//! and `num_computed_tokens`, how many of them have keys and values in the cache. Each
//! step computes some of the rest, within the step's token budget; when the computed
//! count reaches the token count, the step also samples the next token.

use std::time::Instant;

use crate::kv_cache::{extend_block_hashes, BlockHash};
use crate::sampler::{Sampler, SamplingParams};
use crate::stop::Detokenizer;
use pagellm_structured::Guide;

pub type RequestId = u64;

/// Most prompt tokens a request with `prompt_logprobs` computes in one step: each
/// needs a logits row (vocabulary × 4 bytes).
pub const PROMPT_LOGPROBS_CHUNK: usize = 256;

/// What a client asks for.
#[derive(Debug, Clone)]
pub struct RequestParams {
    pub sampling: SamplingParams,
    /// Output tokens at most; `None` = until the context is full.
    pub max_tokens: Option<usize>,
    /// Generate at least this many tokens before end-of-generation tokens and stop
    /// token ids count.
    pub min_tokens: usize,
    /// Tokens that end generation besides the model's end-of-generation tokens.
    pub stop_token_ids: Vec<u32>,
    /// Strings that end generation; not included in the output text.
    pub stop: Vec<String>,
    /// Keep going past end-of-generation tokens (benchmarks).
    pub ignore_eos: bool,
    /// Lower values are served first under the `priority` policy (vLLM's convention).
    pub priority: i32,
    /// Requests with different salts never share cached prefixes.
    pub cache_salt: Option<String>,
    /// Produce text deltas (detokenize) alongside token ids.
    pub detokenize: bool,
    /// Return each sampled token's log-probability and this many alternatives
    /// (at most [`crate::logprobs::MAX_LOGPROBS`]).
    pub logprobs: Option<usize>,
    /// vLLM's `logprob_token_ids`: with `logprobs`, the alternatives reported are these
    /// tokens (and the sampled one) instead of the most likely ones.
    pub logprob_token_ids: Option<Vec<u32>>,
    /// Return the log-probability of every prompt token after the first, with its rank
    /// and this many alternatives (vLLM's `prompt_logprobs`). Such a request computes
    /// its whole prompt: it takes nothing from the prefix cache, and its prompt runs in
    /// chunks of at most [`PROMPT_LOGPROBS_CHUNK`] tokens, whose logits rows it needs.
    pub prompt_logprobs: Option<usize>,
    /// Continue a request another engine started (see [`Resume`]).
    pub resume: Option<Resume>,
    /// Structured output: the tokens allowed at each step (a JSON schema, regex, choice
    /// or grammar compiled by [`crate::Engine::structured`]).
    pub guide: Option<Guide>,
}

/// Output already generated for this request elsewhere (a stream whose server died,
/// continued here). The tokens become the request's first output tokens: they count
/// towards `max_tokens`, `min_tokens`, usage and penalties, a seeded sampler is
/// advanced past them, and attention treats them as generated positions, so what
/// follows is what the uninterrupted run would have produced.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resume {
    pub output_token_ids: Vec<u32>,
    /// Bytes of the output text the client already has; the stream's text starts
    /// there (it may include text of resumed tokens that was still held back).
    pub text_offset: usize,
}

impl Default for RequestParams {
    fn default() -> Self {
        Self {
            sampling: SamplingParams::default(),
            max_tokens: Some(16),
            min_tokens: 0,
            stop_token_ids: Vec::new(),
            stop: Vec::new(),
            ignore_eos: false,
            priority: 0,
            cache_salt: None,
            detokenize: true,
            logprobs: None,
            logprob_token_ids: None,
            prompt_logprobs: None,
            resume: None,
            guide: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestStatus {
    Waiting,
    Running,
    /// Lost its blocks to a higher-priority request; waits to be recomputed.
    Preempted,
    Finished,
}

/// Why a request ended, as the OpenAI API names it (plus `abort` and `error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FinishReason {
    /// An end-of-generation token, a stop token id or a stop string.
    Stop,
    /// `max_tokens` or the context length.
    Length,
    /// Cancelled by the client (or its receiver was dropped).
    Abort,
    /// The engine failed while running it.
    Error,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
            FinishReason::Error => "error",
        }
    }
}

/// What ended a `Stop` finish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// The model's end-of-generation token or a requested stop token id.
    Token(u32),
    /// A stop string.
    Text(String),
}

/// Timestamps of one request's life; TTFT, TPOT, queue and prefill time derive from it.
#[derive(Debug, Clone)]
pub struct RequestTimes {
    pub arrival: Instant,
    pub first_scheduled: Option<Instant>,
    pub first_token: Option<Instant>,
    pub last_token: Option<Instant>,
    pub finished: Option<Instant>,
}

impl RequestTimes {
    /// Seconds from `a` to `b` when both are known.
    pub fn secs(a: Option<Instant>, b: Option<Instant>) -> Option<f64> {
        Some(b?.checked_duration_since(a?)?.as_secs_f64())
    }
    pub fn queue_s(&self) -> Option<f64> {
        Self::secs(Some(self.arrival), self.first_scheduled)
    }
    pub fn ttft_s(&self) -> Option<f64> {
        Self::secs(Some(self.arrival), self.first_token)
    }
    pub fn prefill_s(&self) -> Option<f64> {
        Self::secs(self.first_scheduled, self.first_token)
    }
    pub fn decode_s(&self) -> Option<f64> {
        Self::secs(self.first_token, self.last_token)
    }
    pub fn e2e_s(&self) -> Option<f64> {
        Self::secs(Some(self.arrival), self.finished)
    }
}

/// Token counts of a finished (or running) request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens whose keys and values came from the prefix cache.
    pub cached_prompt_tokens: usize,
}

pub struct Request {
    pub id: RequestId,
    /// Prompt followed by output tokens.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    pub num_computed_tokens: usize,
    /// Set when first scheduled: prompt tokens served from the prefix cache.
    pub num_cached_tokens: Option<usize>,
    pub params: RequestParams,
    /// Output token limit after applying the context length.
    pub max_tokens: usize,
    pub status: RequestStatus,
    pub times: RequestTimes,
    pub num_preemptions: usize,
    pub block_hashes: Vec<BlockHash>,
    pub sampler: Sampler,
    pub detok: Detokenizer,
    /// Prompt logprobs computed and not yet sent (they go with the first output).
    pub prompt_logprobs: Vec<crate::logprobs::TokenLogprobs>,
    /// Prompt tokens whose logprob is known, sent or not: a recomputation after a
    /// preemption skips them.
    pub num_prompt_logprobs: usize,
    /// Order of arrival, for fcfs and tie-breaking.
    pub seq: u64,
}

impl Request {
    /// A waiting request; `max_tokens` is its output limit after validation.
    pub fn new(
        id: RequestId,
        seq: u64,
        prompt: Vec<u32>,
        mut params: RequestParams,
        max_tokens: usize,
        arrival: Instant,
    ) -> Result<Self, crate::EngineError> {
        let prompt_len = prompt.len();
        let mut tokens = prompt;
        let mut sampler = Sampler::new(params.sampling.clone())?;
        if let Some(r) = &params.resume {
            tokens.extend_from_slice(&r.output_token_ids);
            sampler.skip(r.output_token_ids.len());
            if let Some(g) = params.guide.as_mut() {
                g.advance_all(&r.output_token_ids)?;
            }
        }
        Ok(Self {
            id,
            prompt_len,
            tokens,
            num_computed_tokens: 0,
            num_cached_tokens: None,
            max_tokens,
            status: RequestStatus::Waiting,
            times: RequestTimes {
                arrival,
                first_scheduled: None,
                first_token: None,
                last_token: None,
                finished: None,
            },
            num_preemptions: 0,
            block_hashes: Vec::new(),
            sampler,
            detok: Detokenizer::new(params.stop.clone()),
            prompt_logprobs: Vec::new(),
            num_prompt_logprobs: 0,
            seq,
            params,
        })
    }

    pub fn num_tokens(&self) -> usize {
        self.tokens.len()
    }

    pub fn prompt(&self) -> &[u32] {
        &self.tokens[..self.prompt_len]
    }

    pub fn output(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }

    pub fn num_output_tokens(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    /// Positions from which attention uses the decode summation order: the generated
    /// tokens (and a one-token prompt, which llama.cpp also runs as a decode). A fixed
    /// function of the position keeps a request's results the same whatever it is
    /// batched with, however its prompt is chunked, and after recomputation.
    pub fn decode_from(&self) -> usize {
        if self.prompt_len == 1 {
            0
        } else {
            self.prompt_len
        }
    }

    /// Most tokens to compute in one step: unlimited, except while a request that wants
    /// prompt logprobs is in its prompt.
    pub fn max_chunk(&self) -> usize {
        if self.params.prompt_logprobs.is_some() && self.num_computed_tokens + 1 < self.prompt_len {
            PROMPT_LOGPROBS_CHUNK
        } else {
            usize::MAX
        }
    }

    /// Updates the full-block hashes after tokens were added.
    pub fn update_block_hashes(&mut self, block_size: usize) {
        extend_block_hashes(
            &mut self.block_hashes,
            &self.tokens,
            block_size,
            self.params.cache_salt.as_deref(),
        );
    }

    pub fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self.prompt_len,
            completion_tokens: self.num_output_tokens(),
            cached_prompt_tokens: self.num_cached_tokens.unwrap_or(0),
        }
    }
}

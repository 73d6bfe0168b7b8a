//! Single-sequence generation: prefill the prompt in chunks, then decode token by token.
//! This is what `pagellm generate` and `pagellm bench` run; the batched engine builds on
//! the same forward pass.

use std::time::{Duration, Instant};

use pagellm_kernels::pool::ThreadPool;
use pagellm_model::{Logits, ModelError, Transformer, Workspace};

use crate::sampler::{Sampler, SamplingParams};

/// Largest number of prompt tokens sent through one forward pass; bounds the activation
/// buffers while keeping matmuls large enough to run at full speed.
pub const PREFILL_CHUNK_TOKENS: usize = 512;

#[derive(Debug, Clone)]
pub struct GenerateRequest {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Tokens that end generation (end-of-generation tokens of the vocabulary).
    pub stop_ids: Vec<u32>,
}

/// Why generation stopped, as the OpenAI API names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token was produced.
    Stop,
    /// `max_tokens` or the context window was reached.
    Length,
    /// The token callback asked to stop.
    Cancelled,
}

#[derive(Debug, Clone)]
pub struct GenerateStats {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    /// Time to first token: prefill plus the first sample.
    pub ttft: Duration,
    /// Time spent after the first token.
    pub decode: Duration,
    pub finish: FinishReason,
}

impl GenerateStats {
    /// Mean time per output token after the first.
    pub fn tpot(&self) -> Option<Duration> {
        (self.generated_tokens > 1).then(|| self.decode / (self.generated_tokens - 1) as u32)
    }
}

/// Generates up to `req.max_tokens` tokens, calling `on_token` with each (including a
/// final stop token); `on_token` returns false to cancel.
pub fn generate(
    model: &Transformer,
    pool: &ThreadPool,
    req: &GenerateRequest,
    mut on_token: impl FnMut(u32) -> bool,
) -> Result<GenerateStats, ModelError> {
    if req.prompt.is_empty() {
        return Err(ModelError::Other("the prompt is empty".into()));
    }
    let mut sampler =
        Sampler::new(req.sampling.clone()).map_err(|e| ModelError::Other(e.to_string()))?;
    let capacity = (req.prompt.len() + req.max_tokens).min(model.max_context());
    if req.prompt.len() >= model.max_context() {
        return Err(ModelError::Other(format!(
            "the prompt has {} tokens; the model's context window is {}",
            req.prompt.len(),
            model.max_context()
        )));
    }
    let mut cache = model.new_cache(capacity);
    let mut ws = Workspace::default();
    let t0 = Instant::now();
    let chunks: Vec<&[u32]> = req.prompt.chunks(PREFILL_CHUNK_TOKENS).collect();
    for (i, chunk) in chunks.iter().enumerate() {
        let want = if i + 1 == chunks.len() {
            Logits::Last
        } else {
            Logits::None
        };
        model.forward(pool, &mut ws, &mut cache, chunk, want)?;
    }
    let mut output = Vec::with_capacity(req.max_tokens);
    let mut ttft = Duration::ZERO;
    let mut finish = FinishReason::Length;
    while output.len() < req.max_tokens {
        let tok = sampler.sample(&mut ws.logits, &req.prompt, &output);
        output.push(tok);
        if output.len() == 1 {
            ttft = t0.elapsed();
        }
        if !on_token(tok) {
            finish = FinishReason::Cancelled;
            break;
        }
        if req.stop_ids.contains(&tok) {
            finish = FinishReason::Stop;
            break;
        }
        if output.len() == req.max_tokens || cache.len() >= cache.capacity() {
            break;
        }
        model.forward(pool, &mut ws, &mut cache, &[tok], Logits::Last)?;
    }
    let total = t0.elapsed();
    Ok(GenerateStats {
        prompt_tokens: req.prompt.len(),
        generated_tokens: output.len(),
        ttft,
        decode: total.saturating_sub(ttft),
        finish,
    })
}

//! The OpenAI wire types the generation endpoints accept.

use serde::{Deserialize, Deserializer};
use serde_json::Value;

use crate::error::ApiError;

/// A prompt as `/v1/completions` accepts it.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PromptInput {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
    IdLists(Vec<Vec<u32>>),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(crate) enum StopInput {
    One(String),
    Many(Vec<String>),
}

/// `logprobs`: a count on `/v1/completions`, a flag on `/v1/chat/completions`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(crate) enum LogprobsInput {
    Flag(bool),
    Count(i64),
}

#[derive(Debug, Clone, Deserialize, Default)]
pub(crate) struct StreamOptions {
    pub(crate) include_usage: Option<bool>,
    /// vLLM's: with `include_usage`, every chunk carries the usage so far.
    pub(crate) continuous_usage_stats: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct ChatMsg {
    pub(crate) role: String,
    pub(crate) content: Option<Content>,
    /// An assistant turn's calls (OpenAI's shape, arguments as JSON strings).
    #[serde(default)]
    pub(crate) tool_calls: Option<Vec<Value>>,
    /// A `tool` turn's answer to this call.
    #[serde(default)]
    pub(crate) tool_call_id: Option<String>,
    #[serde(default)]
    pub(crate) name: Option<String>,
}

/// Message content: a string, or a list of parts of which text parts are supported.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(crate) enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct ContentPart {
    #[serde(rename = "type")]
    pub(crate) kind: String,
    #[serde(default)]
    pub(crate) text: Option<String>,
}

impl Content {
    pub(crate) fn text(&self, i: usize) -> Result<String, ApiError> {
        match self {
            Content::Text(t) => Ok(t.clone()),
            Content::Parts(parts) => {
                let mut out = String::new();
                for (j, p) in parts.iter().enumerate() {
                    match (p.kind.as_str(), &p.text) {
                        ("text", Some(t)) => out.push_str(t),
                        _ => {
                            return Err(ApiError::bad_request(
                                format!(
                                    "messages[{i}].content[{j}]: only text parts are \
                                     supported, got type `{}`",
                                    p.kind
                                ),
                                Some("messages"),
                            ))
                        }
                    }
                }
                Ok(out)
            }
        }
    }
}

/// The body of both generation endpoints; each uses `prompt` or `messages`.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(default)]
pub struct GenRequest {
    pub(crate) model: Option<String>,
    pub(crate) prompt: Option<PromptInput>,
    pub(crate) messages: Option<Vec<ChatMsg>>,
    pub(crate) max_tokens: Option<i64>,
    pub(crate) max_completion_tokens: Option<i64>,
    pub(crate) temperature: Option<f32>,
    pub(crate) top_p: Option<f32>,
    pub(crate) top_k: Option<i64>,
    pub(crate) min_p: Option<f32>,
    pub(crate) presence_penalty: Option<f32>,
    pub(crate) frequency_penalty: Option<f32>,
    pub(crate) repetition_penalty: Option<f32>,
    pub(crate) stop: Option<StopInput>,
    pub(crate) stop_token_ids: Option<Vec<u32>>,
    #[serde(default, deserialize_with = "seed")]
    pub(crate) seed: Option<i64>,
    pub(crate) echo: Option<bool>,
    pub(crate) n: Option<i64>,
    pub(crate) ignore_eos: Option<bool>,
    pub(crate) min_tokens: Option<i64>,
    pub(crate) priority: Option<i32>,
    pub(crate) user: Option<String>,
    pub(crate) cache_salt: Option<String>,
    pub(crate) stream: Option<bool>,
    pub(crate) stream_options: Option<StreamOptions>,
    pub(crate) logprobs: Option<LogprobsInput>,
    pub(crate) top_logprobs: Option<i64>,
    /// vLLM's: logprobs of the prompt tokens, with this many alternatives.
    pub(crate) prompt_logprobs: Option<i64>,
    /// vLLM's: report token ids (prompt and output) alongside the text.
    pub(crate) return_token_ids: Option<bool>,
    /// vLLM's: name tokens in logprobs `token_id:N` instead of by their text.
    pub(crate) return_tokens_as_token_ids: Option<bool>,
    /// vLLM's: only these tokens may be sampled.
    pub(crate) allowed_token_ids: Option<Vec<u32>>,
    /// vLLM's: with logprobs, report these tokens' logprobs (and the sampled one's)
    /// instead of the most likely tokens'.
    pub(crate) logprob_token_ids: Option<Vec<u32>>,
    /// vLLM's disaggregated-prefill handoff. Its `prompt_token_ids`, the prompt another
    /// server tokenized, are used as they are instead of tokenizing `messages` or
    /// `prompt`; the connector fields are accepted and have nothing to act on here
    /// (the prompt is computed, or taken from the prefix cache).
    pub(crate) kv_transfer_params: Option<KvTransferParams>,
    /// Set by the server, not the client: the engine's limits on logprobs.
    #[serde(skip)]
    pub(crate) logprob_limit: LogprobLimit,
    /// Which end `truncate_prompt_tokens` cuts: `left` (default: keep the last tokens)
    /// or `right`.
    pub(crate) truncation_side: Option<String>,
    /// Chat: end the prompt with the opening of an assistant turn (default true).
    pub(crate) add_generation_prompt: Option<bool>,
    /// Chat: let the model continue the final message instead.
    pub(crate) continue_final_message: Option<bool>,
    /// Continue a request another replica started (see `pagellm_engine::Resume`).
    pub(crate) pagellm_resume: Option<ResumeInput>,
    /// OpenAI's: token id (as a string) → bias added to its logit, in [-100, 100].
    pub(crate) logit_bias: Option<serde_json::Map<String, Value>>,
    /// vLLM's: keep only the last k prompt tokens (-1: as many as the context allows).
    pub(crate) truncate_prompt_tokens: Option<i64>,
    /// Tool calling (see `tools.rs`).
    pub(crate) tools: Option<Vec<Value>>,
    pub(crate) tool_choice: Option<Value>,
    pub(crate) parallel_tool_calls: Option<bool>,
    /// Structured outputs: OpenAI's field, vLLM's, and vLLM's older ones.
    pub(crate) response_format: Option<Value>,
    pub(crate) structured_outputs: Option<Value>,
    pub(crate) guided_json: Option<Value>,
    pub(crate) guided_regex: Option<String>,
    pub(crate) guided_choice: Option<Vec<String>>,
    pub(crate) guided_grammar: Option<String>,
    /// Every other field, checked by `structured::check_fields`.
    #[serde(flatten)]
    pub(crate) extra: serde_json::Map<String, Value>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ResumeInput {
    pub(crate) output_token_ids: Vec<u32>,
    #[serde(default)]
    pub(crate) text_offset: usize,
}

/// A seed anywhere in the i64 range. Outside it, the error names the bound crossed with
/// pydantic's words, which vLLM's clients match on.
fn seed<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    use serde::de::Error;
    let Some(n) = Option::<serde_json::Number>::deserialize(d)? else {
        return Ok(None);
    };
    if let Some(i) = n.as_i64() {
        return Ok(Some(i));
    }
    let f = n.as_f64().unwrap_or(f64::NAN);
    let msg = if f.fract() != 0.0 || !f.is_finite() {
        format!("Input should be a valid integer, got {n}")
    } else if f > 0.0 {
        format!(
            "Input should be less than or equal to {} (less_than_equal), got {n}",
            i64::MAX
        )
    } else {
        format!(
            "Input should be greater than or equal to {} (greater_than_equal), got {n}",
            i64::MIN
        )
    };
    Err(D::Error::custom(msg))
}

/// How many alternatives per token a request may ask for, and what -1 (the whole
/// vocabulary) means.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LogprobLimit {
    pub(crate) max: usize,
    pub(crate) vocab: usize,
}

impl Default for LogprobLimit {
    fn default() -> Self {
        Self {
            max: pagellm_engine::MAX_LOGPROBS,
            vocab: usize::MAX,
        }
    }
}

impl LogprobLimit {
    pub(crate) fn of(limits: &pagellm_engine::EngineLimits) -> Self {
        Self {
            max: limits.max_logprobs,
            vocab: limits.vocab_size,
        }
    }

    /// `k` alternatives, -1 meaning the whole vocabulary, checked against the limit.
    pub(crate) fn check(&self, k: i64, name: &str) -> Result<usize, ApiError> {
        let want = if k == -1 { self.vocab as i64 } else { k };
        if (0..=self.max as i64).contains(&want) {
            Ok(want as usize)
        } else {
            Err(ApiError::bad_request(
                format!(
                    "{name} must be between 0 and {} (the server's --max-logprobs; -1 asks for \
                     the whole vocabulary), got {k}",
                    self.max
                ),
                Some(name),
            ))
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct KvTransferParams {
    pub(crate) prompt_token_ids: Option<Vec<u32>>,
}

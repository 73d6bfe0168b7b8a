//! A request's fields turned into engine parameters, each checked with an error that
//! names it: sampling, logprobs, limits, stops, and how prompts are truncated.

use pagellm_engine::{RequestParams, SamplingParams};

use super::prompt_logprobs;
use super::types::{GenRequest, LogprobsInput, StopInput};
use crate::error::ApiError;

fn non_negative(v: Option<i64>, name: &str) -> Result<Option<usize>, ApiError> {
    match v {
        Some(x) if x < 0 => Err(ApiError::bad_request(
            format!("{name} must be non-negative, got {x}"),
            Some(name),
        )),
        Some(x) => Ok(Some(x as usize)),
        None => Ok(None),
    }
}

/// How many alternatives per token the request wants, if it wants logprobs at all.
pub(crate) fn logprobs(req: &GenRequest, chat: bool) -> Result<Option<usize>, ApiError> {
    let range = |k: i64, name: &str| req.logprob_limit.check(k, name);
    match (&req.logprobs, chat) {
        (None | Some(LogprobsInput::Flag(false)), _) => {
            if chat && req.top_logprobs.is_some_and(|k| k > 0) {
                return Err(ApiError::bad_request(
                    "top_logprobs needs logprobs set to true",
                    Some("top_logprobs"),
                ));
            }
            Ok(None)
        }
        (Some(LogprobsInput::Flag(true)), true) => {
            range(req.top_logprobs.unwrap_or(0), "top_logprobs").map(Some)
        }
        (Some(LogprobsInput::Count(k)), false) => range(*k, "logprobs").map(Some),
        (Some(LogprobsInput::Flag(true)), false) => Err(ApiError::bad_request(
            "logprobs must be an integer (the number of alternatives per token)",
            Some("logprobs"),
        )),
        (Some(LogprobsInput::Count(_)), true) => Err(ApiError::bad_request(
            "logprobs must be a boolean; set the number of alternatives with top_logprobs",
            Some("logprobs"),
        )),
    }
}

/// The engine parameters of one choice.
pub(crate) fn params(
    req: &GenRequest,
    chat: bool,
    choice: usize,
    guide: Option<pagellm_structured::Guide>,
) -> Result<RequestParams, ApiError> {
    let max_tokens = non_negative(req.max_completion_tokens.or(req.max_tokens), "max_tokens")?;
    if max_tokens == Some(0) {
        return Err(ApiError::bad_request(
            "max_tokens must be at least 1",
            Some("max_tokens"),
        ));
    }
    let sampling = SamplingParams {
        temperature: req.temperature.unwrap_or(1.0),
        top_k: req.top_k.map_or(0, |k| k.max(0) as usize),
        top_p: req.top_p.unwrap_or(1.0),
        min_p: req.min_p.unwrap_or(0.0),
        repetition_penalty: req.repetition_penalty.unwrap_or(1.0),
        presence_penalty: req.presence_penalty.unwrap_or(0.0),
        frequency_penalty: req.frequency_penalty.unwrap_or(0.0),
        // Choices of one request differ: each gets its own stream of the seed.
        seed: req.seed.map(|s| (s as u64).wrapping_add(choice as u64)),
        logit_bias: logit_bias(req)?,
        allowed_token_ids: req.allowed_token_ids.clone(),
    };
    sampling.validate().map_err(|e| {
        let pagellm_engine::SamplingError::OutOfRange { name, .. } = &e;
        ApiError::bad_request(e.to_string(), Some(name))
    })?;
    Ok(RequestParams {
        sampling,
        // Completions default to 16 tokens (OpenAI); chat to the rest of the context.
        max_tokens: max_tokens.or(if chat { None } else { Some(16) }),
        min_tokens: non_negative(req.min_tokens, "min_tokens")?.unwrap_or(0),
        stop_token_ids: req.stop_token_ids.clone().unwrap_or_default(),
        stop: match &req.stop {
            None => Vec::new(),
            Some(StopInput::One(s)) => vec![s.clone()],
            Some(StopInput::Many(v)) => v.clone(),
        },
        ignore_eos: req.ignore_eos.unwrap_or(false),
        priority: req.priority.unwrap_or(0),
        cache_salt: req.cache_salt.clone(),
        detokenize: true,
        logprobs: logprobs(req, chat)?,
        logprob_token_ids: match (&req.logprob_token_ids, logprobs(req, chat)?) {
            (Some(_), None) => {
                return Err(ApiError::bad_request(
                    "logprob_token_ids needs logprobs",
                    Some("logprob_token_ids"),
                ))
            }
            (ids, _) => ids.clone(),
        },
        prompt_logprobs: prompt_logprobs::requested(req, chat)?,
        resume: req.pagellm_resume.as_ref().map(|r| pagellm_engine::Resume {
            output_token_ids: r.output_token_ids.clone(),
            text_offset: r.text_offset,
        }),
        guide,
    })
}

/// `logit_bias` as (token, bias); keys must be token ids (the range of the bias and of
/// the ids is checked with the other sampling parameters).
fn logit_bias(req: &GenRequest) -> Result<Vec<(u32, f32)>, ApiError> {
    let Some(m) = &req.logit_bias else {
        return Ok(Vec::new());
    };
    let bad = |m: String| ApiError::bad_request(m, Some("logit_bias"));
    // Every key that is not a token id is named, not just the first.
    let not_ids: Vec<String> = m
        .keys()
        .filter(|k| k.parse::<u32>().is_err())
        .map(|k| format!("`{k}`"))
        .collect();
    if !not_ids.is_empty() {
        return Err(bad(format!(
            "logit_bias keys must be token ids; not token ids: {}",
            not_ids.join(", ")
        )));
    }
    m.iter()
        .map(|(k, v)| {
            let t = k
                .parse::<u32>()
                .map_err(|_| bad(format!("logit_bias: `{k}` is not a token id")))?;
            let b = v
                .as_f64()
                .ok_or_else(|| bad(format!("logit_bias[{k}] must be a number, got {v}")))?;
            Ok((t, b as f32))
        })
        .collect()
}

/// Applies vLLM's `truncate_prompt_tokens`: the last `k` tokens of each prompt, or with
/// -1 as many as the context leaves room for.
pub(crate) fn truncate_prompts(
    req: &GenRequest,
    prompts: &mut [Vec<u32>],
    max_model_len: usize,
) -> Result<(), ApiError> {
    let k = match req.truncate_prompt_tokens {
        None => return Ok(()),
        Some(-1) => max_model_len.saturating_sub(1).max(1),
        Some(k) if k >= 1 => k as usize,
        Some(k) => {
            return Err(ApiError::bad_request(
                format!("truncate_prompt_tokens must be -1 or at least 1, got {k}"),
                Some("truncate_prompt_tokens"),
            ))
        }
    };
    // vLLM's `truncation_side`: which end of the prompt is cut.
    let left = match req.truncation_side.as_deref() {
        None | Some("left") => true,
        Some("right") => false,
        Some(other) => {
            return Err(ApiError::bad_request(
                format!("truncation_side must be `left` or `right`, got `{other}`"),
                Some("truncation_side"),
            ))
        }
    };
    for p in prompts {
        if p.len() > k {
            if left {
                p.drain(..p.len() - k);
            } else {
                p.truncate(k);
            }
        }
    }
    Ok(())
}

pub(crate) fn n_choices(req: &GenRequest) -> Result<usize, ApiError> {
    match req.n {
        None => Ok(1),
        Some(n) if (1..=16).contains(&n) => Ok(n as usize),
        Some(n) => Err(ApiError::bad_request(
            format!("n must be between 1 and 16, got {n}"),
            Some("n"),
        )),
    }
}

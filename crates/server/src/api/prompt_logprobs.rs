//! vLLM's `prompt_logprobs`, and `echo` with `logprobs` on `/v1/completions`, which is
//! answered from the same numbers: the log-probability of each prompt token after the
//! first given the tokens before it, computed by the engine over the whole prompt.

use pagellm_engine::TokenLogprobs;
use serde_json::{json, Map, Value};

use super::types::GenRequest;
use super::{logprobs, LogprobsFormat};
use crate::error::ApiError;

/// How many alternatives per prompt token the engine must compute, if any: the
/// request's `prompt_logprobs`, or, for `echo` with `logprobs`, its `logprobs`.
pub(crate) fn requested(req: &GenRequest, chat: bool) -> Result<Option<usize>, ApiError> {
    let stream = req.stream == Some(true);
    let bad = |m: String| Err(ApiError::bad_request(m, Some("prompt_logprobs")));
    match req.prompt_logprobs {
        Some(p) if stream && (p > 0 || p == -1) => {
            bad("`prompt_logprobs` are not available when `stream=True`".into())
        }
        Some(p) if p < -1 => bad(format!(
            "`prompt_logprobs` must be a positive value or -1, got {p}"
        )),
        // Zero while streaming: nothing would be sent.
        Some(_) if stream => Ok(None),
        Some(p) => req.logprob_limit.check(p, "prompt_logprobs").map(Some),
        None if !chat && req.echo == Some(true) => match logprobs(req, chat)? {
            Some(_) if stream => Err(ApiError::bad_request(
                "echo with logprobs is not available when streaming",
                Some("echo"),
            )),
            k => Ok(k),
        },
        None => Ok(None),
    }
}

/// vLLM's `prompt_logprobs` list: `null` for the first prompt token, then for each later
/// one a map from token id to `{logprob, rank, decoded_token}`: the prompt token and the
/// `k` most likely.
pub(crate) fn vllm_json(fmt: &LogprobsFormat, lps: &[TokenLogprobs]) -> Value {
    // vLLM clamps -inf to -9999 so the number stays valid JSON.
    let entry = |t: u32, l: f32, rank: usize| json!({"logprob": l.max(-9999.0), "rank": rank, "decoded_token": fmt.piece(t).0});
    let mut out = vec![Value::Null];
    for lp in lps {
        let mut m = Map::new();
        m.insert(lp.token.to_string(), entry(lp.token, lp.logprob, lp.rank));
        for (i, &(t, l)) in lp.top.iter().enumerate() {
            m.entry(t.to_string()).or_insert_with(|| entry(t, l, i + 1));
        }
        out.push(Value::Object(m));
    }
    Value::Array(out)
}

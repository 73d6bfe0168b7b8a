//! Logprobs in each endpoint's format.

use pagellm_engine::TokenLogprobs;
use pagellm_model::tokenizer::Tokenizer;
use serde_json::{json, Value};

use super::Kind;

/// Renders logprobs in each endpoint's format: the legacy completions one (`tokens`,
/// `token_logprobs`, `top_logprobs` maps, `text_offset`) or chat's `content` list.
/// `offset` carries the text offset across the chunks of a stream.
pub(crate) struct LogprobsFormat<'a> {
    pub(crate) tokenizer: &'a Tokenizer,
    pub(crate) kind: Kind,
    /// vLLM's `return_tokens_as_token_ids`: tokens are named `token_id:N`, which stays
    /// exact for tokens that are not whole UTF-8 characters.
    pub(crate) as_ids: bool,
}

impl LogprobsFormat<'_> {
    /// A token's name in logprobs and its bytes.
    pub(crate) fn piece(&self, t: u32) -> (String, Vec<u8>) {
        if self.as_ids {
            let s = format!("token_id:{t}");
            let b = s.as_bytes().to_vec();
            return (s, b);
        }
        let b = self
            .tokenizer
            .token_to_piece(t)
            .unwrap_or_default()
            .to_vec();
        (String::from_utf8_lossy(&b).into_owned(), b)
    }

    pub(crate) fn json(&self, lps: &[TokenLogprobs], offset: &mut usize) -> Value {
        match self.kind {
            Kind::Chat => {
                let content: Vec<Value> = lps
                    .iter()
                    .map(|lp| {
                        let (token, bytes) = self.piece(lp.token);
                        let top: Vec<Value> = lp
                            .top
                            .iter()
                            .map(|&(t, l)| {
                                let (token, bytes) = self.piece(t);
                                json!({"token": token, "logprob": l, "bytes": bytes})
                            })
                            .collect();
                        json!({"token": token, "logprob": lp.logprob, "bytes": bytes,
                               "top_logprobs": top})
                    })
                    .collect();
                json!({ "content": content })
            }
            Kind::Completion => {
                self.completion_json(lps.iter().map(|lp| (lp.token, Some(lp))), offset)
            }
        }
    }

    /// The legacy completions format. A token without logprobs (the first of an echoed
    /// prompt) has `null` in `token_logprobs` and `top_logprobs`. As in vLLM, a token's
    /// `top_logprobs` map holds the token itself besides its alternatives.
    fn completion_json<'a>(
        &self,
        items: impl Iterator<Item = (u32, Option<&'a TokenLogprobs>)>,
        offset: &mut usize,
    ) -> Value {
        let mut tokens = Vec::new();
        let mut token_logprobs = Vec::new();
        let mut top_logprobs = Vec::new();
        let mut text_offset = Vec::new();
        for (t, lp) in items {
            let (token, _) = self.piece(t);
            text_offset.push(*offset);
            *offset += token.chars().count();
            tokens.push(token);
            token_logprobs.push(lp.map_or(Value::Null, |lp| json!(lp.logprob)));
            top_logprobs.push(lp.map_or(Value::Null, |lp| {
                let mut top = serde_json::Map::new();
                top.insert(self.piece(lp.token).0, json!(lp.logprob));
                for &(t, l) in &lp.top {
                    top.entry(self.piece(t).0).or_insert_with(|| json!(l));
                }
                Value::Object(top)
            }));
        }
        json!({"tokens": tokens, "token_logprobs": token_logprobs,
               "top_logprobs": top_logprobs, "text_offset": text_offset})
    }

    /// Completions logprobs of an echoed prompt followed by the output.
    pub(crate) fn echo_json(
        &self,
        prompt: &[u32],
        prompt_lps: &[TokenLogprobs],
        lps: &[TokenLogprobs],
    ) -> Value {
        let first = prompt.first().map(|&t| (t, None));
        let rest = prompt_lps.iter().map(|lp| (lp.token, Some(lp)));
        let out = lps.iter().map(|lp| (lp.token, Some(lp)));
        self.completion_json(first.into_iter().chain(rest).chain(out), &mut 0)
    }
}

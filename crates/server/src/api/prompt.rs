//! A request's prompt as token ids: completions prompts tokenized, chat messages
//! rendered through the model's template. Needs only the tokenizer and template, so
//! a router (`pagellm gateway`) computes exactly the ids this server will.

use pagellm_model::chat::{ChatMessage, ChatTemplate};
use pagellm_model::tokenizer::Tokenizer;
use serde_json::Value;

use super::types::{ChatMsg, GenRequest, PromptInput};
use crate::error::ApiError;

/// The prompts of a completions request, tokenized.
pub(crate) fn completion_prompts(
    tok: &Tokenizer,
    p: &Option<PromptInput>,
) -> Result<Vec<Vec<u32>>, ApiError> {
    let encode = |s: &str| {
        tok.encode(s, true, true).map_err(|e| {
            ApiError::bad_request(format!("cannot tokenize the prompt: {e}"), Some("prompt"))
        })
    };
    let prompts = match p {
        None => {
            // vLLM's wording, which clients match on.
            return Err(ApiError::bad_request(
                "`prompt` is required. Either prompt or prompt_embeds must be provided and \
                 non-empty.",
                Some("prompt"),
            ));
        }
        Some(PromptInput::Text(s)) => vec![encode(s)?],
        Some(PromptInput::Texts(v)) => v.iter().map(|s| encode(s)).collect::<Result<_, _>>()?,
        Some(PromptInput::Ids(v)) => vec![v.clone()],
        Some(PromptInput::IdLists(v)) => v.clone(),
    };
    if prompts.is_empty() {
        return Err(ApiError::bad_request(
            "`prompt` is an empty list",
            Some("prompt"),
        ));
    }
    Ok(prompts)
}

/// How a conversation becomes a prompt: vLLM's (and Hugging Face's
/// `apply_chat_template`'s) options.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Render {
    /// End with the template's opening of an assistant turn.
    pub add_generation_prompt: bool,
    /// End inside the last message, so the model continues it (no end of turn).
    pub continue_final_message: bool,
    /// The tokenizer's own special tokens (BOS) before the rendered text.
    pub add_special_tokens: bool,
}

impl Render {
    /// The options as given, with vLLM's defaults for chat; both endings at once are
    /// refused, as vLLM refuses them.
    pub(crate) fn new(
        add_generation_prompt: Option<bool>,
        continue_final_message: Option<bool>,
        add_special_tokens: Option<bool>,
    ) -> Result<Self, ApiError> {
        let r = Render {
            add_generation_prompt: add_generation_prompt.unwrap_or(true),
            continue_final_message: continue_final_message.unwrap_or(false),
            add_special_tokens: add_special_tokens.unwrap_or(false),
        };
        if r.add_generation_prompt && r.continue_final_message {
            return Err(ApiError::bad_request(
                "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                Some("continue_final_message"),
            ));
        }
        Ok(r)
    }

    pub(crate) fn of(req: &GenRequest) -> Result<Self, ApiError> {
        Self::new(req.add_generation_prompt, req.continue_final_message, None)
    }
}

/// Cuts a rendered conversation right after the content of its final message, as
/// Hugging Face's `continue_final_message` does (keeping the content's own leading
/// spaces when the template kept them).
fn continue_final(rendered: &str, last: &str) -> Result<String, ApiError> {
    let stripped = last.trim();
    let at = (!stripped.is_empty())
        .then(|| rendered.rfind(stripped))
        .flatten()
        .ok_or_else(|| {
            ApiError::bad_request(
                "continue_final_message: the final message's content is not in the rendered                  conversation (is it empty, or does the template rewrite it?)",
                Some("continue_final_message"),
            )
        })?;
    let start = last.trim_start();
    let end = if rendered[at..].starts_with(start) {
        at + start.len()
    } else {
        at + stripped.len()
    };
    Ok(rendered[..end].to_string())
}

/// The messages of a chat request, with the tool definitions the template should list,
/// rendered and tokenized.
pub(crate) fn chat_prompt(
    tok: &Tokenizer,
    tmpl: Option<&ChatTemplate>,
    msgs: &Option<Vec<ChatMsg>>,
    tools: Option<&[Value]>,
    render: Render,
) -> Result<Vec<u32>, ApiError> {
    let Some(msgs) = msgs else {
        return Err(ApiError::bad_request(
            "`messages` is required",
            Some("messages"),
        ));
    };
    if msgs.is_empty() {
        return Err(ApiError::bad_request(
            "`messages` must not be empty",
            Some("messages"),
        ));
    }
    let tmpl = tmpl.ok_or_else(|| {
        ApiError::bad_request("this model has no chat template; use /v1/completions", None)
    })?;
    let msgs = msgs
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let mut v = serde_json::to_value(ChatMessage {
                role: m.role.clone(),
                content: match &m.content {
                    Some(c) => c.text(i)?,
                    None => String::new(),
                },
            })
            .expect("a message serializes");
            if let Some(calls) = &m.tool_calls {
                v["tool_calls"] = Value::Array(super::tools::template_calls(calls));
            }
            if let Some(id) = &m.tool_call_id {
                v["tool_call_id"] = Value::String(id.clone());
            }
            if let Some(n) = &m.name {
                v["name"] = Value::String(n.clone());
            }
            Ok(v)
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    let mut text = tmpl
        .render_json(&msgs, tools, render.add_generation_prompt)
        .map_err(|e| {
            ApiError::bad_request(
                format!("cannot apply the chat template: {e}"),
                Some("messages"),
            )
        })?;
    if render.continue_final_message {
        let last = msgs
            .last()
            .and_then(|m| m["content"].as_str())
            .unwrap_or("");
        text = continue_final(&text, last)?;
    }
    tok.encode(&text, render.add_special_tokens, true)
        .map_err(|e| {
            ApiError::bad_request(
                format!("cannot tokenize the messages: {e}"),
                Some("messages"),
            )
        })
}

/// The prompt token ids `pagellm serve` computes for a request `body` of
/// `/v1/chat/completions` (`chat`) or `/v1/completions`: one list per prompt.
pub fn prompt_token_ids(
    tok: &Tokenizer,
    template: Option<&ChatTemplate>,
    chat: bool,
    body: &Value,
) -> Result<Vec<Vec<u32>>, ApiError> {
    let req: GenRequest = super::parse_value(body.clone())?;
    if chat {
        let tools = super::tools::parse(&req, chat)?;
        let defs = tools.as_ref().and_then(|t| t.for_template());
        chat_prompt(tok, template, &req.messages, defs, Render::of(&req)?).map(|p| vec![p])
    } else {
        completion_prompts(tok, &req.prompt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continue_final_cuts_after_the_last_content() {
        let r = "<|user|>Hi<|end|><|assistant|>Sure, <|end|>";
        assert_eq!(
            continue_final(r, "Sure, ").unwrap(),
            "<|user|>Hi<|end|><|assistant|>Sure, "
        );
        // A template that trims the content: cut after what it kept.
        let r = "<|assistant|>Sure,<|end|>";
        assert_eq!(continue_final(r, " Sure, ").unwrap(), "<|assistant|>Sure,");
        // The last occurrence counts.
        let r = "a: ok\nb: ok\n";
        assert_eq!(continue_final(r, "ok").unwrap(), "a: ok\nb: ok");
        assert!(continue_final(r, "").is_err());
        assert!(continue_final(r, "absent").is_err());
        assert!(Render::new(Some(true), Some(true), None).is_err());
        assert!(Render::new(None, Some(true), None).is_err());
        assert!(Render::new(Some(false), Some(true), None).is_ok());
    }
}

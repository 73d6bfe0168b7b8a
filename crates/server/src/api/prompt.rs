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

/// The messages of a chat request, with the tool definitions the template should list,
/// rendered and tokenized.
pub(crate) fn chat_prompt(
    tok: &Tokenizer,
    tmpl: Option<&ChatTemplate>,
    msgs: &Option<Vec<ChatMsg>>,
    tools: Option<&[Value]>,
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
    let text = tmpl.render_json(&msgs, tools, true).map_err(|e| {
        ApiError::bad_request(
            format!("cannot apply the chat template: {e}"),
            Some("messages"),
        )
    })?;
    tok.encode(&text, false, true).map_err(|e| {
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
        chat_prompt(tok, template, &req.messages, defs).map(|p| vec![p])
    } else {
        completion_prompts(tok, &req.prompt)
    }
}

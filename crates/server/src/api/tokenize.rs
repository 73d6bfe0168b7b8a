//! `/tokenize` and `/detokenize`, as vLLM serves them.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::prompt::chat_prompt;
use super::types::ChatMsg;
use super::{check_model, parse};
use crate::error::ApiError;
use crate::AppState;

#[derive(Deserialize)]
struct TokenizeReq {
    #[serde(default)]
    model: Option<String>,
    /// Text, or (vLLM's chat form) `messages` rendered through the chat template with
    /// `tools`, exactly as `/v1/chat/completions` would.
    #[serde(default)]
    prompt: Option<String>,
    #[serde(default)]
    messages: Option<Vec<ChatMsg>>,
    #[serde(default)]
    tools: Option<Vec<Value>>,
    #[serde(default = "yes")]
    add_special_tokens: bool,
    /// Also return each token's text (vLLM's `token_strs`).
    #[serde(default)]
    return_token_strs: bool,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
struct DetokenizeReq {
    #[serde(default)]
    model: Option<String>,
    tokens: Vec<u32>,
}

/// `/tokenize` and `/detokenize` sit outside `/v1` and, as in vLLM, need no API key.
pub async fn tokenize(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let r = (|| {
        let engine = st.engine()?;
        let req: TokenizeReq = parse(&body.map_err(ApiError::from_body)?)?;
        check_model(&st, &req.model)?;
        let model = engine.model();
        let tok = &model.tokenizer;
        let tokens = match (&req.prompt, &req.messages) {
            (Some(p), None) => tok
                .encode(p, req.add_special_tokens, true)
                .map_err(|e| ApiError::bad_request(e.to_string(), Some("prompt")))?,
            (None, Some(_)) => chat_prompt(
                tok,
                model.chat_template.as_ref(),
                &req.messages,
                req.tools.as_deref(),
            )?,
            _ => {
                return Err(ApiError::bad_request(
                    "give either `prompt` or `messages`",
                    Some("prompt"),
                ))
            }
        };
        let mut v = json!({
            "count": tokens.len(),
            "max_model_len": engine.limits().max_model_len,
            "tokens": tokens,
        });
        // vLLM sends the field either way.
        v["token_strs"] = if req.return_token_strs {
            json!(tokens
                .iter()
                .map(|&t| tok.id_to_token(t).unwrap_or_default())
                .collect::<Vec<_>>())
        } else {
            Value::Null
        };
        Ok::<_, ApiError>(Json(v))
    })();
    r.map_or_else(IntoResponse::into_response, IntoResponse::into_response)
}

pub async fn detokenize(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let r = (|| {
        let engine = st.engine()?;
        let req: DetokenizeReq = parse(&body.map_err(ApiError::from_body)?)?;
        check_model(&st, &req.model)?;
        let vocab = engine.limits().vocab_size;
        if let Some(t) = req.tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(ApiError::bad_request(
                format!("token id {t} is outside the vocabulary of {vocab}"),
                Some("tokens"),
            ));
        }
        let prompt = engine.model().tokenizer.decode(&req.tokens, false);
        Ok(Json(json!({"prompt": prompt})))
    })();
    r.map_or_else(IntoResponse::into_response, IntoResponse::into_response)
}

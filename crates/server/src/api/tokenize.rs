//! `/tokenize`, `/detokenize` and `/tokenizer_info`, as vLLM serves them.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::prompt::{chat_prompt, Render};
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
    /// Default: true for a prompt, false for messages (the template has them), as in
    /// vLLM.
    #[serde(default)]
    add_special_tokens: Option<bool>,
    #[serde(default)]
    add_generation_prompt: Option<bool>,
    #[serde(default)]
    continue_final_message: Option<bool>,
    /// Also return each token's text (vLLM's `token_strs`).
    #[serde(default)]
    return_token_strs: bool,
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
                .encode(p, req.add_special_tokens.unwrap_or(true), true)
                .map_err(|e| ApiError::bad_request(e.to_string(), Some("prompt")))?,
            (None, Some(_)) => chat_prompt(
                tok,
                model.chat_template.as_ref(),
                &req.messages,
                req.tools.as_deref(),
                Render::new(
                    req.add_generation_prompt,
                    req.continue_final_message,
                    req.add_special_tokens,
                )?,
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

/// vLLM's `GET /tokenizer_info` (behind `--enable-tokenizer-info-endpoint`): the
/// tokenizer's configuration as Hugging Face's `tokenizer_config.json` names it, for
/// clients that tokenize on their side.
pub async fn tokenizer_info(State(st): State<Arc<AppState>>) -> Response {
    let r = (|| {
        let engine = st.engine()?;
        let tok = &engine.model().tokenizer;
        let piece = |id: Option<u32>| id.and_then(|i| tok.id_to_token(i)).map(str::to_string);
        let mut added: Vec<(u32, Value)> = tok
            .inner()
            .get_added_tokens_decoder()
            .into_iter()
            .map(|(id, t)| {
                (
                    id,
                    json!({"content": t.content, "special": t.special, "lstrip": t.lstrip,
                           "rstrip": t.rstrip, "normalized": t.normalized,
                           "single_word": t.single_word}),
                )
            })
            .collect();
        added.sort_by_key(|(id, _)| *id);
        let decoder: serde_json::Map<String, Value> = added
            .into_iter()
            .map(|(id, t)| (id.to_string(), t))
            .collect();
        Ok::<_, ApiError>(Json(json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "add_bos_token": tok.add_bos(),
            "add_eos_token": tok.add_eos(),
            "bos_token": piece(tok.bos_id()),
            "eos_token": piece(tok.eos_id()),
            "chat_template": tok.chat_template(),
            "model_max_length": engine.limits().max_model_len,
            "vocab_size": tok.vocab_size(),
            "clean_up_tokenization_spaces": false,
            "added_tokens_decoder": decoder,
        })))
    })();
    r.map_or_else(IntoResponse::into_response, IntoResponse::into_response)
}

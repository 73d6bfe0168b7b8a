//! Endpoint handlers and the OpenAI wire types they speak.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use pagellm_engine::{FinishInfo, RequestStream, RequestTimes, StopReason, TokenLogprobs};
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::AppState;

mod logprobs;
mod params;
mod prompt;
mod prompt_logprobs;
mod stream;
mod structured;
mod tokenize;
mod tools;
mod types;

pub use tokenize::{detokenize, tokenize, tokenizer_info};

pub(crate) use logprobs::LogprobsFormat;
use params::{logprobs, n_choices, params, truncate_prompts};
pub use prompt::prompt_token_ids;
use prompt::{chat_prompt, completion_prompts, Render};
use stream::stream_response;
use types::LogprobLimit;
pub use types::{GenRequest, PromptInput};

pub(crate) fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

pub(crate) fn check_key(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = &state.config.api_key else {
        return Ok(());
    };
    let ok = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|v| v == key);
    if ok {
        Ok(())
    } else {
        Err(ApiError::unauthorized())
    }
}

/// Parses a JSON body into `T`, naming the field at fault on a type error.
fn parse<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("malformed JSON body: {e}"), None))?;
    parse_value(v)
}

fn parse_value<T: serde::de::DeserializeOwned>(v: Value) -> Result<T, ApiError> {
    if !v.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
            None,
        ));
    }
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        ApiError::bad_request(format!("{path}: {}", e.inner()), Some(&path))
    })
}

fn check_model(state: &AppState, model: &Option<String>) -> Result<(), ApiError> {
    match model {
        Some(m) if *m != state.config.served_model_name => Err(ApiError::not_found(
            format!(
                "the model `{m}` does not exist; this server serves `{}`",
                state.config.served_model_name
            ),
            Some("model"),
        )),
        _ => Ok(()),
    }
}

pub(crate) fn stop_reason_json(s: &Option<StopReason>) -> Value {
    match s {
        None => Value::Null,
        Some(StopReason::Token(t)) => json!(t),
        Some(StopReason::Text(t)) => json!(t),
    }
}

pub(crate) fn finish_str(f: &FinishInfo) -> &'static str {
    f.reason.as_str()
}

/// Usage over all choices; `n` choices share each prompt, which counts once. With
/// `details`, the prompt tokens served from the prefix cache.
pub(crate) fn usage_json(finishes: &[&FinishInfo], n: usize, details: bool) -> Value {
    let per_prompt = || finishes.iter().step_by(n.max(1));
    let prompt: usize = per_prompt().map(|f| f.usage.prompt_tokens).sum();
    let cached: usize = per_prompt().map(|f| f.usage.cached_prompt_tokens).sum();
    let completion: usize = finishes.iter().map(|f| f.usage.completion_tokens).sum();
    let mut u = json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    });
    if details {
        u["prompt_tokens_details"] = json!({"cached_tokens": cached});
    }
    u
}

/// Per-request timing breakdown, in an extra field OpenAI clients ignore.
pub(crate) fn timings_json(f: &FinishInfo) -> Value {
    let ms = |x: Option<f64>| x.map(|s| s * 1e3);
    json!({
        "queue_ms": ms(f.times.queue_s()),
        "prefill_ms": ms(f.times.prefill_s()),
        "decode_ms": ms(f.times.decode_s()),
        "ttft_ms": ms(f.times.ttft_s()),
        "e2e_ms": ms(f.times.e2e_s()),
        "cached_tokens": f.usage.cached_prompt_tokens,
        "num_preemptions": f.num_preemptions,
    })
}

/// vLLM's per-request `metrics` (with `--enable-per-request-metrics`): time to first
/// token, queue and generation time (first scheduled to finished), output tokens per
/// second of generation time, and, from two tokens on, the mean inter-token latency.
pub(crate) fn request_metrics_json(f: &FinishInfo) -> Value {
    let t = &f.times;
    let ms = |x: Option<f64>| x.unwrap_or(0.0) * 1e3;
    let generation = RequestTimes::secs(t.first_scheduled, t.finished).unwrap_or(0.0);
    let n = f.usage.completion_tokens;
    let mut m = json!({
        "time_to_first_token_ms": ms(t.ttft_s()),
        "queue_time_ms": ms(t.queue_s()),
        "generation_time_ms": generation * 1e3,
        "tokens_per_second": if generation > 0.0 { n as f64 / generation } else { 0.0 },
    });
    if n > 1 {
        m["mean_itl_ms"] = json!(ms(t.decode_s()) / (n - 1) as f64);
    }
    m
}

/// One choice's result.
struct Choice {
    text: String,
    token_ids: Vec<u32>,
    logprobs: Vec<TokenLogprobs>,
    prompt_logprobs: Vec<TokenLogprobs>,
    finish: FinishInfo,
}

async fn collect(mut s: RequestStream) -> Result<Choice, ApiError> {
    let mut text = String::new();
    let mut token_ids = Vec::new();
    let mut logprobs = Vec::new();
    let mut prompt_logprobs = Vec::new();
    while let Some(o) = s.next().await {
        text.push_str(&o.text);
        token_ids.extend_from_slice(&o.token_ids);
        logprobs.extend(o.logprobs);
        prompt_logprobs.extend(o.prompt_logprobs);
        if let Some(f) = o.finish {
            if let Some(e) = &f.error {
                return Err(ApiError::internal(format!("generation failed: {e}")));
            }
            return Ok(Choice {
                text,
                token_ids,
                logprobs,
                prompt_logprobs,
                finish: f,
            });
        }
    }
    Err(ApiError::internal(
        "the engine stopped before the request finished",
    ))
}

#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Kind {
    Completion,
    Chat,
}

pub async fn completions(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    generate(st, headers, body, Kind::Completion)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

pub async fn chat_completions(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    generate(st, headers, body, Kind::Chat)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// SageMaker's `POST /invocations`, as vLLM serves it: a body with `messages` is a chat
/// completion, one with `prompt` a completion.
pub async fn invocations(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let kind = body.as_ref().ok().and_then(|b| {
        let v: Value = serde_json::from_slice(b).ok()?;
        if v.get("messages").is_some() {
            Some(Kind::Chat)
        } else if v.get("prompt").is_some() {
            Some(Kind::Completion)
        } else {
            None
        }
    });
    match kind {
        Some(kind) => generate(st, headers, body, kind)
            .await
            .unwrap_or_else(IntoResponse::into_response),
        None => ApiError::bad_request(
            "/invocations takes a chat completion (`messages`) or a completion (`prompt`)",
            None,
        )
        .into_response(),
    }
}

async fn generate(
    st: Arc<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
    kind: Kind,
) -> Result<Response, ApiError> {
    check_key(&st, &headers)?;
    let engine = st.engine()?;
    let mut req: GenRequest = parse(&body.map_err(ApiError::from_body)?)?;
    req.logprob_limit = LogprobLimit::of(&engine.limits());
    check_model(&st, &req.model)?;
    let n = n_choices(&req)?;
    let chat = kind == Kind::Chat;
    let echo = req.echo == Some(true);
    let prompt_lps = prompt_logprobs::requested(&req, chat)?;
    if req.stream_options.is_some() && req.stream != Some(true) {
        return Err(ApiError::bad_request(
            "stream_options can only be set when stream is true",
            Some("stream_options"),
        ));
    }
    structured::check_fields(&req)?;
    let tools = tools::parse(&req, chat)?;
    let constraint = match (
        structured::constraint(&req)?,
        tools.as_ref().and_then(|t| t.constraint()),
    ) {
        (Some((_, field)), Some(_)) => {
            return Err(ApiError::bad_request(
                format!("{field} cannot be combined with a required tool call"),
                Some(field),
            ))
        }
        (Some(c), None) => Some(c),
        (None, Some(c)) => Some((c, "tool_choice")),
        (None, None) => None,
    };
    // Tokenization and compiling a constraint can take a while: keep them off the async
    // workers.
    let (st2, req2, tools2) = (st.clone(), req.clone(), tools.clone());
    let (prompts, guide) =
        tokio::task::spawn_blocking(move || {
            let engine = st2.engine()?;
            let guide =
                match constraint {
                    None => None,
                    Some((c, field)) => Some(engine.structured()?.compile(&c).map_err(|e| {
                        ApiError::bad_request(format!("{field}: {e}"), Some(field))
                    })?),
                };
            let model = engine.model();
            let forwarded = req2
                .kv_transfer_params
                .as_ref()
                .and_then(|k| k.prompt_token_ids.clone());
            let prompts = if let Some(ids) = forwarded {
                Ok(vec![ids])
            } else if chat {
                chat_prompt(
                    &model.tokenizer,
                    model.chat_template.as_ref(),
                    &req2.messages,
                    tools2.as_ref().and_then(|t| t.for_template()),
                    Render::of(&req2)?,
                )
                .map(|p| vec![p])
            } else {
                completion_prompts(&model.tokenizer, &req2.prompt)
            }?;
            Ok::<_, ApiError>((prompts, guide))
        })
        .await
        .map_err(|e| ApiError::internal(e.to_string()))??;
    let mut prompts = prompts;
    truncate_prompts(&req, &mut prompts, engine.limits().max_model_len)?;
    // With echo, each prompt's text leads its choices' text (as given, or decoded from
    // ids and after truncation).
    // Chat, as vLLM does: the reply leads with the last message when it is the
    // assistant's own (the one `continue_final_message` continues).
    let echoed: Option<Vec<String>> = echo.then(|| {
        if chat {
            let last = req.messages.as_ref().and_then(|m| m.last());
            let own = last
                .filter(|m| m.role == "assistant")
                .and_then(|m| m.content.as_ref()?.text(0).ok());
            return vec![own.unwrap_or_default()];
        }
        let tok = &engine.model().tokenizer;
        prompts
            .iter()
            .enumerate()
            .map(|(i, ids)| match (&req.prompt, req.truncate_prompt_tokens) {
                (Some(PromptInput::Text(s)), None) => s.clone(),
                (Some(PromptInput::Texts(v)), None) => v[i].clone(),
                _ => tok.decode(ids, false),
            })
            .collect()
    });
    if req.pagellm_resume.is_some() && (n != 1 || prompts.len() != 1) {
        return Err(ApiError::bad_request(
            "pagellm_resume continues one choice: it needs one prompt and n = 1",
            Some("pagellm_resume"),
        ));
    }
    // Check everything first: a request that cannot run fails before any starts.
    let mut group = Vec::with_capacity(prompts.len() * n);
    for prompt in &prompts {
        for c in 0..n {
            group.push((prompt.clone(), params(&req, chat, c, guide.clone())?));
        }
    }
    let token_ids = req.return_token_ids.unwrap_or(false);
    let tokens_as_ids = req
        .return_tokens_as_token_ids
        .unwrap_or(st.config.tokens_as_token_ids);
    let streams = engine.submit_group(group)?;
    if let Ok(mut h) = st.params_n.lock() {
        for _ in &prompts {
            h.observe(n as f64);
        }
    }
    let id = format!(
        "{}-{}",
        if chat { "chatcmpl" } else { "cmpl" },
        streams[0].id
    );
    let model = st.config.served_model_name.clone();
    if req.stream.unwrap_or(false) {
        let force = st.config.force_include_usage;
        let include_usage = force
            || req
                .stream_options
                .as_ref()
                .is_some_and(|o| o.include_usage == Some(true));
        let continuous_usage = force
            || include_usage
                && req
                    .stream_options
                    .as_ref()
                    .is_some_and(|o| o.continuous_usage_stats == Some(true));
        return Ok(stream_response(
            st.clone(),
            streams,
            stream::Shape {
                n_per_prompt: n,
                id,
                model,
                kind,
                include_usage,
                continuous_usage,
                prompt_lens: prompts.iter().map(Vec::len).collect(),
                prompt_ids: token_ids.then_some(prompts),
                tools: tools.clone().filter(|t| t.parses()),
                echo: echoed,
                tokens_as_ids,
            },
        ));
    }
    let mut choices = Vec::new();
    for s in streams {
        choices.push(collect(s).await?);
    }
    let finishes: Vec<&FinishInfo> = choices.iter().map(|c| &c.finish).collect();
    let usage = usage_json(&finishes, n, st.config.prompt_tokens_details);
    let timings = timings_json(&choices[0].finish);
    let fmt = LogprobsFormat {
        tokenizer: &engine.model().tokenizer,
        kind,
        as_ids: tokens_as_ids,
    };
    let want_logprobs = logprobs(&req, chat)?.is_some();
    let choices_json: Vec<Value> = choices
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let lp = if want_logprobs && echo && !chat {
                fmt.echo_json(&prompts[i / n], &c.prompt_logprobs, &c.logprobs)
            } else if want_logprobs {
                fmt.json(&c.logprobs, &mut 0)
            } else {
                Value::Null
            };
            let mut v = json!({
                "index": i, "logprobs": lp, "finish_reason": finish_str(&c.finish),
                "stop_reason": stop_reason_json(&c.finish.stop_reason),
            });
            if kind == Kind::Completion {
                // vLLM always sends the field.
                v["prompt_logprobs"] = match prompt_lps {
                    Some(_) => prompt_logprobs::vllm_json(&fmt, &c.prompt_logprobs),
                    None => Value::Null,
                };
            }
            let lead = echoed.as_ref().map_or("", |e| e[i / n].as_str());
            match kind {
                Kind::Completion => v["text"] = json!(format!("{lead}{}", c.text)),
                Kind::Chat if tools.as_ref().is_some_and(|t| t.parses()) => {
                    let (text, calls) = tools.as_ref().expect("checked").split(&c.text);
                    let text = format!("{lead}{}", text.trim());
                    let text = text.trim();
                    v["message"] = json!({"role": "assistant",
                        "content": if text.is_empty() && !calls.is_empty() { Value::Null } else { json!(text) }});
                    if !calls.is_empty() {
                        v["message"]["tool_calls"] = tools::calls_json(&calls, &format!("{id}_{i}"));
                        if c.finish.reason == pagellm_engine::FinishReason::Stop {
                            v["finish_reason"] = json!("tool_calls");
                        }
                    }
                }
                Kind::Chat => {
                    v["message"] = json!({"role": "assistant", "content": format!("{lead}{}", c.text)})
                }
            }
            // vLLM sends these fields either way, null unless asked for.
            // With pagellm_resume, `token_ids` are only the tokens generated here.
            v["token_ids"] = if token_ids { json!(c.token_ids) } else { Value::Null };
            if kind == Kind::Completion {
                v["prompt_token_ids"] = if token_ids { json!(prompts[i / n]) } else { Value::Null };
            }
            v
        })
        .collect();
    let mut body = json!({
        "id": id,
        "object": if chat { "chat.completion" } else { "text_completion" },
        "created": now_s(),
        "model": model,
        "choices": choices_json,
        "usage": usage,
        "pagellm_timings": timings,
    });
    if st.config.per_request_metrics {
        body["metrics"] = request_metrics_json(&choices[0].finish);
    }
    if kind == Kind::Chat {
        body["prompt_token_ids"] = if token_ids {
            json!(prompts[0])
        } else {
            Value::Null
        };
    }
    if kind == Kind::Chat {
        body["prompt_logprobs"] = match prompt_lps {
            Some(_) => prompt_logprobs::vllm_json(&fmt, &choices[0].prompt_logprobs),
            None => Value::Null,
        };
    }
    Ok(Json(body).into_response())
}

pub async fn models(State(st): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    let r = (|| {
        check_key(&st, &headers)?;
        Ok::<_, ApiError>(Json(json!({"object": "list", "data": [model_card(&st)?]})))
    })();
    r.map_or_else(IntoResponse::into_response, IntoResponse::into_response)
}

/// `GET /v1/models/{id}`: the served model's card, or 404 for another id.
pub async fn model(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Response {
    let r = (|| {
        check_key(&st, &headers)?;
        if id != st.config.served_model_name {
            return Err(ApiError::not_found(
                format!(
                    "the model `{id}` does not exist; this server serves `{}`",
                    st.config.served_model_name
                ),
                Some("model"),
            ));
        }
        Ok(Json(model_card(&st)?))
    })();
    r.map_or_else(IntoResponse::into_response, IntoResponse::into_response)
}

fn model_card(st: &AppState) -> Result<Value, ApiError> {
    let engine = st.engine()?;
    Ok(json!({
        "id": st.config.served_model_name,
        "object": "model",
        "created": st.created,
        "owned_by": "pagellm",
        "root": st.config.served_model_name,
        "parent": null,
        "max_model_len": engine.limits().max_model_len,
    }))
}

pub async fn version() -> Json<Value> {
    Json(json!({"version": env!("CARGO_PKG_VERSION")}))
}

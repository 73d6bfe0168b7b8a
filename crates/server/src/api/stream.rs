//! Streamed responses: every choice as server-sent events, ending with `data: [DONE]`.

use std::convert::Infallible;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use pagellm_engine::{FinishInfo, RequestStream};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::tools::{deltas_json, Tools};
use super::{
    finish_str, now_s, request_metrics_json, stop_reason_json, timings_json, usage_json, Kind,
    LogprobsFormat,
};
use crate::AppState;

/// What the stream looks like besides its choices.
pub(crate) struct Shape {
    pub n_per_prompt: usize,
    pub id: String,
    pub model: String,
    pub kind: Kind,
    pub include_usage: bool,
    /// vLLM's `continuous_usage_stats`: every chunk carries its choice's usage so far.
    pub continuous_usage: bool,
    /// Each prompt's length in tokens.
    pub prompt_lens: Vec<usize>,
    /// Each prompt's token ids, when the request asked for `return_token_ids`.
    pub prompt_ids: Option<Vec<Vec<u32>>>,
    /// Replies are parsed for tool calls (`tools` with a `tool_choice` other than none).
    pub tools: Option<Tools>,
    /// With `echo`: each prompt's text, sent as its choices' first chunk.
    pub echo: Option<Vec<String>>,
    /// `return_tokens_as_token_ids`.
    pub tokens_as_ids: bool,
}

/// Streams every choice as server-sent events, ending with `data: [DONE]`.
pub(crate) fn stream_response(
    st: Arc<AppState>,
    streams: Vec<RequestStream>,
    shape: Shape,
) -> Response {
    let Shape {
        n_per_prompt,
        id,
        model,
        kind,
        include_usage,
        continuous_usage,
        prompt_lens,
        prompt_ids,
        tools,
        echo,
        tokens_as_ids,
    } = shape;
    let details = st.config.prompt_tokens_details;
    let per_request_metrics = st.config.per_request_metrics;
    let (tx, rx) = mpsc::channel::<Result<Event, Infallible>>(64);
    let created = now_s();
    let object = if kind == Kind::Chat {
        "chat.completion.chunk"
    } else {
        "text_completion"
    };
    // One forwarding task per choice; a last task sends usage and [DONE] once all ended.
    let (done_tx, mut done_rx) = mpsc::channel::<(usize, FinishInfo)>(streams.len());
    let n = streams.len();
    for (index, mut s) in streams.into_iter().enumerate() {
        let (tx, done_tx, id, model) = (tx.clone(), done_tx.clone(), id.clone(), model.clone());
        let tools = tools.clone();
        let echo = echo
            .as_ref()
            .map(|e| e[index / n_per_prompt.max(1)].clone());
        // With return_token_ids: this choice's prompt, sent once in its first chunk.
        let mut prompt = prompt_ids
            .as_ref()
            .map(|p| p[index / n_per_prompt.max(1)].clone());
        let token_ids = prompt.is_some();
        let prompt_len = prompt_lens[index / n_per_prompt.max(1)];
        let st = st.clone();
        tokio::spawn(async move {
            let Some(engine) = st.loaded_engine() else {
                return;
            };
            let fmt = LogprobsFormat {
                tokenizer: &engine.model().tokenizer,
                kind,
                as_ids: tokens_as_ids,
            };
            let mut offset = 0;
            // With tools: the text is passed on except calls, whose names and argument
            // fragments go out as tool_calls deltas; a reply that called ends "tool_calls".
            let mut calls = tools
                .as_ref()
                .filter(|_| kind == Kind::Chat)
                .map(Tools::stream);
            let n_calls = std::sync::atomic::AtomicUsize::new(0);
            let call_id = format!("{id}_{index}");
            // Tokens sent so far, for continuous usage.
            let completion = std::sync::atomic::AtomicUsize::new(0);
            let mut chunk = |delta: Value,
                             logprobs: Value,
                             finish: Option<&FinishInfo>,
                             ids: Option<&[u32]>| {
                let reason = finish.map(|f| match f.reason {
                    pagellm_engine::FinishReason::Stop if n_calls.load(Relaxed) > 0 => "tool_calls",
                    _ => finish_str(f),
                });
                let mut choice = json!({
                    "index": index, "logprobs": logprobs,
                    "finish_reason": reason,
                    "stop_reason": finish.map_or(Value::Null, |f| stop_reason_json(&f.stop_reason)),
                });
                choice[if kind == Kind::Chat { "delta" } else { "text" }] = delta;
                if let Some(ids) = ids {
                    choice["token_ids"] = json!(ids);
                }
                let first_prompt = prompt.take();
                if let (Some(p), Kind::Completion) = (&first_prompt, kind) {
                    choice["prompt_token_ids"] = json!(p);
                }
                let mut v = json!({"id": id, "object": object, "created": created,
                                   "model": model, "choices": [choice]});
                if let (Some(p), Kind::Chat) = (first_prompt, kind) {
                    v["prompt_token_ids"] = json!(p);
                }
                if let Some(f) = finish {
                    v["pagellm_timings"] = timings_json(f);
                }
                if continuous_usage {
                    let done =
                        finish.map_or(completion.load(Relaxed), |f| f.usage.completion_tokens);
                    v["usage"] = json!({"prompt_tokens": prompt_len, "completion_tokens": done,
                                        "total_tokens": prompt_len + done});
                }
                Ok(Event::default().data(v.to_string()))
            };
            if kind == Kind::Chat
                && tx
                    .send(chunk(
                        json!({"role": "assistant", "content": ""}),
                        Value::Null,
                        None,
                        None,
                    ))
                    .await
                    .is_err()
            {
                return;
            }
            if let Some(text) = echo.filter(|t| kind == Kind::Completion || !t.is_empty()) {
                let delta = match kind {
                    Kind::Completion => json!(text),
                    Kind::Chat => json!({"content": text}),
                };
                if tx
                    .send(chunk(delta, Value::Null, None, None))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            while let Some(mut o) = s.next().await {
                let mut new_calls = Value::Null;
                if let Some(ts) = calls.as_mut() {
                    let (mut text, mut found) = ts.push(&o.text);
                    if o.finish.is_some() {
                        let (t, f) = ts.finish();
                        text.push_str(&t);
                        found.extend(f);
                    }
                    n_calls.store(ts.calls(), Relaxed);
                    if !found.is_empty() {
                        new_calls = deltas_json(&found, &call_id);
                    }
                    o.text = text;
                }
                let delta = match kind {
                    Kind::Completion => json!(o.text),
                    Kind::Chat if !new_calls.is_null() && o.text.is_empty() => {
                        json!({"tool_calls": new_calls})
                    }
                    Kind::Chat if !new_calls.is_null() => {
                        json!({"content": o.text, "tool_calls": new_calls})
                    }
                    Kind::Chat if o.finish.is_some() && o.text.is_empty() => json!({}),
                    Kind::Chat => json!({"content": o.text}),
                };
                let last = o.finish.is_some();
                completion.fetch_add(o.token_ids.len(), Relaxed);
                let lp = if o.logprobs.is_empty() {
                    Value::Null
                } else {
                    fmt.json(&o.logprobs, &mut offset)
                };
                // With token ids, every update is sent, even one whose text is held
                // back: a router continuing the stream must know every token.
                let ids = token_ids.then_some(o.token_ids.as_slice());
                let new_ids = ids.is_some_and(|i| !i.is_empty());
                if (last || new_ids || !o.text.is_empty() || !lp.is_null() || !new_calls.is_null())
                    && tx
                        .send(chunk(delta, lp, o.finish.as_ref(), ids))
                        .await
                        .is_err()
                {
                    // The client went away: dropping `s` aborts the request.
                    return;
                }
                if let Some(f) = o.finish {
                    let _ = done_tx.send((index, f)).await;
                    return;
                }
            }
        });
    }
    drop(done_tx);
    tokio::spawn(async move {
        let mut finishes = Vec::new();
        while let Some(f) = done_rx.recv().await {
            finishes.push(f);
        }
        if finishes.len() == n && include_usage {
            finishes.sort_by_key(|f| f.0);
            let refs: Vec<&FinishInfo> = finishes.iter().map(|f| &f.1).collect();
            let mut v = json!({"id": id, "object": object, "created": created, "model": model,
                "choices": [], "usage": usage_json(&refs, n_per_prompt, details)});
            if per_request_metrics {
                v["metrics"] = request_metrics_json(refs[0]);
            }
            let _ = tx.send(Ok(Event::default().data(v.to_string()))).await;
        }
        let _ = tx.send(Ok(Event::default().data("[DONE]"))).await;
    });
    Sse::new(ReceiverStream::new(rx)).into_response()
}

//! Streamed requests: relay server-sent events as they arrive, and when the replica
//! dies mid-answer, continue the stream on another replica.
//!
//! For a single-choice stream to a pagellm replica the gateway asks for
//! `return_token_ids`, so it knows every token the client has been sent. If the
//! stream then breaks (connection reset, truncated, idle past the timeout, an
//! unreadable chunk), it sends the same request to another replica of the group with
//! `pagellm_resume: {output_token_ids, text_offset}`: that replica computes the prompt
//! and those tokens (batch-invariant kernels make their logits identical to the first
//! replica's), advances a seeded sampler past them, and streams only what follows.
//! The client sees one stream with one id; for greedy and seeded requests the text is
//! what an undisturbed run gives.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::error::GatewayError;
use crate::proxy::{
    chain, classify, failure_of, idle_timeout, usage_of, with_retries, Attempt, Ctx, Principal,
    REPLICA_HEADER,
};
use crate::replica::{Failure, InFlight, Replica};
use crate::sse::SseSplitter;

struct Relay {
    ctx: Ctx,
    tx: mpsc::Sender<Result<Bytes, Infallible>>,
    client_ids: bool,
    client_usage: bool,
    want_usage: bool,
    /// Output token ids the client has been sent (choice 0), when the replica reports them.
    ids: Vec<u32>,
    /// Bytes of output text the client has been sent.
    text_bytes: usize,
    finished: bool,
    usage: Option<(u64, u64)>,
    first_id: Option<Value>,
    first_created: Option<Value>,
    segment: u32,
    first_chunk: Option<Instant>,
    tried: Vec<String>,
}

enum End {
    Done,
    ClientGone,
    Broken(String, Failure),
}

fn bool_at(v: &Value, ptr: &str) -> bool {
    v.pointer(ptr).and_then(Value::as_bool).unwrap_or(false)
}

fn extra(want_usage: bool, ids: bool) -> Vec<(&'static str, Value)> {
    let mut e = Vec::new();
    if ids {
        e.push(("return_token_ids", Value::Bool(true)));
    }
    if want_usage {
        e.push(("stream_options", json!({"include_usage": true})));
    }
    e
}

pub async fn start(ctx: Ctx) -> Result<Response, GatewayError> {
    let n = ctx.body.get("n").and_then(Value::as_u64).unwrap_or(1);
    let client_ids = bool_at(&ctx.body, "/return_token_ids");
    let client_usage = bool_at(&ctx.body, "/stream_options/include_usage");
    // Usage is counted against keys and against deployments' `tpm`.
    let want_usage = client_usage
        || matches!(ctx.principal, Principal::Virtual(_))
        || chain(&ctx)
            .iter()
            .filter_map(|g| ctx.rt.groups.get(g))
            .flatten()
            .any(|r| r.dep.tpm.is_some());
    let timeout = idle_timeout(&ctx);
    let ((resp, inflight, resumable), r) = with_retries(&ctx, |r| {
        let ctx = &ctx;
        async move {
            let inflight = InFlight::new(&r);
            let resumable = n == 1 && r.is_pagellm.load(std::sync::atomic::Ordering::Relaxed);
            let body = ctx.upstream_body(&r, &extra(want_usage, resumable));
            let sent = tokio::time::timeout(timeout, ctx.send(&r, body).send()).await;
            let resp = match sent {
                Err(_) => return Attempt::Retry(Failure::Response, None),
                Ok(Err(e)) => return Attempt::Retry(failure_of(&e), None),
                Ok(Ok(resp)) => resp,
            };
            match classify(&r, resp).await {
                Ok(resp) => Attempt::Ok((resp, inflight, resumable)),
                Err(a) => a,
            }
        }
    })
    .await?;
    let (tx, rx) = mpsc::channel(64);
    let relay = Relay {
        tried: vec![r.dep.id.clone()],
        ctx,
        tx,
        client_ids,
        client_usage,
        want_usage,
        ids: Vec::new(),
        text_bytes: 0,
        finished: false,
        usage: None,
        first_id: None,
        first_created: None,
        segment: 0,
        first_chunk: None,
    };
    let id = r.dep.id.clone();
    tokio::spawn(relay.run(r, resp, inflight, resumable));
    let mut out = Response::new(Body::from_stream(ReceiverStream::new(rx)));
    let h = out.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Ok(v) = HeaderValue::from_str(&id) {
        h.insert(REPLICA_HEADER, v);
    }
    Ok(out)
}

impl Relay {
    async fn run(
        mut self,
        mut r: Arc<Replica>,
        mut resp: reqwest::Response,
        mut inflight: InFlight,
        mut resumable: bool,
    ) {
        let t0 = Instant::now();
        let status = loop {
            let end = self.pump(&r.dep.id, resp).await;
            drop(inflight);
            match end {
                End::Done => {
                    r.record_success();
                    break StatusCode::OK;
                }
                End::ClientGone => {
                    return self.ctx.done(
                        &r.dep.id,
                        StatusCode::from_u16(499).unwrap_or(StatusCode::OK),
                    )
                }
                End::Broken(why, kind) => {
                    tracing::warn!("stream from replica {} broke: {why}", r.dep.id);
                    self.ctx.fail(&r, kind);
                    if self.finished {
                        // Only the closing marker was lost.
                        let _ = self.send_raw("[DONE]").await;
                        break StatusCode::OK;
                    }
                    // Exact continuation needs every sent token's id.
                    let next = if resumable && (!self.ids.is_empty() || self.text_bytes == 0) {
                        self.resume().await
                    } else {
                        None
                    };
                    match next {
                        Some((r2, resp2, in2)) => {
                            self.ctx.gw.metrics.inc(
                                "pagellm_gateway_failovers_total",
                                &[
                                    ("model", &self.ctx.group),
                                    ("from", &r.dep.id),
                                    ("to", &r2.dep.id),
                                ],
                            );
                            tracing::info!(
                                "stream continued on {} after {} tokens",
                                r2.dep.id,
                                self.ids.len()
                            );
                            r = r2;
                            resp = resp2;
                            inflight = in2;
                            resumable = true;
                            self.segment += 1;
                        }
                        None => {
                            let e = GatewayError::bad_gateway(format!(
                                "replica `{}` failed mid-stream ({why}) and the stream could not \
                                 be continued elsewhere",
                                r.dep.id
                            ));
                            let _ = self.send_raw(&e.body().to_string()).await;
                            break StatusCode::BAD_GATEWAY;
                        }
                    }
                }
            }
        };
        self.ctx.gw.metrics.observe(
            "pagellm_gateway_upstream_latency_seconds",
            &[("model", &self.ctx.group), ("replica", &r.dep.id)],
            t0.elapsed().as_secs_f64(),
        );
        self.ctx.done(&r.dep.id, status);
        self.ctx.charge(&r, self.usage).await;
    }

    async fn send_raw(&self, data: &str) -> Result<(), ()> {
        self.tx
            .send(Ok(Bytes::from(format!("data: {data}\n\n"))))
            .await
            .map_err(|_| ())
    }

    /// Relays one upstream stream until it ends or breaks.
    async fn pump(&mut self, replica: &str, resp: reqwest::Response) -> End {
        let idle = idle_timeout(&self.ctx);
        let mut sse = SseSplitter::default();
        let mut body = resp.bytes_stream();
        loop {
            let chunk = match tokio::time::timeout(idle, body.next()).await {
                Err(_) => {
                    return End::Broken(
                        format!("no data for {} s", idle.as_secs()),
                        Failure::Response,
                    )
                }
                Ok(None) => {
                    return End::Broken(
                        "the stream ended before [DONE]".into(),
                        Failure::Connection,
                    )
                }
                // A body that breaks off mid-stream: the connection died with the replica.
                Ok(Some(Err(e))) => return End::Broken(e.to_string(), Failure::Connection),
                Ok(Some(Ok(b))) => b,
            };
            let events = match sse.push(&chunk) {
                Ok(ev) => ev,
                Err(e) => return End::Broken(e, Failure::Response),
            };
            for data in events {
                if data.trim() == "[DONE]" {
                    let sent = self.send_raw("[DONE]").await;
                    // Read the upstream body to its end so its connection goes back to
                    // the pool instead of being closed.
                    let _ = tokio::time::timeout(Duration::from_millis(100), async {
                        while let Some(Ok(_)) = body.next().await {}
                    })
                    .await;
                    return match sent {
                        Ok(()) => End::Done,
                        Err(()) => End::ClientGone,
                    };
                }
                let Ok(mut v) = serde_json::from_str::<Value>(&data) else {
                    return End::Broken("a chunk that is not valid JSON".into(), Failure::Response);
                };
                if let Some(e) = v.get("error") {
                    return End::Broken(format!("an error event: {e}"), Failure::Response);
                }
                let Some(out) = self.process(&mut v, data) else {
                    continue;
                };
                if self.first_chunk.is_none() {
                    let now = Instant::now();
                    self.first_chunk = Some(now);
                    self.ctx.gw.metrics.observe(
                        "pagellm_gateway_time_to_first_token_seconds",
                        &[("model", &self.ctx.group), ("replica", replica)],
                        now.duration_since(self.ctx.started).as_secs_f64(),
                    );
                }
                if self.send_raw(&out).await.is_err() {
                    return End::ClientGone;
                }
            }
        }
    }

    /// Tracks what the client has been sent and rewrites the chunk for it; `None`
    /// drops the chunk.
    fn process(&mut self, v: &mut Value, raw: String) -> Option<String> {
        let mut modified = false;
        if self.first_id.is_none() {
            self.first_id = v.get("id").cloned();
            self.first_created = v.get("created").cloned();
        } else if self.segment > 0 {
            // One stream, one id, whichever replica wrote the chunk.
            if let Some(o) = v.as_object_mut() {
                if let Some(id) = &self.first_id {
                    o.insert("id".into(), id.clone());
                }
                if let Some(c) = &self.first_created {
                    o.insert("created".into(), c.clone());
                }
            }
            modified = true;
        }
        if let Some(u) = usage_of(v) {
            self.usage = Some(u);
        }
        let chat = self.ctx.chat;
        let mut skip = false;
        let choices = v.get_mut("choices").and_then(Value::as_array_mut);
        let no_choices = choices.as_ref().is_none_or(|c| c.is_empty());
        for c in choices.into_iter().flatten() {
            let ids = c.get("token_ids").and_then(Value::as_array);
            let n_ids = ids.map_or(0, Vec::len);
            if let Some(ids) = ids {
                self.ids
                    .extend(ids.iter().filter_map(|i| i.as_u64()).map(|i| i as u32));
            }
            let text = if chat {
                c.pointer("/delta/content").and_then(Value::as_str)
            } else {
                c.get("text").and_then(Value::as_str)
            };
            let text_len = text.map_or(0, str::len);
            self.text_bytes += text_len;
            if c.get("finish_reason").is_some_and(|f| !f.is_null()) {
                self.finished = true;
            }
            // A continued chat stream opens with its own role chunk; the client has one.
            if self.segment > 0
                && chat
                && c.pointer("/delta/role").is_some()
                && text_len == 0
                && n_ids == 0
            {
                skip = true;
            }
            if !self.client_ids {
                if let Some(o) = c.as_object_mut() {
                    modified |= o.remove("token_ids").is_some();
                    modified |= o.remove("prompt_token_ids").is_some();
                }
            }
        }
        if skip {
            return None;
        }
        if no_choices && v.get("usage").is_some_and(|u| !u.is_null()) && !self.client_usage {
            return None;
        }
        if !self.client_ids {
            if let Some(o) = v.as_object_mut() {
                modified |= o.remove("prompt_token_ids").is_some();
            }
        }
        if !self.client_usage && self.want_usage {
            // Usage was asked for the key's ledger, not by the client.
            if let Some(o) = v.as_object_mut() {
                modified |= o.remove("usage").is_some();
            }
        }
        Some(if modified { v.to_string() } else { raw })
    }

    /// Sends the request, with what the client already has, to another replica.
    async fn resume(&mut self) -> Option<(Arc<Replica>, reqwest::Response, InFlight)> {
        let timeout = idle_timeout(&self.ctx);
        let mut extra = extra(self.want_usage, true);
        extra.push((
            "pagellm_resume",
            json!({"output_token_ids": self.ids, "text_offset": self.text_bytes}),
        ));
        for _ in 0..=self.ctx.rt.config.num_retries {
            let group = self.ctx.group.clone();
            let d = self.ctx.pick_resume(&group, &self.tried)?;
            let r = d.replica;
            self.tried.push(r.dep.id.clone());
            if !r.is_pagellm.load(std::sync::atomic::Ordering::Relaxed) {
                continue;
            }
            let inflight = InFlight::new(&r);
            let body = self.ctx.upstream_body(&r, &extra);
            match tokio::time::timeout(timeout, self.ctx.send(&r, body).send()).await {
                Ok(Ok(resp)) => match classify::<()>(&r, resp).await {
                    Ok(resp) => return Some((r, resp, inflight)),
                    Err(_) => self.ctx.fail(&r, Failure::Response),
                },
                Ok(Err(e)) => self.ctx.fail(&r, failure_of(&e)),
                Err(_) => self.ctx.fail(&r, Failure::Response),
            }
        }
        None
    }
}

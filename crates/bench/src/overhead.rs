//! `pagellm bench overhead`: what a gateway adds to each request's latency.
//!
//! A mock OpenAI upstream answers at once (a fixed completion, or a four-chunk stream),
//! so nothing but the gateway's own work separates a request through it from a direct
//! one. The load is open-loop: requests start at a fixed rate whatever the answers do
//! (as TensorZero's and BerriAI's gateway benchmarks do), so a slow gateway shows up
//! as latency and errors rather than as a lower rate.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::response::IntoResponse;
use serde::Serialize;
use serde_json::{json, Value};

use crate::metrics::percentile;

const COMPLETION: &str = r#"{"id":"cmpl-mock","object":"text_completion","created":0,"model":"mock","choices":[{"index":0,"text":" Paris.","finish_reason":"stop","logprobs":null}],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}"#;
const CHAT: &str = r#"{"id":"chatcmpl-mock","object":"chat.completion","created":0,"model":"mock","choices":[{"index":0,"message":{"role":"assistant","content":"Paris."},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}"#;

fn chat_stream() -> String {
    let chunk = |delta: Value, finish: Value| {
        json!({"id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": 0, "model": "mock",
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    let mut s = String::new();
    for c in [
        chunk(json!({"role": "assistant", "content": ""}), Value::Null),
        chunk(json!({"content": "Par"}), Value::Null),
        chunk(json!({"content": "is."}), Value::Null),
        chunk(json!({}), json!("stop")),
    ] {
        s.push_str(&format!("data: {c}\n\n"));
    }
    s.push_str("data: [DONE]\n\n");
    s
}

/// Serves the mock upstream on `listener` until the process ends.
pub async fn mock_upstream(listener: tokio::net::TcpListener) -> std::io::Result<()> {
    let stream_body: Arc<str> = chat_stream().into();
    let chat = move |body: axum::body::Bytes| {
        let stream_body = stream_body.clone();
        async move {
            let streamed = serde_json::from_slice::<Value>(&body)
                .ok()
                .and_then(|v| v.get("stream")?.as_bool())
                .unwrap_or(false);
            if streamed {
                (
                    [(axum::http::header::CONTENT_TYPE, "text/event-stream")],
                    stream_body.to_string(),
                )
                    .into_response()
            } else {
                (
                    [(axum::http::header::CONTENT_TYPE, "application/json")],
                    CHAT,
                )
                    .into_response()
            }
        }
    };
    let app = axum::Router::new()
        .route("/v1/chat/completions", axum::routing::post(chat))
        .route(
            "/v1/completions",
            axum::routing::post(|| async {
                (
                    [(axum::http::header::CONTENT_TYPE, "application/json")],
                    COMPLETION,
                )
            }),
        )
        .route(
            "/v1/models",
            axum::routing::get(|| async {
                axum::Json(json!({"object": "list", "data": [{"id": "mock", "object": "model"}]}))
            }),
        )
        .route("/health", axum::routing::get(|| async { "ok" }))
        .route("/metrics", axum::routing::get(|| async { "" }));
    use axum::serve::ListenerExt;
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, app).await
}

#[derive(Debug, Clone, Serialize)]
pub struct OverheadResult {
    pub label: String,
    pub rate: f64,
    pub stream: bool,
    pub sent: usize,
    pub ok: usize,
    pub failed: usize,
    /// Achieved completions per second.
    pub throughput: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub mean_ms: f64,
    /// First streamed byte (streams only).
    pub p50_ttfb_ms: Option<f64>,
    pub p99_ttfb_ms: Option<f64>,
}

/// One chat request; returns (latency s, time to first body byte s).
async fn one(
    client: &reqwest::Client,
    url: &str,
    key: Option<&str>,
    model: &str,
    stream: bool,
) -> Result<(f64, f64), String> {
    let t0 = Instant::now();
    let mut req = client.post(url).json(&json!({
        "model": model, "stream": stream, "max_tokens": 4,
        "messages": [{"role": "user", "content": "What is the capital of France?"}]
    }));
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    let mut resp = req.send().await.map_err(|e| e.to_string())?;
    if !resp.status().is_success() {
        return Err(format!("status {}", resp.status()));
    }
    let mut first = None;
    let mut body = Vec::new();
    while let Some(c) = resp.chunk().await.map_err(|e| e.to_string())? {
        first.get_or_insert_with(|| t0.elapsed().as_secs_f64());
        body.extend_from_slice(&c);
    }
    let done = if stream {
        body.windows(6).any(|w| w == b"[DONE]")
    } else {
        serde_json::from_slice::<Value>(&body).is_ok()
    };
    if !done {
        return Err("incomplete body".into());
    }
    let total = t0.elapsed().as_secs_f64();
    Ok((total, first.unwrap_or(total)))
}

/// Sends `rate` requests per second for `duration` (evenly spaced), to the chat
/// endpoint under `base_url`, and summarizes their latencies.
pub async fn open_loop(
    base_url: &str,
    key: Option<&str>,
    model: &str,
    label: &str,
    rate: f64,
    duration: Duration,
    stream: bool,
) -> OverheadResult {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(4096)
        .tcp_nodelay(true)
        .timeout(Duration::from_secs(30))
        .build()
        .expect("http client");
    let url = format!("{}/v1/chat/completions", base_url.trim_end_matches('/'));
    let n = (rate * duration.as_secs_f64()).round() as usize;
    let gap = Duration::from_secs_f64(1.0 / rate);
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        tokio::time::sleep_until(start + gap * i as u32).await;
        let (client, url, key, model) = (
            client.clone(),
            url.clone(),
            key.map(str::to_string),
            model.to_string(),
        );
        tasks.push(tokio::spawn(async move {
            one(&client, &url, key.as_deref(), &model, stream).await
        }));
    }
    let mut lat = Vec::new();
    let mut ttfb = Vec::new();
    let mut failed = 0;
    for t in tasks {
        match t.await {
            Ok(Ok((l, f))) => {
                lat.push(l * 1e3);
                ttfb.push(f * 1e3);
            }
            _ => failed += 1,
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    lat.sort_by(f64::total_cmp);
    ttfb.sort_by(f64::total_cmp);
    let p = |v: &[f64], q: f64| percentile(v, q);
    OverheadResult {
        label: label.to_string(),
        rate,
        stream,
        sent: n,
        ok: lat.len(),
        failed,
        throughput: lat.len() as f64 / elapsed,
        p50_ms: p(&lat, 50.0),
        p90_ms: p(&lat, 90.0),
        p99_ms: p(&lat, 99.0),
        mean_ms: if lat.is_empty() {
            f64::NAN
        } else {
            lat.iter().sum::<f64>() / lat.len() as f64
        },
        p50_ttfb_ms: stream.then(|| p(&ttfb, 50.0)),
        p99_ttfb_ms: stream.then(|| p(&ttfb, 99.0)),
    }
}

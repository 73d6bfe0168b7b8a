//! The dashboard at `/`: one page built into the binary (no network needed), fed by
//! `GET /dashboard/events`.
//!
//! The event stream is server-sent events, one JSON frame every [`FRAME_INTERVAL`]:
//!
//! ```text
//! {"t": unix ms, "model": name, "loading": false, "step": engine steps,
//!  "block_size": 16, "blocks": ".ccuus…"   one letter per KV block: free, cached, used, shared
//!  "requests": [{"id", "phase", "prompt", "cached", "computed", "output", "max",
//!                "preemptions", "age", "ttft", "blocks": [block ids]}],
//!  "stats": {"running", "waiting", "kv_usage", "prefix_queries", "prefix_hits",
//!            "preemptions", "prompt_tokens", "generation_tokens", "finished",
//!            "ttft_sum", "ttft_count", "itl_sum", "itl_count", "e2e_sum", "e2e_count"}}
//! ```
//!
//! Counters are cumulative; the page charts their rates between frames. The engine
//! publishes the block map and request list itself ([`pagellm_engine::live`]); a frame
//! reads the latest copy and never waits on the engine thread. Until the model is loaded
//! a frame is `{"t", "model", "loading": true}`. The stream requires the API key when
//! the server has one, as the API does; the page sends it as a bearer token.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::http::HeaderMap;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::AppState;

/// Time between two frames of the event stream.
pub const FRAME_INTERVAL: Duration = Duration::from_millis(500);

const INDEX_HTML: &str = include_str!("../assets/dashboard/index.html");
const APP_JS: &str = include_str!("../assets/dashboard/app.js");
/// Helpers shared with the gateway's dashboard, which serves this same file.
pub const COMMON_JS: &str = include_str!("../assets/dashboard/common.js");
/// The stylesheet, shared with the gateway's dashboard.
pub const STYLE_CSS: &str = include_str!("../assets/dashboard/style.css");

pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/", get(|| asset("text/html; charset=utf-8", INDEX_HTML)))
        .route(
            "/dashboard/app.js",
            get(|| asset("text/javascript; charset=utf-8", APP_JS)),
        )
        .route(
            "/dashboard/common.js",
            get(|| asset("text/javascript; charset=utf-8", COMMON_JS)),
        )
        .route(
            "/dashboard/style.css",
            get(|| asset("text/css; charset=utf-8", STYLE_CSS)),
        )
        .route("/dashboard/events", get(events))
}

pub async fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [(CONTENT_TYPE, content_type), (CACHE_CONTROL, "no-cache")],
        body,
    )
        .into_response()
}

async fn events(State(st): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(e) = crate::api::check_key(&st, &headers) {
        return e.into_response();
    }
    // A stream that never ends would hold a graceful shutdown until its deadline.
    frame_stream(move || (!st.draining.load(Ordering::Acquire)).then(|| frame(&st)))
}

/// Server-sent events with the frame `next` makes every [`FRAME_INTERVAL`], until it
/// makes none or the page goes away. The gateway's dashboard streams with it too.
pub fn frame_stream(mut next: impl FnMut() -> Option<Value> + Send + 'static) -> Response {
    let (tx, rx) = mpsc::channel::<Result<Event, Infallible>>(4);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(FRAME_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tick.tick().await;
            let Some(frame) = next() else {
                return;
            };
            if tx
                .send(Ok(Event::default().data(frame.to_string())))
                .await
                .is_err()
            {
                return; // the page went away
            }
        }
    });
    Sse::new(ReceiverStream::new(rx)).into_response()
}

/// One frame of the event stream (see the module docs).
pub fn frame(st: &AppState) -> Value {
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let model = &st.config.served_model_name;
    let Some(engine) = st.loaded_engine() else {
        return json!({"t": t, "model": model, "loading": true});
    };
    let s = engine.stats();
    let live = engine.live();
    let l = &s.latency;
    let requests: Vec<Value> = live
        .requests
        .iter()
        .map(|r| {
            json!({"id": r.id, "phase": r.phase.name(), "prompt": r.prompt_tokens,
                "cached": r.cached_tokens, "computed": r.computed_tokens,
                "output": r.output_tokens, "max": r.max_tokens,
                "preemptions": r.num_preemptions, "age": r.age_s, "ttft": r.ttft_s,
                "blocks": r.blocks})
        })
        .collect();
    json!({
        "t": t,
        "model": model,
        "loading": false,
        "step": live.step,
        "max_model_len": engine.limits().max_model_len,
        "block_size": live.block_size,
        "blocks": live.blocks,
        "requests": requests,
        "stats": {
            "running": s.num_running,
            // Submitted requests the engine thread has not picked up yet count as waiting.
            "waiting": s.num_waiting.max(engine.num_queued()),
            "kv_usage": s.kv_cache_usage,
            "prefix_queries": s.prefix_cache.queries,
            "prefix_hits": s.prefix_cache.hits,
            "preemptions": s.num_preemptions,
            "prompt_tokens": s.prompt_tokens,
            "generation_tokens": s.generation_tokens,
            "finished": s.finished.iter().sum::<u64>(),
            "ttft_sum": l.ttft.sum, "ttft_count": l.ttft.count,
            "itl_sum": l.inter_token.sum, "itl_count": l.inter_token.count,
            "e2e_sum": l.e2e.sum, "e2e_count": l.e2e.count,
        },
    })
}

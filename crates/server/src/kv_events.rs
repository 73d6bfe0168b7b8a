//! `GET /v1/kv_events`: the prefix cache's contents as server-sent events, so a router
//! can send requests where their prompt's KV blocks already are.
//!
//! The first event is a snapshot, `{"type": "snapshot", "block_size", "num_blocks",
//! "hashes": [...]}`; then, after each engine step that changed the cache,
//! `{"type": "stored", "hashes": [...]}` and `{"type": "removed", "hashes": [...]}`
//! (`{"type": "cleared"}` when everything was forgotten). Hashes are the engine's
//! 128-bit chained block hashes (`pagellm_engine::kv_cache::hash_block`) as 32
//! lowercase hex digits. A subscriber that falls behind gets a new snapshot.

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use pagellm_engine::kv_cache::KvEvent;
use pagellm_engine::kv_events::KvUpdate;
use serde_json::json;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::error::ApiError;
use crate::AppState;

fn hex(h: u128) -> String {
    format!("{h:032x}")
}

pub async fn kv_events(State(st): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    let r = (|| {
        crate::api::check_key(&st, &headers)?;
        let e = st.engine()?;
        Ok::<_, ApiError>((e.kv_events(), e.limits()))
    })();
    let (mut sub, limits) = match r {
        Ok(x) => x,
        Err(e) => return e.into_response(),
    };
    let (tx, rx) = mpsc::channel::<Result<Event, Infallible>>(16);
    tokio::spawn(async move {
        let mut seq = None;
        loop {
            let update = {
                let log = sub.log.lock().unwrap_or_else(|p| p.into_inner());
                match seq {
                    None => log.snapshot(),
                    Some(s) => log.since(s),
                }
            };
            let events = match update {
                KvUpdate::Snapshot { seq: s, hashes } => {
                    seq = Some(s);
                    vec![json!({"type": "snapshot", "block_size": limits.block_size,
                        "num_blocks": limits.num_blocks,
                        "hashes": hashes.into_iter().map(hex).collect::<Vec<_>>()})]
                }
                KvUpdate::Batches { seq: s, batches } => {
                    seq = Some(s);
                    batches.iter().flat_map(|b| batch_json(b)).collect()
                }
            };
            for v in events {
                if tx
                    .send(Ok(Event::default().data(v.to_string())))
                    .await
                    .is_err()
                {
                    return; // the subscriber went away
                }
            }
            if sub.changed.changed().await.is_err() {
                return; // the engine stopped
            }
        }
    });
    Sse::new(ReceiverStream::new(rx)).into_response()
}

/// One step's changes: stored and removed runs in order (a hash can be removed and
/// stored again within one step, so order matters).
fn batch_json(events: &[KvEvent]) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    let mut run: Option<(&str, Vec<String>)> = None;
    for e in events {
        let (kind, h) = match e {
            KvEvent::Stored(h) => ("stored", Some(h.0)),
            KvEvent::Removed(h) => ("removed", Some(h.0)),
            KvEvent::Cleared => ("cleared", None),
        };
        match (&mut run, h) {
            (Some((k, hs)), Some(h)) if *k == kind => hs.push(hex(h)),
            _ => {
                if let Some((k, hs)) = run.take() {
                    out.push(json!({"type": k, "hashes": hs}));
                }
                match h {
                    Some(h) => run = Some((kind, vec![hex(h)])),
                    None => out.push(json!({"type": "cleared"})),
                }
            }
        }
    }
    if let Some((k, hs)) = run {
        out.push(json!({"type": k, "hashes": hs}));
    }
    out
}

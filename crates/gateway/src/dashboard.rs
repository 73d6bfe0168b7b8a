//! The gateway's dashboard at `/`: the twin of `pagellm serve`'s page, showing the
//! replicas, their health and load, and the routing decisions as they are made. One
//! page built into the binary (its helpers and stylesheet are the server dashboard's),
//! fed by `GET /dashboard/events`, server-sent events with one JSON frame every
//! half second (`pagellm_server::dashboard::FRAME_INTERVAL`):
//!
//! ```text
//! {"t": unix ms, "policy": "prefix_aware",
//!  "replicas": [{"id", "model", "upstream_model", "api_base", "kind": "pagellm"|"openai",
//!                "state": "up"|"ejected"|"down", "ejected_for": s|null, "in_flight",
//!                "max_concurrency", "waiting", "running", "kv_usage", "load_age": s|null,
//!                "kv_events": bool, "blocks_exact", "blocks_routed", "num_blocks",
//!                "routed", "failures"}],
//!  "decisions": [{"seq", "t", "model", "replica", "reason", "matched", "blocks",
//!                 "resume", "outcome": null (in flight) | "200" | "failed: connection" …}],
//!  "reasons": {"prefix_hit": n, …}}
//! ```
//!
//! `decisions` holds the last [`LOG_FRAME`] of the gateway's routing log (the page keeps
//! the ones it has seen by `seq`); counters are cumulative. The stream needs the master
//! key when one is configured: routing shows every client's traffic.

use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use pagellm_server::dashboard::{asset, frame_stream, COMMON_JS, STYLE_CSS};
use serde::Serialize;
use serde_json::{json, Value};

use crate::error::GatewayError;
use crate::proxy::{authenticate, Principal};
use crate::replica::Replica;
use crate::routing::Reason;
use crate::Gateway;

/// Decisions the gateway remembers.
const LOG_CAP: usize = 512;
/// Decisions sent per frame (the newest).
const LOG_FRAME: usize = 100;

const INDEX_HTML: &str = include_str!("../assets/dashboard/index.html");
const GATEWAY_JS: &str = include_str!("../assets/dashboard/gateway.js");

const REASONS: [Reason; 7] = [
    Reason::RoundRobin,
    Reason::LeastOutstanding,
    Reason::PowerOfTwo,
    Reason::PrefixHit,
    Reason::NoPrefix,
    Reason::LowMatch,
    Reason::LoadGuard,
];

pub fn routes() -> Router<Arc<Gateway>> {
    let js = "text/javascript; charset=utf-8";
    Router::new()
        .route("/", get(|| asset("text/html; charset=utf-8", INDEX_HTML)))
        .route("/dashboard/gateway.js", get(move || asset(js, GATEWAY_JS)))
        .route("/dashboard/common.js", get(move || asset(js, COMMON_JS)))
        .route(
            "/dashboard/style.css",
            get(|| asset("text/css; charset=utf-8", STYLE_CSS)),
        )
        .route("/dashboard/events", get(events))
}

/// One routing decision and what became of it.
#[derive(Debug, Clone, Serialize)]
pub struct LoggedDecision {
    pub seq: u64,
    /// Unix time in ms.
    pub t: u64,
    pub model: String,
    pub replica: String,
    pub reason: &'static str,
    /// Leading prompt blocks the replica was believed to hold, of `blocks`.
    pub matched: usize,
    pub blocks: usize,
    /// A stream continued on this replica after another one died.
    pub resume: bool,
    /// `None` while the request is in flight; the status sent, or why it failed here.
    pub outcome: Option<String>,
}

/// The last [`LOG_CAP`] routing decisions.
#[derive(Default)]
pub struct RoutingLog {
    entries: Mutex<VecDeque<LoggedDecision>>,
}

impl RoutingLog {
    /// Records a decision (its `seq` and `t` are set here); returns its `seq`.
    pub fn push(&self, mut d: LoggedDecision) -> u64 {
        let mut e = self.entries.lock().unwrap();
        d.seq = e.back().map_or(1, |l| l.seq + 1);
        d.t = unix_ms();
        let seq = d.seq;
        e.push_back(d);
        if e.len() > LOG_CAP {
            e.pop_front();
        }
        seq
    }

    /// Sets the outcome of decision `seq`, if it is still remembered and open.
    pub fn finish(&self, seq: u64, outcome: impl Into<String>) {
        let mut e = self.entries.lock().unwrap();
        let first = e.front().map_or(0, |d| d.seq);
        if let Some(d) = seq
            .checked_sub(first)
            .and_then(|i| e.get_mut(i as usize))
            .filter(|d| d.outcome.is_none())
        {
            d.outcome = Some(outcome.into());
        }
    }

    /// The newest `n` decisions, oldest first.
    pub fn last(&self, n: usize) -> Vec<LoggedDecision> {
        let e = self.entries.lock().unwrap();
        e.iter().skip(e.len().saturating_sub(n)).cloned().collect()
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

async fn events(State(gw): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    match authenticate(&gw.runtime(), &headers) {
        Ok(Principal::Open | Principal::Master) => {}
        Ok(Principal::Virtual(_)) => {
            return GatewayError::unauthorized("the dashboard needs the master key").into_response()
        }
        Err(e) => return e.into_response(),
    }
    frame_stream(move || Some(frame(&gw)))
}

/// One frame of the event stream (see the module docs).
pub fn frame(gw: &Gateway) -> Value {
    let rt = gw.runtime();
    let now = Instant::now();
    let mut replicas: Vec<Value> = rt
        .replicas()
        .map(|r| replica_json(r, now, rt.router.fresh))
        .collect();
    replicas.sort_by(|a, b| {
        (a["model"].as_str(), a["id"].as_str()).cmp(&(b["model"].as_str(), b["id"].as_str()))
    });
    let policy = rt.router.policy.as_str();
    let reasons: serde_json::Map<String, Value> = REASONS
        .iter()
        .map(|r| {
            let n = gw.metrics.get(
                "pagellm_gateway_routing_decisions_total",
                &[("policy", policy), ("reason", r.as_str())],
            );
            (r.as_str().to_string(), json!(n as u64))
        })
        .filter(|(_, n)| n.as_u64() != Some(0))
        .collect();
    json!({
        "t": unix_ms(),
        "policy": policy,
        "replicas": replicas,
        "decisions": gw.routing_log.last(LOG_FRAME),
        "reasons": reasons,
    })
}

fn replica_json(r: &Replica, now: Instant, fresh: Duration) -> Value {
    let health = r.health.lock().unwrap();
    let ejected_for = health
        .ejected_until
        .filter(|&t| t > now)
        .map(|t| (t - now).as_secs_f64());
    let state = if ejected_for.is_some() {
        "ejected"
    } else if health.up {
        "up"
    } else {
        "down"
    };
    let failures = health.consecutive_fails.max(health.check_fails);
    drop(health);
    let load = *r.load.lock().unwrap();
    let load_age = load
        .scraped
        .map(|t| now.duration_since(t).as_secs_f64())
        .filter(|&a| a < fresh.as_secs_f64());
    let p = r.prefix.lock().unwrap();
    let pagellm = r.is_pagellm.load(Relaxed);
    json!({
        "id": r.dep.id, "model": r.dep.group, "upstream_model": r.dep.upstream_model,
        "api_base": without_credentials(&r.dep.api_base),
        "kind": if pagellm { "pagellm" } else { "openai" },
        "state": state, "ejected_for": ejected_for, "failures": failures,
        "in_flight": r.in_flight.load(Relaxed), "max_concurrency": r.dep.max_concurrency,
        "waiting": load_age.map(|_| load.waiting), "running": load_age.map(|_| load.running),
        "kv_usage": load_age.map(|_| load.kv_usage), "load_age": load_age,
        "kv_events": p.connected, "blocks_exact": p.exact.len(),
        "blocks_routed": p.recent_len(), "num_blocks": p.num_blocks,
        "routed": r.routed.load(Relaxed),
    })
}

/// `api_base` without a user name or password, should it carry one.
fn without_credentials(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut u) if !u.username().is_empty() || u.password().is_some() => {
            let _ = u.set_username("");
            let _ = u.set_password(None);
            u.to_string()
        }
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(replica: &str) -> LoggedDecision {
        LoggedDecision {
            seq: 0,
            t: 0,
            model: "m".into(),
            replica: replica.into(),
            reason: "round_robin",
            matched: 0,
            blocks: 0,
            resume: false,
            outcome: None,
        }
    }

    #[test]
    fn the_log_keeps_the_newest_and_finishes_by_seq() {
        let log = RoutingLog::default();
        let first = log.push(decision("a"));
        for i in 0..LOG_CAP {
            log.push(decision(&format!("r{i}")));
        }
        // The first decision has left the log: finishing it changes nothing.
        log.finish(first, "200");
        let last = log.last(3);
        assert_eq!(last.len(), 3);
        assert_eq!(last[2].seq, LOG_CAP as u64 + 1);
        assert_eq!(last[2].replica, format!("r{}", LOG_CAP - 1));
        log.finish(last[1].seq, "failed: connection");
        log.finish(last[1].seq, "200");
        let again = log.last(3);
        assert_eq!(again[1].outcome.as_deref(), Some("failed: connection"));
        assert_eq!(again[2].outcome, None);
        assert!(log.last(10_000).iter().all(|d| d.seq != first));
    }

    #[test]
    fn credentials_are_not_shown() {
        assert_eq!(
            without_credentials("http://u:p@10.0.0.1:8000/v1"),
            "http://10.0.0.1:8000/v1"
        );
        assert_eq!(
            without_credentials("http://127.0.0.1:8000/v1"),
            "http://127.0.0.1:8000/v1"
        );
    }
}

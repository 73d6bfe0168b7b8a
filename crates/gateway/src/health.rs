//! Background tasks per replica: active health checks, scraping its `/metrics` for
//! load, and following its KV events. Each task holds only weak references and ends
//! when its replica leaves the configuration (after a reload) or the gateway stops.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::Value;

use crate::metrics::{scrape_label, scrape_value};
use crate::replica::Replica;
use crate::sse::SseSplitter;
use crate::Gateway;

pub fn spawn_all(gw: &Arc<Gateway>) {
    for r in gw.runtime().replicas() {
        if r.tasks_started.swap(true, Ordering::AcqRel) {
            continue;
        }
        let (g, w) = (Arc::downgrade(gw), Arc::downgrade(r));
        tokio::spawn(health_loop(g.clone(), w.clone()));
        tokio::spawn(metrics_loop(g.clone(), w.clone()));
        if gw.runtime().config.kv_events {
            tokio::spawn(kv_events_loop(g, w));
        }
    }
}

fn get(g: &Weak<Gateway>, r: &Weak<Replica>) -> Option<(Arc<Gateway>, Arc<Replica>)> {
    Some((g.upgrade()?, r.upgrade()?))
}

fn authed(gw: &Gateway, r: &Replica, url: String) -> reqwest::RequestBuilder {
    let req = gw.http.get(url);
    match &r.dep.api_key {
        Some(k) => req.bearer_auth(k),
        None => req,
    }
}

async fn health_loop(g: Weak<Gateway>, w: Weak<Replica>) {
    loop {
        let Some((gw, r)) = get(&g, &w) else { return };
        let h = gw.runtime().config.health.clone();
        let ok = authed(&gw, &r, format!("{}/health", r.dep.root()))
            .timeout(h.timeout)
            .send()
            .await
            .is_ok_and(|resp| resp.status().is_success());
        if r.record_check(ok, h.failure_threshold) {
            tracing::info!("replica {} is healthy again", r.dep.id);
        }
        drop((gw, r));
        tokio::time::sleep(h.interval).await;
    }
}

async fn metrics_loop(g: Weak<Gateway>, w: Weak<Replica>) {
    loop {
        let Some((gw, r)) = get(&g, &w) else { return };
        let every = gw.runtime().config.metrics_interval;
        let resp = authed(&gw, &r, format!("{}/metrics", r.dep.root()))
            .timeout(Duration::from_secs(2))
            .send()
            .await;
        if let Ok(resp) = resp {
            if resp.status().is_success() {
                if let Ok(text) = resp.text().await {
                    let waiting = scrape_value(&text, "vllm:num_requests_waiting");
                    let running = scrape_value(&text, "vllm:num_requests_running");
                    let kv = scrape_value(&text, "vllm:kv_cache_usage_perc")
                        .or_else(|| scrape_value(&text, "vllm:gpu_cache_usage_perc"));
                    if let (Some(waiting), Some(running)) = (waiting, running) {
                        let mut l = r.load.lock().unwrap();
                        l.waiting = waiting;
                        l.running = running;
                        l.kv_usage = kv.unwrap_or(0.0);
                        l.scraped = Some(Instant::now());
                    }
                    let bs = scrape_label(&text, "vllm:cache_config_info", "block_size")
                        .and_then(|b| b.parse().ok());
                    if let Some(bs) = bs {
                        r.prefix.lock().unwrap().block_size.get_or_insert(bs);
                    }
                }
            }
        }
        drop((gw, r));
        tokio::time::sleep(every).await;
    }
}

fn hashes(v: &Value) -> Vec<u128> {
    v.get("hashes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|h| u128::from_str_radix(h.as_str()?, 16).ok())
        .collect()
}

/// Follows `GET /v1/kv_events`; a server that has it is a pagellm replica.
async fn kv_events_loop(g: Weak<Gateway>, w: Weak<Replica>) {
    let mut backoff = Duration::from_millis(250);
    loop {
        let Some((gw, r)) = get(&g, &w) else { return };
        let resp = authed(&gw, &r, format!("{}/kv_events", r.dep.api_base))
            .send()
            .await;
        drop(gw);
        match resp {
            Ok(resp) if resp.status().is_success() => {
                backoff = Duration::from_millis(250);
                r.is_pagellm.store(true, Ordering::Relaxed);
                let mut body = resp.bytes_stream();
                let mut sse = SseSplitter::default();
                let weak = Arc::downgrade(&r);
                drop(r);
                while let Some(Ok(chunk)) = body.next().await {
                    let Some(r) = weak.upgrade() else { return };
                    let Ok(events) = sse.push(&chunk) else { break };
                    for data in events {
                        let Ok(v) = serde_json::from_str::<Value>(&data) else {
                            continue;
                        };
                        let mut p = r.prefix.lock().unwrap();
                        match v.get("type").and_then(Value::as_str) {
                            Some("snapshot") => {
                                p.block_size = v
                                    .get("block_size")
                                    .and_then(Value::as_u64)
                                    .map(|b| b as usize);
                                p.num_blocks = v
                                    .get("num_blocks")
                                    .and_then(Value::as_u64)
                                    .map(|b| b as usize);
                                p.snapshot(hashes(&v));
                            }
                            Some("stored") => p.stored(hashes(&v)),
                            Some("removed") => p.removed(hashes(&v)),
                            Some("cleared") => p.snapshot(Vec::new()),
                            _ => {}
                        }
                    }
                }
                if let Some(r) = weak.upgrade() {
                    r.prefix.lock().unwrap().disconnected();
                }
            }
            Ok(resp) if resp.status() == reqwest::StatusCode::NOT_FOUND => {
                // Not a pagellm replica (or an old one): look again now and then.
                r.is_pagellm.store(false, Ordering::Relaxed);
                drop(r);
                tokio::time::sleep(Duration::from_secs(30)).await;
                continue;
            }
            _ => drop(r),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

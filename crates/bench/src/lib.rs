//! `pagellm bench serve`: a serving benchmark for any OpenAI-compatible server, with
//! `vllm bench serve`'s definitions and output names, so numbers compare directly.
//!
//! - [`dataset`]: the prompts (random, prefix-repetition, JSONL).
//! - [`schedule`]: when each request is sent (all at once, Poisson or gamma arrivals).
//! - [`client`]: one streamed request, timed on the client.
//! - [`metrics`]: the statistics (TTFT, TPOT, ITL, E2EL, throughput, goodput).
//! - [`report`], [`plot`]: the table, and SVG charts.

pub mod client;
pub mod dataset;
pub mod metrics;
pub mod overhead;
pub mod plot;
pub mod report;
pub mod schedule;

use std::sync::Arc;
use std::time::{Duration, Instant};

use client::{RequestRecord, Target};
use dataset::Sample;
use metrics::{Slo, Summary};

/// How to pace one run.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub target: Target,
    /// Requests per second; infinite = all at once.
    pub request_rate: f64,
    pub burstiness: f64,
    /// Most requests in flight; `None` = no limit.
    pub max_concurrency: Option<usize>,
    pub seed: u64,
    pub slo: Option<Slo>,
    pub label: String,
    pub progress: bool,
}

/// The id of the first model the server lists (`GET /v1/models`).
pub async fn first_model(base_url: &str, api_key: Option<&str>) -> anyhow::Result<String> {
    let url = format!("{}/v1/models", base_url.trim_end_matches('/'));
    let mut req = reqwest::Client::new()
        .get(&url)
        .timeout(Duration::from_secs(30));
    if let Some(k) = api_key {
        req = req.bearer_auth(k);
    }
    let r = req
        .send()
        .await
        .map_err(|e| anyhow::anyhow!("cannot reach {url}: {e}"))?;
    anyhow::ensure!(r.status().is_success(), "{url} answered {}", r.status());
    let v: serde_json::Value = r.json().await?;
    v["data"][0]["id"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| anyhow::anyhow!("{url} lists no model; pass --model"))
}

/// Sends every sample on the schedule and summarizes the run.
pub async fn run(cfg: &RunConfig, samples: &[Sample]) -> anyhow::Result<Summary> {
    anyhow::ensure!(
        cfg.max_concurrency != Some(0),
        "--max-concurrency must be at least 1"
    );
    let offsets =
        schedule::arrival_offsets(samples.len(), cfg.request_rate, cfg.burstiness, cfg.seed)?;
    // A fresh connection per request: some servers (llama.cpp's) close a connection
    // after each stream while advertising keep-alive, and a pooled dead connection
    // would fail a request that never reached the server.
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()?;
    let permits = Arc::new(tokio::sync::Semaphore::new(
        cfg.max_concurrency.unwrap_or(samples.len()).max(1),
    ));
    let bar = if cfg.progress {
        indicatif::ProgressBar::new(samples.len() as u64)
    } else {
        indicatif::ProgressBar::hidden()
    };
    let start = Instant::now();
    let tasks: Vec<_> = samples
        .iter()
        .zip(offsets)
        .map(|(sample, at)| {
            let (client, target, permits, bar, sample) = (
                client.clone(),
                cfg.target.clone(),
                permits.clone(),
                bar.clone(),
                sample.clone(),
            );
            tokio::spawn(async move {
                tokio::time::sleep_until((start + Duration::from_secs_f64(at)).into()).await;
                let _permit = permits.acquire_owned().await.expect("semaphore open");
                let rec = client::send(&client, &target, &sample).await;
                bar.inc(1);
                rec
            })
        })
        .collect();
    let mut records: Vec<RequestRecord> = Vec::with_capacity(tasks.len());
    for t in tasks {
        records.push(t.await?);
    }
    let duration = start.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let mut s = metrics::summarize(&records, duration, cfg.slo.as_ref());
    s.label = cfg.label.clone();
    s.model_id = cfg.target.model.clone();
    s.endpoint = match cfg.target.endpoint {
        client::Endpoint::Completions => "/v1/completions",
        client::Endpoint::Chat => "/v1/chat/completions",
    }
    .into();
    s.request_rate = if cfg.request_rate.is_infinite() {
        "inf".into()
    } else {
        cfg.request_rate.to_string()
    };
    s.burstiness = cfg.burstiness;
    s.max_concurrency = cfg.max_concurrency;
    Ok(s)
}

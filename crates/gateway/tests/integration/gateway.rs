//! The gateway end to end: real pagellm replicas on the tiny checkpoint and scripted
//! upstreams on loopback, reached through the gateway's HTTP API.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use axum::response::IntoResponse;
use serde_json::{json, Value};

fn completion(prompt: &str, max_tokens: u32) -> Value {
    json!({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
}

/// A scripted upstream: each request gets the next behaviour of `script` (the last
/// one repeats). Returns its URL and how many requests it saw.
async fn scripted(script: Vec<&'static str>) -> (String, Arc<AtomicUsize>) {
    let seen = Arc::new(AtomicUsize::new(0));
    let s2 = seen.clone();
    let handler = move || {
        let n = s2.fetch_add(1, Ordering::SeqCst);
        let mode = script[n.min(script.len() - 1)];
        async move {
            let ok = json!({"id": "x", "object": "text_completion", "choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}});
            match mode {
                "ok" => axum::Json(ok).into_response(),
                "500" => (axum::http::StatusCode::INTERNAL_SERVER_ERROR, "{\"error\": {\"message\": \"boom\"}}").into_response(),
                "400" => (axum::http::StatusCode::BAD_REQUEST, axum::Json(json!({"error": {"message": "temperature: must be in [0, 2]", "type": "invalid_request_error", "param": "temperature", "code": 400}}))).into_response(),
                "bad_json" => (axum::http::StatusCode::OK, "{\"choices\": [").into_response(),
                "truncated" => (
                    [(axum::http::header::CONTENT_TYPE, "text/event-stream")],
                    "data: {\"id\":\"x\",\"choices\":[{\"index\":0,\"text\":\"par\",\"finish_reason\":null}]}\n\n",
                )
                    .into_response(),
                _ => unreachable!(),
            }
        }
    };
    let app = axum::Router::new()
        .route("/v1/completions", axum::routing::post(handler))
        .route("/health", axum::routing::get(|| async { "ok" }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, seen)
}

/// A port nothing listens on.
async fn dead_url() -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    drop(l);
    url
}

const FAST_HEALTH: &str = "pagellm_settings:\n  health_check: {interval: 0.2, timeout: 0.5, failure_threshold: 1}\n  metrics_interval: 0.1\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_spreads_and_unknown_models_list_the_known_ones() {
    let dir = tiny_dir();
    let (a, b) = (replica(&dir, None).await, replica(&dir, None).await);
    let yaml = format!(
        "model_list:\n{}{}{}router_settings: {{routing_strategy: simple-shuffle}}\n",
        deployment(MODEL, "a", &a.url),
        deployment(MODEL, "b", &b.url),
        deployment("other", "c", &a.url),
    );
    let (gw, _) = gateway(&yaml).await;
    let mut by = std::collections::HashMap::new();
    let mut texts = std::collections::HashSet::new();
    for _ in 0..6 {
        let r = post(&gw, "/v1/completions", &completion("abc", 5), None).await;
        assert_eq!(r.status, 200, "{}", r.text);
        *by.entry(r.replica.clone().unwrap()).or_insert(0) += 1;
        texts.insert(r.json()["choices"][0]["text"].as_str().unwrap().to_string());
    }
    assert_eq!(by.get("a"), Some(&3), "{by:?}");
    assert_eq!(by.get("b"), Some(&3), "{by:?}");
    assert_eq!(
        texts.len(),
        1,
        "greedy output differs between replicas: {texts:?}"
    );
    let r = post(
        &gw,
        "/v1/completions",
        &json!({"model": "gpt-9", "prompt": "a"}),
        None,
    )
    .await;
    assert_eq!(r.status, 404);
    let m = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(m.contains("gpt-9") && m.contains("tiny, other"), "{m}");
    let models = get(&gw, "/v1/models", None).await.json();
    let ids: Vec<_> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].clone())
        .collect();
    assert_eq!(ids, [json!(MODEL), json!("other")]);
    // The gateway's own errors are OpenAI-shaped.
    let r = client()
        .post(format!("{gw}/v1/completions"))
        .body("{nope")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_before_the_first_byte_move_to_another_replica() {
    let dir = tiny_dir();
    let good = replica(&dir, None).await;
    let dead = dead_url().await;
    let (flaky, flaky_seen) = scripted(vec!["500"]).await;
    let yaml = format!(
        "model_list:\n{}{}{}router_settings: {{routing_strategy: simple-shuffle}}\nlitellm_settings: {{num_retries: 2, allowed_fails: 2, cooldown_time: 60}}\n{FAST_HEALTH}",
        deployment(MODEL, "dead", &dead),
        deployment(MODEL, "flaky", &flaky),
        deployment(MODEL, "good", &good.url),
    );
    let (gw, _) = gateway(&yaml).await;
    for stream in [false, true, false, true] {
        let mut body = completion("abc", 4);
        body["stream"] = json!(stream);
        let r = post(&gw, "/v1/completions", &body, None).await;
        assert_eq!(r.status, 200, "{}", r.text);
        assert_eq!(r.replica.as_deref(), Some("good"));
    }
    let m = get(&gw, "/metrics", None).await.text;
    assert!(
        metric(&m, "pagellm_gateway_retries_total", &[]) >= 2.0,
        "{m}"
    );
    // The replica that answered 500 twice in a row was ejected: it saw no more.
    assert_eq!(
        metric(
            &m,
            "pagellm_gateway_ejections_total",
            &[("replica", "flaky")]
        ),
        1.0,
        "{m}"
    );
    assert_eq!(flaky_seen.load(Ordering::SeqCst), 2);
    assert_eq!(
        metric(
            &m,
            "pagellm_gateway_requests_total",
            &[("replica", "good"), ("status", "200")]
        ),
        4.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_upstreams_give_clear_errors() {
    let (bad_json, _) = scripted(vec!["bad_json"]).await;
    let (truncated, _) = scripted(vec!["truncated"]).await;
    let (client_error, _) = scripted(vec!["400"]).await;
    let (always_500, _) = scripted(vec!["500"]).await;
    let dead = dead_url().await;
    let yaml = format!(
        "model_list:\n{}{}{}{}{}litellm_settings: {{num_retries: 0}}\n",
        deployment("bad-json", "bj", &bad_json),
        deployment("truncated", "tr", &truncated),
        deployment("client-error", "ce", &client_error),
        deployment("server-error", "se", &always_500),
        deployment("down", "dn", &dead),
    );
    let (gw, _) = gateway(&yaml).await;
    let ask = |m: &str, stream: bool| json!({"model": m, "prompt": "a", "stream": stream});
    let r = post(&gw, "/v1/completions", &ask("bad-json", false), None).await;
    assert_eq!(r.status, 502, "{}", r.text);
    assert!(
        r.text.contains("not valid JSON") && r.text.contains("`bj`"),
        "{}",
        r.text
    );
    // Mid-stream, a stream that cannot be continued ends with an error event, after the
    // text already sent.
    let r = post(&gw, "/v1/completions", &ask("truncated", true), None).await;
    assert_eq!(r.status, 200);
    let ev = r.events();
    assert!(ev[0].contains("par"), "{ev:?}");
    let last: Value = serde_json::from_str(ev.last().unwrap()).unwrap();
    assert_eq!(last["error"]["code"], 502, "{ev:?}");
    assert!(!ev.iter().any(|e| e == "[DONE]"), "{ev:?}");
    // Upstream errors pass through with their status and body.
    let r = post(&gw, "/v1/completions", &ask("client-error", false), None).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["param"], "temperature");
    let r = post(&gw, "/v1/completions", &ask("server-error", false), None).await;
    assert_eq!(r.status, 500);
    assert_eq!(r.json()["error"]["message"], "boom");
    // Nothing reachable: 503 with Retry-After.
    let r = post(&gw, "/v1/completions", &ask("down", false), None).await;
    assert_eq!(r.status, 503, "{}", r.text);
    assert!(r.headers.get("retry-after").is_some());
    let r = post(&gw, "/v1/completions", &ask("down", false), None).await;
    assert_eq!(r.status, 503);
    assert_eq!(r.json()["error"]["type"], "service_unavailable");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_comes_back_takes_traffic_again() {
    let dir = tiny_dir();
    let (a, b) = (replica(&dir, None).await, replica(&dir, None).await);
    let link = Link::new(&a.url).await;
    let yaml = format!(
        "model_list:\n{}{}router_settings: {{routing_strategy: least-busy}}\n{FAST_HEALTH}",
        deployment(MODEL, "a", &link.url()),
        deployment(MODEL, "b", &b.url),
    );
    let (gw, g) = gateway(&yaml).await;
    link.cut();
    for _ in 0..4 {
        let r = post(&gw, "/v1/completions", &completion("ab", 2), None).await;
        assert_eq!(
            (r.status, r.replica.as_deref()),
            (200, Some("b")),
            "{}",
            r.text
        );
    }
    let rt = g.runtime();
    let ra = rt.replicas().find(|r| r.dep.id == "a").unwrap().clone();
    assert!(!ra.is_up());
    link.restore().await;
    let t = std::time::Instant::now();
    assert!(eventually(5.0, || ra.is_up()).await, "not readmitted");
    let back = t.elapsed();
    let mut saw_a = false;
    for _ in 0..6 {
        let r = post(&gw, "/v1/completions", &completion("ab", 2), None).await;
        assert_eq!(r.status, 200);
        saw_a |= r.replica.as_deref() == Some("a");
    }
    assert!(saw_a, "the restored replica took no traffic");
    assert!(back < Duration::from_secs(2), "readmitted after {back:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_hangs_up_cancels_the_upstream_request() {
    let a = smollm_replica().await;
    let yaml = format!("model_list:\n{}", deployment(MODEL, "a", &a.url));
    let (gw, _) = gateway(&yaml).await;
    let body = json!({"model": MODEL, "prompt": "abc", "max_tokens": 900, "ignore_eos": true, "stream": true});
    let resp = client()
        .post(format!("{gw}/v1/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let mut s = resp.bytes_stream();
    use futures_util::StreamExt;
    let _ = s.next().await.unwrap().unwrap();
    let running = || async {
        metric(
            &get(&a.url, "/metrics", None).await.text,
            "vllm:num_requests_running",
            &[],
        )
    };
    // The replica publishes its gauges after each step, so the step that sent the first
    // token may not be counted yet when that token arrives: wait for it.
    let until = |want: f64| async move {
        for _ in 0..100 {
            if running().await == want {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    };
    assert!(
        until(1.0).await,
        "the replica never counted the request as running"
    );
    drop(s);
    assert!(
        until(0.0).await,
        "the replica kept running the abandoned request"
    );
    let m = get(&a.url, "/metrics", None).await.text;
    assert_eq!(
        metric(
            &m,
            "vllm:request_success_total",
            &[("finished_reason", "abort")]
        ),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_applies_a_new_config_and_keeps_requests_in_flight() {
    let dir = tiny_dir();
    let (a, b) = (smollm_replica().await, replica(&dir, None).await);
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        file.path(),
        format!("model_list:\n{}", deployment(MODEL, "a", &a.url)),
    )
    .unwrap();
    let text = std::fs::read_to_string(file.path()).unwrap();
    let (gw, g) = gateway_with_path(&text, Some(file.path().to_path_buf())).await;
    // A long stream starts on the old configuration.
    let body = json!({"model": MODEL, "prompt": "abc", "max_tokens": 64, "ignore_eos": true, "stream": true, "temperature": 0});
    let long = tokio::spawn({
        let gw = gw.clone();
        async move { post(&gw, "/v1/completions", &body, None).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    std::fs::write(
        file.path(),
        format!(
            "model_list:\n{}{}",
            deployment(MODEL, "b", &b.url),
            deployment("new", "n", &b.url)
        ),
    )
    .unwrap();
    g.reload().unwrap();
    let r = post(
        &gw,
        "/v1/completions",
        &json!({"model": "new", "prompt": "ab", "max_tokens": 2}),
        None,
    )
    .await;
    assert_eq!((r.status, r.replica.as_deref()), (200, Some("n")));
    let r = post(&gw, "/v1/completions", &completion("ab", 2), None).await;
    assert_eq!(r.replica.as_deref(), Some("b"));
    let long = long.await.unwrap();
    assert_eq!(long.status, 200);
    assert!(
        long.text.ends_with("data: [DONE]\n\n"),
        "the stream in flight was cut"
    );
    // A broken file is refused and the running configuration stays.
    std::fs::write(file.path(), "model_list: [{model_name: x}]\n").unwrap();
    let e = g.reload().unwrap_err().to_string();
    assert!(e.contains("litellm_params") && e.contains("line 1"), "{e}");
    let r = post(
        &gw,
        "/v1/completions",
        &json!({"model": "new", "prompt": "ab", "max_tokens": 2}),
        None,
    )
    .await;
    assert_eq!(r.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployment_rpm_and_tpm_hold_requests_back() {
    let dir = tiny_dir();
    let (a, b) = (replica(&dir, None).await, replica(&dir, None).await);
    let dep = |id: &str, url: &str, limit: &str| {
        format!(
            "  - model_name: {MODEL}\n    litellm_params: {{model: openai/{MODEL}, api_base: \"{url}/v1\", {limit}}}\n    model_info: {{id: {id}}}\n"
        )
    };
    // rpm: a takes 2 a minute, b takes 3; then the group is held back.
    let yaml = format!(
        "model_list:\n{}{}router_settings: {{routing_strategy: simple-shuffle}}\n",
        dep("a", &a.url, "rpm: 2"),
        dep("b", &b.url, "rpm: 3"),
    );
    let (gw, _) = gateway(&yaml).await;
    let mut by = std::collections::HashMap::new();
    for _ in 0..5 {
        let r = post(&gw, "/v1/completions", &completion("abc", 2), None).await;
        assert_eq!(r.status, 200, "{}", r.text);
        *by.entry(r.replica.unwrap()).or_insert(0) += 1;
    }
    assert_eq!((by.get("a"), by.get("b")), (Some(&2), Some(&3)), "{by:?}");
    let r = post(&gw, "/v1/completions", &completion("abc", 2), None).await;
    assert_eq!(r.status, 429, "{}", r.text);
    let wait: u64 = r.headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=60).contains(&wait), "{wait}");
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("rpm/tpm limit"),
        "{}",
        r.text
    );
    let m = get(&gw, "/metrics", None).await.text;
    assert_eq!(
        metric(
            &m,
            "pagellm_gateway_rate_limited_total",
            &[("limit", "deployment")]
        ),
        1.0
    );

    // tpm counts the tokens the replica reports: "hello" is 5 prompt tokens, 4 come
    // back; 9 < 10 lets a second request in, 18 holds the third back.
    let yaml = format!("model_list:\n{}", dep("a", &a.url, "tpm: 10"));
    let (gw, _) = gateway(&yaml).await;
    let ask = json!({"model": MODEL, "prompt": "hello", "max_tokens": 4, "temperature": 0, "ignore_eos": true});
    for stream in [false, true] {
        let mut body = ask.clone();
        body["stream"] = json!(stream);
        let r = post(&gw, "/v1/completions", &body, None).await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
    assert_eq!(post(&gw, "/v1/completions", &ask, None).await.status, 429);
}

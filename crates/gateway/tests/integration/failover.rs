//! Streams that outlive their replica, and routing by the replicas' own KV events.

use std::time::Duration;

use crate::common::*;
use futures_util::StreamExt;
use serde_json::{json, Value};

/// Text of a streamed response body (completions `text` or chat `delta.content`).
fn text_of(body: &str) -> String {
    Reply {
        status: 200,
        replica: None,
        headers: Default::default(),
        text: body.to_string(),
    }
    .stream_text()
}

/// Streams `body` through `gw`; after `cut_after` content chunks, kills the link the
/// gateway named as the serving replica. Returns the whole body.
async fn stream_with_kill(
    gw: &str,
    path: &str,
    body: &Value,
    links: &[(&str, &Link)],
    cut_after: usize,
) -> (String, String) {
    let resp = client()
        .post(format!("{gw}{path}"))
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let first = resp.headers()["x-pagellm-replica"]
        .to_str()
        .unwrap()
        .to_string();
    let mut s = resp.bytes_stream();
    let mut out = String::new();
    let mut cut = false;
    while let Some(c) = tokio::time::timeout(Duration::from_secs(60), s.next())
        .await
        .expect("stream hung")
    {
        out.push_str(std::str::from_utf8(&c.unwrap()).unwrap());
        if !cut && out.matches("data: ").count() > cut_after {
            links.iter().find(|(id, _)| *id == first).unwrap().1.cut();
            cut = true;
        }
    }
    assert!(cut, "the stream ended before the cut: {out}");
    (out, first)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_continues_on_another_replica_with_the_same_text() {
    let (a, b) = (smollm_replica().await, smollm_replica().await);
    let reference = smollm_replica().await;
    let bodies = [
        (
            "/v1/completions",
            json!({"model": MODEL, "prompt": "The history of the printing press", "max_tokens": 40, "temperature": 0, "stream": true}),
        ),
        (
            "/v1/completions",
            json!({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 40, "temperature": 0.8, "top_p": 0.9, "seed": 7, "frequency_penalty": 0.5, "stream": true, "stream_options": {"include_usage": true}}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": [{"role": "user", "content": "List three colours."}], "max_tokens": 40, "temperature": 0.7, "seed": 3, "stop": [" and"], "stream": true}),
        ),
    ];
    for (path, body) in &bodies {
        let direct = post(&reference.url, path, body, None).await;
        assert_eq!(direct.status, 200);
        let want = direct.stream_text();
        for cut_after in [2, 9] {
            let (la, lb) = (Link::new(&a.url).await, Link::new(&b.url).await);
            let yaml = format!(
                "model_list:\n{}{}router_settings: {{routing_strategy: least-busy}}\npagellm_settings:\n  health_check: {{interval: 0.2}}\n",
                deployment(MODEL, "a", &la.url()),
                deployment(MODEL, "b", &lb.url()),
            );
            let (gw, g) = gateway(&yaml).await;
            let rt = g.runtime();
            assert!(
                eventually(5.0, || rt
                    .replicas()
                    .all(|r| r.is_pagellm.load(std::sync::atomic::Ordering::Relaxed)))
                .await,
                "KV events never connected"
            );
            let (got, first) =
                stream_with_kill(&gw, path, body, &[("a", &la), ("b", &lb)], cut_after).await;
            assert_eq!(
                text_of(&got),
                want,
                "{path} {body} cut after {cut_after} chunks on {first}:\n{got}"
            );
            assert!(got.ends_with("data: [DONE]\n\n"), "{got}");
            // One stream id throughout, no second role chunk, usage counts every token.
            let events: Vec<Value> = got
                .split("\n\n")
                .filter_map(|e| e.strip_prefix("data: "))
                .filter(|e| *e != "[DONE]")
                .map(|e| serde_json::from_str(e).unwrap())
                .collect();
            let ids: std::collections::HashSet<_> =
                events.iter().map(|e| e["id"].to_string()).collect();
            assert_eq!(ids.len(), 1, "{ids:?}");
            assert!(
                events
                    .iter()
                    .all(|e| e["choices"][0].get("token_ids").is_none()),
                "token ids leaked to a client that did not ask"
            );
            assert!(
                events
                    .iter()
                    .filter(|e| e["choices"][0]["delta"].get("role").is_some())
                    .count()
                    <= 1
            );
            if body["stream_options"]["include_usage"] == true {
                let u = events
                    .iter()
                    .rev()
                    .find(|e| e["usage"].is_object())
                    .expect("usage chunk");
                assert_eq!(u["usage"]["completion_tokens"], 40, "{u}");
            }
            let m = get(&gw, "/metrics", None).await.text;
            assert_eq!(
                metric(&m, "pagellm_gateway_failovers_total", &[("from", &first)]),
                1.0,
                "{m}"
            );
            // The dashboard's routing log shows the failed attempt and the resumed stream.
            let frame = pagellm_gateway::dashboard::frame(&g);
            let ds = frame["decisions"].as_array().unwrap();
            let other = if first == "a" { "b" } else { "a" };
            assert!(
                ds.iter().any(|d| d["replica"] == first.as_str()
                    && d["outcome"] == "failed: connection"
                    && d["resume"] == false),
                "{frame}"
            );
            assert!(
                ds.iter()
                    .any(|d| d["replica"] == other && d["resume"] == true && d["outcome"] == "200"),
                "{frame}"
            );
            la.cut();
            lb.cut();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefix_aware_routing_matches_the_replicas_own_blocks() {
    let dir = tiny_dir();
    let (a, b) = (replica(&dir, None).await, replica(&dir, None).await);
    let tok = dir.path().to_str().unwrap();
    let yaml = format!(
        "model_list:\n{}{}pagellm_settings:\n  tokenizers: {{{MODEL}: \"{tok}\"}}\n  metrics_interval: 0.05\n",
        deployment(MODEL, "a", &a.url),
        deployment(MODEL, "b", &b.url),
    );
    let (gw, g) = gateway(&yaml).await;
    exact_prefixes_ready(&g, 5.0).await;
    let rt = g.runtime();
    // Two long shared prefixes (one token per character on the tiny model: 4 blocks).
    let p1 = "the quick brown fox jumps over the lazy dog and keeps on running";
    let p2 = "pack my box with five dozen liquor jugs said the sphinx of black";
    let ask = |p: &str, s: usize| json!({"model": MODEL, "prompt": format!("{p} {s}"), "max_tokens": 2, "temperature": 0});
    let first1 = post(&gw, "/v1/completions", &ask(p1, 0), None)
        .await
        .replica
        .unwrap();
    let first2 = post(&gw, "/v1/completions", &ask(p2, 0), None)
        .await
        .replica
        .unwrap();
    assert_ne!(
        first1, first2,
        "idle replicas: the second prefix goes to the other one"
    );
    // The blocks the replica stored reach the gateway as events.
    let holder = rt.replicas().find(|r| r.dep.id == first1).unwrap().clone();
    assert!(eventually(5.0, || holder.prefix.lock().unwrap().exact.len() >= 4).await);
    for s in 1..6 {
        assert_eq!(
            post(&gw, "/v1/completions", &ask(p1, s), None)
                .await
                .replica
                .unwrap(),
            first1
        );
        assert_eq!(
            post(&gw, "/v1/completions", &ask(p2, s), None)
                .await
                .replica
                .unwrap(),
            first2
        );
    }
    // Exact: the gateway's view of each replica equals the replica's own prefix cache.
    for (r, url) in [(&a, "a"), (&b, "b")] {
        let rep = rt.replicas().find(|x| x.dep.id == url).unwrap().clone();
        let m = get(&r.url, "/metrics", None).await.text;
        let hits = metric(&m, "vllm:prefix_cache_hits_total", &[]);
        assert!(
            hits >= 5.0 * 64.0,
            "replica {url}: {hits} cached tokens hit"
        );
        let cached = rep.prefix.lock().unwrap().exact.clone();
        let resp = client()
            .get(format!("{}/v1/kv_events", r.url))
            .send()
            .await
            .unwrap();
        let mut s = resp.bytes_stream();
        let first = String::from_utf8(s.next().await.unwrap().unwrap().to_vec()).unwrap();
        let snap: Value =
            serde_json::from_str(first.trim().strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(snap["type"], "snapshot");
        assert_eq!(snap["block_size"], 16);
        let theirs: std::collections::HashSet<u128> = snap["hashes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| u128::from_str_radix(h.as_str().unwrap(), 16).unwrap())
            .collect();
        assert_eq!(cached, theirs, "replica {url}");
    }
    let m = get(&gw, "/metrics", None).await.text;
    assert!(
        metric(
            &m,
            "pagellm_gateway_routing_decisions_total",
            &[("reason", "prefix_hit")]
        ) >= 10.0,
        "{m}"
    );
    assert!(m.contains("pagellm_gateway_prefix_blocks{replica=\"a\",source=\"kv_events\"}"));
    // The dashboard's frame: both replicas up with their KV events and cached blocks,
    // and the prefix hits in the routing log with the blocks they matched.
    let frame = pagellm_gateway::dashboard::frame(&g);
    let reps = frame["replicas"].as_array().unwrap();
    assert_eq!(reps.len(), 2, "{frame}");
    for r in reps {
        assert_eq!(
            (&r["state"], &r["kind"], &r["kv_events"]),
            (&json!("up"), &json!("pagellm"), &json!(true)),
            "{r}"
        );
        assert!(r["blocks_exact"].as_u64().unwrap() >= 4, "{r}");
        assert_eq!(r["routed"], 6, "{r}");
        assert!(r["kv_usage"].is_number(), "{r}");
    }
    let ds = frame["decisions"].as_array().unwrap();
    assert_eq!(ds.len(), 12, "{frame}");
    let hits: Vec<&Value> = ds.iter().filter(|d| d["reason"] == "prefix_hit").collect();
    assert!(hits.len() >= 10, "{frame}");
    assert!(
        hits.iter().all(|d| d["matched"].as_u64() >= Some(4)
            && d["blocks"].as_u64() >= d["matched"].as_u64()
            && d["outcome"] == "200"),
        "{frame}"
    );
    assert!(
        frame["reasons"]["prefix_hit"].as_u64() >= Some(10),
        "{frame}"
    );
    let rm = get(&a.url, "/metrics", None).await.text;
    assert!(
        rm.contains("vllm:cache_config_info{block_size=\"16\""),
        "{rm}"
    );
}

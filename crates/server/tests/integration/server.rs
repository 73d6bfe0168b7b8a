//! The HTTP server on a real model (smollm2-135m, pulled by scripts/test.sh), on a
//! loopback port chosen by the OS, driven with an ordinary HTTP client: real text,
//! concurrent streams, clients that disconnect, and shutdown.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::common::{completion_stream_text, sse_chunks, sse_events, TestServer};
use pagellm_engine::{Engine, EngineConfig};
use pagellm_model::loader::{load_gguf, LoadedModel};
use pagellm_model::registry;
use pagellm_server::{AppState, ServerConfig};
use serde_json::{json, Value};

const NAME: &str = "smollm2";
const KEY: &str = "sesame";

pub(crate) fn model() -> Arc<LoadedModel> {
    static MODEL: OnceLock<Arc<LoadedModel>> = OnceLock::new();
    MODEL
        .get_or_init(|| {
            let path = registry::pull("smollm2-135m", false)
                .expect("model in cache (scripts/test.sh pulls it)");
            Arc::new(load_gguf(&path).unwrap())
        })
        .clone()
}

fn new_server(grace: Duration) -> TestServer {
    let config = EngineConfig {
        threads: 2,
        kv_cache_memory: 256 << 20,
        max_model_len: Some(512),
        ..EngineConfig::default()
    };
    let state = AppState::with_engine(
        ServerConfig {
            served_model_name: NAME.into(),
            api_key: Some(KEY.into()),
            max_body_bytes: 1 << 20,
            prompt_tokens_details: true,
            ..ServerConfig::new(NAME)
        },
        Engine::start(model(), &config).unwrap(),
    );
    TestServer::start(Arc::new(state), grace)
}

/// One server shared by the tests that do not stop it.
fn shared() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| new_server(Duration::from_secs(1)))
}

fn base() -> &'static str {
    &shared().url
}

fn post(path: &str, body: &str) -> (u16, String) {
    shared().post(path, body)
}

fn post_json(path: &str, body: Value) -> (u16, Value) {
    shared().post_json(path, &body)
}

#[test]
fn completion_is_greedy_text_with_usage_and_timings() {
    let (s, v) = post_json(
        "/v1/completions",
        json!({"model": NAME, "prompt": "The capital of France is", "max_tokens": 2, "temperature": 0}),
    );
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"], " Paris.");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["prompt_tokens"], 5);
    assert_eq!(v["usage"]["completion_tokens"], 2);
    assert_eq!(v["usage"]["total_tokens"], 7);
    assert!(v["usage"]["prompt_tokens_details"]["cached_tokens"].is_u64());
    assert!(v["pagellm_timings"]["ttft_ms"].as_f64().unwrap() > 0.0);
    // Token ids are a prompt too, and give the same answer.
    let (_, w) = post_json(
        "/v1/completions",
        json!({"prompt": [504, 3575, 282, 4649, 314], "max_tokens": 2, "temperature": 0}),
    );
    assert_eq!(w["choices"][0]["text"], " Paris.");
}

#[test]
fn streamed_chat_ends_with_usage_and_done() {
    let body = json!({
        "model": NAME,
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 8, "temperature": 0, "stream": true,
        "stream_options": {"include_usage": true},
    });
    let (s, text) = post("/v1/chat/completions", &body.to_string());
    assert_eq!(s, 200, "{text}");
    let events = sse_events(&text);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let content: String = chunks
        .iter()
        .filter_map(|c| {
            c["choices"].get(0)?["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(usage["completion_tokens"], 8);
    // The same request unstreamed gives the same text.
    let mut plain = body.clone();
    plain["stream"] = json!(false);
    plain.as_object_mut().unwrap().remove("stream_options");
    let (_, v) = post_json("/v1/chat/completions", plain);
    assert_eq!(
        v["choices"][0]["message"]["content"].as_str().unwrap(),
        content
    );
    assert_eq!(v["object"], "chat.completion");
}

#[test]
fn n_choices_and_seeds() {
    let req = json!({"prompt": "Once upon a time", "max_tokens": 12, "temperature": 1.0, "seed": 42, "n": 2});
    let (s, a) = post_json("/v1/completions", req.clone());
    assert_eq!(s, 200, "{a}");
    let (_, b) = post_json("/v1/completions", req);
    assert_eq!(a["choices"].as_array().unwrap().len(), 2);
    assert_eq!(
        a["choices"], b["choices"],
        "the same seed gives the same choices"
    );
    assert_ne!(
        a["choices"][0]["text"], a["choices"][1]["text"],
        "choices differ from each other"
    );
    assert_eq!(a["usage"]["completion_tokens"], 24);
    // Two prompts with two choices each: four choices, each prompt counted once.
    let (s, v) = post_json(
        "/v1/completions",
        json!({"prompt": ["Hello", "The capital of France is"], "max_tokens": 3, "n": 2, "seed": 1, "ignore_eos": true}),
    );
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["choices"].as_array().unwrap().len(), 4);
    assert_eq!(v["usage"]["prompt_tokens"], 1 + 5);
    assert_eq!(v["usage"]["completion_tokens"], 12);
}

#[test]
fn bad_requests_get_openai_errors_naming_the_problem() {
    let err = |path: &str, body: &str, status: u16, param: Option<&str>| {
        let (s, t) = post(path, body);
        assert_eq!(s, status, "{body}: {t}");
        let v: Value = serde_json::from_str(&t).unwrap();
        let e = &v["error"];
        assert!(e["message"].as_str().unwrap().len() > 5, "{v}");
        assert!(e["type"].is_string(), "{v}");
        if let Some(p) = param {
            assert_eq!(e["param"], p, "{v}");
        }
        e["message"].as_str().unwrap().to_string()
    };
    err("/v1/completions", "{not json", 400, None);
    err(
        "/v1/completions",
        r#"{"prompt": "x", "temperature": "hot"}"#,
        400,
        Some("temperature"),
    );
    err(
        "/v1/completions",
        r#"{"prompt": "x", "top_p": 1.5}"#,
        400,
        Some("top_p"),
    );
    err(
        "/v1/completions",
        r#"{"prompt": "x", "n": 0}"#,
        400,
        Some("n"),
    );
    err(
        "/v1/completions",
        r#"{"max_tokens": 3}"#,
        400,
        Some("prompt"),
    );
    let m = err(
        "/v1/completions",
        r#"{"prompt": "x", "max_tokens": 5000}"#,
        400,
        Some("max_tokens"),
    );
    assert!(m.contains("512"), "{m}");
    err(
        "/v1/completions",
        r#"{"model": "gpt-9", "prompt": "x"}"#,
        404,
        Some("model"),
    );
    err(
        "/v1/chat/completions",
        r#"{"messages": []}"#,
        400,
        Some("messages"),
    );
    // Without the key.
    let r = reqwest::blocking::Client::new()
        .get(format!("{}/v1/models", base()))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    // The server still works after all of that.
    let (s, _) = post_json("/v1/completions", json!({"prompt": "Hi", "max_tokens": 1}));
    assert_eq!(s, 200);
}

#[test]
fn models_tokenize_detokenize_health_version() {
    let c = reqwest::blocking::Client::new();
    let v: Value = c
        .get(format!("{}/v1/models", base()))
        .bearer_auth(KEY)
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(v["data"][0]["id"], NAME);
    assert_eq!(v["data"][0]["max_model_len"], 512);
    let (_, t) = post_json("/tokenize", json!({"prompt": "The capital of France is"}));
    assert_eq!(t["tokens"], json!([504, 3575, 282, 4649, 314]));
    assert_eq!(t["count"], 5);
    let (_, d) = post_json(
        "/detokenize",
        json!({"tokens": [504, 3575, 282, 4649, 314]}),
    );
    assert_eq!(d["prompt"], "The capital of France is");
    let (s, _) = post_json("/detokenize", json!({"tokens": [999999]}));
    assert_eq!(s, 400);
    assert_eq!(
        c.get(format!("{}/health", base()))
            .send()
            .unwrap()
            .status()
            .as_u16(),
        200
    );
    let v: Value = c
        .get(format!("{}/version", base()))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert!(v["version"].is_string());
}

/// A streamed greedy completion's text.
fn stream_text(srv: &TestServer, prompt: &str, max_tokens: usize) -> String {
    let body = json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                      "ignore_eos": true, "stream": true});
    let (s, t) = srv.post("/v1/completions", &body.to_string());
    assert_eq!(s, 200, "{t}");
    completion_stream_text(&t)
}

#[test]
fn concurrent_streams_match_their_outputs_alone() {
    let srv = new_server(Duration::from_secs(1));
    let prompts: Vec<String> = (0..32)
        .map(|i| format!("Fact number {i} about the number {}:", i * 7 + 3))
        .collect();
    let alone: Vec<String> = prompts.iter().map(|p| stream_text(&srv, p, 12)).collect();
    let together: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|p| s.spawn(|| stream_text(&srv, p, 12)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, (a, t)) in alone.iter().zip(&together).enumerate() {
        assert_eq!(a, t, "prompt {i} ({:?})", prompts[i]);
    }
    // Outputs are independent: different prompts, mostly different texts.
    let distinct: std::collections::HashSet<&String> = together.iter().collect();
    assert!(distinct.len() > 16, "{together:?}");
}

/// Polls `/metrics` until running requests and KV usage are back to 0.
fn wait_idle(srv: &TestServer, within: Duration) -> Duration {
    let t0 = Instant::now();
    loop {
        let running = srv.metric("vllm:num_requests_running");
        let waiting = srv.metric("vllm:num_requests_waiting");
        let kv = srv.metric("vllm:kv_cache_usage_perc");
        if running == 0.0 && waiting == 0.0 && kv == 0.0 {
            return t0.elapsed();
        }
        assert!(
            t0.elapsed() < within,
            "not idle after {within:?}: running {running}, waiting {waiting}, kv {kv}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn clients_that_disconnect_mid_stream_free_their_requests() {
    let srv = new_server(Duration::from_secs(1));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let url = format!("{}/v1/completions", srv.url);
    rt.block_on(async {
        let client = reqwest::Client::new();
        let tasks: Vec<_> = (0..100)
            .map(|i| {
                let (client, url) = (client.clone(), url.clone());
                tokio::spawn(async move {
                    let body = json!({"prompt": format!("Story {i}: once upon a time"),
                                      "max_tokens": 400, "ignore_eos": true, "stream": true});
                    let mut r = client
                        .post(url)
                        .bearer_auth(KEY)
                        .json(&body)
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(r.status().as_u16(), 200);
                    // Read until a token arrives, then hang up.
                    let mut seen = String::new();
                    while !seen.contains("\"text\":\"") {
                        let c = r.chunk().await.unwrap().expect("stream ended early");
                        seen.push_str(&String::from_utf8_lossy(&c));
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
    });
    drop(rt);
    let took = wait_idle(&srv, Duration::from_secs(10));
    eprintln!("idle {took:?} after 100 disconnects");
    assert_eq!(
        srv.metric("vllm:request_success_total{model_name=\"smollm2\",finished_reason=\"abort\"}"),
        100.0
    );
    // The server still serves.
    assert!(!stream_text(&srv, "Hello", 3).is_empty());
}

#[test]
fn shutdown_lets_running_requests_finish_within_the_grace_period() {
    let mut srv = new_server(Duration::from_secs(60));
    let mut r = srv
        .request(
            "/v1/completions",
            &json!({"prompt": "Count: one, two,", "max_tokens": 24, "ignore_eos": true,
                    "temperature": 0, "stream": true})
            .to_string(),
        )
        .send()
        .unwrap();
    let mut first = [0u8; 1];
    std::io::Read::read_exact(&mut r, &mut first).unwrap();
    srv.signal_shutdown();
    // Read on through the same reader (it buffers what it has read ahead).
    let mut text = String::from_utf8_lossy(&first).into_owned();
    std::io::Read::read_to_string(&mut r, &mut text).unwrap();
    let chunks = sse_chunks(&text);
    let last = &chunks.last().unwrap()["choices"][0];
    assert_eq!(last["finish_reason"], "length", "{text}");
    srv.join().unwrap();
}

#[test]
fn shutdown_aborts_what_outlives_the_grace_period() {
    let mut srv = new_server(Duration::from_millis(300));
    let mut r = srv
        .request(
            "/v1/completions",
            &json!({"prompt": "Count: one, two,", "max_tokens": 480, "ignore_eos": true,
                    "stream": true})
            .to_string(),
        )
        .send()
        .unwrap();
    let mut first = [0u8; 1];
    std::io::Read::read_exact(&mut r, &mut first).unwrap();
    let t0 = Instant::now();
    srv.signal_shutdown();
    // Read on through the same reader (it buffers what it has read ahead).
    let mut text = String::from_utf8_lossy(&first).into_owned();
    std::io::Read::read_to_string(&mut r, &mut text).unwrap();
    let chunks = sse_chunks(&text);
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "abort",
        "{text}"
    );
    srv.join().unwrap();
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    // It no longer listens.
    assert!(TestServer::client()
        .get(format!("{}/health", srv.url))
        .send()
        .is_err());
}

#[test]
fn vllm_parity_fields() {
    let greedy = |extra: Value| {
        let mut body =
            json!({"prompt": "The capital of France is", "max_tokens": 3, "temperature": 0});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        post_json("/v1/completions", body)
    };
    let param = |v: &Value| v["error"]["param"].as_str().unwrap_or_default().to_string();
    // logit_bias pushes one token to the top, and is checked.
    let (s, v) = greedy(json!({"logit_bias": {"4649": 100}, "return_token_ids": true}));
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["choices"][0]["token_ids"], json!([4649, 4649, 4649]));
    for bad in [
        json!({"x": 1}),
        json!({"4649": 150}),
        json!({"99999999": 1}),
        json!({"4649": "a"}),
    ] {
        let (s, v) = greedy(json!({"logit_bias": bad}));
        assert_eq!((s, param(&v)), (400, "logit_bias".into()), "{v}");
    }
    // truncate_prompt_tokens keeps the prompt's tail.
    let (_, v) = greedy(json!({"truncate_prompt_tokens": 2}));
    assert_eq!(v["usage"]["prompt_tokens"], 2, "{v}");
    let (s, v) = greedy(json!({"truncate_prompt_tokens": 0}));
    assert_eq!((s, param(&v)), (400, "truncate_prompt_tokens".into()));
    // echo leads with the prompt, streamed or not; it needs prompt logprobs to combine
    // with logprobs, and means nothing for chat.
    let (_, plain) = greedy(json!({}));
    assert!(plain["choices"][0]["prompt_logprobs"].is_null());
    assert!(plain["choices"][0]
        .as_object()
        .unwrap()
        .contains_key("prompt_logprobs"));
    let (_, v) = greedy(json!({"echo": true}));
    assert_eq!(
        v["choices"][0]["text"].as_str().unwrap(),
        format!(
            "The capital of France is{}",
            plain["choices"][0]["text"].as_str().unwrap()
        )
    );
    let body = json!({"prompt": "The capital of France is", "max_tokens": 3, "temperature": 0,
                      "echo": true, "stream": true});
    let (_, text) = post("/v1/completions", &body.to_string());
    assert_eq!(
        completion_stream_text(&text),
        v["choices"][0]["text"].as_str().unwrap()
    );
    // echo with logprobs: the prompt's tokens lead, the first without a logprob.
    let (s, v) = greedy(json!({"echo": true, "logprobs": 1}));
    assert_eq!(s, 200, "{v}");
    let lp = &v["choices"][0]["logprobs"];
    assert!(lp["token_logprobs"][0].is_null(), "{lp}");
    let n = v["usage"]["prompt_tokens"].as_u64().unwrap() + 3;
    assert_eq!(lp["tokens"].as_array().unwrap().len() as u64, n, "{lp}");
    // One model's card, and a 404 for another.
    let (s, card) = shared().get(&format!("/v1/models/{NAME}"));
    assert_eq!(s, 200, "{card}");
    assert_eq!(serde_json::from_str::<Value>(&card).unwrap()["id"], NAME);
    assert_eq!(shared().get("/v1/models/nope").0, 404);
    // /tokenize renders chat messages as the chat endpoint does, with token texts.
    let (s, t) = post_json(
        "/tokenize",
        json!({"messages": [{"role": "user", "content": "Hi"}], "return_token_strs": true}),
    );
    assert_eq!(s, 200, "{t}");
    let (_, c) = post_json(
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "return_token_ids": true}),
    );
    assert_eq!(t["tokens"], c["prompt_token_ids"]);
    assert_eq!(t["token_strs"][0], "<|im_start|>");
    assert_eq!(
        t["token_strs"].as_array().unwrap().len(),
        t["count"].as_u64().unwrap() as usize
    );
    // Waiting requests by reason, under vLLM's name.
    let (_, m) = shared().get("/metrics");
    assert!(
        m.contains(
            "vllm:num_requests_waiting_by_reason{model_name=\"smollm2\",reason=\"capacity\"}"
        ),
        "{m}"
    );
}

//! The HTTP server on a real model (smollm2-135m, pulled by scripts/test.sh), on a
//! loopback port chosen by the OS, driven with an ordinary HTTP client.

use std::sync::{Arc, OnceLock};

use pagellm_engine::{Engine, EngineConfig};
use pagellm_model::loader::load_gguf;
use pagellm_model::registry;
use pagellm_server::{AppState, ServerConfig};
use serde_json::{json, Value};

const NAME: &str = "smollm2";
const KEY: &str = "sesame";

/// One server for all tests (with an API key), started on first use.
fn base() -> &'static str {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| {
        let path = registry::pull("smollm2-135m", false)
            .expect("model in cache (scripts/test.sh pulls it)");
        let model = Arc::new(load_gguf(&path).unwrap());
        let config = EngineConfig {
            threads: 2,
            kv_cache_memory: 256 << 20,
            max_model_len: Some(512),
            ..EngineConfig::default()
        };
        let state = Arc::new(AppState::with_engine(
            ServerConfig {
                served_model_name: NAME.into(),
                api_key: Some(KEY.into()),
                max_body_bytes: 1 << 20,
            },
            Engine::start(model, &config).unwrap(),
        ));
        let rt = tokio::runtime::Runtime::new().unwrap();
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            rt.block_on(pagellm_server::serve(
                listener,
                state,
                std::future::pending(),
                std::time::Duration::from_secs(1),
            ))
            .unwrap();
        });
        url
    })
}

fn post(path: &str, body: &str) -> (u16, String) {
    let r = reqwest::blocking::Client::new()
        .post(format!("{}{path}", base()))
        .bearer_auth(KEY)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .unwrap();
    (r.status().as_u16(), r.text().unwrap())
}

fn post_json(path: &str, body: Value) -> (u16, Value) {
    let (s, t) = post(path, &body.to_string());
    (
        s,
        serde_json::from_str(&t).unwrap_or_else(|_| panic!("not JSON: {t}")),
    )
}

/// The `data:` payloads of a server-sent event stream.
fn sse_events(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
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

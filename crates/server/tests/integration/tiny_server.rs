//! The server end to end on a tiny model written by the test (a Llama-shaped
//! checkpoint of two layers with a 40-character tokenizer), on a loopback port
//! chosen by the OS: every endpoint, the error contract, loading and overload.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::common::{completion_stream_text, sse_chunks, TestServer};
use pagellm_engine::{Engine, EngineConfig};
use pagellm_model::loader::load_model;
use pagellm_server::{AppState, ServerConfig};
use safetensors::Dtype;
use serde_json::{json, Value};

const NAME: &str = "tiny";
const KEY: &str = "open-sesame";

fn server_config() -> ServerConfig {
    ServerConfig {
        served_model_name: NAME.into(),
        api_key: Some(KEY.into()),
        max_body_bytes: 64 << 10,
        ..ServerConfig::new(NAME)
    }
}

fn engine(dir: &Path, max_waiting: Option<usize>) -> Engine {
    let model = Arc::new(load_model(dir.to_str().unwrap()).unwrap());
    let config = EngineConfig {
        threads: 1,
        kv_cache_memory: 8 << 20,
        max_waiting_requests: max_waiting,
        ..EngineConfig::default()
    };
    Engine::start(model, &config).unwrap()
}

fn tiny_dir() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    pagellm_testkit::write_tiny_model(tmp.path(), "LlamaForCausalLM", Dtype::F32);
    tmp
}

fn start(max_waiting: Option<usize>) -> (tempfile::TempDir, TestServer) {
    let dir = tiny_dir();
    let state = AppState::with_engine(server_config(), engine(dir.path(), max_waiting));
    (
        dir,
        TestServer::start(Arc::new(state), Duration::from_secs(5)),
    )
}

/// Asserts an OpenAI error body with this status, type and (when given) param.
fn assert_error(r: (u16, String), status: u16, kind: &str, param: Option<&str>) -> String {
    let (s, t) = r;
    assert_eq!(s, status, "{t}");
    let v: Value = serde_json::from_str(&t).unwrap_or_else(|_| panic!("not JSON: {t}"));
    let e = &v["error"];
    assert_eq!(e["type"], kind, "{v}");
    assert_eq!(e["code"], status, "{v}");
    if let Some(p) = param {
        assert_eq!(e["param"], p, "{v}");
    }
    e["message"].as_str().unwrap().to_string()
}

#[test]
fn health_is_503_until_the_model_is_loaded() {
    let state = Arc::new(AppState::new(server_config()));
    let srv = TestServer::start(state.clone(), Duration::from_secs(1));
    assert_eq!(srv.get("/health").0, 503);
    let m = assert_error(
        srv.post("/v1/completions", r#"{"prompt": "ab"}"#),
        503,
        "service_unavailable",
        None,
    );
    assert!(m.contains("loading"), "{m}");
    // /metrics answers while loading, with zeros; the dashboard's stream says so.
    assert_eq!(srv.metric("vllm:num_requests_running"), 0.0);
    let f = srv.frames("/dashboard/events", 1).unwrap();
    assert_eq!(
        (&f[0]["loading"], &f[0]["model"]),
        (&json!(true), &json!(NAME))
    );
    let dir = tiny_dir();
    state.set_engine(engine(dir.path(), None));
    assert_eq!(srv.get("/health").0, 200);
    let (s, v) = srv.post_json("/v1/completions", &json!({"prompt": "ab", "max_tokens": 2}));
    assert_eq!(s, 200, "{v}");
}

#[test]
fn completions_chat_streaming_logprobs_and_metrics() {
    let (_dir, srv) = start(None);
    let req = json!({"model": NAME, "prompt": "hello world", "max_tokens": 12,
                     "temperature": 0, "ignore_eos": true, "logprobs": 3});
    let (s, v) = srv.post_json("/v1/completions", &req);
    assert_eq!(s, 200, "{v}");
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(v["usage"]["prompt_tokens"], 11);
    assert_eq!(v["usage"]["completion_tokens"], 12);
    // Greedy: each chosen token is the most likely one, and logprobs are <= 0.
    let lp = &choice["logprobs"];
    let chosen = lp["token_logprobs"].as_array().unwrap();
    assert_eq!(chosen.len(), 12);
    for (i, top) in lp["top_logprobs"].as_array().unwrap().iter().enumerate() {
        let top = top.as_object().unwrap();
        assert!(!top.is_empty() && top.len() <= 3, "{top:?}");
        let best = top
            .values()
            .map(|x| x.as_f64().unwrap())
            .fold(f64::MIN, f64::max);
        let c = chosen[i].as_f64().unwrap();
        assert!(
            c <= 0.0 && (c - best).abs() < 1e-5,
            "token {i}: {c} vs best {best}"
        );
    }
    // Streaming gives the same text; text of the tokens adds up to the text.
    let mut sreq = req.clone();
    sreq["stream"] = json!(true);
    let (s, t) = srv.post("/v1/completions", &sreq.to_string());
    assert_eq!(s, 200, "{t}");
    assert_eq!(completion_stream_text(&t), choice["text"].as_str().unwrap());
    let tokens: String = lp["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap())
        .collect();
    assert_eq!(tokens, choice["text"].as_str().unwrap());

    // Chat renders the template (`{{ messages[0].content }}`): the same prompt.
    let (s, c) = srv.post_json(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "hello world"}]}],
                "max_tokens": 12, "temperature": 0, "ignore_eos": true,
                "logprobs": true, "top_logprobs": 2}),
    );
    assert_eq!(s, 200, "{c}");
    assert_eq!(c["choices"][0]["message"]["content"], choice["text"]);
    let content = c["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 12);
    assert_eq!(content[0]["top_logprobs"].as_array().unwrap().len(), 2);
    assert_eq!(
        content[0]["top_logprobs"][0]["logprob"],
        content[0]["logprob"]
    );

    // A streamed chat carries a role chunk first and usage last.
    let (_, t) = srv.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "abc"}], "max_tokens": 5,
                "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true}})
        .to_string(),
    );
    let chunks = sse_chunks(&t);
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(chunks.last().unwrap()["usage"]["completion_tokens"], 5);

    // Metrics count what was served: 3 requests of 12 tokens and one of 5.
    let (s, text) = srv.get("/metrics");
    assert_eq!(s, 200);
    let labels = format!("{{model_name=\"{NAME}\"}}");
    assert!(
        text.contains(&format!("vllm:generation_tokens_total{labels} 41\n")),
        "{text}"
    );
    assert!(text.contains(&format!(
        "vllm:time_to_first_token_seconds_count{labels} 4\n"
    )));
    assert!(text.contains(&format!(
        "vllm:inter_token_latency_seconds_count{labels} 37\n"
    )));
    assert!(text.contains(&format!(
        "vllm:request_success_total{{model_name=\"{NAME}\",finished_reason=\"length\"}} 4\n"
    )));
    assert_eq!(srv.metric("vllm:num_requests_running"), 0.0);
    assert_eq!(srv.metric("vllm:kv_cache_usage_perc"), 0.0);
}

#[test]
fn bad_input_gets_openai_errors_and_harms_nothing() {
    let (_dir, srv) = start(None);
    let bad = "invalid_request_error";
    assert_error(srv.post("/v1/completions", "{not json"), 400, bad, None);
    assert_error(srv.post("/v1/completions", "[1, 2]"), 400, bad, None);
    for (body, param) in [
        (r#"{"prompt": "ab", "max_tokens": "ten"}"#, "max_tokens"),
        (r#"{"prompt": "ab", "temperature": -1}"#, "temperature"),
        (r#"{"prompt": "ab", "top_p": 0}"#, "top_p"),
        (r#"{"prompt": "ab", "n": 17}"#, "n"),
        (r#"{"prompt": "ab", "logprobs": 21}"#, "logprobs"),
        (r#"{"prompt": "ab", "best_of": 2}"#, "best_of"),
        (
            r#"{"prompt": "ab", "logit_bias": {"1": 101}}"#,
            "logit_bias",
        ),
        (r#"{"prompt": "ab", "guided_regex": "[a-"}"#, "guided_regex"),
        (
            r#"{"prompt": "ab", "prompt_logprobs": 1, "stream": true}"#,
            "prompt_logprobs",
        ),
        (r#"{"prompt": []}"#, "prompt"),
        (r#"{"prompt": [99999]}"#, "prompt"),
    ] {
        assert_error(srv.post("/v1/completions", body), 400, bad, Some(param));
    }
    // The tiny model's context is 128 tokens.
    let m = assert_error(
        srv.post("/v1/completions", r#"{"prompt": "ab", "max_tokens": 500}"#),
        400,
        bad,
        Some("max_tokens"),
    );
    assert!(m.contains("128"), "{m}");
    for (body, param) in [
        (r#"{"messages": "hi"}"#, "messages"),
        (
            r#"{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}"#,
            "messages",
        ),
        (
            r#"{"messages": [{"role": "user", "content": "a"}], "logprobs": 2}"#,
            "logprobs",
        ),
        (
            r#"{"messages": [{"role": "user", "content": "a"}], "top_logprobs": 2}"#,
            "top_logprobs",
        ),
    ] {
        assert_error(
            srv.post("/v1/chat/completions", body),
            400,
            bad,
            Some(param),
        );
    }
    assert_error(
        srv.post("/v1/completions", r#"{"model": "gpt-9", "prompt": "ab"}"#),
        404,
        "not_found_error",
        Some("model"),
    );
    let big = format!(r#"{{"prompt": "{}"}}"#, "a".repeat(100 << 10));
    assert_error(srv.post("/v1/completions", &big), 413, bad, None);
    assert_error(srv.get("/v2/nothing"), 404, "not_found_error", None);
    assert_error(srv.get("/v1/completions"), 405, bad, None);
    let no_key = TestServer::client()
        .post(format!("{}/v1/completions", srv.url))
        .body(r#"{"prompt": "ab"}"#)
        .send()
        .unwrap();
    let status = no_key.status().as_u16();
    assert_error(
        (status, no_key.text().unwrap()),
        401,
        "authentication_error",
        None,
    );
    // Nothing leaked: no request left running or holding blocks, and the server works.
    assert_eq!(srv.metric("vllm:num_requests_running"), 0.0);
    assert_eq!(srv.metric("vllm:num_requests_waiting"), 0.0);
    assert_eq!(srv.metric("vllm:kv_cache_usage_perc"), 0.0);
    let (s, v) = srv.post_json("/v1/completions", &json!({"prompt": "ab", "max_tokens": 3}));
    assert_eq!(s, 200, "{v}");
}

#[test]
fn a_full_queue_answers_429_with_retry_after() {
    // No room to wait at all: every generation request is refused, nothing else is.
    let (_dir, srv) = start(Some(0));
    let r = srv
        .request("/v1/completions", r#"{"prompt": "ab"}"#)
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 429);
    assert_eq!(r.headers()["retry-after"], "1");
    let m = assert_error((429, r.text().unwrap()), 429, "rate_limit_error", None);
    assert!(m.contains("--max-waiting-requests"), "{m}");
    let (s, v) = srv.post_json("/tokenize", &json!({"prompt": "ab"}));
    assert_eq!((s, v["count"].clone()), (200, json!(2)), "{v}");
}

#[test]
fn models_tokenize_detokenize_version() {
    let (_dir, srv) = start(None);
    let (_, t) = srv.get("/v1/models");
    let v: Value = serde_json::from_str(&t).unwrap();
    assert_eq!(v["data"][0]["id"], NAME);
    assert_eq!(v["data"][0]["max_model_len"], 128);
    let (_, t) = srv.post_json("/tokenize", &json!({"prompt": "bad cab"}));
    assert_eq!(t["tokens"], json!([1, 0, 3, 26, 2, 0, 1]));
    let (_, d) = srv.post_json("/detokenize", &json!({"tokens": [1, 0, 3, 26, 2, 0, 1]}));
    assert_eq!(d["prompt"], "bad cab");
    assert_error(
        srv.post("/detokenize", r#"{"tokens": [40]}"#),
        400,
        "invalid_request_error",
        Some("tokens"),
    );
    let (s, t) = srv.get("/version");
    assert_eq!(s, 200);
    assert!(t.contains(env!("CARGO_PKG_VERSION")), "{t}");
}

#[test]
fn dashboard_page_and_its_live_stream() {
    let (_dir, srv) = start(None);
    let (s, html) = srv.get("/");
    assert_eq!(s, 200);
    assert!(html.contains("<title>pagellm</title>") && html.contains("/dashboard/app.js"));
    for (path, kind) in [
        ("/dashboard/app.js", "text/javascript"),
        ("/dashboard/style.css", "text/css"),
    ] {
        let r = TestServer::client()
            .get(format!("{}{path}", srv.url))
            .send()
            .unwrap();
        assert_eq!(r.status(), 200, "{path}");
        let ct = r.headers()["content-type"].to_str().unwrap().to_string();
        assert!(ct.starts_with(kind), "{path}: {ct}");
        assert!(r.text().unwrap().len() > 1000, "{path}");
    }
    // Like the API, the stream wants the key (the page itself is public).
    let r = TestServer::client()
        .get(format!("{}/dashboard/events", srv.url))
        .send()
        .unwrap();
    assert_eq!(r.status(), 401);

    let limits = srv.state.loaded_engine().unwrap().limits();
    let idle = &srv.frames("/dashboard/events", 1).unwrap()[0];
    assert_eq!(idle["model"], NAME);
    assert_eq!(idle["block_size"], limits.block_size);
    let map = idle["blocks"].as_str().unwrap();
    assert_eq!(map.len(), limits.num_blocks);
    assert!(map.chars().all(|c| c == '.'), "{map}");
    assert_eq!(idle["requests"], json!([]));
    assert_eq!(idle["stats"]["generation_tokens"], 0);

    // The full blocks of the request's computed tokens (all but the last sampled one)
    // stay cached after it ends.
    let prompt = "abcdefghij".repeat(4);
    let (s, v) = srv.post_json(
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 5, "temperature": 0, "ignore_eos": true}),
    );
    assert_eq!(s, 200, "{v}");
    let after = &srv.frames("/dashboard/events", 1).unwrap()[0];
    let st = &after["stats"];
    assert_eq!(st["generation_tokens"], 5, "{after}");
    assert_eq!(st["prompt_tokens"], v["usage"]["prompt_tokens"]);
    assert_eq!((&st["ttft_count"], &st["finished"]), (&json!(1), &json!(1)));
    let map = after["blocks"].as_str().unwrap();
    let computed = v["usage"]["prompt_tokens"].as_u64().unwrap() as usize + 5 - 1;
    let full = computed / limits.block_size;
    assert!(full >= 2);
    assert_eq!(map.chars().filter(|&c| c == 'c').count(), full, "{map}");
    assert!(!map.contains(['u', 's']), "{map}");
    assert!(after["step"].as_u64().unwrap() >= 5);
}

#[test]
fn prompt_logprobs_and_echo_with_logprobs() {
    let (_dir, srv) = start(None);
    let (s, v) = srv.post_json(
        "/v1/completions",
        &json!({"prompt": "bad cab", "max_tokens": 3, "temperature": 0,
                "prompt_logprobs": 2, "return_token_ids": true}),
    );
    assert_eq!(s, 200, "{v}");
    let ids = v["choices"][0]["prompt_token_ids"]
        .as_array()
        .unwrap()
        .clone();
    let plp = v["choices"][0]["prompt_logprobs"].as_array().unwrap();
    assert_eq!(plp.len(), ids.len());
    assert!(plp[0].is_null());
    for (i, entry) in plp.iter().enumerate().skip(1) {
        let m = entry.as_object().unwrap();
        // The prompt token itself, then the two most likely (one may be the same).
        let own = &m[&ids[i].to_string()];
        assert!((2..=3).contains(&m.len()), "{m:?}");
        assert!(own["logprob"].as_f64().unwrap() <= 0.0);
        assert!(own["rank"].as_u64().unwrap() >= 1);
        assert!(own["decoded_token"].is_string());
        assert!(m.values().any(|e| e["rank"] == 1), "{m:?}");
    }

    // echo with logprobs: the prompt's tokens lead, the first without a logprob.
    let (s, v) = srv.post_json(
        "/v1/completions",
        &json!({"prompt": "bad cab", "max_tokens": 3, "temperature": 0, "echo": true,
                "logprobs": 1}),
    );
    assert_eq!(s, 200, "{v}");
    let lp = &v["choices"][0]["logprobs"];
    let n = ids.len() + 3;
    assert_eq!(lp["tokens"].as_array().unwrap().len(), n, "{lp}");
    assert!(lp["token_logprobs"][0].is_null() && lp["top_logprobs"][0].is_null());
    for i in 1..n {
        assert!(lp["token_logprobs"][i].as_f64().unwrap() <= 0.0);
        let top = lp["top_logprobs"][i].as_object().unwrap();
        assert!((1..=2).contains(&top.len()), "{top:?}");
    }
    assert!(v["choices"][0]["text"]
        .as_str()
        .unwrap()
        .starts_with("bad cab"));

    // Chat: at the top level.
    let (s, v) = srv.post_json(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "abcdef"}], "max_tokens": 2,
                "prompt_logprobs": 0}),
    );
    assert_eq!(s, 200, "{v}");
    let plp = v["prompt_logprobs"].as_array().unwrap();
    assert_eq!(
        plp.len() as u64,
        v["usage"]["prompt_tokens"].as_u64().unwrap()
    );
    // No alternatives: each map holds the prompt token alone.
    assert!(plp[0].is_null() && plp[1..].iter().all(|m| m.as_object().unwrap().len() == 1));

    for (body, param) in [
        (
            json!({"prompt": "ab", "prompt_logprobs": 1, "stream": true}),
            "prompt_logprobs",
        ),
        (
            json!({"prompt": "ab", "prompt_logprobs": -1}),
            "prompt_logprobs",
        ),
        (
            json!({"prompt": "ab", "prompt_logprobs": -2}),
            "prompt_logprobs",
        ),
        (
            json!({"prompt": "ab", "prompt_logprobs": 21}),
            "prompt_logprobs",
        ),
        (
            json!({"prompt": "ab", "prompt_logprobs": "1"}),
            "prompt_logprobs",
        ),
        (
            json!({"prompt": "ab", "echo": true, "logprobs": 1, "stream": true}),
            "echo",
        ),
    ] {
        assert_error(
            srv.post("/v1/completions", &body.to_string()),
            400,
            "invalid_request_error",
            Some(param),
        );
    }
}

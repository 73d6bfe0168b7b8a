//! vLLM's request options and opt-in server switches on a real model (smollm2-135m):
//! chat rendering (`add_generation_prompt`, `continue_final_message`, chat `echo`),
//! `/invocations`, `truncation_side`, `allowed_token_ids` with `logprob_token_ids`, seed
//! bounds, usage in every streamed chunk, `/tokenizer_info`, and vLLM's per-request and
//! per-step histograms in `/metrics`.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use crate::common::{sse_chunks, TestServer};
use crate::server::model;
use pagellm_engine::{Engine, EngineConfig};
use pagellm_server::{AppState, ServerConfig};
use serde_json::{json, Value};

fn server(switches: impl FnOnce(&mut ServerConfig)) -> TestServer {
    let config = EngineConfig {
        threads: 2,
        kv_cache_memory: 64 << 20,
        max_model_len: Some(512),
        ..EngineConfig::default()
    };
    let mut sc = ServerConfig::new("smollm2");
    switches(&mut sc);
    let state = AppState::with_engine(sc, Engine::start(model(), &config).unwrap());
    TestServer::start(Arc::new(state), Duration::from_secs(1))
}

fn ok(r: (u16, Value)) -> Value {
    assert_eq!(r.0, 200, "{}", r.1);
    r.1
}

fn bad(r: (u16, Value), param: &str) -> String {
    assert_eq!(r.0, 400, "{}", r.1);
    assert_eq!(r.1["error"]["param"], param, "{}", r.1);
    r.1["error"]["message"].as_str().unwrap().to_string()
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect()
}

#[test]
fn chat_rendering_options_echo_and_invocations() {
    let srv = server(|_| {});
    let conv = json!([{"role": "user", "content": "Hi there!"},
                      {"role": "assistant", "content": "Nice to meet you!"},
                      {"role": "user", "content": "Can I ask a question?"}]);
    let tokenize = |extra: Value| {
        let mut body = json!({"messages": conv});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        ids(&ok(srv.post_json("/tokenize", &body))["tokens"])
    };
    let with = tokenize(json!({}));
    let without = tokenize(json!({"add_generation_prompt": false}));
    assert!(with.len() > without.len() && with.starts_with(&without));
    let opening = ok(srv.post_json("/detokenize", &json!({"tokens": with[without.len()..]})));
    assert!(
        opening["prompt"].as_str().unwrap().contains("assistant"),
        "{opening}"
    );

    // The model continues the final message: the prompt ends inside it.
    let mut cont = conv.clone();
    cont.as_array_mut()
        .unwrap()
        .push(json!({"role": "assistant", "content": "The capital of France is"}));
    let body =
        json!({"messages": cont, "add_generation_prompt": false, "continue_final_message": true});
    let toks = ids(&ok(srv.post_json("/tokenize", &body))["tokens"]);
    let text = ok(srv.post_json("/detokenize", &json!({"tokens": toks})));
    assert!(
        text["prompt"]
            .as_str()
            .unwrap()
            .ends_with("The capital of France is"),
        "{text}"
    );
    let both = json!({"messages": cont, "continue_final_message": true});
    bad(srv.post_json("/tokenize", &both), "continue_final_message");
    bad(
        srv.post_json("/v1/chat/completions", &both),
        "continue_final_message",
    );

    // Chat echo leads the reply with the assistant's own last message.
    let chat = |echo: bool| {
        let v = ok(srv.post_json(
            "/v1/chat/completions",
            &json!({"messages": cont, "add_generation_prompt": false, "continue_final_message": true,
                    "echo": echo, "max_tokens": 4, "temperature": 0}),
        ));
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (echoed, plain) = (chat(true), chat(false));
    assert_eq!(echoed, format!("The capital of France is{plain}"));
    let (_, streamed) = srv.post(
        "/v1/chat/completions",
        &json!({"messages": cont, "add_generation_prompt": false, "continue_final_message": true,
                "echo": true, "max_tokens": 4, "temperature": 0, "stream": true})
        .to_string(),
    );
    let text: String = sse_chunks(&streamed)
        .iter()
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert_eq!(text, echoed);

    // SageMaker's /invocations: the chat or the completion its body is.
    let req = json!({"messages": conv, "max_tokens": 5, "temperature": 0});
    let a = ok(srv.post_json("/v1/chat/completions", &req));
    let b = ok(srv.post_json("/invocations", &req));
    assert_eq!(a["choices"], b["choices"]);
    let c = ok(srv.post_json("/invocations", &json!({"prompt": "Hello", "max_tokens": 2})));
    assert_eq!(c["object"], "text_completion");
    assert_eq!(
        srv.post_json("/invocations", &json!({"max_tokens": 2})).0,
        400
    );
}

#[test]
fn truncation_side_allowed_and_pinned_logprob_tokens_and_seed_bounds() {
    let srv = server(|_| {});
    let prompt: Vec<u64> = (1..=8).map(|i| i * 100).collect();
    let truncated = |side: &str| {
        let v = ok(srv.post_json(
            "/v1/completions",
            &json!({"prompt": prompt, "max_tokens": 1, "return_token_ids": true,
                    "truncate_prompt_tokens": 4, "truncation_side": side}),
        ));
        ids(&v["choices"][0]["prompt_token_ids"])
    };
    assert_eq!(truncated("right"), prompt[..4]);
    assert_eq!(truncated("left"), prompt[4..]);
    bad(
        srv.post_json(
            "/v1/completions",
            &json!({"prompt": prompt, "truncate_prompt_tokens": 4, "truncation_side": "middle"}),
        ),
        "truncation_side",
    );

    // Only 42 may be sampled; the alternatives reported are 5000 (pinned) and 42.
    let v = ok(srv.post_json(
        "/v1/completions",
        &json!({"prompt": "Hello", "max_tokens": 1, "temperature": 0, "logprobs": 5,
                "allowed_token_ids": [42], "logprob_token_ids": [5000],
                "return_tokens_as_token_ids": true}),
    ));
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"], json!(["token_id:42"]), "{v}");
    let keys: BTreeSet<&str> = lp["top_logprobs"][0]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(keys, BTreeSet::from(["token_id:42", "token_id:5000"]));
    // Chat, sampled at a high temperature: never outside the allowed set.
    let v = ok(srv.post_json(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6,
                "temperature": 1.5, "seed": 5, "logprobs": true, "allowed_token_ids": [42, 43],
                "logprob_token_ids": [100, 5000], "return_tokens_as_token_ids": true}),
    ));
    for c in v["choices"][0]["logprobs"]["content"].as_array().unwrap() {
        let tok = c["token"].as_str().unwrap();
        assert!(tok == "token_id:42" || tok == "token_id:43", "{c}");
        let top: Vec<(&str, f64)> = c["top_logprobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| (t["token"].as_str().unwrap(), t["logprob"].as_f64().unwrap()))
            .collect();
        let names: BTreeSet<&str> = top.iter().map(|t| t.0).collect();
        assert_eq!(
            names,
            BTreeSet::from([tok, "token_id:100", "token_id:5000"]),
            "{c}"
        );
        assert!(top.windows(2).all(|w| w[0].1 >= w[1].1), "{c}");
    }
    for (body, param) in [
        (
            json!({"prompt": "a", "allowed_token_ids": []}),
            "allowed_token_ids",
        ),
        (
            json!({"prompt": "a", "allowed_token_ids": [10_000_000]}),
            "allowed_token_ids",
        ),
        (
            json!({"prompt": "a", "logprob_token_ids": [5]}),
            "logprob_token_ids",
        ),
    ] {
        let (s, v) = srv.post_json("/v1/completions", &body);
        assert_eq!(s, 400, "{body}: {v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(param),
            "{v}"
        );
    }

    // Seeds: the whole i64 range, and past it an error naming the bound crossed.
    let seeded = |seed: &str| {
        srv.post(
            "/v1/completions",
            &format!(r#"{{"prompt": "a", "max_tokens": 1, "seed": {seed}}}"#),
        )
    };
    assert_eq!(seeded("-9223372036854775808").0, 200);
    assert_eq!(seeded("9223372036854775807").0, 200);
    for (seed, word) in [
        ("9223372036854775808", "less_than_equal"),
        ("-9223372036854775809", "greater_than_equal"),
    ] {
        let (s, t) = seeded(seed);
        assert!(s == 400 && t.contains(word), "{seed}: {s} {t}");
    }
}

/// Checks a stream where every chunk carries usage: completion tokens grow with each
/// choice chunk, and the final usage chunk repeats the last count. Returns that count.
fn check_continuous_usage(text: &str) -> u64 {
    let chunks = sse_chunks(text);
    let mut last = 0;
    for c in &chunks {
        let u = &c["usage"];
        let (p, n) = (
            u["prompt_tokens"].as_u64().unwrap(),
            u["completion_tokens"].as_u64().unwrap(),
        );
        assert_eq!(u["total_tokens"].as_u64(), Some(p + n), "{c}");
        let has_choice = !c["choices"].as_array().unwrap().is_empty();
        if has_choice && last > 0 {
            assert!(n > last, "usage did not grow: {c}");
        }
        if !has_choice {
            assert_eq!(n, last, "{c}");
        }
        last = n;
    }
    assert!(chunks.last().unwrap()["choices"]
        .as_array()
        .unwrap()
        .is_empty());
    last
}

#[test]
fn opt_in_switches_usage_in_every_chunk_and_tokenizer_info() {
    let plain = server(|_| {});
    let ask =
        json!({"prompt": "Once upon a time", "max_tokens": 6, "ignore_eos": true, "logprobs": 1});
    let v = ok(plain.post_json("/v1/completions", &ask));
    assert!(v["usage"].get("prompt_tokens_details").is_none(), "{v}");
    assert!(v.get("metrics").is_none(), "{v}");
    assert!(!v["choices"][0]["logprobs"]["tokens"][0]
        .as_str()
        .unwrap()
        .starts_with("token_id:"));
    assert_eq!(plain.get("/tokenizer_info").0, 404);
    let mut streamed = ask.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true, "continuous_usage_stats": true});
    assert_eq!(
        check_continuous_usage(&plain.post("/v1/completions", &streamed.to_string()).1),
        6
    );

    let switched = server(|c| {
        c.prompt_tokens_details = true;
        c.force_include_usage = true;
        c.tokens_as_token_ids = true;
        c.tokenizer_info = true;
        c.per_request_metrics = true;
    });
    let v = ok(switched.post_json("/v1/completions", &ask));
    assert!(
        v["usage"]["prompt_tokens_details"]["cached_tokens"].is_u64(),
        "{v}"
    );
    let m = &v["metrics"];
    for k in [
        "time_to_first_token_ms",
        "queue_time_ms",
        "generation_time_ms",
        "mean_itl_ms",
    ] {
        assert!(m[k].as_f64().is_some_and(|x| x >= 0.0), "{k}: {v}");
    }
    assert!(m["tokens_per_second"].as_f64().unwrap() > 0.0, "{v}");
    assert!(v["choices"][0]["logprobs"]["tokens"][0]
        .as_str()
        .unwrap()
        .starts_with("token_id:"));
    // Usage in every chunk of a stream that did not ask for it.
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5,
                      "ignore_eos": true, "stream": true});
    let (_, text) = switched.post("/v1/chat/completions", &chat.to_string());
    assert_eq!(check_continuous_usage(&text), 5);
    let chunks = sse_chunks(&text);
    assert!(chunks[..chunks.len() - 1]
        .iter()
        .all(|c| c.get("metrics").is_none()));
    assert!(chunks.last().unwrap()["metrics"]["time_to_first_token_ms"].is_number());
    let (s, info) = switched.get("/tokenizer_info");
    assert_eq!(s, 200, "{info}");
    let info: Value = serde_json::from_str(&info).unwrap();
    assert_eq!(info["eos_token"], "<|im_end|>", "{info}");
    assert!(info["chat_template"].as_str().unwrap().contains("im_start"));
    assert_eq!(info["model_max_length"], 512);
    let added = info["added_tokens_decoder"].as_object().unwrap();
    assert!(
        added
            .values()
            .any(|t| t["content"] == "<|im_start|>" && t["special"] == true),
        "{info}"
    );
}

#[test]
fn vllm_request_and_step_histograms_count_every_request() {
    let srv = server(|_| {});
    let prompt: Vec<u64> = (1..=6).map(|i| 1000 + i).collect();
    for _ in 0..3 {
        ok(srv.post_json(
            "/v1/completions",
            &json!({"prompt": prompt, "max_tokens": 4, "ignore_eos": true, "temperature": 0}),
        ));
    }
    let m = |name: &str| srv.metric(name);
    // One observation per step: the first token's step counts the whole prompt plus
    // the token, each later step its one token.
    assert_eq!(m("vllm:iteration_tokens_total_count"), 12.0);
    assert_eq!(m("vllm:iteration_tokens_total_sum"), 3.0 * (6.0 + 4.0));
    // n = 2: one observation of n for the request, two of each per-choice histogram;
    // its steps hold both choices, so the tokens add up the same way.
    ok(srv.post_json(
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 4, "ignore_eos": true, "n": 2, "seed": 1}),
    ));
    assert_eq!(m("vllm:iteration_tokens_total_sum"), 5.0 * (6.0 + 4.0));
    assert_eq!(m("vllm:request_prompt_tokens_count"), 5.0);
    assert_eq!(m("vllm:request_prompt_tokens_sum"), 30.0);
    assert_eq!(m("vllm:request_generation_tokens_sum"), 20.0);
    assert_eq!(m("vllm:request_params_max_tokens_sum"), 20.0);
    assert_eq!(m("vllm:request_params_n_count"), 4.0);
    assert_eq!(m("vllm:request_params_n_sum"), 5.0);
    assert_eq!(m("vllm:request_inference_time_seconds_count"), 5.0);
    assert_eq!(m("vllm:request_num_preemptions_count"), 5.0);
    assert_eq!(m("vllm:request_num_preemptions_sum"), 0.0);
    assert_eq!(m("vllm:admission_rejections_total"), 0.0);
    let (_, text) = srv.get("/metrics");
    let info = text
        .lines()
        .find(|l| l.starts_with("vllm:cache_config_info{"))
        .unwrap();
    assert!(
        info.contains("kv_cache_size_tokens=\"") && info.contains("kv_cache_max_concurrency=\""),
        "{info}"
    );
}

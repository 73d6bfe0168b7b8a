//! The request path under arbitrary input: random JSON, valid requests with fields
//! replaced by random values, truncated bodies and random bytes, with random
//! credentials, sent through a prefix-aware gateway (exact prefix keys: the replicas'
//! tokenizer and KV events) to two real replicas. Every answer must come within a
//! bound, never be a 5xx, and carry an OpenAI-shaped error when it is one; a greedy
//! neighbour request running all along must keep its text, and afterwards nothing is
//! left in flight anywhere.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config as RunnerConfig, TestCaseError, TestRunner};
use serde_json::{json, Map, Value};

const MASTER: &str = "sk-master-fuzz";
/// Requests sent (a few seconds on the tiny model).
const CASES: u32 = 2000;

/// Field names the gateway or the server read, so that random objects hit real code.
const KEYS: &[&str] = &[
    "model",
    "prompt",
    "messages",
    "role",
    "content",
    "text",
    "type",
    "name",
    "max_tokens",
    "max_completion_tokens",
    "stream",
    "stream_options",
    "include_usage",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "n",
    "best_of",
    "stop",
    "stop_token_ids",
    "seed",
    "logprobs",
    "top_logprobs",
    "echo",
    "suffix",
    "logit_bias",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "ignore_eos",
    "min_tokens",
    "cache_salt",
    "priority",
    "user",
    "tools",
    "tool_choice",
    "response_format",
    "return_token_ids",
    "pagellm_resume",
    "output_token_ids",
    "text_offset",
    "skip_special_tokens",
    "add_generation_prompt",
    "continue_final_message",
];

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => proptest::sample::select(KEYS).prop_map(str::to_string),
        1 => "\\PC{0,8}",
    ]
}

fn string() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(MODEL.to_string()),
        Just(String::new()),
        proptest::sample::select(
            &["user", "assistant", "system", "tool", "text", "json_object"][..]
        )
        .prop_map(str::to_string),
        "\\PC{0,40}",
        // Long enough to cross the tiny model's context (one token per character).
        "[a-z ]{100,200}",
    ]
}

fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        prop_oneof![
            Just(i64::MAX),
            Just(i64::MIN),
            Just(-1i64),
            Just(0),
            -3i64..300
        ]
        .prop_map(Value::from),
        Just(Value::from(u64::MAX)),
        prop_oneof![Just(1e308), Just(-0.0), Just(1e-9), -3.0f64..3.0].prop_map(Value::from),
        string().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((key(), inner), 0..4)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// A request the gateway serves as it stands.
fn valid() -> impl Strategy<Value = (Value, bool)> {
    (any::<bool>(), any::<bool>(), 1u32..6, "[a-z ]{1,20}").prop_map(
        |(chat, stream, max_tokens, text)| {
            let mut b = json!({"model": MODEL, "max_tokens": max_tokens, "stream": stream});
            if chat {
                b["messages"] = json!([{"role": "user", "content": text}]);
            } else {
                b["prompt"] = json!(text);
            }
            (b, chat)
        },
    )
}

#[derive(Debug, Clone)]
enum Body {
    Json(Value),
    Raw(Vec<u8>),
}

#[derive(Debug, Clone)]
struct Case {
    body: Body,
    chat: bool,
    /// 0 none, 1 master, 2 the virtual key, 3 and 4 malformed.
    auth: u8,
}

fn case() -> impl Strategy<Value = Case> {
    // Replace, add or remove fields of a valid request; at the top level and inside
    // its first message.
    let mutated = (
        valid(),
        prop::collection::vec((any::<bool>(), key(), prop::option::of(value())), 1..4),
    )
        .prop_map(|((mut b, chat), muts)| {
            for (inner, k, v) in muts {
                let target = match b.pointer_mut("/messages/0") {
                    Some(m) if inner && chat => m,
                    _ => &mut b,
                };
                match (target.as_object_mut(), v) {
                    (Some(o), Some(v)) => {
                        o.insert(k, v);
                    }
                    (Some(o), None) => {
                        o.remove(&k);
                    }
                    (None, _) => {}
                }
            }
            (Body::Json(b), chat)
        });
    let truncated = (valid(), any::<Index>()).prop_map(|((b, chat), i)| {
        let s = serde_json::to_vec(&b).unwrap();
        (Body::Raw(s[..i.index(s.len())].to_vec()), chat)
    });
    let body = prop_oneof![
        6 => mutated,
        2 => (value(), any::<bool>()).prop_map(|(v, chat)| (Body::Json(v), chat)),
        1 => truncated,
        1 => (prop::collection::vec(any::<u8>(), 0..64), any::<bool>())
            .prop_map(|(b, chat)| (Body::Raw(b), chat)),
    ];
    (
        body,
        prop_oneof![1 => Just(0u8), 1 => Just(1u8), 6 => Just(2u8), 1 => 3u8..5],
    )
        .prop_map(|((body, chat), auth)| Case { body, chat, auth })
}

struct Fixture {
    gw: String,
    virtual_key: String,
}

async fn send(f: &Fixture, c: &Case) -> Result<(u16, String), String> {
    let path = if c.chat {
        "/v1/chat/completions"
    } else {
        "/v1/completions"
    };
    let mut r = client().post(format!("{}{path}", f.gw));
    r = match &c.body {
        Body::Json(v) => r.json(v),
        Body::Raw(b) => r.body(b.clone()),
    };
    r = match c.auth {
        1 => r.bearer_auth(MASTER),
        2 => r.bearer_auth(&f.virtual_key),
        3 => r.header("authorization", "Basic Zm9vOmJhcg=="),
        4 => r.header("authorization", "Bearer"),
        _ => r,
    };
    let resp = tokio::time::timeout(Duration::from_secs(30), async {
        let resp = r.send().await.map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let text = resp.text().await.map_err(|e| e.to_string())?;
        Ok::<_, String>((status, text))
    })
    .await
    .map_err(|_| "no complete answer within 30 s".to_string())??;
    Ok(resp)
}

fn check(c: &Case, status: u16, text: &str) -> Result<(), TestCaseError> {
    prop_assert!(status < 500, "status {status} for {c:?}: {text}");
    if status >= 400 {
        let v: Value = serde_json::from_str(text)
            .map_err(|_| TestCaseError::fail(format!("error body is not JSON: {text}")))?;
        let m = v["error"]["message"].as_str().unwrap_or("");
        prop_assert!(!m.is_empty(), "error without a message: {text}");
        return Ok(());
    }
    if text.starts_with("data: ") {
        prop_assert!(
            text.ends_with("data: [DONE]\n\n"),
            "a stream that does not end with [DONE]: {text}"
        );
    } else {
        let v: Value = serde_json::from_str(text)
            .map_err(|_| TestCaseError::fail(format!("200 body is not JSON: {text}")))?;
        prop_assert!(v["choices"].is_array(), "200 without choices: {text}");
    }
    Ok(())
}

#[test]
fn the_request_path_survives_arbitrary_input() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tiny_dir();
    let db = tempfile::tempdir().unwrap();
    let (f, replicas, g) = rt.block_on(async {
        let (a, b) = (replica(&dir, None).await, replica(&dir, None).await);
        let yaml = format!(
            "model_list:\n{}{}general_settings: {{master_key: {MASTER}}}\npagellm_settings:\n  tokenizers: {{{MODEL}: \"{}\"}}\n  key_store: {{type: sqlite, path: \"{}\"}}\n",
            deployment(MODEL, "a", &a.url),
            deployment(MODEL, "b", &b.url),
            dir.path().display(),
            db.path().join("gw.db").display(),
        );
        let (gw, g) = gateway(&yaml).await;
        exact_prefixes_ready(&g, 10.0).await;
        let k = post(&gw, "/key/generate", &json!({"models": [MODEL], "rpm_limit": 100000}), Some(MASTER)).await;
        assert_eq!(k.status, 200, "{}", k.text);
        let virtual_key = k.json()["key"].as_str().unwrap().to_string();
        (Fixture { gw, virtual_key }, [a, b], g)
    });

    // A greedy neighbour, plain and streamed in turn, all through the run.
    let reference = json!({"model": MODEL, "prompt": "neighbour", "max_tokens": 16, "temperature": 0, "ignore_eos": true});
    let expected = rt.block_on(async {
        let r = post(&f.gw, "/v1/completions", &reference, Some(MASTER)).await;
        assert_eq!(r.status, 200, "{}", r.text);
        r.json()["choices"][0]["text"].as_str().unwrap().to_string()
    });
    let stop = Arc::new(AtomicBool::new(false));
    let (done, wrong) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let neighbour = rt.spawn({
        let (gw, stop, done, wrong, expected, reference) = (
            f.gw.clone(),
            stop.clone(),
            done.clone(),
            wrong.clone(),
            expected.clone(),
            reference.clone(),
        );
        async move {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let mut body = reference.clone();
                body["stream"] = json!(i % 2 == 1);
                let r = post(&gw, "/v1/completions", &body, Some(MASTER)).await;
                let text = if i % 2 == 1 {
                    r.stream_text()
                } else {
                    r.json()["choices"][0]["text"]
                        .as_str()
                        .unwrap_or("")
                        .to_string()
                };
                if r.status != 200 || text != expected {
                    eprintln!("neighbour: {} {:?} != {expected:?}", r.status, text);
                    wrong.fetch_add(1, Ordering::SeqCst);
                }
                done.fetch_add(1, Ordering::SeqCst);
                i += 1;
            }
        }
    });

    let mut runner = TestRunner::new(RunnerConfig {
        cases: CASES,
        failure_persistence: None,
        ..RunnerConfig::default()
    });
    let statuses = std::sync::Mutex::new(std::collections::BTreeMap::<u16, usize>::new());
    let result = runner.run(&case(), |c| {
        let (status, text) = rt
            .block_on(send(&f, &c))
            .map_err(|e| TestCaseError::fail(format!("{e} for {c:?}")))?;
        *statuses.lock().unwrap().entry(status).or_default() += 1;
        check(&c, status, &text)
    });
    stop.store(true, Ordering::Relaxed);
    rt.block_on(neighbour).unwrap();
    if let Err(e) = result {
        panic!("{e}");
    }
    // The cases reach the replicas, not only the gateway's own checks.
    let statuses = statuses.into_inner().unwrap();
    eprintln!(
        "statuses: {statuses:?}, neighbour requests: {}",
        done.load(Ordering::SeqCst)
    );
    let served = statuses.get(&200).copied().unwrap_or(0);
    assert!(
        served >= CASES as usize / 10,
        "only {served} of {CASES} cases were served: {statuses:?}"
    );
    assert!(done.load(Ordering::SeqCst) > 0);
    assert_eq!(
        wrong.load(Ordering::SeqCst),
        0,
        "the neighbour's text changed"
    );

    // Nothing is left in flight: not in the gateway, not in either engine.
    rt.block_on(async {
        let settled = eventually(10.0, || {
            g.runtime()
                .replicas()
                .all(|r| r.in_flight.load(Ordering::Relaxed) == 0)
        })
        .await;
        assert!(settled, "the gateway still counts requests in flight");
        for r in &replicas {
            // Gauges are published after each engine step; give the last step time to land.
            let mut left = (f64::NAN, f64::NAN);
            for _ in 0..100 {
                let m = get(&r.url, "/metrics", None).await.text;
                left = (
                    metric(&m, "vllm:num_requests_running", &[]),
                    metric(&m, "vllm:num_requests_waiting", &[]),
                );
                if left == (0.0, 0.0) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            assert_eq!(left, (0.0, 0.0), "running, waiting left in {}", r.url);
        }
        assert_eq!(get(&f.gw, "/health", None).await.status, 200);
        let r = post(&f.gw, "/v1/completions", &reference, Some(MASTER)).await;
        assert_eq!(r.json()["choices"][0]["text"], json!(expected));
    });
}

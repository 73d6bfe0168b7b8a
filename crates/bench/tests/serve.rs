//! `bench serve` against servers on loopback: a scripted server whose token timings
//! are known (the statistics must follow them exactly where exactness is possible:
//! counts and token totals; timings no shorter than scripted), and pagellm's own server
//! on a tiny model written by the test.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::response::sse::{Event, Sse};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use pagellm_bench::client::{Endpoint, Target};
use pagellm_bench::dataset::{self, Dataset, DatasetArgs, Sample};
use pagellm_bench::RunConfig;
use serde_json::{json, Value};

const TTFT: Duration = Duration::from_millis(40);
const GAP: Duration = Duration::from_millis(15);
const CHUNKS: usize = 4;

#[derive(Default)]
struct Load {
    now: AtomicUsize,
    max: AtomicUsize,
}

/// Streams CHUNKS one-token chunks: the first after TTFT, then one every GAP, then
/// usage and [DONE]. A prompt containing "fail" gets a 500.
async fn completions(load: Arc<Load>, body: Value) -> axum::response::Response {
    let prompt = body["prompt"].as_str().unwrap_or("").to_string();
    if prompt.contains("fail") {
        return (
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            "scripted failure",
        )
            .into_response();
    }
    let n = load.now.fetch_add(1, Ordering::SeqCst) + 1;
    load.max.fetch_max(n, Ordering::SeqCst);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Event, std::convert::Infallible>>(16);
    tokio::spawn(async move {
        tokio::time::sleep(TTFT).await;
        for i in 0..CHUNKS {
            if i > 0 {
                tokio::time::sleep(GAP).await;
            }
            let c = json!({"choices": [{"index": 0, "text": format!("t{i}")}]});
            let _ = tx.send(Ok(Event::default().data(c.to_string()))).await;
        }
        let words = prompt.split(' ').count();
        let u =
            json!({"choices": [], "usage": {"prompt_tokens": words, "completion_tokens": CHUNKS}});
        let _ = tx.send(Ok(Event::default().data(u.to_string()))).await;
        load.now.fetch_sub(1, Ordering::SeqCst);
        let _ = tx.send(Ok(Event::default().data("[DONE]"))).await;
    });
    Sse::new(tokio_stream::wrappers::ReceiverStream::new(rx)).into_response()
}

fn target(base_url: String, model: &str) -> Target {
    Target {
        base_url,
        model: model.into(),
        endpoint: Endpoint::Completions,
        api_key: None,
        ignore_eos: true,
        temperature: 0.0,
    }
}

fn config(target: Target, rate: f64, max_concurrency: Option<usize>) -> RunConfig {
    RunConfig {
        target,
        request_rate: rate,
        burstiness: 1.0,
        max_concurrency,
        seed: 1,
        slo: Some("ttft:10000".parse().unwrap()),
        label: "test".into(),
        progress: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statistics_follow_a_scripted_server() {
    let load = Arc::new(Load::default());
    let l = load.clone();
    let app = Router::new()
        .route(
            "/v1/completions",
            post(move |Json(b): Json<Value>| completions(l.clone(), b)),
        )
        .route(
            "/v1/models",
            get(|| async { Json(json!({"data": [{"id": "scripted"}]})) }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });

    assert_eq!(
        pagellm_bench::first_model(&url, None).await.unwrap(),
        "scripted"
    );
    // Ten prompts of 3 words; every fifth fails.
    let samples: Vec<Sample> = (0..10)
        .map(|i| Sample {
            prompt: if i % 5 == 4 {
                "please fail now".into()
            } else {
                format!("prompt number {i}")
            },
            output_len: CHUNKS,
        })
        .collect();
    let s = pagellm_bench::run(&config(target(url, "scripted"), 200.0, Some(2)), &samples)
        .await
        .unwrap();
    assert_eq!((s.completed, s.failed, s.num_prompts), (8, 2, 10));
    assert_eq!((s.total_input_tokens, s.total_output_tokens), (24, 32));
    assert!(s.errors[4].starts_with("HTTP 500"), "{:?}", s.errors);
    assert!(
        load.max.load(Ordering::SeqCst) <= 2,
        "more than 2 in flight"
    );
    // Timings are no shorter than the script, and not wildly longer.
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let slack = 400.0;
    let t = &s.ttft.dist;
    assert!(
        t.median >= ms(TTFT) && t.p99 < ms(TTFT) + slack,
        "ttft {t:?}"
    );
    let itl = &s.itl.dist;
    assert!(
        itl.median >= ms(GAP) - 1.0 && itl.p99 < ms(GAP) + slack,
        "itl {itl:?}"
    );
    assert_eq!(s.itls.iter().map(Vec::len).sum::<usize>(), 8 * (CHUNKS - 1));
    let floor = ms(TTFT) + ms(GAP) * (CHUNKS - 1) as f64;
    assert!(s.e2el.dist.median >= floor, "e2el {:?}", s.e2el.dist);
    assert!(s.tpot.dist.median >= ms(GAP) - 1.0);
    // Throughputs are the counts over the measured duration; all met the loose SLO.
    assert!((s.output_throughput - 32.0 / s.duration).abs() < 1e-9);
    assert!((s.request_goodput.unwrap() - 8.0 / s.duration).abs() < 1e-9);
    assert_eq!(s.max_concurrency, Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pagellm_serve_on_a_tiny_model() {
    let dir = tempfile::tempdir().unwrap();
    pagellm_testkit::write_tiny_model(dir.path(), "LlamaForCausalLM", safetensors::Dtype::F32);
    let model = Arc::new(pagellm_model::loader::load_model(dir.path().to_str().unwrap()).unwrap());
    let engine_config = pagellm_engine::EngineConfig {
        threads: 1,
        kv_cache_memory: 8 << 20,
        ..Default::default()
    };
    let state = pagellm_server::AppState::with_engine(
        pagellm_server::ServerConfig {
            served_model_name: "tiny".into(),
            api_key: None,
            max_body_bytes: 1 << 20,
            ..pagellm_server::ServerConfig::new("tiny")
        },
        pagellm_engine::Engine::start(model.clone(), &engine_config).unwrap(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(pagellm_server::serve(
        listener,
        Arc::new(state),
        std::future::pending(),
        Duration::from_secs(1),
    ));
    let samples = dataset::build(
        &Dataset::Random,
        &DatasetArgs {
            num_prompts: 8,
            input_len: 12,
            output_len: 5,
            prefix_len: 0,
            num_prefixes: 1,
            seed: 0,
        },
        Some(&model.tokenizer),
    )
    .unwrap();
    for chat in [false, true] {
        let mut t = target(url.clone(), "tiny");
        if chat {
            t.endpoint = Endpoint::Chat;
        }
        let s = pagellm_bench::run(&config(t, f64::INFINITY, Some(4)), &samples)
            .await
            .unwrap();
        assert_eq!((s.completed, s.failed), (8, 0), "{:?}", s.errors);
        // Exact prompt lengths from the tokenizer; exact outputs with ignore_eos. The
        // tiny chat template is the message itself, so chat prompts count the same.
        assert_eq!(s.total_input_tokens, 8 * 12);
        assert_eq!(s.total_output_tokens, 8 * 5);
        assert!(s.output_lens.iter().all(|&n| n == 5));
    }
}

//! Fixtures for the gateway's tests: real pagellm replicas on the tiny checkpoint, a
//! cuttable TCP link in front of a replica (what a killed process looks like on the
//! wire), scripted upstreams that misbehave on purpose, and the gateway itself, all
//! on loopback ports chosen by the OS.

#![allow(dead_code)] // each test binary uses a different subset

use std::sync::{Arc, Mutex};
use std::time::Duration;

use pagellm_engine::{Engine, EngineConfig};
use pagellm_gateway::config::Config;
use pagellm_gateway::Gateway;
use pagellm_model::loader::load_model;
use pagellm_server::{AppState, ServerConfig};
use safetensors::Dtype;
use serde_json::Value;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

pub const MODEL: &str = "tiny";

/// A `pagellm serve` on the tiny model, in this process.
pub struct Replica {
    pub url: String,
    pub state: Arc<AppState>,
    _dir: Arc<tempfile::TempDir>,
}

pub fn tiny_dir() -> Arc<tempfile::TempDir> {
    let tmp = tempfile::tempdir().unwrap();
    pagellm_testkit::write_tiny_model(tmp.path(), "LlamaForCausalLM", Dtype::F32);
    Arc::new(tmp)
}

pub async fn replica(dir: &Arc<tempfile::TempDir>, num_blocks: Option<usize>) -> Replica {
    replica_of(dir.path().to_str().unwrap(), dir, num_blocks).await
}

/// A replica of smollm2-135m (pulled by `scripts/test.sh`), served as `tiny`: slow
/// enough that a long request is still running when the test acts on it.
pub async fn smollm_replica() -> Replica {
    replica_of("smollm2-135m", &tiny_dir(), None).await
}

async fn replica_of(
    model: &str,
    dir: &Arc<tempfile::TempDir>,
    num_blocks: Option<usize>,
) -> Replica {
    let smollm = !model.starts_with('/');
    let model = Arc::new(load_model(model).unwrap());
    let config = EngineConfig {
        threads: 1,
        kv_cache_memory: 64 << 20,
        num_kv_blocks: num_blocks,
        max_model_len: Some(1024).filter(|_| smollm),
        ..EngineConfig::default()
    };
    let engine = Engine::start(model, &config).unwrap();
    let state = Arc::new(AppState::with_engine(
        ServerConfig {
            served_model_name: MODEL.into(),
            api_key: None,
            max_body_bytes: 1 << 20,
            ..ServerConfig::new(MODEL)
        },
        engine,
    ));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(pagellm_server::serve(
        listener,
        state.clone(),
        std::future::pending(),
        Duration::from_secs(1),
    ));
    Replica {
        url,
        state,
        _dir: dir.clone(),
    }
}

/// A TCP link to `target` on its own port that can be cut (every connection reset,
/// new ones refused: a dead process) and restored on the same port.
pub struct Link {
    pub port: u16,
    target: String,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
    acceptor: Mutex<Option<JoinHandle<()>>>,
}

impl Link {
    pub async fn new(target: &str) -> Arc<Link> {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let link = Arc::new(Link {
            port: listener.local_addr().unwrap().port(),
            target: target.trim_start_matches("http://").to_string(),
            tasks: Arc::default(),
            acceptor: Mutex::new(None),
        });
        link.serve(listener);
        link
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn serve(&self, listener: TcpListener) {
        let (target, tasks) = (self.target.clone(), self.tasks.clone());
        let acceptor = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let target = target.clone();
                let t = tokio::spawn(async move {
                    if let Ok(mut up) = TcpStream::connect(&target).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut up).await;
                    }
                });
                tasks.lock().unwrap().push(t);
            }
        });
        *self.acceptor.lock().unwrap() = Some(acceptor);
    }

    /// Kills the link: stops listening and drops every open connection.
    pub fn cut(&self) {
        if let Some(a) = self.acceptor.lock().unwrap().take() {
            a.abort();
        }
        for t in self.tasks.lock().unwrap().drain(..) {
            t.abort();
        }
    }

    /// Listens again on the same port.
    pub async fn restore(&self) {
        let listener = loop {
            match TcpListener::bind(("127.0.0.1", self.port)).await {
                Ok(l) => break l,
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        };
        self.serve(listener);
    }
}

/// A gateway on `yaml`, served in this process; returns its URL.
pub async fn gateway(yaml: &str) -> (String, Arc<Gateway>) {
    gateway_with_path(yaml, None).await
}

pub async fn gateway_with_path(
    yaml: &str,
    path: Option<std::path::PathBuf>,
) -> (String, Arc<Gateway>) {
    let config = Config::parse(yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    let gw = Gateway::new(config, path).await.unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(pagellm_gateway::serve(
        listener,
        gw.clone(),
        std::future::pending(),
    ));
    (url, gw)
}

/// One `model_list` entry.
pub fn deployment(group: &str, id: &str, base: &str) -> String {
    format!(
        "  - model_name: {group}\n    litellm_params: {{model: openai/{MODEL}, api_base: \"{base}/v1\"}}\n    model_info: {{id: {id}}}\n"
    )
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

pub struct Reply {
    pub status: u16,
    pub replica: Option<String>,
    pub headers: reqwest::header::HeaderMap,
    pub text: String,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|_| panic!("not JSON: {}", self.text))
    }

    /// The data of each server-sent event.
    pub fn events(&self) -> Vec<String> {
        self.text
            .split("\n\n")
            .filter_map(|e| e.strip_prefix("data: "))
            .map(str::to_string)
            .collect()
    }

    /// The concatenated text of a streamed completion or chat.
    pub fn stream_text(&self) -> String {
        self.events()
            .iter()
            .filter(|e| *e != "[DONE]")
            .filter_map(|e| serde_json::from_str::<Value>(e).ok())
            .filter_map(|v| {
                let c = &v["choices"][0];
                c["text"]
                    .as_str()
                    .or(c["delta"]["content"].as_str())
                    .map(str::to_string)
            })
            .collect()
    }
}

pub async fn post(url: &str, path: &str, body: &Value, key: Option<&str>) -> Reply {
    let mut r = client().post(format!("{url}{path}")).json(body);
    if let Some(k) = key {
        r = r.bearer_auth(k);
    }
    let resp = r.send().await.unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let replica = headers
        .get("x-pagellm-replica")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    Reply {
        status,
        replica,
        headers,
        text: resp.text().await.unwrap(),
    }
}

pub async fn get(url: &str, path: &str, key: Option<&str>) -> Reply {
    let mut r = client().get(format!("{url}{path}"));
    if let Some(k) = key {
        r = r.bearer_auth(k);
    }
    let resp = r.send().await.unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    Reply {
        status,
        replica: None,
        headers,
        text: resp.text().await.unwrap(),
    }
}

/// Waits until `f` holds, for up to `secs`.
pub async fn eventually(secs: f64, mut f: impl FnMut() -> bool) -> bool {
    let end = tokio::time::Instant::now() + Duration::from_secs_f64(secs);
    while tokio::time::Instant::now() < end {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    f()
}

/// Waits until the gateway has `MODEL`'s tokenizer and every replica's KV events, so
/// prefix-aware routing is exact; panics after `secs`.
pub async fn exact_prefixes_ready(g: &Gateway, secs: f64) {
    let rt = g.runtime();
    assert!(
        eventually(secs, || g.tokenizers.is_loaded(MODEL)
            && rt.replicas().all(|r| r.prefix.lock().unwrap().connected))
        .await,
        "no tokenizer or KV events after {secs} s"
    );
}

/// A metric's value summed over series whose labels contain every `k="v"` given.
pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

//! A server on a loopback port chosen by the OS, and the HTTP helpers the tests use.

#![allow(dead_code)] // each test binary uses a different subset

use std::sync::Arc;
use std::time::Duration;

use pagellm_server::AppState;
use serde_json::Value;

pub struct TestServer {
    pub url: String,
    pub state: Arc<AppState>,
    key: Option<String>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<std::io::Result<()>>>,
}

impl TestServer {
    /// Serves `state` on its own runtime thread; `grace` is the shutdown grace period.
    pub fn start(state: Arc<AppState>, grace: Duration) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let st = state.clone();
        let thread = std::thread::spawn(move || {
            rt.block_on(pagellm_server::serve(
                listener,
                st,
                async {
                    let _ = stopped.await;
                },
                grace,
            ))
        });
        Self {
            url,
            key: state.config.api_key.clone(),
            state,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Signals shutdown (as SIGTERM does) without waiting.
    pub fn signal_shutdown(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }

    /// Waits for the server to return after [`Self::signal_shutdown`].
    pub fn join(&mut self) -> std::io::Result<()> {
        self.thread.take().map_or(Ok(()), |t| t.join().unwrap())
    }

    pub fn client() -> reqwest::blocking::Client {
        reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(120))
            .build()
            .unwrap()
    }

    pub fn request(&self, path: &str, body: &str) -> reqwest::blocking::RequestBuilder {
        let mut r = Self::client()
            .post(format!("{}{path}", self.url))
            .header("content-type", "application/json")
            .body(body.to_string());
        if let Some(k) = &self.key {
            r = r.bearer_auth(k);
        }
        r
    }

    /// POSTs a body; returns the status and the response text.
    pub fn post(&self, path: &str, body: &str) -> (u16, String) {
        let r = self.request(path, body).send().unwrap();
        (r.status().as_u16(), r.text().unwrap())
    }

    pub fn post_json(&self, path: &str, body: &Value) -> (u16, Value) {
        let (s, t) = self.post(path, &body.to_string());
        (
            s,
            serde_json::from_str(&t).unwrap_or_else(|_| panic!("not JSON: {t}")),
        )
    }

    pub fn get(&self, path: &str) -> (u16, String) {
        let mut r = Self::client().get(format!("{}{path}", self.url));
        if let Some(k) = &self.key {
            r = r.bearer_auth(k);
        }
        let r = r.send().unwrap();
        (r.status().as_u16(), r.text().unwrap())
    }

    /// The first `n` frames of an endless event stream such as `/dashboard/events`,
    /// parsed as JSON; or the status when it is not 200.
    pub fn frames(&self, path: &str, n: usize) -> Result<Vec<Value>, u16> {
        use std::io::Read;
        let mut r = Self::client().get(format!("{}{path}", self.url));
        if let Some(k) = &self.key {
            r = r.bearer_auth(k);
        }
        let mut r = r.send().unwrap();
        if r.status() != 200 {
            return Err(r.status().as_u16());
        }
        let mut text = String::new();
        let mut buf = [0u8; 4096];
        while text.matches("\n\n").count() < n {
            let k = r.read(&mut buf).unwrap();
            assert!(k > 0, "the stream ended after {text}");
            text.push_str(std::str::from_utf8(&buf[..k]).unwrap());
        }
        Ok(sse_events(&text)
            .iter()
            .take(n)
            .map(|e| serde_json::from_str(e).unwrap())
            .collect())
    }

    /// One sample of `/metrics`: `vllm:num_requests_running` or a name with labels.
    pub fn metric(&self, name: &str) -> f64 {
        let (_, text) = self.get("/metrics");
        // A bare name matches its first sample; a name with labels, that sample.
        let prefix = if name.contains('{') {
            format!("{name} ")
        } else {
            format!("{name}{{")
        };
        text.lines()
            .find(|l| l.starts_with(&prefix))
            .and_then(|l| l.rsplit_once(' '))
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or_else(|| panic!("no sample {name} in:\n{text}"))
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.signal_shutdown();
        let _ = self.join();
    }
}

/// The `data:` payloads of a server-sent event stream.
pub fn sse_events(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}

/// The JSON chunks of a stream (everything before `[DONE]`, which must end it).
pub fn sse_chunks(text: &str) -> Vec<Value> {
    let events = sse_events(text);
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "stream does not end with [DONE]: {text}"
    );
    events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect()
}

/// The text of a completions stream, concatenated.
pub fn completion_stream_text(text: &str) -> String {
    sse_chunks(text)
        .iter()
        .filter_map(|c| c["choices"].get(0)?["text"].as_str().map(str::to_string))
        .collect()
}

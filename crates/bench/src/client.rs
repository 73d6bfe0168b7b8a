//! One streamed request against an OpenAI-compatible server, timed on the client as
//! `vllm bench serve` times it: TTFT at the first chunk carrying text, ITL as the gaps
//! between later text chunks, E2EL at the end of the stream, token counts from the
//! usage the server reports (`stream_options.include_usage`).

use std::time::Instant;

use serde_json::{json, Value};

use crate::dataset::Sample;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Completions,
    Chat,
}

impl std::str::FromStr for Endpoint {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "completions" => Ok(Endpoint::Completions),
            "chat" => Ok(Endpoint::Chat),
            _ => Err(format!(
                "unknown endpoint {s:?}: expected completions or chat"
            )),
        }
    }
}

/// Where and how to send.
#[derive(Debug, Clone)]
pub struct Target {
    pub base_url: String,
    pub model: String,
    pub endpoint: Endpoint,
    pub api_key: Option<String>,
    pub ignore_eos: bool,
    pub temperature: f32,
}

/// What one request did, in seconds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestRecord {
    pub success: bool,
    pub error: String,
    pub prompt_tokens: usize,
    pub output_tokens: usize,
    /// Time to the first chunk with text.
    pub ttft: f64,
    /// Gaps between consecutive text chunks.
    pub itl: Vec<f64>,
    /// Send to end of stream.
    pub latency: f64,
}

impl Target {
    fn url(&self) -> String {
        let base = self.base_url.trim_end_matches('/');
        match self.endpoint {
            Endpoint::Completions => format!("{base}/v1/completions"),
            Endpoint::Chat => format!("{base}/v1/chat/completions"),
        }
    }

    fn body(&self, s: &Sample) -> Value {
        let mut b = json!({
            "model": self.model,
            "max_tokens": s.output_len,
            "temperature": self.temperature,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        match self.endpoint {
            Endpoint::Completions => b["prompt"] = json!(s.prompt),
            Endpoint::Chat => b["messages"] = json!([{"role": "user", "content": s.prompt}]),
        }
        if self.ignore_eos {
            b["ignore_eos"] = json!(true);
        }
        b
    }
}

/// Reads server-sent events and times them.
#[derive(Default)]
struct StreamTimer {
    buf: Vec<u8>,
    rec: RequestRecord,
    text_chunks: usize,
    last: Option<f64>,
    usage: Option<(usize, usize)>,
    done: bool,
}

impl StreamTimer {
    /// Feeds bytes received `t` seconds after sending.
    fn feed(&mut self, bytes: &[u8], t: f64) -> Result<(), String> {
        self.buf.extend_from_slice(bytes);
        while let Some(end) = find(&self.buf, b"\n\n") {
            let event: Vec<u8> = self.buf.drain(..end + 2).collect();
            let event = String::from_utf8_lossy(&event);
            for line in event.lines() {
                let Some(data) = line.strip_prefix("data:") else {
                    continue;
                };
                self.data(data.trim(), t)?;
            }
        }
        Ok(())
    }

    fn data(&mut self, data: &str, t: f64) -> Result<(), String> {
        if data == "[DONE]" {
            self.done = true;
            return Ok(());
        }
        let v: Value =
            serde_json::from_str(data).map_err(|e| format!("bad event {data:?}: {e}"))?;
        if let Some(e) = v.get("error") {
            return Err(format!("error in stream: {e}"));
        }
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            let n = |k: &str| u[k].as_u64().unwrap_or(0) as usize;
            self.usage = Some((n("prompt_tokens"), n("completion_tokens")));
        }
        let c = &v["choices"][0];
        let text = c["text"]
            .as_str()
            .or_else(|| c["delta"]["content"].as_str())
            .unwrap_or("");
        if !text.is_empty() {
            match self.last {
                None => self.rec.ttft = t,
                Some(prev) => self.rec.itl.push(t - prev),
            }
            self.last = Some(t);
            self.text_chunks += 1;
        }
        Ok(())
    }

    fn finish(mut self, t: f64) -> RequestRecord {
        self.rec.latency = t;
        if !self.done {
            self.rec.error = "the stream ended without [DONE]".into();
        } else if self.text_chunks == 0 {
            self.rec.error = "the stream carried no text".into();
        } else {
            self.rec.success = true;
            // Servers without usage in streams: one chunk per token is the best guess.
            let (p, o) = self.usage.unwrap_or((0, self.text_chunks));
            self.rec.prompt_tokens = p;
            self.rec.output_tokens = o;
        }
        self.rec
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Sends one request and times it; failures are records too, never errors.
pub async fn send(client: &reqwest::Client, target: &Target, sample: &Sample) -> RequestRecord {
    let start = Instant::now();
    let mut req = client.post(target.url()).json(&target.body(sample));
    if let Some(k) = &target.api_key {
        req = req.bearer_auth(k);
    }
    let failed = |error: String| RequestRecord {
        error,
        latency: start.elapsed().as_secs_f64(),
        ..RequestRecord::default()
    };
    let mut resp = match req.send().await {
        Ok(r) => r,
        Err(e) => return failed(format!("request failed: {e}")),
    };
    if !resp.status().is_success() {
        let status = resp.status();
        let body = resp.text().await.unwrap_or_default();
        return failed(format!(
            "HTTP {status}: {}",
            body.chars().take(300).collect::<String>()
        ));
    }
    let mut timer = StreamTimer::default();
    loop {
        match resp.chunk().await {
            Ok(Some(bytes)) => {
                if let Err(e) = timer.feed(&bytes, start.elapsed().as_secs_f64()) {
                    return failed(e);
                }
            }
            Ok(None) => break,
            Err(e) => return failed(format!("stream broken: {e}")),
        }
    }
    timer.finish(start.elapsed().as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_across_reads_are_timed_by_arrival() {
        let mut t = StreamTimer::default();
        t.feed(b"data: {\"choices\":[{\"text\":\"a\"}]}\n", 0.5)
            .unwrap();
        // The event completes in the second read: its time is the second read's.
        t.feed(
            b"\ndata: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n",
            0.7,
        )
        .unwrap();
        t.feed(b"data: {\"choices\":[{\"text\":\"\"}]}\n\n", 0.8)
            .unwrap();
        t.feed(b"data: {\"choices\":[{\"text\":\"c\"}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3}}\n\ndata: [DONE]\n\n", 1.0).unwrap();
        let r = t.finish(1.25);
        assert!(r.success, "{r:?}");
        assert_eq!(
            (r.ttft, r.itl.clone(), r.latency),
            (0.7, vec![0.0, 0.30000000000000004], 1.25)
        );
        assert_eq!((r.prompt_tokens, r.output_tokens), (7, 3));
    }

    #[test]
    fn truncated_or_erroring_streams_fail() {
        let mut t = StreamTimer::default();
        t.feed(b"data: {\"choices\":[{\"text\":\"a\"}]}\n\n", 0.1)
            .unwrap();
        assert!(!t.finish(0.2).success);
        let mut t = StreamTimer::default();
        assert!(t
            .feed(b"data: {\"error\":{\"message\":\"x\"}}\n\n", 0.1)
            .is_err());
        let mut t = StreamTimer::default();
        t.feed(
            b"data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: [DONE]\n\n",
            0.1,
        )
        .unwrap();
        let r = t.finish(0.2);
        assert_eq!(
            (r.success, r.output_tokens),
            (true, 1),
            "no usage: chunks count"
        );
    }
}

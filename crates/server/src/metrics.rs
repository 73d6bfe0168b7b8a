//! `GET /metrics`: Prometheus text format with vLLM's metric names and a `model_name`
//! label, so dashboards and routers built for vLLM read pagellm unchanged.

use std::fmt::Write;
use std::sync::Arc;

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use pagellm_engine::{EngineLimits, EngineStats, FinishReason, Histogram};

use crate::AppState;

pub async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    let stats = st.loaded_engine().map(|e| e.stats()).unwrap_or_default();
    let params_n = st.params_n.lock().map(|h| h.clone()).ok();
    let mut text = render(&stats, params_n.as_ref(), &st.config.served_model_name);
    if let Some(e) = st.loaded_engine() {
        text.push_str(&cache_config_info(
            &e.limits(),
            &st.config.served_model_name,
        ));
    }
    (
        [(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        text,
    )
        .into_response()
}

/// vLLM's info gauge of the cache layout, which routers (llm-d's endpoint picker)
/// read to compute block hashes the way the engine does.
/// With the KV cache's size in tokens and how many requests of the longest context it
/// holds at once, as vLLM reports them.
pub fn cache_config_info(limits: &EngineLimits, model_name: &str) -> String {
    let (block_size, num_blocks) = (limits.block_size, limits.num_blocks);
    let tokens = block_size * num_blocks;
    let concurrency = tokens as f64 / limits.max_model_len.max(1) as f64;
    format!(
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n\
         # TYPE vllm:cache_config_info gauge\n\
         vllm:cache_config_info{{block_size=\"{block_size}\",num_gpu_blocks=\"{num_blocks}\",\
         kv_cache_size_tokens=\"{tokens}\",kv_cache_max_concurrency=\"{concurrency:.2}\",\
         model_name=\"{}\"}} 1\n",
        label(model_name)
    )
}

/// Escapes a label value (backslash, quote, newline).
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

struct Out {
    text: String,
    labels: String,
}

impl Out {
    fn header(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.text, "# HELP {name} {help}");
        let _ = writeln!(self.text, "# TYPE {name} {kind}");
    }

    fn gauge(&mut self, name: &str, help: &str, v: f64) {
        self.header(name, "gauge", help);
        let _ = writeln!(self.text, "{name}{{{}}} {v}", self.labels);
    }

    /// A counter; as Prometheus' Python client does, the sample name ends in `_total`.
    fn counter(&mut self, name: &str, help: &str, v: u64) {
        let name = format!("{name}_total");
        self.header(&name, "counter", help);
        let _ = writeln!(self.text, "{name}{{{}}} {v}", self.labels);
    }

    fn histogram(&mut self, name: &str, help: &str, h: &Histogram) {
        self.header(name, "histogram", help);
        for (le, n) in h.cumulative() {
            // As Prometheus' Python client writes them: `+Inf`, `1.0`, `0.25`.
            let le = if le.is_infinite() {
                "+Inf".to_string()
            } else if le.fract() == 0.0 {
                format!("{le:.1}")
            } else {
                le.to_string()
            };
            let _ = writeln!(
                self.text,
                "{name}_bucket{{{},le=\"{le}\"}} {n}",
                self.labels
            );
        }
        let _ = writeln!(self.text, "{name}_sum{{{}}} {}", self.labels, h.sum);
        let _ = writeln!(self.text, "{name}_count{{{}}} {}", self.labels, h.count);
    }
}

/// The engine's metrics, and the server's `params_n` when it has one.
pub fn render(s: &EngineStats, params_n: Option<&Histogram>, model_name: &str) -> String {
    let mut o = Out {
        text: String::new(),
        labels: format!("model_name=\"{}\"", label(model_name)),
    };
    o.gauge(
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        s.num_running as f64,
    );
    o.gauge(
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        s.num_waiting as f64,
    );
    // Every waiting request here waits for room in the batch; none is deferred (vLLM
    // defers requests whose KV comes from elsewhere or whose grammar still compiles).
    o.header(
        "vllm:num_requests_waiting_by_reason",
        "gauge",
        "Number of requests waiting, by the reason they wait.",
    );
    for (reason, n) in [("capacity", s.num_waiting), ("deferred", 0)] {
        let _ = writeln!(
            o.text,
            "vllm:num_requests_waiting_by_reason{{{},reason=\"{reason}\"}} {n}",
            o.labels
        );
    }
    o.gauge(
        "vllm:kv_cache_usage_perc",
        "KV-cache usage. 1 means 100 percent usage.",
        s.kv_cache_usage,
    );
    o.counter(
        "vllm:prefix_cache_queries",
        "Prefix cache queries, in terms of number of queried tokens.",
        s.prefix_cache.queries,
    );
    o.counter(
        "vllm:prefix_cache_hits",
        "Prefix cache hits, in terms of number of cached tokens.",
        s.prefix_cache.hits,
    );
    o.counter(
        "vllm:num_preemptions",
        "Cumulative number of preemptions from the engine.",
        s.num_preemptions,
    );
    o.counter(
        "vllm:admission_rejections",
        "Requests refused because the waiting queue was full.",
        s.admission_rejections,
    );
    o.counter(
        "vllm:prompt_tokens",
        "Number of prefill tokens processed.",
        s.prompt_tokens,
    );
    o.counter(
        "vllm:generation_tokens",
        "Number of generation tokens processed.",
        s.generation_tokens,
    );
    let name = "vllm:request_success_total";
    o.header(name, "counter", "Count of successfully processed requests.");
    for r in [
        FinishReason::Stop,
        FinishReason::Length,
        FinishReason::Abort,
        FinishReason::Error,
    ] {
        let _ = writeln!(
            o.text,
            "{name}{{{},finished_reason=\"{}\"}} {}",
            o.labels,
            r.as_str(),
            s.finished[r as usize]
        );
    }
    let l = &s.latency;
    o.histogram(
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        &l.ttft,
    );
    o.histogram(
        "vllm:inter_token_latency_seconds",
        "Histogram of inter-token latency in seconds.",
        &l.inter_token,
    );
    o.histogram(
        "vllm:e2e_request_latency_seconds",
        "Histogram of e2e request latency in seconds.",
        &l.e2e,
    );
    o.histogram(
        "vllm:request_queue_time_seconds",
        "Histogram of time spent in WAITING phase for request.",
        &l.queue,
    );
    o.histogram(
        "vllm:request_prefill_time_seconds",
        "Histogram of time spent in PREFILL phase for request.",
        &l.prefill,
    );
    o.histogram(
        "vllm:request_decode_time_seconds",
        "Histogram of time spent in DECODE phase for request.",
        &l.decode,
    );
    o.histogram(
        "vllm:request_inference_time_seconds",
        "Histogram of time spent in RUNNING phase for request.",
        &l.inference,
    );
    o.histogram(
        "vllm:request_prompt_tokens",
        "Number of prefill tokens processed.",
        &l.prompt_tokens,
    );
    o.histogram(
        "vllm:request_generation_tokens",
        "Number of generation tokens processed.",
        &l.generation_tokens,
    );
    o.histogram(
        "vllm:request_params_max_tokens",
        "Histogram of the max_tokens request parameter.",
        &l.max_tokens,
    );
    if let Some(n) = params_n {
        o.histogram(
            "vllm:request_params_n",
            "Histogram of the n request parameter.",
            n,
        );
    }
    o.histogram(
        "vllm:request_num_preemptions",
        "Number of preemptions of each finished request.",
        &l.num_preemptions,
    );
    o.histogram(
        "vllm:iteration_tokens_total",
        "Histogram of number of tokens per engine_step.",
        &l.iteration_tokens,
    );
    o.text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_config_info_is_vllms_info_gauge() {
        let limits = EngineLimits {
            block_size: 16,
            num_blocks: 512,
            max_model_len: 3000,
            vocab_size: 100,
            max_logprobs: 20,
        };
        assert_eq!(
            cache_config_info(&limits, "m"),
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n\
             # TYPE vllm:cache_config_info gauge\n\
             vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"512\",\
             kv_cache_size_tokens=\"8192\",kv_cache_max_concurrency=\"2.73\",model_name=\"m\"} 1\n"
        );
    }

    #[test]
    fn renders_vllm_names_with_the_model_label() {
        let mut s = EngineStats {
            num_running: 3,
            generation_tokens: 42,
            ..EngineStats::default()
        };
        s.finished[FinishReason::Length as usize] = 2;
        s.latency.ttft.observe(0.03);
        let t = render(&s, None, "m\"x");
        assert!(t.contains("vllm:num_requests_running{model_name=\"m\\\"x\"} 3\n"));
        assert!(t.contains("vllm:generation_tokens_total{model_name=\"m\\\"x\"} 42\n"));
        assert!(t.contains(
            "vllm:request_success_total{model_name=\"m\\\"x\",finished_reason=\"length\"} 2\n"
        ));
        assert!(t.contains(
            "vllm:time_to_first_token_seconds_bucket{model_name=\"m\\\"x\",le=\"0.02\"} 0\n"
        ));
        assert!(t.contains(
            "vllm:time_to_first_token_seconds_bucket{model_name=\"m\\\"x\",le=\"0.04\"} 1\n"
        ));
        assert!(t.contains(
            "vllm:time_to_first_token_seconds_bucket{model_name=\"m\\\"x\",le=\"+Inf\"} 1\n"
        ));
        assert!(t.contains("vllm:time_to_first_token_seconds_count{model_name=\"m\\\"x\"} 1\n"));
        // Every sample line is `name{labels} value`.
        for line in t.lines().filter(|l| !l.starts_with('#')) {
            let (_, v) = line.rsplit_once(' ').unwrap();
            assert!(v.parse::<f64>().is_ok(), "bad sample line {line}");
        }
    }
}

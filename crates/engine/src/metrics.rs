//! Latency histograms with vLLM's bucket bounds, so dashboards built for vLLM's
//! `/metrics` read pagellm's the same way.

/// `vllm:time_to_first_token_seconds`.
pub const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// `vllm:inter_token_latency_seconds`.
pub const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// End-to-end, queue, prefill and decode times of whole requests.
pub const REQUEST_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// Token counts (prompt and generation tokens of a request, `max_tokens`, tokens of a
/// step): vLLM's 1-2-5 series.
pub const COUNT_BUCKETS: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0, 20000.0,
    50000.0, 100000.0, 200000.0, 500000.0, 1000000.0,
];
/// `vllm:request_params_n` and `vllm:request_num_preemptions`.
pub const SMALL_COUNT_BUCKETS: &[f64] = &[0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0];

/// A cumulative-on-export histogram: `counts[i]` holds observations in
/// `(bounds[i-1], bounds[i]]`, the last slot those above every bound.
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    pub bounds: &'static [f64],
    pub counts: Vec<u64>,
    pub sum: f64,
    pub count: u64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    pub fn observe(&mut self, v: f64) {
        let i = self.bounds.partition_point(|&b| b < v);
        self.counts[i] += 1;
        self.sum += v;
        self.count += 1;
    }

    /// `(upper bound, observations <= it)` per bucket, ending with `+Inf`.
    pub fn cumulative(&self) -> impl Iterator<Item = (f64, u64)> + '_ {
        let mut acc = 0;
        self.bounds
            .iter()
            .copied()
            .chain([f64::INFINITY])
            .zip(&self.counts)
            .map(move |(b, &c)| {
                acc += c;
                (b, acc)
            })
    }
}

/// Per-request latencies and sizes, observed by the engine as requests progress and
/// finish, and the tokens of each step (vLLM's `iteration_tokens_total`).
#[derive(Debug, Clone, PartialEq)]
pub struct LatencyHistograms {
    pub ttft: Histogram,
    pub inter_token: Histogram,
    pub e2e: Histogram,
    pub queue: Histogram,
    pub prefill: Histogram,
    pub decode: Histogram,
    /// Prefill and decode: from first scheduled to finished.
    pub inference: Histogram,
    pub prompt_tokens: Histogram,
    pub generation_tokens: Histogram,
    /// The effective `max_tokens` of each request.
    pub max_tokens: Histogram,
    pub num_preemptions: Histogram,
    /// Per step: the prompts of requests sampling their first token, plus every token
    /// sampled.
    pub iteration_tokens: Histogram,
}

impl Default for LatencyHistograms {
    fn default() -> Self {
        Self {
            ttft: Histogram::new(TTFT_BUCKETS),
            inter_token: Histogram::new(ITL_BUCKETS),
            e2e: Histogram::new(REQUEST_BUCKETS),
            queue: Histogram::new(REQUEST_BUCKETS),
            prefill: Histogram::new(REQUEST_BUCKETS),
            decode: Histogram::new(REQUEST_BUCKETS),
            inference: Histogram::new(REQUEST_BUCKETS),
            prompt_tokens: Histogram::new(COUNT_BUCKETS),
            generation_tokens: Histogram::new(COUNT_BUCKETS),
            max_tokens: Histogram::new(COUNT_BUCKETS),
            num_preemptions: Histogram::new(SMALL_COUNT_BUCKETS),
            iteration_tokens: Histogram::new(COUNT_BUCKETS),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_upper_inclusive_and_cumulative() {
        let mut h = Histogram::new(&[0.1, 1.0]);
        for v in [0.05, 0.1, 0.5, 1.0, 3.0] {
            h.observe(v);
        }
        let c: Vec<(f64, u64)> = h.cumulative().collect();
        assert_eq!(c, [(0.1, 2), (1.0, 4), (f64::INFINITY, 5)]);
        assert_eq!(h.count, 5);
        assert!((h.sum - 4.65).abs() < 1e-12);
    }
}

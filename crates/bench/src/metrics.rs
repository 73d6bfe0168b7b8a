//! The statistics of a run, with `vllm bench serve`'s definitions and JSON field names.
//!
//! - TTFT: send to first text chunk. TPOT per request: (E2EL − TTFT) / (output tokens − 1),
//!   over requests with more than one output token. ITL: gaps between text chunks,
//!   pooled over all requests. E2EL: send to end of stream.
//! - Medians and percentiles interpolate linearly between order statistics (numpy's
//!   default); std is the population standard deviation.
//! - Throughputs divide by the whole run's duration. Failed requests are counted in
//!   `failed` and kept in `errors`; they contribute no tokens and no latencies.
//! - Goodput: completed requests meeting every given SLO, per second.

use serde::Serialize;

use crate::client::RequestRecord;

/// Service-level objectives in milliseconds (`--goodput ttft:MS,tpot:MS,e2el:MS`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Slo {
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub e2el_ms: Option<f64>,
}

impl std::str::FromStr for Slo {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let mut slo = Slo::default();
        for part in s.split([',', ' ']).filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once(':')
                .ok_or_else(|| format!("bad goodput term {part:?}: expected NAME:MS"))?;
            let v: f64 = v.parse().ok().filter(|v: &f64| *v > 0.0).ok_or_else(|| {
                format!("bad goodput value in {part:?}: expected milliseconds > 0")
            })?;
            match k {
                "ttft" => slo.ttft_ms = Some(v),
                "tpot" => slo.tpot_ms = Some(v),
                "e2el" => slo.e2el_ms = Some(v),
                _ => {
                    return Err(format!(
                        "unknown goodput metric {k:?}: expected ttft, tpot or e2el"
                    ))
                }
            }
        }
        Ok(slo)
    }
}

/// Mean, median, std and percentiles of one latency, in ms.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Dist {
    pub mean: f64,
    pub median: f64,
    pub std: f64,
    pub p90: f64,
    pub p99: f64,
}

/// Linear interpolation between order statistics of sorted `xs` (numpy's default).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = p / 100.0 * (sorted.len() - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64)
}

impl Dist {
    /// Of values in seconds, reported in milliseconds.
    pub fn of_secs(xs: &[f64]) -> Self {
        if xs.is_empty() {
            return Self::default();
        }
        let mut s: Vec<f64> = xs.iter().map(|x| x * 1e3).collect();
        s.sort_by(f64::total_cmp);
        let n = s.len() as f64;
        let mean = s.iter().sum::<f64>() / n;
        let var = s.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
        Self {
            mean,
            median: percentile(&s, 50.0),
            std: var.sqrt(),
            p90: percentile(&s, 90.0),
            p99: percentile(&s, 99.0),
        }
    }
}

/// One run's results; serialized with vLLM's field names.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Summary {
    pub label: String,
    pub model_id: String,
    pub endpoint: String,
    /// `inf` for all at once.
    pub request_rate: String,
    pub burstiness: f64,
    pub max_concurrency: Option<usize>,
    pub num_prompts: usize,
    pub duration: f64,
    pub completed: usize,
    pub failed: usize,
    pub total_input_tokens: usize,
    pub total_output_tokens: usize,
    pub request_throughput: f64,
    pub request_goodput: Option<f64>,
    pub output_throughput: f64,
    pub total_token_throughput: f64,
    #[serde(flatten)]
    pub ttft: Flat<'static>,
    #[serde(flatten)]
    pub tpot: Flat<'static>,
    #[serde(flatten)]
    pub itl: Flat<'static>,
    #[serde(flatten)]
    pub e2el: Flat<'static>,
    pub input_lens: Vec<usize>,
    pub output_lens: Vec<usize>,
    pub ttfts: Vec<f64>,
    pub itls: Vec<Vec<f64>>,
    pub errors: Vec<String>,
}

/// A distribution under its metric's names: `mean_ttft_ms`, `median_ttft_ms`, ...
#[derive(Debug, Clone, Default)]
pub struct Flat<'a> {
    pub name: &'a str,
    pub dist: Dist,
}

impl Serialize for Flat<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let d = &self.dist;
        let mut m = s.serialize_map(Some(5))?;
        for (stat, v) in [
            ("mean", d.mean),
            ("median", d.median),
            ("std", d.std),
            ("p90", d.p90),
            ("p99", d.p99),
        ] {
            m.serialize_entry(&format!("{stat}_{}_ms", self.name), &v)?;
        }
        m.end()
    }
}

/// Per-request TPOT in seconds, for requests with more than one output token.
fn tpot(r: &RequestRecord) -> Option<f64> {
    (r.output_tokens > 1).then(|| (r.latency - r.ttft) / (r.output_tokens - 1) as f64)
}

/// The statistics of `records` over a run of `duration` seconds.
pub fn summarize(records: &[RequestRecord], duration: f64, slo: Option<&Slo>) -> Summary {
    let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.success).collect();
    let ttfts: Vec<f64> = ok.iter().map(|r| r.ttft).collect();
    let tpots: Vec<f64> = ok.iter().filter_map(|r| tpot(r)).collect();
    let itls: Vec<f64> = ok.iter().flat_map(|r| r.itl.iter().copied()).collect();
    let e2els: Vec<f64> = ok.iter().map(|r| r.latency).collect();
    let total_input_tokens = ok.iter().map(|r| r.prompt_tokens).sum();
    let total_output_tokens = ok.iter().map(|r| r.output_tokens).sum();
    let per_s = |x: usize| {
        if duration > 0.0 {
            x as f64 / duration
        } else {
            0.0
        }
    };
    let request_goodput = slo.map(|slo| {
        let meets = |limit: Option<f64>, v: f64| limit.is_none_or(|ms| v * 1e3 <= ms);
        let good = ok
            .iter()
            .filter(|r| {
                meets(slo.ttft_ms, r.ttft)
                    && meets(slo.tpot_ms, tpot(r).unwrap_or(0.0))
                    && meets(slo.e2el_ms, r.latency)
            })
            .count();
        per_s(good)
    });
    Summary {
        num_prompts: records.len(),
        duration,
        completed: ok.len(),
        failed: records.len() - ok.len(),
        total_input_tokens,
        total_output_tokens,
        request_throughput: per_s(ok.len()),
        request_goodput,
        output_throughput: per_s(total_output_tokens),
        total_token_throughput: per_s(total_input_tokens + total_output_tokens),
        ttft: Flat {
            name: "ttft",
            dist: Dist::of_secs(&ttfts),
        },
        tpot: Flat {
            name: "tpot",
            dist: Dist::of_secs(&tpots),
        },
        itl: Flat {
            name: "itl",
            dist: Dist::of_secs(&itls),
        },
        e2el: Flat {
            name: "e2el",
            dist: Dist::of_secs(&e2els),
        },
        input_lens: records.iter().map(|r| r.prompt_tokens).collect(),
        output_lens: records.iter().map(|r| r.output_tokens).collect(),
        ttfts: records.iter().map(|r| r.ttft).collect(),
        itls: records.iter().map(|r| r.itl.clone()).collect(),
        errors: records.iter().map(|r| r.error.clone()).collect(),
        ..Summary::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(ttft: f64, itl: &[f64], out: usize) -> RequestRecord {
        RequestRecord {
            success: true,
            error: String::new(),
            prompt_tokens: 10,
            output_tokens: out,
            ttft,
            itl: itl.to_vec(),
            latency: ttft + itl.iter().sum::<f64>(),
        }
    }

    #[test]
    fn percentiles_interpolate_like_numpy() {
        let s = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&s, 50.0), 2.5);
        assert!((percentile(&s, 99.0) - 3.97).abs() < 1e-12);
        assert_eq!(percentile(&s, 0.0), 1.0);
        assert_eq!(percentile(&s, 100.0), 4.0);
        assert_eq!(percentile(&[7.0], 90.0), 7.0);
    }

    #[test]
    fn a_known_schedule_gives_exact_statistics() {
        // Two requests: TTFT 0.1 s then 3 gaps of 0.02 s; TTFT 0.3 s then 1 gap of 0.04 s.
        // One failure, and a one-token request (no TPOT, no ITL).
        let records = vec![
            rec(0.1, &[0.02, 0.02, 0.02], 4),
            rec(0.3, &[0.04], 2),
            RequestRecord {
                error: "HTTP 500".into(),
                latency: 0.01,
                ..RequestRecord::default()
            },
            rec(0.2, &[], 1),
        ];
        let s = summarize(&records, 2.0, Some(&"ttft:150,tpot:30".parse().unwrap()));
        assert_eq!((s.completed, s.failed, s.num_prompts), (3, 1, 4));
        assert_eq!((s.total_input_tokens, s.total_output_tokens), (30, 7));
        assert_eq!(s.request_throughput, 1.5);
        assert_eq!(s.output_throughput, 3.5);
        assert_eq!(s.total_token_throughput, 18.5);
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        // TTFT over the three completed: 100, 300, 200 ms.
        let t = &s.ttft.dist;
        assert!(close(t.mean, 200.0) && close(t.median, 200.0) && close(t.p99, 298.0));
        assert!(close(t.std, (20000.0f64 / 3.0).sqrt()));
        // TPOT: (0.16 - 0.1)/3 = 20 ms and (0.34 - 0.3)/1 = 40 ms.
        assert!(close(s.tpot.dist.mean, 30.0) && close(s.tpot.dist.p90, 38.0));
        // ITL pooled: 20, 20, 20, 40 ms.
        assert!(close(s.itl.dist.median, 20.0) && close(s.itl.dist.mean, 25.0));
        // E2EL: 160, 340, 200 ms.
        assert!(close(s.e2el.dist.median, 200.0));
        // Goodput: only the first request meets TTFT <= 150 ms and TPOT <= 30 ms.
        assert_eq!(s.request_goodput, Some(0.5));
        assert_eq!(s.errors[2], "HTTP 500");
        let j = serde_json::to_value(&s).unwrap();
        for k in [
            "mean_ttft_ms",
            "median_tpot_ms",
            "p99_itl_ms",
            "std_e2el_ms",
            "completed",
        ] {
            assert!(j.get(k).is_some(), "no {k} in {j}");
        }
    }

    #[test]
    fn goodput_terms_parse_or_name_the_problem() {
        let s: Slo = "ttft:200,e2el:5000".parse().unwrap();
        assert_eq!(
            (s.ttft_ms, s.tpot_ms, s.e2el_ms),
            (Some(200.0), None, Some(5000.0))
        );
        assert!("ttft".parse::<Slo>().unwrap_err().contains("NAME:MS"));
        assert!("foo:1".parse::<Slo>().unwrap_err().contains("foo"));
        assert!("tpot:-1".parse::<Slo>().is_err());
    }

    #[test]
    fn no_completed_requests_is_all_zeros_not_nan() {
        let s = summarize(&[RequestRecord::default()], 1.0, None);
        assert_eq!((s.completed, s.failed), (0, 1));
        assert_eq!(s.ttft.dist, Dist::default());
    }
}

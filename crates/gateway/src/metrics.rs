//! The gateway's own Prometheus metrics, rendered in the text exposition format.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

/// Latency buckets in seconds (vLLM's TTFT buckets, which span loopback to minutes).
const BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
];

type Labels = Vec<(&'static str, String)>;

#[derive(Default)]
struct Histogram {
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

#[derive(Default)]
struct Inner {
    counters: BTreeMap<(&'static str, Labels), f64>,
    hists: BTreeMap<(&'static str, Labels), Histogram>,
}

#[derive(Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

const HELP: &[(&str, &str, &str)] = &[
    (
        "pagellm_gateway_requests_total",
        "counter",
        "Requests answered, by model group, replica (\"none\" when none was reached) and HTTP status.",
    ),
    ("pagellm_gateway_retries_total", "counter", "Attempts re-sent to another replica or fallback group before the first byte."),
    ("pagellm_gateway_failovers_total", "counter", "Streams continued on another replica after theirs failed mid-answer."),
    ("pagellm_gateway_ejections_total", "counter", "Replicas taken out of rotation after failures."),
    ("pagellm_gateway_routing_decisions_total", "counter", "Routing decisions by policy and reason."),
    ("pagellm_gateway_rate_limited_total", "counter", "Requests refused by a key's limits or because every deployment is at its rpm/tpm (limit=\"deployment\"), by limit."),
    ("pagellm_gateway_upstream_latency_seconds", "histogram", "Time from sending a request upstream to its last byte."),
    ("pagellm_gateway_time_to_first_token_seconds", "histogram", "Time from the request's arrival to the first streamed chunk."),
];

impl Metrics {
    pub fn inc(&self, name: &'static str, labels: &[(&'static str, &str)]) {
        self.add(name, labels, 1.0);
    }

    pub fn add(&self, name: &'static str, labels: &[(&'static str, &str)], v: f64) {
        let key = (name, own(labels));
        *self.inner.lock().unwrap().counters.entry(key).or_default() += v;
    }

    pub fn observe(&self, name: &'static str, labels: &[(&'static str, &str)], secs: f64) {
        let mut g = self.inner.lock().unwrap();
        let h = g.hists.entry((name, own(labels))).or_default();
        if h.counts.is_empty() {
            h.counts = vec![0; BUCKETS.len()];
        }
        if let Some(i) = BUCKETS.iter().position(|&b| secs <= b) {
            h.counts[i] += 1;
        }
        h.sum += secs;
        h.count += 1;
    }

    /// The counter's current value (tests and the admin view).
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let g = self.inner.lock().unwrap();
        g.counters
            .iter()
            .filter(|((n, l), _)| {
                *n == name
                    && labels
                        .iter()
                        .all(|(k, v)| l.iter().any(|(lk, lv)| lk == k && lv == v))
            })
            .map(|(_, v)| v)
            .sum()
    }

    /// Everything, followed by `gauges` (already rendered lines).
    pub fn render(&self, gauges: &str) -> String {
        let g = self.inner.lock().unwrap();
        let mut out = String::new();
        for &(name, kind, help) in HELP {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for ((n, l), v) in &g.counters {
                if *n == name {
                    let _ = writeln!(out, "{name}{} {v}", fmt_labels(l, None));
                }
            }
            for ((n, l), h) in &g.hists {
                if *n != name {
                    continue;
                }
                let mut cum = 0;
                for (b, c) in BUCKETS.iter().zip(&h.counts) {
                    cum += c;
                    let _ = writeln!(
                        out,
                        "{name}_bucket{} {cum}",
                        fmt_labels(l, Some(&b.to_string()))
                    );
                }
                let _ = writeln!(
                    out,
                    "{name}_bucket{} {}",
                    fmt_labels(l, Some("+Inf")),
                    h.count
                );
                let _ = writeln!(out, "{name}_sum{} {}", fmt_labels(l, None), h.sum);
                let _ = writeln!(out, "{name}_count{} {}", fmt_labels(l, None), h.count);
            }
        }
        out.push_str(gauges);
        out
    }
}

fn own(labels: &[(&'static str, &str)]) -> Labels {
    labels.iter().map(|(k, v)| (*k, v.to_string())).collect()
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

pub fn fmt_labels(l: &[(&'static str, String)], le: Option<&str>) -> String {
    let mut parts: Vec<String> = l
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
        .collect();
    if let Some(le) = le {
        parts.push(format!("le=\"{le}\""));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", parts.join(","))
    }
}

/// Reads one gauge or counter from Prometheus text: the sum over all series of `name`
/// (a replica serves one model, so its series differ only in labels we do not need).
pub fn scrape_value(text: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        if !(rest.starts_with('{') || rest.starts_with(' ')) {
            continue;
        }
        let value = rest.rsplit(' ').next()?.parse::<f64>().ok()?;
        *found.get_or_insert(0.0) += value;
    }
    found
}

/// The value of `label` on the first series of `name`.
pub fn scrape_label(text: &str, name: &str, label: &str) -> Option<String> {
    let line = text
        .lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))?;
    let pat = format!("{label}=\"");
    let start = line.find(&pat)? + pat.len();
    let end = line[start..].find('"')? + start;
    Some(line[start..end].to_string())
}

//! The table printed at the end of a run, laid out like `vllm bench serve`'s.

use std::fmt::Write;

use crate::metrics::{Flat, Summary};

pub fn table(s: &Summary) -> String {
    let mut o = String::new();
    let line = |o: &mut String, k: &str, v: String| {
        let _ = writeln!(o, "{k:<40}{v:>12}");
    };
    let _ = writeln!(o, "{:=^52}", " Serving Benchmark Result ");
    if !s.label.is_empty() {
        line(&mut o, "Label:", s.label.clone());
    }
    line(
        &mut o,
        "Maximum request concurrency:",
        s.max_concurrency
            .map_or_else(|| "none".into(), |c| c.to_string()),
    );
    line(&mut o, "Request rate (req/s):", s.request_rate.clone());
    line(&mut o, "Successful requests:", s.completed.to_string());
    line(&mut o, "Failed requests:", s.failed.to_string());
    line(
        &mut o,
        "Benchmark duration (s):",
        format!("{:.2}", s.duration),
    );
    line(
        &mut o,
        "Total input tokens:",
        s.total_input_tokens.to_string(),
    );
    line(
        &mut o,
        "Total generated tokens:",
        s.total_output_tokens.to_string(),
    );
    line(
        &mut o,
        "Request throughput (req/s):",
        format!("{:.2}", s.request_throughput),
    );
    if let Some(g) = s.request_goodput {
        line(&mut o, "Request goodput (req/s):", format!("{g:.2}"));
    }
    line(
        &mut o,
        "Output token throughput (tok/s):",
        format!("{:.2}", s.output_throughput),
    );
    line(
        &mut o,
        "Total token throughput (tok/s):",
        format!("{:.2}", s.total_token_throughput),
    );
    for (title, f) in [
        ("Time to First Token", &s.ttft),
        ("Time per Output Token (excl. 1st token)", &s.tpot),
        ("Inter-token Latency", &s.itl),
        ("End-to-end Latency", &s.e2el),
    ] {
        section(&mut o, title, f);
    }
    let _ = writeln!(o, "{:=<52}", "");
    if s.failed > 0 {
        let first = s
            .errors
            .iter()
            .find(|e| !e.is_empty())
            .cloned()
            .unwrap_or_default();
        let _ = writeln!(o, "first error: {first}");
    }
    o
}

fn section(o: &mut String, title: &str, f: &Flat<'_>) {
    let _ = writeln!(o, "{:-^52}", format!(" {title} "));
    let name = f.name.to_uppercase();
    for (stat, v) in [
        ("Mean", f.dist.mean),
        ("Median", f.dist.median),
        ("P90", f.dist.p90),
        ("P99", f.dist.p99),
    ] {
        let _ = writeln!(o, "{:<40}{:>12.2}", format!("{stat} {name} (ms):"), v);
    }
}

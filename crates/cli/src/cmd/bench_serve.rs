//! `pagellm bench serve`: load an OpenAI-compatible server (pagellm, vLLM, llama.cpp's
//! server, ...) with streamed requests and report what `vllm bench serve` reports, under
//! the same names; `pagellm bench plot` draws saved results side by side.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use pagellm_bench::client::{Endpoint, Target};
use pagellm_bench::dataset::{self, Dataset, DatasetArgs};
use pagellm_bench::metrics::Slo;
use pagellm_bench::{plot, report, RunConfig};
use pagellm_model::loader::load_model;
use serde_json::{json, Value};

#[derive(clap::Args)]
pub struct Args {
    /// The server, e.g. http://127.0.0.1:8000.
    #[arg(long)]
    base_url: String,
    /// Model name to send (default: the first one the server lists).
    #[arg(long)]
    model: Option<String>,
    /// completions or chat.
    #[arg(long, default_value = "completions")]
    endpoint: Endpoint,
    /// random, prefix-repetition, or a FILE.jsonl of {"prompt", "output_len"} lines.
    #[arg(long, default_value = "random")]
    dataset: Dataset,
    #[arg(long, default_value_t = 100)]
    num_prompts: usize,
    /// Prompt tokens (random) or suffix tokens after the shared prefix (prefix-repetition).
    #[arg(long, default_value_t = 128)]
    input_len: usize,
    /// Output tokens asked for (`max_tokens`).
    #[arg(long, default_value_t = 128)]
    output_len: usize,
    /// Tokens of each shared prefix (prefix-repetition).
    #[arg(long, default_value_t = 256)]
    prefix_len: usize,
    /// Distinct shared prefixes (prefix-repetition).
    #[arg(long, default_value_t = 1)]
    num_prefixes: usize,
    /// A pagellm model whose tokenizer makes prompts of exact token lengths (random
    /// words, about a token each, without it).
    #[arg(long)]
    tokenizer: Option<String>,
    /// Requests per second, or inf to send all at once; finite rates arrive as a
    /// Poisson process (gamma with --burstiness).
    #[arg(long, default_value = "inf", value_parser = parse_rate)]
    request_rate: f64,
    /// Gamma shape of arrivals: 1 = Poisson, below 1 burstier, above 1 more even.
    #[arg(long, default_value_t = 1.0)]
    burstiness: f64,
    /// Most requests in flight at once.
    #[arg(long)]
    max_concurrency: Option<usize>,
    /// Ask the server to ignore end-of-sequence tokens, so every request produces
    /// --output-len tokens.
    #[arg(long)]
    ignore_eos: bool,
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// SLOs for goodput, in ms: ttft:MS,tpot:MS,e2el:MS (any subset).
    #[arg(long)]
    goodput: Option<Slo>,
    #[arg(long, env = "OPENAI_API_KEY")]
    api_key: Option<String>,
    /// A name for this run in the JSON and the plots (e.g. the engine).
    #[arg(long, default_value = "")]
    label: String,
    /// Run once per concurrency in this list (1,4,16,64).
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["sweep_request_rate", "max_concurrency"])]
    sweep_concurrency: Vec<usize>,
    /// Run once per request rate in this list.
    #[arg(long, value_delimiter = ',', value_parser = parse_rate, conflicts_with = "request_rate")]
    sweep_request_rate: Vec<f64>,
    /// Save the results as JSON (vLLM's field names).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Save an SVG plot: latency percentiles, or for a sweep throughput against latency.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

fn parse_rate(s: &str) -> Result<f64, String> {
    if s == "inf" {
        return Ok(f64::INFINITY);
    }
    match s.parse::<f64>() {
        Ok(r) if r > 0.0 && r.is_finite() => Ok(r),
        _ => Err(format!(
            "invalid request rate {s:?}: expected a positive number or inf"
        )),
    }
}

pub fn run(a: Args) -> Result<()> {
    let tokenizer = match &a.tokenizer {
        Some(m) => Some(
            load_model(m)
                .with_context(|| format!("--tokenizer {m}"))?
                .tokenizer,
        ),
        None => None,
    };
    let samples = dataset::build(
        &a.dataset,
        &DatasetArgs {
            num_prompts: a.num_prompts,
            input_len: a.input_len,
            output_len: a.output_len,
            prefix_len: a.prefix_len,
            num_prefixes: a.num_prefixes,
            seed: a.seed,
        },
        tokenizer.as_ref(),
    )?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(async {
        let model = match &a.model {
            Some(m) => m.clone(),
            None => pagellm_bench::first_model(&a.base_url, a.api_key.as_deref()).await?,
        };
        let base = RunConfig {
            target: Target {
                base_url: a.base_url.clone(),
                model,
                endpoint: a.endpoint,
                api_key: a.api_key.clone(),
                ignore_eos: a.ignore_eos,
                temperature: a.temperature,
            },
            request_rate: a.request_rate,
            burstiness: a.burstiness,
            max_concurrency: a.max_concurrency,
            seed: a.seed,
            slo: a.goodput.clone(),
            label: a.label.clone(),
            progress: !a.quiet,
        };
        let configs: Vec<RunConfig> = if !a.sweep_concurrency.is_empty() {
            a.sweep_concurrency
                .iter()
                .map(|&c| RunConfig {
                    max_concurrency: Some(c),
                    ..base.clone()
                })
                .collect()
        } else if !a.sweep_request_rate.is_empty() {
            a.sweep_request_rate
                .iter()
                .map(|&r| RunConfig {
                    request_rate: r,
                    ..base.clone()
                })
                .collect()
        } else {
            vec![base]
        };
        let mut runs = Vec::new();
        for cfg in &configs {
            let s = pagellm_bench::run(cfg, &samples).await?;
            print!("{}", report::table(&s));
            runs.push(serde_json::to_value(&s)?);
        }
        let sweep = configs.len() > 1;
        let doc = if sweep {
            json!({
                "sweep": if a.sweep_concurrency.is_empty() { "request_rate" } else { "max_concurrency" },
                "label": a.label,
                "runs": runs,
            })
        } else {
            runs[0].clone()
        };
        if let Some(p) = &a.json {
            std::fs::write(p, serde_json::to_string_pretty(&doc)? + "\n")
                .with_context(|| format!("cannot write {}", p.display()))?;
        }
        if let Some(p) = &a.plot {
            let svg = if sweep {
                plot::sweep_chart(&sweep_title(&a.label, &runs), &[(a.label.clone(), runs)])
            } else {
                plot::run_chart(&doc)
            };
            std::fs::write(p, svg).with_context(|| format!("cannot write {}", p.display()))?;
        }
        Ok(())
    })
}

fn sweep_title(label: &str, runs: &[Value]) -> String {
    let model = runs
        .first()
        .and_then(|r| r["model_id"].as_str())
        .unwrap_or("");
    format!("{label} {model}").trim().to_string()
}

/// `pagellm bench plot`: draws saved sweeps (JSON from `bench serve --json`) together.
#[derive(clap::Args)]
pub struct PlotArgs {
    /// The SVG to write.
    #[arg(long)]
    out: PathBuf,
    /// Chart title.
    #[arg(long, default_value = "Serving benchmark")]
    title: String,
    /// Sweep or single-run JSON files; each is one line, named by its label.
    #[arg(required = true)]
    inputs: Vec<PathBuf>,
}

pub fn plot(a: PlotArgs) -> Result<()> {
    let mut sweeps = Vec::new();
    for p in &a.inputs {
        let text =
            std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))?;
        let v: Value =
            serde_json::from_str(&text).with_context(|| format!("{} is not JSON", p.display()))?;
        let runs = match v.get("runs").and_then(Value::as_array) {
            Some(r) => r.clone(),
            None if v.get("output_throughput").is_some() => vec![v.clone()],
            None => bail!("{} is not a bench serve result", p.display()),
        };
        let label = v["label"]
            .as_str()
            .filter(|l| !l.is_empty())
            .map_or_else(|| p.display().to_string(), str::to_string);
        sweeps.push((label, runs));
    }
    std::fs::write(&a.out, plot::sweep_chart(&a.title, &sweeps))
        .with_context(|| format!("cannot write {}", a.out.display()))
}

use std::path::PathBuf;

use anyhow::{Context, Result};
use pagellm_kernels::pool::ThreadPool;
use pagellm_quant::eval::{chunks, evaluate, table, EvalConfig};

#[derive(clap::Subcommand)]
pub enum EvalCmd {
    /// Perplexity over a text (as llama-perplexity computes it) and, against a base
    /// model, KL divergence and top-token agreement.
    Perplexity(PerplexityArgs),
}

#[derive(clap::Args)]
pub struct PerplexityArgs {
    /// Models to evaluate (repeat for several; one results row each).
    #[arg(short, long, required = true)]
    model: Vec<String>,
    /// The evaluation text.
    #[arg(short, long)]
    file: PathBuf,
    /// Tokens per chunk; the second half of each chunk is scored.
    #[arg(long, default_value_t = 512)]
    ctx: usize,
    /// Evaluate at most this many chunks.
    #[arg(long)]
    chunks: Option<usize>,
    /// Reference model for KL divergence, run in the same process (KV cache in f16).
    #[arg(long)]
    base_model: Option<String>,
    /// KV cache element type of the evaluated models: f16, bf16, f32, fp8 or int8
    /// (with the same model as --base-model: what the cache type alone costs).
    #[arg(long, default_value = "f16")]
    kv_cache_dtype: pagellm_model::KvDtype,
    /// Worker threads (0 = one per core).
    #[arg(short, long, default_value_t = 0)]
    threads: usize,
    /// Write the results as JSON to this file ("-" for stdout instead of the table).
    #[arg(long)]
    json: Option<PathBuf>,
    /// No progress bar.
    #[arg(short, long)]
    quiet: bool,
}

pub fn run(c: EvalCmd) -> Result<()> {
    match c {
        EvalCmd::Perplexity(a) => perplexity(a),
    }
}

pub fn layer_bar(quiet: bool, unit: &str) -> indicatif::ProgressBar {
    let bar = if quiet {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new(0)
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template(&format!(
            "{{bar:40}} {{pos}}/{{len}} {unit}  {{elapsed_precise}}  {{msg}}"
        ))
        .expect("valid template"),
    );
    bar
}

fn perplexity(a: PerplexityArgs) -> Result<()> {
    let text = std::fs::read_to_string(&a.file)
        .with_context(|| format!("reading {}", a.file.display()))?;
    let threads = if a.threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        a.threads
    };
    let pool = ThreadPool::new(threads);
    let base = a
        .base_model
        .as_deref()
        .map(|b| pagellm_model::loader::load_model(b).with_context(|| format!("loading {b}")))
        .transpose()?;
    let cfg = EvalConfig {
        ctx: a.ctx,
        max_chunks: a.chunks,
    };
    let mut reports = Vec::new();
    for m in &a.model {
        let model = pagellm_model::loader::load_model(m).with_context(|| format!("loading {m}"))?;
        let chunks = chunks(&model, &text, &cfg)?;
        let bar = layer_bar(a.quiet, "chunks");
        bar.set_message(m.clone());
        let kv = a.kv_cache_dtype;
        let mut r = evaluate(&model, base.as_ref(), &pool, &chunks, kv, |done, total| {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
        })?;
        bar.finish_and_clear();
        if kv != pagellm_model::KvDtype::F16 {
            r.model = format!("{} (KV {kv})", r.model);
        }
        reports.push(r);
    }
    let json = serde_json::to_string_pretty(&reports)?;
    match a.json.as_deref() {
        Some(p) if p.as_os_str() == "-" => println!("{json}"),
        Some(p) => {
            std::fs::write(p, json + "\n").with_context(|| format!("writing {}", p.display()))?;
            print!("{}", table(&reports));
        }
        None => print!("{}", table(&reports)),
    }
    Ok(())
}

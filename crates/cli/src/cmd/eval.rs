use std::path::PathBuf;

use anyhow::{Context, Result};
use pagellm_kernels::cpu::Numerics;
use pagellm_kernels::pool::ThreadPool;
use pagellm_quant::eval::{chunks, evaluate, table, Base, EvalConfig, KldBaseWriter};

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
    /// The arithmetic of the base: `fast` (the kernels every model runs) or `reference`
    /// (the float reference path: weights dequantized to f32, activations, attention and
    /// sums in f32, KV cache in f32). `reference` without --base-model measures each
    /// model against itself: what the fast kernels cost.
    #[arg(long, default_value = "fast", value_parser = ["fast", "reference"])]
    base_numerics: String,
    /// Also write the base's log-probabilities (of the first model's run) to this file
    /// in the format of `llama-perplexity --kl-divergence-base`, so that
    /// `llama-perplexity -m M.gguf --kl-divergence-base FILE --kl-divergence` measures
    /// llama.cpp against the same base. Needs a base (--base-model or
    /// --base-numerics reference).
    #[arg(long, value_name = "FILE")]
    kl_divergence_base: Option<PathBuf>,
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
    if a.kl_divergence_base.is_some() && a.base_model.is_none() && a.base_numerics != "reference" {
        anyhow::bail!(
            "--kl-divergence-base writes the base's log-probabilities: give --base-model or \
             --base-numerics reference"
        );
    }
    let mut reports = Vec::new();
    for (i, m) in a.model.iter().enumerate() {
        let model = pagellm_model::loader::load_model(m).with_context(|| format!("loading {m}"))?;
        let chunks = chunks(&model, &text, &cfg)?;
        let bar = layer_bar(a.quiet, "chunks");
        bar.set_message(m.clone());
        let kv = a.kv_cache_dtype;
        let numerics = match a.base_numerics.as_str() {
            "reference" => Numerics::Reference,
            _ => Numerics::Fast,
        };
        let base = match (&base, numerics) {
            (Some(b), _) => Some(Base { model: b, numerics }),
            (None, Numerics::Reference) => Some(Base {
                model: &model,
                numerics,
            }),
            (None, Numerics::Fast) => None,
        };
        let mut writer = match (&a.kl_divergence_base, i) {
            (Some(path), 0) => Some(KldBaseWriter::create(
                path,
                &chunks,
                model.transformer.config.vocab_size,
            )?),
            _ => None,
        };
        let mut r = evaluate(
            &model,
            base,
            &pool,
            &chunks,
            kv,
            writer.as_mut(),
            |done, total| {
                bar.set_length(total as u64);
                bar.set_position(done as u64);
            },
        )?;
        if let Some(w) = writer {
            w.finish()?;
        }
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

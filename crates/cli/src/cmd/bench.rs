//! `pagellm bench`: the same two measurements as llama.cpp's `llama-bench` so the two
//! can be compared line by line: pp (a prompt of N tokens in one pass) and tg (N
//! tokens generated one at a time), each repeated and reported as mean ± stddev.

use std::time::Instant;

use anyhow::{bail, Result};
use pagellm_kernels::pool::ThreadPool;
use pagellm_model::loader::load_model;
use pagellm_model::{Logits, Workspace};

use super::ModelArgs;

/// `pagellm bench` alone measures single-sequence speed; subcommands run other benchmarks.
#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Args {
    #[command(subcommand)]
    command: Option<BenchCmd>,
    #[command(flatten)]
    latency: LatencyArgs,
}

#[derive(clap::Subcommand)]
enum BenchCmd {
    /// Offline throughput: many requests at once through the batching engine.
    Throughput(super::bench_throughput::Args),
    /// Online serving: streamed requests against an OpenAI-compatible server, with
    /// `vllm bench serve`'s metrics (TTFT, TPOT, ITL, E2EL, throughput, goodput).
    Serve(super::bench_serve::Args),
    /// Draw saved `bench serve` results (JSON) together in one SVG.
    Plot(super::bench_serve::PlotArgs),
    /// A gateway's added latency: open-loop chat requests at fixed rates against a
    /// URL (a gateway in front of `bench mock-upstream`, or the mock itself).
    Overhead(super::bench_overhead::Args),
    /// An OpenAI-compatible upstream that answers at once, for `bench overhead`.
    MockUpstream(super::bench_overhead::MockArgs),
}

/// Prompt tokens per forward pass in the pp test.
const PREFILL_CHUNK_TOKENS: usize = 512;

#[derive(clap::Args)]
pub struct LatencyArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt tokens for the prompt-processing test (0 = skip).
    #[arg(short = 'p', long, default_value_t = 512)]
    n_prompt: usize,
    /// Tokens for the generation test (0 = skip).
    #[arg(short = 'n', long, default_value_t = 128)]
    n_gen: usize,
    /// Repetitions of each test.
    #[arg(short = 'r', long, default_value_t = 5)]
    repetitions: usize,
    /// Print one JSON object per test instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> Result<()> {
    match a.command {
        Some(BenchCmd::Throughput(t)) => super::bench_throughput::run(t),
        Some(BenchCmd::Serve(s)) => super::bench_serve::run(s),
        Some(BenchCmd::Plot(p)) => super::bench_serve::plot(p),
        Some(BenchCmd::Overhead(o)) => super::bench_overhead::run(o),
        Some(BenchCmd::MockUpstream(m)) => super::bench_overhead::mock(m),
        None => run_latency(a.latency),
    }
}

fn run_latency(a: LatencyArgs) -> Result<()> {
    if a.repetitions == 0 {
        bail!("--repetitions must be at least 1");
    }
    let pool = ThreadPool::new(a.model.threads);
    let m = load_model(&a.model.model)?;
    let model = &m.transformer;
    let vocab = model.config.vocab_size as u32;
    // Deterministic pseudo-random tokens, as llama-bench uses random tokens.
    let tokens = |n: usize| -> Vec<u32> {
        (0..n as u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 7) % vocab)
            .collect()
    };
    let mut ws = Workspace::default();
    let mut results = Vec::new();
    if a.n_prompt > 0 {
        let prompt = tokens(a.n_prompt);
        let mut runs = Vec::new();
        for rep in 0..=a.repetitions {
            let mut cache = model.new_cache(a.n_prompt);
            let t = Instant::now();
            for chunk in prompt.chunks(PREFILL_CHUNK_TOKENS) {
                model.forward(&pool, &mut ws, &mut cache, chunk, Logits::Last)?;
            }
            // The first run warms caches and page tables, as llama-bench's warm-up does.
            if rep > 0 {
                runs.push(a.n_prompt as f64 / t.elapsed().as_secs_f64());
            }
        }
        results.push((format!("pp{}", a.n_prompt), runs));
    }
    if a.n_gen > 0 {
        let gen = tokens(a.n_gen);
        let mut runs = Vec::new();
        for rep in 0..=a.repetitions {
            let mut cache = model.new_cache(a.n_gen);
            let t = Instant::now();
            for &tok in &gen {
                model.forward(&pool, &mut ws, &mut cache, &[tok], Logits::Last)?;
            }
            if rep > 0 {
                runs.push(a.n_gen as f64 / t.elapsed().as_secs_f64());
            }
        }
        results.push((format!("tg{}", a.n_gen), runs));
    }
    let name = &m.source;
    for (test, runs) in &results {
        let mean = runs.iter().sum::<f64>() / runs.len() as f64;
        let sd = (runs.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / runs.len() as f64).sqrt();
        let mut sorted = runs.clone();
        sorted.sort_by(f64::total_cmp);
        let median = sorted[sorted.len() / 2];
        if a.json {
            println!(
                "{}",
                serde_json::json!({"model": name, "threads": pool.n_threads(), "test": test,
                    "tokens_per_s_mean": mean, "tokens_per_s_median": median, "tokens_per_s_stddev": sd, "runs": runs})
            );
        } else {
            println!(
                "{name} | threads {} | {test:>6} | {mean:8.2} ± {sd:6.2} tokens/s (median {median:.2})",
                pool.n_threads()
            );
        }
    }
    Ok(())
}

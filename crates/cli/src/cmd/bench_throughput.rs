//! `pagellm bench throughput`: offline throughput like `vllm bench throughput`. All
//! prompts (random tokens) are submitted at once and the engine runs until every one
//! has finished; reported are requests/s, output tokens/s and total tokens/s, plus how
//! well the KV cache was used.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use pagellm_engine::{EngineCore, FinishReason, RequestParams, SamplingParams};
use pagellm_model::loader::load_model;
use rand::{Rng, SeedableRng};

use super::{EngineArgs, ModelArgs};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    engine: EngineArgs,
    /// Requests submitted at once.
    #[arg(long, default_value_t = 64)]
    num_prompts: usize,
    /// Prompt tokens per request.
    #[arg(long, default_value_t = 128)]
    input_len: usize,
    /// Output tokens per request (end-of-generation tokens are ignored).
    #[arg(long, default_value_t = 128)]
    output_len: usize,
    /// Draw each length uniformly from [len·(1−r), len·(1+r)] (a mixed-length workload).
    #[arg(long, default_value_t = 0.0)]
    random_range_ratio: f64,
    /// Seed of the random prompts and lengths.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

pub fn run(a: Args) -> Result<()> {
    if a.num_prompts == 0 || a.input_len == 0 || a.output_len == 0 {
        bail!("--num-prompts, --input-len and --output-len must be at least 1");
    }
    if !(0.0..1.0).contains(&a.random_range_ratio) {
        bail!(
            "--random-range-ratio must be in [0, 1), got {}",
            a.random_range_ratio
        );
    }
    let m = Arc::new(load_model(&a.model.model)?);
    let vocab = m.transformer.config.vocab_size as u32;
    let mut rng = rand::rngs::StdRng::seed_from_u64(a.seed);
    let mut len = |base: usize| -> usize {
        let lo = ((base as f64) * (1.0 - a.random_range_ratio))
            .floor()
            .max(1.0) as usize;
        let hi = ((base as f64) * (1.0 + a.random_range_ratio))
            .ceil()
            .max(lo as f64) as usize;
        if lo == hi {
            lo
        } else {
            rng.gen_range(lo..=hi)
        }
    };
    let shapes: Vec<(usize, usize)> = (0..a.num_prompts)
        .map(|_| (len(a.input_len), len(a.output_len)))
        .collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(a.seed ^ 0x9e37_79b9);
    let prompts: Vec<Vec<u32>> = shapes
        .iter()
        .map(|&(i, _)| (0..i).map(|_| rng.gen_range(0..vocab)).collect())
        .collect();

    let config = a.engine.config(a.model.threads);
    let mut core = EngineCore::new(m.clone(), &config)?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let start = Instant::now();
    for (id, (prompt, &(_, out_len))) in prompts.into_iter().zip(&shapes).enumerate() {
        let params = RequestParams {
            sampling: SamplingParams::greedy(),
            max_tokens: Some(out_len),
            ignore_eos: true,
            detokenize: false,
            ..RequestParams::default()
        };
        core.add_request(id as u64, prompt, params, tx.clone(), start)
            .with_context(|| format!("request {id}"))?;
    }
    drop(tx);
    let bar = if a.quiet {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new(a.num_prompts as u64)
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:40} {pos}/{len} requests  {elapsed_precise}  {msg}",
        )
        .expect("valid template"),
    );
    let mut output_tokens = 0usize;
    let mut done = 0usize;
    let mut ttft = Vec::new();
    let mut failed = 0usize;
    while done < a.num_prompts {
        let report = core.step();
        while let Ok(o) = rx.try_recv() {
            output_tokens += o.token_ids.len();
            if let Some(f) = o.finish {
                done += 1;
                bar.inc(1);
                if f.reason == FinishReason::Error || f.reason == FinishReason::Abort {
                    failed += 1;
                }
                ttft.extend(f.times.ttft_s());
            }
        }
        if report.num_scheduled_tokens == 0 && !core.has_unfinished() && done < a.num_prompts {
            bail!(
                "the engine stopped with {} requests unfinished",
                a.num_prompts - done
            );
        }
        bar.set_message(format!("{output_tokens} output tokens"));
    }
    let elapsed = start.elapsed().as_secs_f64();
    bar.finish_and_clear();
    if failed > 0 {
        bail!("{failed} requests failed");
    }
    let stats = core.stats();
    let prompt_tokens: usize = shapes.iter().map(|s| s.0).sum();
    let total = prompt_tokens + output_tokens;
    ttft.sort_by(f64::total_cmp);
    let mean_ttft = ttft.iter().sum::<f64>() / ttft.len().max(1) as f64;
    let hit_rate = if stats.prefix_cache.queries > 0 {
        stats.prefix_cache.hits as f64 / stats.prefix_cache.queries as f64
    } else {
        0.0
    };
    let result = serde_json::json!({
        "model": m.source,
        "threads": a.model.threads,
        "num_prompts": a.num_prompts,
        "input_len": a.input_len,
        "output_len": a.output_len,
        "random_range_ratio": a.random_range_ratio,
        "max_num_seqs": config.scheduler.max_num_seqs,
        "max_num_batched_tokens": config.scheduler.max_num_batched_tokens,
        "block_size": config.block_size,
        "elapsed_s": elapsed,
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "requests_per_s": a.num_prompts as f64 / elapsed,
        "output_tokens_per_s": output_tokens as f64 / elapsed,
        "total_tokens_per_s": total as f64 / elapsed,
        "mean_ttft_ms": mean_ttft * 1e3,
        "steps": stats.steps,
        "num_preemptions": stats.num_preemptions,
        "prefix_cache_hit_rate": hit_rate,
        "kv_slot_utilization": stats.kv_slot_utilization(),
    });
    println!(
        "Throughput: {:.2} requests/s, {:.2} total tokens/s, {:.2} output tokens/s",
        a.num_prompts as f64 / elapsed,
        total as f64 / elapsed,
        output_tokens as f64 / elapsed
    );
    println!(
        "Total num prompt tokens: {prompt_tokens}\nTotal num output tokens: {output_tokens}\nElapsed: {elapsed:.2} s over {} steps, {} preemptions",
        stats.steps, stats.num_preemptions
    );
    if let Some(u) = stats.kv_slot_utilization() {
        println!(
            "KV slots used by tokens / slots allocated: {:.2}% (block size {})",
            u * 100.0,
            config.block_size
        );
    }
    if let Some(path) = &a.json {
        std::fs::write(path, serde_json::to_string_pretty(&result)? + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

use std::io::Write;

use anyhow::{bail, Context, Result};
use pagellm_engine::generate::{generate, GenerateRequest};
use pagellm_engine::SamplingParams;
use pagellm_kernels::pool::ThreadPool;
use pagellm_model::chat::ChatMessage;
use pagellm_model::loader::load_model;
use pagellm_model::tokenizer::StreamDecoder;

use super::ModelArgs;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// The prompt (or, with --chat, the user message).
    #[arg(short, long)]
    prompt: String,
    /// Most tokens to generate.
    #[arg(short = 'n', long, default_value_t = 128)]
    max_tokens: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.8)]
    temperature: f32,
    #[arg(long, default_value_t = 0.95)]
    top_p: f32,
    /// 0 = off.
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    #[arg(long, default_value_t = 0.05)]
    min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    repetition_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    presence_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    frequency_penalty: f32,
    /// Seed for reproducible sampling.
    #[arg(long)]
    seed: Option<u64>,
    /// Wrap the prompt in the model's chat template as a user message.
    #[arg(long)]
    chat: bool,
    /// System message for --chat.
    #[arg(long, requires = "chat")]
    system: Option<String>,
    /// Keep generating past end-of-generation tokens.
    #[arg(long)]
    ignore_eos: bool,
}

pub fn run(a: Args) -> Result<()> {
    let sampling = SamplingParams {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        min_p: a.min_p,
        repetition_penalty: a.repetition_penalty,
        presence_penalty: a.presence_penalty,
        frequency_penalty: a.frequency_penalty,
        seed: a.seed,
    };
    sampling.validate()?;
    if a.max_tokens == 0 {
        bail!("--max-tokens must be at least 1");
    }
    let pool = ThreadPool::new(a.model.threads);
    let m = load_model(&a.model.model)?;
    let text = if a.chat {
        let tmpl = m
            .chat_template
            .as_ref()
            .context("this model has no chat template; run without --chat")?;
        let mut msgs = Vec::new();
        if let Some(s) = a.system {
            msgs.push(ChatMessage {
                role: "system".into(),
                content: s,
            });
        }
        msgs.push(ChatMessage {
            role: "user".into(),
            content: a.prompt,
        });
        tmpl.render(&msgs, true)?
    } else {
        a.prompt
    };
    // A chat template writes its own special tokens; a plain prompt gets BOS if the model wants it.
    let prompt = m.tokenizer.encode(&text, !a.chat, true)?;
    let req = GenerateRequest {
        prompt,
        max_tokens: a.max_tokens,
        sampling,
        stop_ids: if a.ignore_eos {
            Vec::new()
        } else {
            m.tokenizer.eos_ids().to_vec()
        },
    };
    let mut decoder = StreamDecoder::new(&m.tokenizer);
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let stats = generate(&m.transformer, &pool, &req, |tok| {
        if req.stop_ids.contains(&tok) {
            return true;
        }
        if let Some(piece) = decoder.push(tok) {
            // A closed stdout (e.g. `| head`) ends generation quietly.
            if out
                .write_all(piece.as_bytes())
                .and_then(|_| out.flush())
                .is_err()
            {
                return false;
            }
        }
        true
    })?;
    if let Some(rest) = decoder.finish() {
        let _ = out.write_all(rest.as_bytes());
    }
    let _ = writeln!(out);
    let decode_tps = stats.tpot().map(|t| 1.0 / t.as_secs_f64()).unwrap_or(0.0);
    eprintln!(
        "prompt tokens: {} | generated: {} | TTFT: {:.1} ms | TPOT: {:.2} ms | {:.1} tokens/s | prefill {:.1} tokens/s | finish: {:?}",
        stats.prompt_tokens,
        stats.generated_tokens,
        stats.ttft.as_secs_f64() * 1e3,
        stats.tpot().map_or(0.0, |t| t.as_secs_f64() * 1e3),
        decode_tps,
        stats.prompt_tokens as f64 / stats.ttft.as_secs_f64(),
        stats.finish
    );
    Ok(())
}

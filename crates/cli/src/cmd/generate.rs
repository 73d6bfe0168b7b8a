use std::io::Write;

use anyhow::{bail, Context, Result};
use std::sync::Arc;

use pagellm_engine::generate::generate;
use pagellm_engine::{EngineCore, RequestParams, SamplingParams};
use pagellm_model::chat::ChatMessage;
use pagellm_model::loader::load_model;

use super::{EngineArgs, ModelArgs};

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
    /// Stop before this text (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    #[command(flatten)]
    engine: EngineArgs,
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
        logit_bias: Vec::new(),
        allowed_token_ids: None,
    };
    sampling.validate()?;
    if a.max_tokens == 0 {
        bail!("--max-tokens must be at least 1");
    }
    let m = Arc::new(load_model(&a.model.model)?);
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
    // One request: no need to reserve more cache than it can use.
    let mut engine = a.engine.clone();
    if engine.max_model_len.is_none() {
        engine.max_model_len = Some((prompt.len() + a.max_tokens).min(m.transformer.max_context()));
    }
    let mut core = EngineCore::new(m.clone(), &engine.config(a.model.threads))?;
    let params = RequestParams {
        sampling,
        max_tokens: Some(a.max_tokens),
        stop: a.stop,
        ignore_eos: a.ignore_eos,
        ..RequestParams::default()
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let info = generate(&mut core, 0, prompt, params, |o| {
        // A closed stdout (e.g. `| head`) ends generation quietly.
        o.text.is_empty()
            || out
                .write_all(o.text.as_bytes())
                .and_then(|_| out.flush())
                .is_ok()
    })?;
    let _ = writeln!(out);
    let t = &info.times;
    let n = info.usage.completion_tokens;
    let tpot = t.decode_s().filter(|_| n > 1).map(|d| d / (n - 1) as f64);
    eprintln!(
        "prompt tokens: {} | generated: {} | TTFT: {:.1} ms | TPOT: {:.2} ms | {:.1} tokens/s | prefill {:.1} tokens/s | finish: {}",
        info.usage.prompt_tokens,
        n,
        t.ttft_s().unwrap_or(0.0) * 1e3,
        tpot.unwrap_or(0.0) * 1e3,
        tpot.map_or(0.0, |t| 1.0 / t),
        info.usage.prompt_tokens as f64 / t.ttft_s().unwrap_or(f64::INFINITY),
        info.reason.as_str()
    );
    if let Some(e) = info.error {
        bail!("generation failed: {e}");
    }
    Ok(())
}

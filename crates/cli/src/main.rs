//! `pagellm`: one binary, one subcommand per job. Flags are parsed into typed structs
//! here and handed to the library crates; errors are reported once, in `main`.

mod cmd;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "pagellm", version, about = "An LLM inference engine for CPUs")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the OpenAI-compatible API (completions, chat, models, tokenize).
    Serve(cmd::serve::Args),
    /// Route OpenAI requests across many models and replicas (reads LiteLLM configs).
    Gateway(cmd::gateway::Args),
    /// Generate text from a prompt (streams to stdout, timings to stderr).
    Generate(cmd::generate::Args),
    /// Print a text's token ids as a JSON array.
    Tokenize(cmd::tokenize::Args),
    /// Manage the model cache.
    #[command(subcommand)]
    Models(cmd::models::ModelsCmd),
    /// Measure prompt processing and generation speed (like llama-bench).
    Bench(cmd::bench::Args),
    /// Convert a GGUF model to another format.
    Convert(cmd::convert::Args),
    /// Quantize a model's linear layers (INT8, W8A8, INT4, FP8) into a standard
    /// checkpoint format.
    Quantize(cmd::quantize::Args),
    /// Measure a model's quality: perplexity, KL divergence against a base model.
    #[command(subcommand)]
    Eval(cmd::eval::EvalCmd),
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("PAGELLM_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    if let Err(e) = pagellm_kernels::cpu::check_env() {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
    let result = match cli.command {
        Command::Serve(a) => cmd::serve::run(a),
        Command::Gateway(a) => cmd::gateway::run(a),
        Command::Generate(a) => cmd::generate::run(a),
        Command::Tokenize(a) => cmd::tokenize::run(a),
        Command::Models(c) => cmd::models::run(c),
        Command::Bench(a) => cmd::bench::run(a),
        Command::Convert(a) => cmd::convert::run(a),
        Command::Quantize(a) => cmd::quantize::run(a),
        Command::Eval(c) => cmd::eval::run(c),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

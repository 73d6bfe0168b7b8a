//! `pagellm serve`: the OpenAI-compatible HTTP server on the batching engine.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use pagellm_engine::Engine;
use pagellm_model::loader::load_model;
use pagellm_server::{AppState, ServerConfig};

use super::{EngineArgs, ModelArgs};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    engine: EngineArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0 = any free port).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// The model name clients send (default: the --model argument).
    #[arg(long)]
    served_model_name: Option<String>,
    /// Require `Authorization: Bearer KEY` on every API request.
    #[arg(long, env = "PAGELLM_API_KEY")]
    api_key: Option<String>,
    /// Requests that may wait for a place in the running batch; beyond this new
    /// requests get 429 with Retry-After.
    #[arg(long, default_value_t = 1024)]
    max_waiting_requests: usize,
    /// Largest request body accepted, in bytes (units accepted: 16MiB).
    #[arg(long, default_value = "16MiB", value_parser = super::parse_size)]
    max_request_body: u64,
    /// On SIGTERM or SIGINT, seconds running requests may take to finish before they
    /// are aborted.
    #[arg(long, default_value_t = 20.0)]
    shutdown_grace_period: f64,
    /// Usage carries `prompt_tokens_details` (the prompt tokens served from the prefix
    /// cache), as vLLM's flag of the same name.
    #[arg(long)]
    enable_prompt_tokens_details: bool,
    /// Streams carry usage in every chunk and end with a usage chunk, whether the
    /// request asked for it or not.
    #[arg(long)]
    enable_force_include_usage: bool,
    /// Logprobs name tokens `token_id:N` unless a request says otherwise.
    #[arg(long)]
    return_tokens_as_token_ids: bool,
    /// Serve `GET /tokenizer_info`: the tokenizer's configuration (special tokens, chat
    /// template, added tokens).
    #[arg(long)]
    enable_tokenizer_info_endpoint: bool,
    /// Responses carry vLLM's `metrics` object (time to first token, queue and
    /// generation time, tokens per second, mean inter-token latency); streams, on their
    /// usage chunk.
    #[arg(long)]
    enable_per_request_metrics: bool,
}

pub fn run(a: Args) -> Result<()> {
    if !(a.shutdown_grace_period >= 0.0 && a.shutdown_grace_period.is_finite()) {
        anyhow::bail!(
            "--shutdown-grace-period must be a non-negative number of seconds, got {}",
            a.shutdown_grace_period
        );
    }
    let mut config = a.engine.config(a.model.threads);
    config.max_waiting_requests = Some(a.max_waiting_requests);
    let state = Arc::new(AppState::new(ServerConfig {
        served_model_name: a.served_model_name.unwrap_or(a.model.model.clone()),
        api_key: a.api_key,
        max_body_bytes: usize::try_from(a.max_request_body).unwrap_or(usize::MAX),
        prompt_tokens_details: a.enable_prompt_tokens_details,
        force_include_usage: a.enable_force_include_usage,
        tokens_as_token_ids: a.return_tokens_as_token_ids,
        tokenizer_info: a.enable_tokenizer_info_endpoint,
        per_request_metrics: a.enable_per_request_metrics,
    }));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(async move {
        // Listen first: /health answers 503 while the model loads.
        let addr = format!("{}:{}", a.host, a.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        let local = listener.local_addr()?;
        eprintln!(
            "pagellm listening on http://{local}; loading {}",
            a.model.model
        );
        let server = tokio::spawn(pagellm_server::serve(
            listener,
            state.clone(),
            shutdown_signal(),
            Duration::from_secs_f64(a.shutdown_grace_period),
        ));
        let model_arg = a.model.model.clone();
        let engine = tokio::task::spawn_blocking(move || -> Result<Engine> {
            let model = Arc::new(load_model(&model_arg)?);
            Ok(Engine::start(model, &config)?)
        })
        .await
        .context("the model loader panicked")?;
        let engine = match engine {
            Ok(e) => e,
            Err(e) => {
                server.abort();
                return Err(e);
            }
        };
        state.set_engine(engine);
        eprintln!(
            "pagellm serving {} on http://{local}",
            state.config.served_model_name
        );
        server.await.context("the server task panicked")??;
        if let Some(e) = state.loaded_engine() {
            e.shutdown();
        }
        eprintln!("pagellm stopped");
        Ok(())
    })
}

/// Resolves on SIGINT (ctrl-c) or SIGTERM.
pub(crate) async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {},
                    _ = term.recv() => {},
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch SIGTERM; only ctrl-c stops the server");
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    eprintln!("shutting down: finishing running requests");
}

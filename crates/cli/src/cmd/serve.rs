//! `pagellm serve`: the OpenAI-compatible HTTP server on the batching engine.

use std::sync::Arc;

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
}

pub fn run(a: Args) -> Result<()> {
    let model = Arc::new(load_model(&a.model.model)?);
    let engine = Engine::start(model, &a.engine.config(a.model.threads))?;
    let state = Arc::new(AppState {
        engine,
        config: ServerConfig {
            served_model_name: a.served_model_name.unwrap_or(a.model.model.clone()),
            api_key: a.api_key,
            max_body_bytes: 16 << 20,
        },
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(async move {
        let addr = format!("{}:{}", a.host, a.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        eprintln!(
            "pagellm serving {} on http://{}",
            state.config.served_model_name,
            listener.local_addr()?
        );
        let shutdown = async {
            let ctrl_c = tokio::signal::ctrl_c();
            #[cfg(unix)]
            {
                let mut term =
                    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                        .expect("install the SIGTERM handler");
                tokio::select! {
                    _ = ctrl_c => {},
                    _ = term.recv() => {},
                }
            }
            #[cfg(not(unix))]
            let _ = ctrl_c.await;
            eprintln!("shutting down");
        };
        pagellm_server::serve(listener, state.clone(), shutdown).await?;
        state.engine.shutdown();
        Ok(())
    })
}

//! `pagellm gateway`: one OpenAI-compatible endpoint in front of many models and replicas.

use std::path::PathBuf;

use anyhow::{Context, Result};
use pagellm_gateway::config::Config;
use pagellm_gateway::Gateway;

#[derive(clap::Args)]
pub struct Args {
    /// The configuration (a LiteLLM proxy config, plus `pagellm_settings`).
    #[arg(long)]
    config: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0 = any free port).
    #[arg(long, default_value_t = 4000)]
    port: u16,
    /// Check the configuration, print what it sets up, and exit.
    #[arg(long)]
    check: bool,
}

pub fn run(a: Args) -> Result<()> {
    let config = Config::load(&a.config)?;
    for w in &config.ignored {
        eprintln!("warning: no effect in pagellm: {w}");
    }
    if a.check {
        for d in &config.deployments {
            eprintln!(
                "{}: {} -> {} ({})",
                d.group, d.id, d.api_base, d.upstream_model
            );
        }
        eprintln!("routing policy: {}", config.policy.as_str());
        return Ok(());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(async move {
        let addr = format!("{}:{}", a.host, a.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        let local = listener.local_addr()?;
        let policy = config.policy;
        let n = config.deployments.len();
        let gw = Gateway::new(config, Some(a.config.clone())).await?;
        eprintln!(
            "pagellm gateway listening on http://{local} ({n} deployments, {} routing)",
            policy.as_str()
        );
        pagellm_gateway::serve(listener, gw, super::serve::shutdown_signal())
            .await
            .context("gateway failed")
    })
}

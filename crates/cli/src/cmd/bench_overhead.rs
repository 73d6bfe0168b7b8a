//! `pagellm bench overhead` and `pagellm bench mock-upstream`: a gateway's own cost per
//! request, measured against an upstream that answers at once.

use std::time::Duration;

use anyhow::{Context, Result};
use pagellm_bench::overhead::{mock_upstream, open_loop};

#[derive(clap::Args)]
pub struct Args {
    /// The server to load (a gateway, or the mock upstream for the direct baseline).
    #[arg(long)]
    base_url: String,
    /// Model name to send.
    #[arg(long, default_value = "mock")]
    model: String,
    #[arg(long)]
    api_key: Option<String>,
    /// Requests per second, comma-separated; each rate runs for --duration.
    #[arg(long, default_value = "100,500,1000", value_delimiter = ',')]
    rates: Vec<f64>,
    /// Seconds per rate.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// plain, stream or both.
    #[arg(long, default_value = "both")]
    mode: String,
    /// A label for the results (e.g. the gateway's name).
    #[arg(long, default_value = "")]
    label: String,
    /// Append the results, one JSON object per line, to this file.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

#[derive(clap::Args)]
pub struct MockArgs {
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    #[arg(long, default_value_t = 9000)]
    port: u16,
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

pub fn mock(a: MockArgs) -> Result<()> {
    runtime()?.block_on(async move {
        let addr = format!("{}:{}", a.host, a.port);
        let l = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        eprintln!("mock upstream on http://{}", l.local_addr()?);
        mock_upstream(l).await.context("mock upstream failed")
    })
}

pub fn run(a: Args) -> Result<()> {
    let modes: Vec<bool> = match a.mode.as_str() {
        "plain" => vec![false],
        "stream" => vec![true],
        "both" => vec![false, true],
        m => anyhow::bail!("--mode must be plain, stream or both, got `{m}`"),
    };
    if let Some(r) = a.rates.iter().find(|r| !(r.is_finite() && **r > 0.0)) {
        anyhow::bail!("--rates: {r} is not a positive rate");
    }
    if !(a.duration > 0.0 && a.duration.is_finite()) {
        anyhow::bail!("--duration must be a positive number of seconds");
    }
    runtime()?.block_on(async move {
        println!("| label | rate | stream | ok | failed | p50 ms | p90 ms | p99 ms |");
        println!("|---|---|---|---|---|---|---|---|");
        for &rate in &a.rates {
            for &stream in &modes {
                let r = open_loop(
                    &a.base_url,
                    a.api_key.as_deref(),
                    &a.model,
                    &a.label,
                    rate,
                    Duration::from_secs_f64(a.duration),
                    stream,
                )
                .await;
                println!(
                    "| {} | {} | {} | {} | {} | {:.3} | {:.3} | {:.3} |",
                    r.label, r.rate, r.stream, r.ok, r.failed, r.p50_ms, r.p90_ms, r.p99_ms
                );
                if let Some(path) = &a.json {
                    use std::io::Write;
                    let mut f = std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(path)
                        .with_context(|| format!("cannot open {}", path.display()))?;
                    writeln!(f, "{}", serde_json::to_string(&r)?)?;
                }
            }
        }
        Ok(())
    })
}

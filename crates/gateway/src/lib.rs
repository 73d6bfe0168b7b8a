//! `pagellm gateway`: one OpenAI-compatible endpoint in front of many model groups,
//! each served by several replicas (pagellm, vLLM or any OpenAI-compatible server).
//!
//! A request is authenticated (master key or a virtual key with its limits), routed to
//! a replica of its model group by the configured policy, retried on another replica
//! or a fallback group if it fails before its first byte, and, when a pagellm replica
//! dies in the middle of a stream, continued on another replica from the tokens
//! already sent. Background tasks check each replica's health, scrape its `/metrics`
//! for load, and follow its KV events for exact prefix routing.

pub mod admin;
pub mod config;
pub mod dashboard;
pub mod error;
mod health;
pub mod keys;
pub mod metrics;
mod prefix;
mod proxy;
pub mod replica;
pub mod routing;
mod sse;
mod stream;
mod yaml_lines;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

use crate::config::{Config, StoreConfig};
use crate::error::GatewayError;
use crate::keys::{RedisStore, SqliteStore, Store};
use crate::metrics::Metrics;
use crate::prefix::Tokenizers;
use crate::replica::Replica;

pub use crate::config::ConfigError;

/// The configuration in force and the replicas it names. Replaced whole on reload;
/// requests in flight keep the one they started with.
pub struct Runtime {
    pub config: Config,
    pub groups: HashMap<String, Vec<Arc<Replica>>>,
    pub router: routing::Router,
}

impl Runtime {
    /// Builds the runtime for `config`, keeping the state of replicas that `old` has
    /// under the same id and address.
    fn build(config: Config, old: Option<&Runtime>) -> Runtime {
        let mut groups: HashMap<String, Vec<Arc<Replica>>> = HashMap::new();
        for d in &config.deployments {
            let kept = old.and_then(|o| {
                o.groups.values().flatten().find(|r| {
                    r.dep.id == d.id && r.dep.api_base == d.api_base && r.dep.group == d.group
                })
            });
            let r = match kept {
                Some(r) if r.dep.max_concurrency == d.max_concurrency => r.clone(),
                _ => Arc::new(Replica::new(d.clone())),
            };
            groups.entry(d.group.clone()).or_default().push(r);
        }
        let router = routing::Router::new(
            config.policy,
            config.load_guard.clone(),
            config.cache_threshold,
            config.metrics_interval * 4,
        );
        Runtime {
            config,
            groups,
            router,
        }
    }

    pub fn replicas(&self) -> impl Iterator<Item = &Arc<Replica>> {
        self.groups.values().flatten()
    }
}

pub struct Gateway {
    runtime: RwLock<Arc<Runtime>>,
    pub metrics: Metrics,
    pub store: Option<Store>,
    pub http: reqwest::Client,
    pub tokenizers: Tokenizers,
    /// The latest routing decisions, for the dashboard.
    pub routing_log: dashboard::RoutingLog,
    config_path: Option<PathBuf>,
}

impl Gateway {
    pub async fn new(config: Config, config_path: Option<PathBuf>) -> anyhow::Result<Arc<Self>> {
        let store = match (&config.master_key, &config.store) {
            (None, _) => None,
            (Some(_), StoreConfig::Sqlite(path)) => Some(Store::Sqlite(SqliteStore::open(path)?)),
            (Some(_), StoreConfig::Memory) => Some(Store::Sqlite(SqliteStore::open(":memory:")?)),
            (Some(_), StoreConfig::Redis(url)) => Some(Store::Redis(
                RedisStore::connect(url)
                    .await
                    .map_err(|e| anyhow::anyhow!("{e} ({url})"))?,
            )),
        };
        let http = reqwest::Client::builder()
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(256)
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(2))
            .build()?;
        let tokenizers = Tokenizers::default();
        tokenizers.load(&config);
        let gw = Arc::new(Gateway {
            runtime: RwLock::new(Arc::new(Runtime::build(config, None))),
            metrics: Metrics::default(),
            store,
            http,
            tokenizers,
            routing_log: dashboard::RoutingLog::default(),
            config_path,
        });
        health::spawn_all(&gw);
        Ok(gw)
    }

    pub fn runtime(&self) -> Arc<Runtime> {
        self.runtime.read().unwrap().clone()
    }

    /// Re-reads the config file; on error the old configuration stays in force.
    pub fn reload(self: &Arc<Self>) -> Result<(), ConfigError> {
        let Some(path) = &self.config_path else {
            return Ok(());
        };
        let config = Config::load(path)?;
        for w in &config.ignored {
            tracing::warn!("no effect in pagellm: {w}");
        }
        self.tokenizers.load(&config);
        let new = {
            let old = self.runtime();
            Arc::new(Runtime::build(config, Some(&old)))
        };
        *self.runtime.write().unwrap() = new;
        health::spawn_all(self);
        tracing::info!("reloaded {}", path.display());
        Ok(())
    }
}

async fn health_handler(State(gw): State<Arc<Gateway>>) -> Response {
    let rt = gw.runtime();
    let mut healthy = 0;
    let mut replicas = Vec::new();
    for r in rt.replicas() {
        let up = r.is_up();
        healthy += up as usize;
        replicas.push(json!({"id": r.dep.id, "model": r.dep.group, "healthy": up,
            "in_flight": r.in_flight.load(std::sync::atomic::Ordering::Relaxed)}));
    }
    let status = if healthy > 0 {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        Json(json!({"healthy_replicas": healthy, "replicas": replicas})),
    )
        .into_response()
}

async fn models_handler(State(gw): State<Arc<Gateway>>) -> Response {
    let rt = gw.runtime();
    let data: Vec<_> = rt
        .config
        .groups
        .iter()
        .map(|g| json!({"id": g, "object": "model", "created": 0, "owned_by": "pagellm-gateway"}))
        .collect();
    Json(json!({"object": "list", "data": data})).into_response()
}

async fn metrics_handler(State(gw): State<Arc<Gateway>>) -> Response {
    let rt = gw.runtime();
    let mut g = String::new();
    use std::fmt::Write;
    let _ = writeln!(g, "# HELP pagellm_gateway_replica_up 1 when the replica takes traffic.\n# TYPE pagellm_gateway_replica_up gauge");
    for r in rt.replicas() {
        let _ = writeln!(
            g,
            "pagellm_gateway_replica_up{{model=\"{}\",replica=\"{}\"}} {}",
            r.dep.group,
            r.dep.id,
            r.is_up() as u8
        );
    }
    let _ = writeln!(g, "# HELP pagellm_gateway_in_flight Requests in flight per replica.\n# TYPE pagellm_gateway_in_flight gauge");
    for r in rt.replicas() {
        let _ = writeln!(
            g,
            "pagellm_gateway_in_flight{{model=\"{}\",replica=\"{}\"}} {}",
            r.dep.group,
            r.dep.id,
            r.in_flight.load(std::sync::atomic::Ordering::Relaxed)
        );
    }
    let _ = writeln!(g, "# HELP pagellm_gateway_prefix_blocks Block hashes known per replica: exact from KV events, and recently routed.\n# TYPE pagellm_gateway_prefix_blocks gauge");
    for r in rt.replicas() {
        let p = r.prefix.lock().unwrap();
        let _ = writeln!(
            g,
            "pagellm_gateway_prefix_blocks{{replica=\"{}\",source=\"kv_events\"}} {}",
            r.dep.id,
            p.exact.len()
        );
        let _ = writeln!(
            g,
            "pagellm_gateway_prefix_blocks{{replica=\"{}\",source=\"routed\"}} {}",
            r.dep.id,
            p.recent_len()
        );
    }
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        gw.metrics.render(&g),
    )
        .into_response()
}

pub fn router(gw: Arc<Gateway>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(proxy::chat_completions))
        .route("/v1/completions", post(proxy::completions))
        .route("/chat/completions", post(proxy::chat_completions))
        .route("/completions", post(proxy::completions))
        .route("/v1/models", get(models_handler))
        .route("/models", get(models_handler))
        .route("/health", get(health_handler))
        .route("/metrics", get(metrics_handler))
        .route("/key/generate", post(admin::generate))
        .route("/key/list", get(admin::list))
        .route("/key/info", get(admin::info))
        .route("/key/delete", post(admin::delete))
        .merge(dashboard::routes())
        .fallback(|uri: axum::http::Uri| async move {
            GatewayError::not_found(format!("no such endpoint: {}", uri.path()))
        })
        .method_not_allowed_fallback(|m: axum::http::Method, uri: axum::http::Uri| async move {
            GatewayError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "invalid_request_error",
                format!("{m} is not allowed on {}", uri.path()),
            )
        })
        .layer(DefaultBodyLimit::max(32 << 20))
        .with_state(gw)
}

/// Serves until `shutdown`; SIGHUP reloads the configuration (Unix).
pub async fn serve(
    listener: tokio::net::TcpListener,
    gw: Arc<Gateway>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // Only this wrapper is generic: the server stack below is compiled once, here, not
    // again in every crate that calls `serve` with its own shutdown future.
    serve_until(listener, gw, Box::pin(shutdown)).await
}

async fn serve_until(
    listener: tokio::net::TcpListener,
    gw: Arc<Gateway>,
    shutdown: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        let gw = gw.clone();
        tokio::spawn(async move {
            use tokio::signal::unix::{signal, SignalKind};
            let Ok(mut hup) = signal(SignalKind::hangup()) else {
                return;
            };
            while hup.recv().await.is_some() {
                if let Err(e) = gw.reload() {
                    tracing::error!("reload failed, keeping the running configuration: {e}");
                }
            }
        });
    }
    use axum::serve::ListenerExt;
    // Relayed chunks are small writes: without TCP_NODELAY, Nagle's algorithm holds each
    // one back until the client's delayed ACK (40 ms).
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, router(gw))
        .with_graceful_shutdown(shutdown)
        .await
}

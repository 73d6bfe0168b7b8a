//! The OpenAI-compatible HTTP server: `/v1/completions`, `/v1/chat/completions` (plain
//! and streamed as server-sent events), `/v1/models`, `/tokenize`, `/detokenize`,
//! `/metrics` (Prometheus, vLLM's names), `/health`, `/version`, and a dashboard at `/`
//! fed by `/dashboard/events` (see [`dashboard`]).
//!
//! Handlers tokenize and render chat templates on the async runtime's threads and hand
//! token ids to the [`Engine`], whose thread never waits on a socket. Each request's
//! outputs come back over its own channel; a client that goes away drops that channel,
//! which aborts the request at the engine's next step.
//!
//! The server listens before the model is loaded: until [`AppState::set_engine`] is
//! called, `/health` answers 503 and the API refuses requests with 503.

mod api;
pub mod dashboard;
pub mod error;
mod kv_events;
mod metrics;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::Router;
use pagellm_engine::Engine;

pub use api::{prompt_token_ids, GenRequest, PromptInput};
pub use error::ApiError;

/// What the server needs besides the engine.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The name clients use in `model`.
    pub served_model_name: String,
    /// Required as `Authorization: Bearer KEY` when set.
    pub api_key: Option<String>,
    /// Largest request body accepted.
    pub max_body_bytes: usize,
    /// vLLM's `--enable-prompt-tokens-details`: usage has `prompt_tokens_details`.
    pub prompt_tokens_details: bool,
    /// vLLM's `--enable-force-include-usage`: every streamed chunk carries usage, and
    /// streams end with a usage chunk, asked for or not.
    pub force_include_usage: bool,
    /// vLLM's `--return-tokens-as-token-ids`: the default of the request field.
    pub tokens_as_token_ids: bool,
    /// vLLM's `--enable-tokenizer-info-endpoint`: serve `GET /tokenizer_info`.
    pub tokenizer_info: bool,
    /// vLLM's `--enable-per-request-metrics`: responses (a stream's usage chunk) carry
    /// `metrics` with the request's timing.
    pub per_request_metrics: bool,
}

impl ServerConfig {
    /// A server of `served_model_name` with vLLM's defaults otherwise.
    pub fn new(served_model_name: impl Into<String>) -> Self {
        Self {
            served_model_name: served_model_name.into(),
            api_key: None,
            max_body_bytes: 16 << 20,
            prompt_tokens_details: false,
            force_include_usage: false,
            tokens_as_token_ids: false,
            tokenizer_info: false,
            per_request_metrics: false,
        }
    }
}

pub struct AppState {
    engine: OnceLock<Engine>,
    pub config: ServerConfig,
    pub created: u64,
    /// Set on shutdown: new requests get 503 while running ones finish.
    draining: AtomicBool,
    /// vLLM's `request_params_n`: `n` of each prompt of each request admitted.
    pub params_n: std::sync::Mutex<pagellm_engine::Histogram>,
}

impl AppState {
    /// A server whose model is still loading.
    pub fn new(config: ServerConfig) -> Self {
        Self {
            engine: OnceLock::new(),
            config,
            created: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            draining: AtomicBool::new(false),
            params_n: std::sync::Mutex::new(pagellm_engine::Histogram::new(
                pagellm_engine::metrics::SMALL_COUNT_BUCKETS,
            )),
        }
    }

    /// A server ready to serve `engine`.
    pub fn with_engine(config: ServerConfig, engine: Engine) -> Self {
        let s = Self::new(config);
        s.set_engine(engine);
        s
    }

    /// Marks the model loaded; the first call wins.
    pub fn set_engine(&self, engine: Engine) {
        let _ = self.engine.set(engine);
    }

    /// The engine, once loaded.
    pub fn loaded_engine(&self) -> Option<&Engine> {
        self.engine.get()
    }

    /// The engine for a new request: 503 while loading or shutting down.
    pub(crate) fn engine(&self) -> Result<&Engine, ApiError> {
        if self.draining.load(Ordering::Acquire) {
            return Err(ApiError::unavailable("the server is shutting down"));
        }
        self.engine
            .get()
            .ok_or_else(|| ApiError::unavailable("the model is still loading"))
    }
}

async fn health(State(st): State<Arc<AppState>>) -> StatusCode {
    match st.engine() {
        Ok(_) => StatusCode::OK,
        Err(_) => StatusCode::SERVICE_UNAVAILABLE,
    }
}

/// The router with every endpoint.
pub fn router(state: Arc<AppState>) -> Router {
    let limit = state.config.max_body_bytes;
    let mut optional = Router::new();
    if state.config.tokenizer_info {
        optional = optional.route("/tokenizer_info", get(api::tokenizer_info));
    }
    Router::new()
        .route("/v1/completions", post(api::completions))
        .route("/v1/chat/completions", post(api::chat_completions))
        .route("/invocations", post(api::invocations))
        .route("/v1/models", get(api::models))
        .route("/v1/models/{id}", get(api::model))
        .route("/tokenize", post(api::tokenize))
        .route("/detokenize", post(api::detokenize))
        .route("/v1/kv_events", get(kv_events::kv_events))
        .route("/metrics", get(metrics::metrics))
        .route("/health", get(health))
        .route("/version", get(api::version))
        .merge(dashboard::routes())
        .merge(optional)
        .fallback(|uri: axum::http::Uri| async move {
            ApiError::not_found(format!("no such endpoint: {}", uri.path()), None)
        })
        .method_not_allowed_fallback(
            |method: axum::http::Method, uri: axum::http::Uri| async move {
                ApiError::method_not_allowed(format!("{method} is not allowed on {}", uri.path()))
            },
        )
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

/// Serves on `listener` until `shutdown` resolves, then drains: new requests get 503,
/// running ones may finish for up to `grace`, after which they are aborted (their
/// streams end with `finish_reason: "abort"`) and the server returns.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> std::io::Result<()> {
    // Only this wrapper is generic: the server stack below is compiled once, here, not
    // again in every crate that calls `serve` with its own shutdown future.
    serve_until(listener, state, Box::pin(shutdown), grace).await
}

async fn serve_until(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
    grace: Duration,
) -> std::io::Result<()> {
    let (signalled_tx, signalled_rx) = tokio::sync::oneshot::channel::<()>();
    let st = state.clone();
    let graceful = async move {
        shutdown.await;
        st.draining.store(true, Ordering::Release);
        let _ = signalled_tx.send(());
    };
    use axum::serve::ListenerExt;
    // Streamed tokens are small writes: without TCP_NODELAY, Nagle's algorithm holds one
    // back until the client's delayed ACK (40 ms) whenever another is unacknowledged.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let server = axum::serve(listener, router(state.clone())).with_graceful_shutdown(graceful);
    let deadline = async move {
        if signalled_rx.await.is_err() {
            return std::future::pending().await;
        }
        tokio::time::sleep(grace).await;
        if let Some(e) = state.loaded_engine() {
            tracing::warn!("grace period over: aborting the requests still running");
            e.abort_all();
        }
        // Aborted streams end at once; a connection that still hangs is not waited for.
        tokio::time::sleep(Duration::from_secs(5)).await;
    };
    tokio::select! {
        r = server => r,
        () = deadline => Ok(()),
    }
}

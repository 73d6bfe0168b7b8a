//! The OpenAI-compatible HTTP server: `/v1/completions`, `/v1/chat/completions` (plain
//! and streamed as server-sent events), `/v1/models`, `/tokenize`, `/detokenize`,
//! `/health`, `/version`.
//!
//! Handlers tokenize and render chat templates on the async runtime's threads and hand
//! token ids to the [`Engine`], whose thread never waits on a socket. Each request's
//! outputs come back over its own channel; a client that goes away drops that channel,
//! which aborts the request at the engine's next step.

mod api;
pub mod error;

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use pagellm_engine::Engine;

pub use api::{GenRequest, PromptInput};
pub use error::ApiError;

/// What the server needs besides the engine.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The name clients use in `model`; `None` = the model's source path.
    pub served_model_name: String,
    /// Required as `Authorization: Bearer KEY` when set.
    pub api_key: Option<String>,
    /// Largest request body accepted.
    pub max_body_bytes: usize,
}

pub struct AppState {
    pub engine: Engine,
    pub config: ServerConfig,
    pub created: u64,
}

/// The router with every endpoint.
pub fn router(state: Arc<AppState>) -> Router {
    let limit = state.config.max_body_bytes;
    Router::new()
        .route("/v1/completions", post(api::completions))
        .route("/v1/chat/completions", post(api::chat_completions))
        .route("/v1/models", get(api::models))
        .route("/tokenize", post(api::tokenize))
        .route("/detokenize", post(api::detokenize))
        .route("/health", get(|| async { "" }))
        .route("/version", get(api::version))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

/// Serves on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
}

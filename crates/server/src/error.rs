//! OpenAI-style error responses: `{"error": {"message", "type", "param", "code"}}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use pagellm_engine::EngineError;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>, param: Option<&str>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(str::to_string),
        }
    }

    pub fn not_found(message: impl Into<String>, param: Option<&str>) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: message.into(),
            kind: "not_found_error",
            param: param.map(str::to_string),
        }
    }

    pub fn unauthorized() -> Self {
        Self {
            status: StatusCode::UNAUTHORIZED,
            message: "invalid or missing API key (send Authorization: Bearer KEY)".into(),
            kind: "authentication_error",
            param: None,
        }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "internal_server_error",
            param: None,
        }
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        let param = match &e {
            EngineError::ContextLength { .. } => Some("max_tokens"),
            EngineError::EmptyPrompt | EngineError::TokenOutOfVocab { .. } => Some("prompt"),
            EngineError::Sampling(pagellm_engine::SamplingError::OutOfRange { name, .. }) => {
                Some(*name)
            }
            _ => None,
        };
        match e {
            EngineError::ShutDown => Self {
                status: StatusCode::SERVICE_UNAVAILABLE,
                message: e.to_string(),
                kind: "service_unavailable",
                param: None,
            },
            EngineError::Model(_) | EngineError::Config(_) => Self::internal(e.to_string()),
            _ => Self::bad_request(e.to_string(), param),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.status.as_u16(),
            }
        });
        (self.status, Json(body)).into_response()
    }
}

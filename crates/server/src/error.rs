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
    /// Seconds, sent as `Retry-After`.
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>, param: Option<&str>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(str::to_string),
            retry_after: None,
        }
    }

    pub fn not_found(message: impl Into<String>, param: Option<&str>) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: message.into(),
            kind: "not_found_error",
            param: param.map(str::to_string),
            retry_after: None,
        }
    }

    pub fn unauthorized() -> Self {
        Self {
            status: StatusCode::UNAUTHORIZED,
            message: "invalid or missing API key (send Authorization: Bearer KEY)".into(),
            kind: "authentication_error",
            param: None,
            retry_after: None,
        }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_server_error",
            message,
        )
    }

    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            message,
        )
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable",
            message,
        )
    }

    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            kind,
            param: None,
            retry_after: None,
        }
    }

    /// A body that could not be read: too large (413) or broken.
    pub fn from_body(r: axum::extract::rejection::BytesRejection) -> Self {
        let status = r.status();
        let message = if status == StatusCode::PAYLOAD_TOO_LARGE {
            "the request body is larger than the server accepts".to_string()
        } else {
            format!("cannot read the request body: {}", r.body_text())
        };
        Self::new(status, "invalid_request_error", message)
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
            // The engine's messages name the field first (`logit_bias: token id ...`).
            EngineError::InvalidParam(m) => m
                .split_once(':')
                .map(|(p, _)| p)
                .filter(|p| p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')),
            _ => None,
        };
        match e {
            EngineError::ShutDown => Self::unavailable(e.to_string()),
            EngineError::QueueFull { .. } => Self {
                retry_after: Some(1),
                ..Self::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "rate_limit_error",
                    e.to_string(),
                )
            },
            EngineError::Model(_)
            | EngineError::Config(_)
            | EngineError::Structured(pagellm_structured::Error::Vocabulary(_)) => {
                Self::internal(e.to_string())
            }
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
        let mut r = (self.status, Json(body)).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut()
                .insert(axum::http::header::RETRY_AFTER, s.into());
        }
        r
    }
}

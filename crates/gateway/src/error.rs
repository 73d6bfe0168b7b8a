//! The gateway's own errors, shaped as OpenAI's: `{"error": {"message", "type", "param", "code"}}`.

use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

#[derive(Debug)]
pub struct GatewayError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub message: String,
    pub param: Option<&'static str>,
    pub code: Option<&'static str>,
    pub headers: Vec<(HeaderName, String)>,
    /// An upstream's response to relay unchanged instead of this error's own body.
    pub passthrough: Option<Box<Response>>,
}

impl GatewayError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            message: message.into(),
            param: None,
            code: None,
            headers: Vec::new(),
            passthrough: None,
        }
    }

    pub fn bad_request(message: impl Into<String>, param: Option<&'static str>) -> Self {
        Self {
            param,
            ..Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
        }
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found_error", message)
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "authentication_error", message)
    }

    pub fn bad_gateway(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_GATEWAY, "upstream_error", message)
    }

    pub fn unavailable(message: impl Into<String>, retry_after_s: u64) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable",
            message,
        )
        .header(axum::http::header::RETRY_AFTER, retry_after_s.to_string())
    }

    pub fn code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    pub fn header(mut self, name: HeaderName, value: String) -> Self {
        self.headers.push((name, value));
        self
    }

    pub fn body(&self) -> serde_json::Value {
        json!({"error": {"message": self.message, "type": self.kind,
            "param": self.param, "code": self.code.map_or(json!(self.status.as_u16()), |c| json!(c))}})
    }
}

impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        if let Some(r) = self.passthrough {
            return *r;
        }
        let mut r = (self.status, Json(self.body())).into_response();
        for (k, v) in &self.headers {
            if let Ok(v) = HeaderValue::from_str(v) {
                r.headers_mut().insert(k.clone(), v);
            }
        }
        r
    }
}

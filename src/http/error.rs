//! The one REST error type: HTTP status + `{"error": {"code", "message"}}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::core::backend::BackendError;
use crate::core::offsets::StoreError;
use crate::core::protocol::{ErrorCode, FrameError};

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: ErrorCode,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> Self {
        Self { status, code, message: message.into() }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, ErrorCode::BadRequest, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, ErrorCode::NotFound, message)
    }

    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, ErrorCode::Conflict, message)
    }

    pub fn invalid_name(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, ErrorCode::InvalidName, message)
    }
}

/// The HTTP status of each error code.
fn status_of(code: ErrorCode) -> StatusCode {
    match code {
        ErrorCode::BadFrame | ErrorCode::BadRequest | ErrorCode::InvalidName => StatusCode::BAD_REQUEST,
        ErrorCode::UnknownTopic | ErrorCode::NotFound | ErrorCode::UnknownDelivery => StatusCode::NOT_FOUND,
        ErrorCode::NotSubscribed | ErrorCode::Conflict => StatusCode::CONFLICT,
        ErrorCode::LimitExceeded => StatusCode::PAYLOAD_TOO_LARGE,
        ErrorCode::Unauthorized => StatusCode::UNAUTHORIZED,
        ErrorCode::Forbidden => StatusCode::FORBIDDEN,
        ErrorCode::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        ErrorCode::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl From<FrameError> for ApiError {
    fn from(e: FrameError) -> Self {
        // A bad field in a REST body is `bad_request`, not the WebSocket's `bad_frame`.
        let code = if e.code == ErrorCode::BadFrame { ErrorCode::BadRequest } else { e.code };
        Self::new(status_of(code), code, e.message)
    }
}

impl From<BackendError> for ApiError {
    fn from(e: BackendError) -> Self {
        match e {
            BackendError::UnknownTopic(t) => Self::new(StatusCode::NOT_FOUND, ErrorCode::UnknownTopic, format!("topic {t} does not exist")),
            BackendError::Conflict(m) => Self::conflict(m),
            BackendError::InvalidInput(m) => Self::bad_request(m),
            BackendError::LimitExceeded(m) => Self::new(StatusCode::TOO_MANY_REQUESTS, ErrorCode::LimitExceeded, m),
            BackendError::UnknownPartition(m) => Self::not_found(m),
            // The detail (broker addresses, file paths) goes to the log, not to the caller.
            BackendError::Unavailable(m) | BackendError::Io(m) => FrameError::unavailable("the log backend", m).into(),
            truncated @ BackendError::Truncated { .. } => FrameError::unavailable("the log backend", truncated).into(),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        FrameError::unavailable("the offset store", e).into()
    }
}

/// Error bodies are JSON everywhere: an answer with an error status that is not JSON (one of
/// axum's own rejections: bad UTF-8 in a path, a plain GET on /ws, a body over a limit) gets the
/// `{"error": {"code", "message"}}` body, with its text as the message.
pub async fn json_error_bodies(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let response = next.run(request).await;
    let status = response.status();
    let is_json = response.headers().get(axum::http::header::CONTENT_TYPE).is_some_and(|t| t.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let text = match axum::body::to_bytes(response.into_body(), 4096).await {
        Ok(bytes) => String::from_utf8_lossy(&bytes).trim().to_string(),
        Err(_) => String::new(),
    };
    let code = match status {
        StatusCode::NOT_FOUND => ErrorCode::NotFound,
        StatusCode::PAYLOAD_TOO_LARGE => ErrorCode::LimitExceeded,
        StatusCode::UNAUTHORIZED => ErrorCode::Unauthorized,
        StatusCode::FORBIDDEN => ErrorCode::Forbidden,
        StatusCode::SERVICE_UNAVAILABLE => ErrorCode::Unavailable,
        s if s.is_server_error() => ErrorCode::Internal,
        _ => ErrorCode::BadRequest,
    };
    let message = if text.is_empty() { status.canonical_reason().unwrap_or("error").to_string() } else { text };
    ApiError::new(status, code, message).into_response()
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {"code": self.code, "message": self.message}});
        (self.status, Json(body)).into_response()
    }
}

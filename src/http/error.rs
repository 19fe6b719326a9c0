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
pub fn status_of(code: ErrorCode) -> StatusCode {
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
            BackendError::Unavailable(m) | BackendError::Io(m) => Self::new(StatusCode::SERVICE_UNAVAILABLE, ErrorCode::Unavailable, m),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, ErrorCode::Unavailable, e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {"code": self.code, "message": self.message}});
        (self.status, Json(body)).into_response()
    }
}

//! Authentication at the HTTP edge: the admin bearer token (`auth.admin_token`) for `/admin/*`,
//! publishing and topic changes, and HS256 JWTs (`auth.jwt_secret`) for `/ws`. The only import
//! of jsonwebtoken.

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use jsonwebtoken::{decode, Algorithm, DecodingKey, Validation};
use serde::Deserialize;

use super::error::ApiError;
use super::AppState;
use crate::core::access::Access;
use crate::core::names::ClientId;
use crate::core::protocol::ErrorCode;

fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "))
}

/// `auth.admin_token`: the guarded routes need `Authorization: Bearer <token>`.
pub async fn require_admin_token(State(app): State<AppState>, request: Request, next: Next) -> Response {
    let expected = &app.config.auth.admin_token;
    if expected.is_empty() {
        return next.run(request).await;
    }
    match bearer(request.headers()) {
        None => ApiError::new(StatusCode::UNAUTHORIZED, ErrorCode::Unauthorized, "Authorization: Bearer <auth.admin_token> is required").into_response(),
        Some(token) if !constant_time_eq(token.as_bytes(), expected.as_bytes()) => {
            ApiError::new(StatusCode::FORBIDDEN, ErrorCode::Forbidden, "wrong admin token").into_response()
        }
        Some(_) => next.run(request).await,
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The claims ackgate reads from a WebSocket token.
#[derive(Debug, Deserialize)]
struct SessionClaims {
    sub: String,
    /// Epoch seconds; optional, but when present the session ends with 1008 at that time.
    exp: Option<u64>,
    /// Allowed topic patterns (`*` suffix wildcard); absent allows every topic.
    topics: Option<Vec<String>>,
}

/// Checks the `/ws` handshake's token when `auth.jwt_secret` is set: from the `token` query
/// parameter or `Authorization: Bearer`. 401 when missing or invalid (bad signature, expired,
/// not HS256), 403 when its `sub` is not the `client_id` asked for.
pub fn session_access(secret: &str, query_token: Option<&str>, headers: &HeaderMap, client_id: &ClientId) -> Result<Access, ApiError> {
    if secret.is_empty() {
        return Ok(Access::default());
    }
    let unauthorized = |message: String| ApiError::new(StatusCode::UNAUTHORIZED, ErrorCode::Unauthorized, message);
    let token = query_token
        .or_else(|| bearer(headers))
        .ok_or_else(|| unauthorized("a token is required: ?token=<JWT> or Authorization: Bearer <JWT>".into()))?;
    let mut validation = Validation::new(Algorithm::HS256);
    validation.required_spec_claims.clear();
    validation.required_spec_claims.insert("sub".into());
    validation.leeway = 0;
    // A token that is not valid yet is refused like an expired one.
    validation.validate_nbf = true;
    let claims = decode::<SessionClaims>(token, &DecodingKey::from_secret(secret.as_bytes()), &validation)
        .map_err(|e| unauthorized(format!("invalid token: {e}")))?
        .claims;
    if claims.sub != client_id.as_str() {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            ErrorCode::Forbidden,
            format!("the token is for client {:?}, not {:?}", claims.sub, client_id.as_str()),
        ));
    }
    Ok(Access { expires_at_ms: claims.exp.map(|s| s.saturating_mul(1000)), topics: claims.topics })
}

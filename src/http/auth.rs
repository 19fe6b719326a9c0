//! Authentication at the HTTP edge: the admin bearer token (`auth.admin_token`) for `/admin/*`,
//! publishing and topic changes, and HS256 JWTs (`auth.jwt_secret`) for `/ws` and, through their
//! `publish` claim, for publishing. The only import of jsonwebtoken.

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use jsonwebtoken::{decode, Algorithm, DecodingKey, Validation};
use serde::Deserialize;

use super::error::ApiError;
use super::AppState;
use crate::config::AuthConfig;
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

/// The claims ackgate reads from a token.
#[derive(Debug, Deserialize)]
struct Claims {
    sub: String,
    /// Epoch seconds; optional (unless `auth.jwt_max_lifetime_secs` is set), but when present
    /// the session ends with 4004 at that time unless a `refresh` replaced the token.
    exp: Option<u64>,
    /// Allowed topic patterns (`*` suffix wildcard); absent allows every topic.
    topics: Option<Vec<String>>,
    /// Topic patterns the holder may publish to without the admin token; absent allows none.
    publish: Option<Vec<String>>,
    /// Shared-subscription group patterns the holder may join; absent allows none.
    groups: Option<Vec<String>>,
}

impl Claims {
    /// What a session holding this token may do.
    fn into_access(self) -> Access {
        Access {
            expires_at_ms: self.exp.map(|s| s.saturating_mul(1000)),
            topics: self.topics,
            publish: Some(self.publish.unwrap_or_default()),
            groups: Some(self.groups.unwrap_or_default()),
        }
    }
}

/// Decodes and checks a token against `auth`: signature (HS256 only), `exp` and `nbf`, and when
/// configured `aud`, `iss` and the longest lifetime. The error says what is wrong.
fn decode_token(auth: &AuthConfig, token: &str, now_secs: u64) -> Result<Claims, String> {
    let mut validation = Validation::new(Algorithm::HS256);
    validation.required_spec_claims.clear();
    validation.required_spec_claims.insert("sub".into());
    validation.leeway = 0;
    // A token that is not valid yet is refused like an expired one.
    validation.validate_nbf = true;
    if auth.jwt_audience.is_empty() {
        validation.validate_aud = false;
    } else {
        validation.set_audience(&[auth.jwt_audience.as_str()]);
        validation.required_spec_claims.insert("aud".into());
    }
    if !auth.jwt_issuer.is_empty() {
        validation.set_issuer(&[auth.jwt_issuer.as_str()]);
        validation.required_spec_claims.insert("iss".into());
    }
    if auth.jwt_max_lifetime_secs > 0 {
        validation.required_spec_claims.insert("exp".into());
    }
    let claims = decode::<Claims>(token, &DecodingKey::from_secret(auth.jwt_secret.as_bytes()), &validation).map_err(|e| format!("invalid token: {e}"))?.claims;
    if auth.jwt_max_lifetime_secs > 0 {
        let exp = claims.exp.unwrap_or(u64::MAX);
        if exp.saturating_sub(now_secs) > auth.jwt_max_lifetime_secs {
            return Err(format!("invalid token: exp is more than auth.jwt_max_lifetime_secs ({}) ahead", auth.jwt_max_lifetime_secs));
        }
    }
    Ok(claims)
}

fn now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Checks a session handshake's token when `auth.jwt_secret` is set: from the `token` query
/// parameter or `Authorization: Bearer`. 401 when missing or invalid (bad signature, expired,
/// not HS256, wrong audience or issuer, too long a lifetime), 403 when its `sub` is not the
/// `client_id` asked for.
pub fn session_access(auth: &AuthConfig, query_token: Option<&str>, headers: &HeaderMap, client_id: &ClientId) -> Result<Access, ApiError> {
    if auth.jwt_secret.is_empty() {
        // Publishing over a session needs a credential: with the admin token set and no JWTs,
        // only REST with the admin token publishes.
        let publish = (!auth.admin_token.is_empty()).then(Vec::new);
        return Ok(Access { publish, ..Access::default() });
    }
    let unauthorized = |message: String| ApiError::new(StatusCode::UNAUTHORIZED, ErrorCode::Unauthorized, message);
    let token =
        query_token.or_else(|| bearer(headers)).ok_or_else(|| unauthorized("a token is required: ?token=<JWT> or Authorization: Bearer <JWT>".into()))?;
    let claims = decode_token(auth, token, now_secs()).map_err(unauthorized)?;
    if claims.sub != client_id.as_str() {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            ErrorCode::Forbidden,
            format!("the token is for client {:?}, not {:?}", claims.sub, client_id.as_str()),
        ));
    }
    Ok(claims.into_access())
}

/// Checks the token of a session's `refresh` frame as the handshake checks its first one.
pub struct JwtCheck(pub AuthConfig);

impl crate::core::access::TokenCheck for JwtCheck {
    fn check(&self, token: &str, client_id: &ClientId) -> Result<Access, String> {
        let claims = decode_token(&self.0, token, now_secs())?;
        if claims.sub != client_id.as_str() {
            return Err(format!("the token is for client {:?}, not {:?}", claims.sub, client_id.as_str()));
        }
        Ok(claims.into_access())
    }
}

/// `POST /topics/{topic}/events` with `auth.admin_token` set: the admin token, or a JWT (when
/// `auth.jwt_secret` is set) whose `publish` claim allows the topic.
pub async fn require_publish_right(State(app): State<AppState>, request: Request, next: Next) -> Response {
    let auth = &app.config.auth;
    if auth.admin_token.is_empty() {
        return next.run(request).await;
    }
    let Some(token) = bearer(request.headers()) else {
        return ApiError::new(
            StatusCode::UNAUTHORIZED,
            ErrorCode::Unauthorized,
            "Authorization: Bearer <auth.admin_token or a JWT with a publish claim> is required",
        )
        .into_response();
    };
    if constant_time_eq(token.as_bytes(), auth.admin_token.as_bytes()) {
        return next.run(request).await;
    }
    let topic = request.uri().path().strip_prefix("/topics/").and_then(|rest| rest.strip_suffix("/events")).unwrap_or("");
    if auth.jwt_secret.is_empty() || token.matches('.').count() != 2 {
        return ApiError::new(StatusCode::FORBIDDEN, ErrorCode::Forbidden, "wrong admin token").into_response();
    }
    let claims = match decode_token(auth, token, now_secs()) {
        Ok(claims) => claims,
        Err(message) => return ApiError::new(StatusCode::UNAUTHORIZED, ErrorCode::Unauthorized, message).into_response(),
    };
    // The same patterns as the `topics` claim; no `publish` claim allows nothing.
    let may_publish = Access { publish: Some(claims.publish.unwrap_or_default()), ..Access::default() };
    if !may_publish.may_publish(topic) {
        let message = format!("the token's publish claim does not allow topic {topic:?}");
        return ApiError::new(StatusCode::FORBIDDEN, ErrorCode::Forbidden, message).into_response();
    }
    let mut request = request;
    request.extensions_mut().insert(PublisherSub(claims.sub));
    next.run(request).await
}

/// The `sub` of the JWT a publish was allowed by (absent for the admin token and anonymous
/// publishers): its `Idempotency-Key`s are its own (`IdempotencyKey::scoped`).
#[derive(Debug, Clone)]
pub struct PublisherSub(pub String);

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{encode, EncodingKey, Header};
    use serde_json::json;

    const SECRET: &str = "0123456789abcdef0123456789abcdef";

    fn auth(audience: &str, issuer: &str, max_lifetime: u64) -> AuthConfig {
        AuthConfig {
            jwt_secret: SECRET.into(),
            jwt_audience: audience.into(),
            jwt_issuer: issuer.into(),
            jwt_max_lifetime_secs: max_lifetime,
            ..Default::default()
        }
    }

    fn token(claims: serde_json::Value) -> String {
        encode(&Header::default(), &claims, &EncodingKey::from_secret(SECRET.as_bytes())).unwrap()
    }

    #[test]
    fn audience_and_issuer_are_checked_when_set() {
        let now = now_secs();
        let plain = token(json!({"sub": "a"}));
        assert!(decode_token(&auth("", "", 0), &plain, now).is_ok());
        assert!(decode_token(&auth("", "", 0), &token(json!({"sub": "a", "aud": "other"})), now).is_ok(), "aud is not checked unless configured");
        assert!(decode_token(&auth("ackgate", "", 0), &plain, now).is_err(), "aud required when configured");
        assert!(decode_token(&auth("ackgate", "", 0), &token(json!({"sub": "a", "aud": "other"})), now).is_err());
        assert!(decode_token(&auth("ackgate", "", 0), &token(json!({"sub": "a", "aud": ["x", "ackgate"]})), now).is_ok());
        assert!(decode_token(&auth("", "https://idp", 0), &plain, now).is_err(), "iss required when configured");
        assert!(decode_token(&auth("", "https://idp", 0), &token(json!({"sub": "a", "iss": "https://evil"})), now).is_err());
        assert!(decode_token(&auth("", "https://idp", 0), &token(json!({"sub": "a", "iss": "https://idp"})), now).is_ok());
    }

    #[test]
    fn a_maximum_lifetime_requires_a_near_exp() {
        let now = now_secs();
        let a = auth("", "", 3600);
        assert!(decode_token(&a, &token(json!({"sub": "a"})), now).is_err(), "exp required");
        assert!(decode_token(&a, &token(json!({"sub": "a", "exp": now + 60})), now).is_ok());
        assert!(decode_token(&a, &token(json!({"sub": "a", "exp": now + 7200})), now).is_err(), "too far ahead");
        assert!(decode_token(&a, &token(json!({"sub": "a", "exp": u64::MAX})), now).is_err(), "2^64-1 is too far ahead, no overflow");
    }
}

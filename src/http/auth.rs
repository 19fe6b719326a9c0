//! Authentication at the HTTP edge: the admin bearer token (`auth.admin_token`) for `/admin/*`,
//! publishing and topic changes, and JWTs for `/ws` and `/sse` and, through their `publish` claim,
//! for publishing: HS256 with `auth.jwt_secret`, and an identity provider's keys (`auth.jwks_url`:
//! RS256/384/512, PS256, ES256/384, EdDSA, chosen by the token's `kid`). The only import of
//! jsonwebtoken.

use std::collections::HashMap;
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk};
use jsonwebtoken::{decode, decode_header, Algorithm, DecodingKey, Validation};
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
    /// Epoch seconds before which the token is refused; optional.
    nbf: Option<u64>,
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

/// One fetch of the key set, connect to last byte.
const JWKS_FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// A token with a `kid` the key set lacks is fetched for again at most this often: anyone can
/// send tokens naming made-up kids.
const UNKNOWN_KID_REFETCH: Duration = Duration::from_secs(60);

/// An identity provider's verifying keys by `kid`, each with the one algorithm it checks.
type KeysByKid = HashMap<String, (DecodingKey, Algorithm)>;

/// The keys tokens are checked with: the HS256 secret, and an identity provider's public keys by
/// `kid`, replaced whole at each fetch of `auth.jwks_url` (a rotated-out key stops being accepted
/// once the provider drops it from its set).
pub struct TokenKeys {
    /// Replaced by a reload that changes `auth.jwt_secret` (`replace_secret`).
    secret: RwLock<Option<DecodingKey>>,
    /// The keys and the fetch they came from.
    by_kid: RwLock<(u64, KeysByKid)>,
    fetches_started: std::sync::atomic::AtomicU64,
    jwks_url: String,
    jwks_ca_file: String,
    /// When a token's unknown kid last made a fetch.
    unknown_kid_fetch: Mutex<Option<Instant>>,
}

impl TokenKeys {
    pub fn new(auth: &AuthConfig) -> Self {
        Self {
            secret: RwLock::new(hs256_key(&auth.jwt_secret)),
            by_kid: RwLock::new((0, HashMap::new())),
            fetches_started: std::sync::atomic::AtomicU64::new(0),
            jwks_url: auth.jwks_url.clone(),
            jwks_ca_file: auth.jwks_ca_file.clone(),
            unknown_kid_fetch: Mutex::new(None),
        }
    }

    /// A new `auth.jwt_secret` (a reload): HS256 tokens are checked with it from now on, and a
    /// token signed with the old one is refused (at a handshake, a `refresh`, an SSE session's
    /// frame POST; a WebSocket session keeps the credentials it has until they expire).
    pub fn replace_secret(&self, secret: &str) {
        *self.secret.write().unwrap_or_else(|e| e.into_inner()) = hs256_key(secret);
    }

    pub fn uses_jwks(&self) -> bool {
        !self.jwks_url.is_empty()
    }

    /// Fetches the key set and replaces the keys; how many it holds now. Fetches may overlap (the
    /// period, an unknown kid): one that ends after a later-started one keeps its answer out.
    pub async fn fetch(&self) -> Result<usize, String> {
        let started = self.fetches_started.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        let body = super::fetch::get(&self.jwks_url, &self.jwks_ca_file, JWKS_FETCH_TIMEOUT).await?;
        self.load(&body, started).map_err(|e| format!("{}: {e}", self.jwks_url))
    }

    /// Replaces the keys with those of a JWKS document, fetch `started` (newer ones win). Keys
    /// that do not parse, without a `kid`, of another use than signing, or of an algorithm it
    /// cannot check are left out, each alone; a document with none left is refused (the keys in
    /// use stay: a provider's passing glitch must not refuse every token).
    fn load(&self, body: &[u8], started: u64) -> Result<usize, String> {
        #[derive(serde::Deserialize)]
        struct Document {
            keys: Vec<serde_json::Value>,
        }
        let document: Document = serde_json::from_slice(body).map_err(|e| format!("not a JWKS document: {e}"))?;
        let keys: KeysByKid = document
            .keys
            .into_iter()
            .filter_map(|key| serde_json::from_value::<Jwk>(key).ok())
            .filter_map(|jwk| Some((jwk.common.key_id.clone()?, signing_key(&jwk)?)))
            .collect();
        if keys.is_empty() {
            return Err("no key in it has a kid and an algorithm ackgate checks tokens with".into());
        }
        let count = keys.len();
        let mut current = self.by_kid.write().unwrap_or_else(|e| e.into_inner());
        if started >= current.0 {
            *current = (started, keys);
        }
        Ok(count)
    }

    /// When `token` names a `kid` the set lacks, fetches the set again, at most once a
    /// minute (a key rotated in since the last fetch); then the token is checked as usual.
    pub async fn prepare(&self, token: Option<&str>) {
        let Some(kid) = token.filter(|_| self.uses_jwks()).and_then(|t| decode_header(t).ok()).and_then(|h| h.kid) else { return };
        if self.by_kid.read().unwrap_or_else(|e| e.into_inner()).1.contains_key(&kid) || !self.may_fetch_for_unknown_kid() {
            return;
        }
        match self.fetch().await {
            Ok(keys) => tracing::info!(%kid, keys, "a token named an unknown kid: the JWKS was fetched again"),
            Err(e) => tracing::warn!(%kid, error = %e, "a token named an unknown kid; fetching the JWKS again failed"),
        }
    }

    fn may_fetch_for_unknown_kid(&self) -> bool {
        let mut last = self.unknown_kid_fetch.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_some_and(|at| at.elapsed() < UNKNOWN_KID_REFETCH) {
            return false;
        }
        *last = Some(Instant::now());
        true
    }

    /// The key and algorithm a token of this header is checked with.
    fn key_for(&self, header: &jsonwebtoken::Header) -> Result<(DecodingKey, Algorithm), String> {
        if header.alg == Algorithm::HS256 {
            return self
                .secret
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
                .map(|key| (key, Algorithm::HS256))
                .ok_or_else(|| "HS256 tokens are not accepted here (auth.jwt_secret is not set)".to_string());
        }
        if !self.uses_jwks() {
            return Err(format!("{:?} tokens are not accepted here: only HS256 (auth.jwks_url is not set)", header.alg));
        }
        let kid = header.kid.as_deref().ok_or("a token not signed HS256 must name its key (kid)")?;
        let keys = self.by_kid.read().unwrap_or_else(|e| e.into_inner());
        let (key, alg) = keys.1.get(kid).ok_or_else(|| format!("no key {kid:?} in the key set of auth.jwks_url"))?;
        // The key decides the algorithm, never the token (algorithm confusion).
        if *alg != header.alg {
            return Err(format!("key {kid:?} is for {alg:?}, the token says {:?}", header.alg));
        }
        Ok((key.clone(), *alg))
    }
}

fn hs256_key(secret: &str) -> Option<DecodingKey> {
    (!secret.is_empty()).then(|| DecodingKey::from_secret(secret.as_bytes()))
}

/// A JWK's verifying key and the one algorithm it is used with: its `alg`, or what its key type
/// implies (RSA: RS256, P-256: ES256, P-384: ES384, Ed25519: EdDSA). `None` for keys ackgate
/// does not check tokens with (encryption keys, symmetric keys, other curves).
fn signing_key(jwk: &Jwk) -> Option<(DecodingKey, Algorithm)> {
    if jwk.common.public_key_use.as_ref().is_some_and(|u| *u != jsonwebtoken::jwk::PublicKeyUse::Signature) {
        return None;
    }
    // A named `alg` must be a signing one (not RSA-OAEP, RSA1_5: an encryption key).
    let named = match jwk.common.key_algorithm {
        Some(a) => Some(format!("{a:?}").parse::<Algorithm>().ok()?),
        None => None,
    };
    let implied = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => Algorithm::RS256,
        AlgorithmParameters::EllipticCurve(ec) if ec.curve == EllipticCurve::P256 => Algorithm::ES256,
        AlgorithmParameters::EllipticCurve(ec) if ec.curve == EllipticCurve::P384 => Algorithm::ES384,
        AlgorithmParameters::OctetKeyPair(okp) if okp.curve == EllipticCurve::Ed25519 => Algorithm::EdDSA,
        _ => return None,
    };
    let alg = named.unwrap_or(implied);
    let family_matches = match alg {
        Algorithm::RS256 | Algorithm::RS384 | Algorithm::RS512 | Algorithm::PS256 | Algorithm::PS384 | Algorithm::PS512 => implied == Algorithm::RS256,
        other => other == implied,
    };
    family_matches.then_some(())?;
    Some((DecodingKey::from_jwk(jwk).ok()?, alg))
}

/// Decodes and checks a token: its signature (HS256 with the secret, or the key its `kid` names),
/// `exp` and `nbf`, and when configured `aud`, `iss` and the longest lifetime. The error says
/// what is wrong.
fn decode_token(auth: &AuthConfig, keys: &TokenKeys, token: &str, now_secs: u64) -> Result<Claims, String> {
    let header = decode_header(token).map_err(|e| format!("invalid token: {e}"))?;
    let (key, alg) = keys.key_for(&header).map_err(|e| format!("invalid token: {e}"))?;
    let mut validation = Validation::new(alg);
    validation.required_spec_claims.clear();
    validation.required_spec_claims.insert("sub".into());
    validation.leeway = 0;
    // `exp` and `nbf` are checked below against the gateway's wall clock (the library reads the
    // system's): a token that is not valid yet is refused like an expired one.
    validation.validate_exp = false;
    validation.validate_nbf = false;
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
    let claims = decode::<Claims>(token, &key, &validation).map_err(|e| format!("invalid token: {e}"))?.claims;
    // As jsonwebtoken's own checks with no leeway, in its words.
    if claims.exp.is_some_and(|exp| exp < now_secs) {
        return Err("invalid token: ExpiredSignature".into());
    }
    if claims.nbf.is_some_and(|nbf| nbf > now_secs) {
        return Err("invalid token: ImmatureSignature".into());
    }
    if auth.jwt_max_lifetime_secs > 0 {
        let exp = claims.exp.unwrap_or(u64::MAX);
        if exp.saturating_sub(now_secs) > auth.jwt_max_lifetime_secs {
            return Err(format!("invalid token: exp is more than auth.jwt_max_lifetime_secs ({}) ahead", auth.jwt_max_lifetime_secs));
        }
    }
    Ok(claims)
}

fn now_secs() -> u64 {
    crate::core::clock::wall_now_ms() / 1000
}

/// The token of a session handshake: the `token` query parameter or `Authorization: Bearer`.
pub fn session_token<'a>(query_token: Option<&'a str>, headers: &'a HeaderMap) -> Option<&'a str> {
    query_token.or_else(|| bearer(headers))
}

/// Checks a session handshake's token when tokens are checked (`auth.jwt_secret`,
/// `auth.jwks_url`; `TokenKeys::prepare` first, for a rotated key): from the `token` query
/// parameter or `Authorization: Bearer`. 401 when missing or invalid (bad signature, expired, an
/// unknown key, wrong audience or issuer, too long a lifetime), 403 when its `sub` is not the
/// `client_id` asked for.
pub fn session_access(auth: &AuthConfig, keys: &TokenKeys, query_token: Option<&str>, headers: &HeaderMap, client_id: &ClientId) -> Result<Access, ApiError> {
    if !auth.checks_tokens() {
        // Publishing over a session needs a credential: with the admin token set and no JWTs,
        // only REST with the admin token publishes.
        let publish = (!auth.admin_token.is_empty()).then(Vec::new);
        return Ok(Access { publish, ..Access::default() });
    }
    let unauthorized = |message: String| ApiError::new(StatusCode::UNAUTHORIZED, ErrorCode::Unauthorized, message);
    let token = session_token(query_token, headers).ok_or_else(|| unauthorized("a token is required: ?token=<JWT> or Authorization: Bearer <JWT>".into()))?;
    let claims = decode_token(auth, keys, token, now_secs()).map_err(unauthorized)?;
    if claims.sub != client_id.as_str() {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            ErrorCode::Forbidden,
            format!("the token is for client {:?}, not {:?}", claims.sub, client_id.as_str()),
        ));
    }
    Ok(claims.into_access())
}

/// Logs credentials a session was refused (said to the client inside its socket or stream, so
/// the request log sees a 101 or a 200): at most once a second, anyone can cause it.
pub(super) fn log_refused_credentials(client_id: &ClientId, remote: std::net::SocketAddr, refused: &ApiError) {
    static REFUSED: crate::core::log_throttle::Throttled = crate::core::log_throttle::Throttled::new();
    if let Some(suppressed) = REFUSED.allow() {
        tracing::info!(%client_id, %remote, code = refused.code.as_str(), reason = %refused.message, suppressed, "session credentials refused");
    }
}

/// Checks the token of a session's `refresh` frame as the handshake checks its first one. A token
/// naming a key the set lacks starts a fetch of the set (at most once a minute) and is refused
/// this time: the session's task does not wait on the network.
pub struct JwtCheck(pub AuthConfig, pub std::sync::Arc<TokenKeys>);

impl crate::core::access::TokenCheck for JwtCheck {
    fn check(&self, token: &str, client_id: &ClientId) -> Result<Access, String> {
        let claims = decode_token(&self.0, &self.1, token, now_secs()).inspect_err(|_| {
            let (keys, token) = (self.1.clone(), token.to_string());
            tokio::spawn(async move { keys.prepare(Some(&token)).await });
        })?;
        if claims.sub != client_id.as_str() {
            return Err(format!("the token is for client {:?}, not {:?}", claims.sub, client_id.as_str()));
        }
        Ok(claims.into_access())
    }
}

/// `POST /topics/{topic}/events` with `auth.admin_token` set: the admin token, or a JWT (when
/// tokens are checked) whose `publish` claim allows the topic.
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
    if !auth.checks_tokens() || token.matches('.').count() != 2 {
        return ApiError::new(StatusCode::FORBIDDEN, ErrorCode::Forbidden, "wrong admin token").into_response();
    }
    app.token_keys.prepare(Some(token)).await;
    let claims = match decode_token(auth, &app.token_keys, token, now_secs()) {
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

    fn decode_token_hs(auth: &AuthConfig, token: &str, now: u64) -> Result<Claims, String> {
        decode_token(auth, &TokenKeys::new(auth), token, now)
    }

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
        assert!(decode_token_hs(&auth("", "", 0), &plain, now).is_ok());
        assert!(decode_token_hs(&auth("", "", 0), &token(json!({"sub": "a", "aud": "other"})), now).is_ok(), "aud is not checked unless configured");
        assert!(decode_token_hs(&auth("ackgate", "", 0), &plain, now).is_err(), "aud required when configured");
        assert!(decode_token_hs(&auth("ackgate", "", 0), &token(json!({"sub": "a", "aud": "other"})), now).is_err());
        assert!(decode_token_hs(&auth("ackgate", "", 0), &token(json!({"sub": "a", "aud": ["x", "ackgate"]})), now).is_ok());
        assert!(decode_token_hs(&auth("", "https://idp", 0), &plain, now).is_err(), "iss required when configured");
        assert!(decode_token_hs(&auth("", "https://idp", 0), &token(json!({"sub": "a", "iss": "https://evil"})), now).is_err());
        assert!(decode_token_hs(&auth("", "https://idp", 0), &token(json!({"sub": "a", "iss": "https://idp"})), now).is_ok());
    }

    #[test]
    fn a_maximum_lifetime_requires_a_near_exp() {
        let now = now_secs();
        let a = auth("", "", 3600);
        assert!(decode_token_hs(&a, &token(json!({"sub": "a"})), now).is_err(), "exp required");
        assert!(decode_token_hs(&a, &token(json!({"sub": "a", "exp": now + 60})), now).is_ok());
        assert!(decode_token_hs(&a, &token(json!({"sub": "a", "exp": now + 7200})), now).is_err(), "too far ahead");
        assert!(decode_token_hs(&a, &token(json!({"sub": "a", "exp": u64::MAX})), now).is_err(), "2^64-1 is too far ahead, no overflow");
    }

    #[test]
    fn a_key_set_keeps_only_signing_keys_whose_algorithm_fits_them() {
        let keys = TokenKeys::new(&AuthConfig { jwks_url: "http://idp.example/jwks".into(), ..Default::default() });
        let ed = |kid: &str, extra: serde_json::Value| {
            let mut jwk = json!({"kty": "OKP", "crv": "Ed25519", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo", "kid": kid});
            jwk.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            jwk
        };
        let set = json!({"keys": [
            ed("sig", json!({})),
            ed("enc", json!({"use": "enc"})),
            ed("claims-rs256", json!({"alg": "RS256"})),
            {"kty": "EC", "crv": "P-256", "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU", "y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"},
        ]});
        assert_eq!(keys.load(set.to_string().as_bytes(), 1), Ok(1), "only the signing key with a kid and a fitting algorithm");
        assert!(keys.by_kid.read().unwrap().1.get("sig").is_some_and(|(_, alg)| *alg == Algorithm::EdDSA));
        let none = json!({"keys": [ed("enc", json!({"use": "enc"})), ed("oaep", json!({"alg": "RSA-OAEP"}))]});
        assert!(keys.load(none.to_string().as_bytes(), 2).is_err(), "a set with no usable key is refused");
        assert!(keys.load(br#"{"keys": []}"#, 2).is_err(), "an empty set too");
        assert!(keys.by_kid.read().unwrap().1.contains_key("sig"), "and the keys in use stay");
        assert!(keys.load(b"<html>", 2).is_err());
        // One key jsonwebtoken cannot parse (an unknown curve) leaves the others.
        let mixed = json!({"keys": [{"kty": "EC", "crv": "P-521", "x": "AA", "y": "AA", "kid": "odd"}, ed("next", json!({}))]});
        assert_eq!(keys.load(mixed.to_string().as_bytes(), 3), Ok(1));
        // An older fetch that ends last does not replace a newer one's keys.
        assert_eq!(keys.load(set.to_string().as_bytes(), 2), Ok(1));
        assert!(keys.by_kid.read().unwrap().1.contains_key("next"), "fetch 3's keys stay");
    }
}

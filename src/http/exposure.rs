//! Who may reach the gateway from a browser (docs/protocol.md, "Exposure"). Any page a user opens can
//! open a WebSocket or send a simple POST to any address, loopback included, and the browser
//! attaches no credential ackgate could tell apart. Two checks, before auth and before any body
//! is read:
//! - **Origin**: a request that carries an `Origin` (every browser request that could change
//!   something does) must come from the gateway's own origin, a `cluster.peers` instance's or
//!   one in `server.allowed_origins`. Applies to the WebSocket and SSE handshakes and to every POST, PUT
//!   and DELETE; requests without `Origin` (curl, servers, native clients) pass.
//! - **Fetch Metadata**: browsers send no `Origin` on a GET a page makes blind (`<img>`,
//!   `<iframe>`, `<script>`, a navigation, `fetch` in `no-cors` mode), and an SSE GET opens a
//!   session and can move offsets (`from=latest`). What browsers do send on every request is
//!   `Sec-Fetch-Site` and `Sec-Fetch-Dest`: a request that can act whose `Sec-Fetch-Site` is
//!   `cross-site` or `same-site` must carry an allowed `Origin` (so it is a CORS request whose
//!   page reads the answer), and `/ws` and `/sse` take only the destinations EventSource, fetch
//!   and WebSocket send: `empty`, and on `/ws` also `websocket`, the value MDN lists for a WebSocket
//!   handshake (Chromium 156 sends no Fetch Metadata on one at all).
//!   Requests without Fetch Metadata (curl, servers, native clients) pass.
//! - **Host**: on a loopback listener the `Host` must be a loopback name, the `public_url` host
//!   or one in `server.allowed_hosts`; a page that rebinds its own DNS name to 127.0.0.1 sends
//!   its own name and is refused. Elsewhere only when `server.allowed_hosts` is set.

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::forwarded::Forwarded;
use super::AppState;
use crate::config::origin::{parse_origin, split_host_port, Origin};
use crate::config::Config;
use crate::core::log_throttle::Throttled;
use crate::core::protocol::ErrorCode;

/// A host the `Host` check accepts: any port, or only the one named.
#[derive(Debug, Clone)]
struct HostRule {
    host: String,
    port: Option<u16>,
}

/// The two checks, prepared from the configuration once.
#[derive(Debug, Clone)]
pub struct Exposure {
    /// The listener's scheme: the request's own origin is this plus its `Host`.
    scheme: &'static str,
    any_origin: bool,
    origins: Vec<Origin>,
    /// `None`: no Host check on this listener.
    hosts: Option<Vec<HostRule>>,
}

impl Exposure {
    pub fn from_config(config: &Config) -> Self {
        let server = &config.server;
        let scheme = if server.tls_cert.is_empty() { "http" } else { "https" };
        let any_origin = server.allowed_origins.iter().any(|o| o == "*");
        // The instances of the cluster serve the same console: a page of one follows a takeover
        // to another (its /session/recommend names it), so their origins are this one's too.
        let origins = server.allowed_origins.iter().chain(&config.cluster.peers).chain([&server.public_url]).filter_map(|o| parse_origin(o)).collect();
        let any_host = server.allowed_hosts.iter().any(|h| h == "*");
        let hosts = (!any_host && (server.listens_on_loopback() || !server.allowed_hosts.is_empty())).then(|| {
            let mut rules: Vec<HostRule> = ["localhost", "127.0.0.1", "[::1]"].iter().map(|h| HostRule { host: h.to_string(), port: None }).collect();
            if let Some(public) = parse_origin(&server.public_url) {
                rules.push(HostRule { host: public.host, port: None });
            }
            rules.extend(server.allowed_hosts.iter().filter_map(|h| split_host_port(h)).map(|(host, port)| HostRule { host, port }));
            rules
        });
        Self { scheme, any_origin, origins, hosts }
    }

    /// The Host check: `Err` with the reason when the request is addressed to a host that is
    /// not allowed. A request without any host (HTTP/1.0) cannot come from a browser and passes.
    /// Behind a trusted proxy the host the client sent the proxy (`X-Forwarded-Host`) must pass
    /// too, besides the request's own `Host`: a browser cannot forge `Host`, but a DNS-rebinding
    /// page on a trusted address (the proxy's host) can send `X-Forwarded-Host` same-origin.
    fn check_host(&self, headers: &HeaderMap, uri: &Uri, forwarded: Option<&Forwarded>) -> Result<(), String> {
        let Some(rules) = &self.hosts else { return Ok(()) };
        let own = headers.get(header::HOST).map(|h| h.to_str().unwrap_or("\u{fffd}").to_string()).or_else(|| uri.authority().map(|a| a.to_string()));
        let proxied = forwarded.and_then(|f| f.host.clone());
        for given in [own, proxied].into_iter().flatten() {
            let Some((host, port)) = split_host_port(&given) else {
                return Err(format!("the Host header {given:?} is malformed"));
            };
            if !rules.iter().any(|r| r.host == host && (r.port.is_none() || r.port == port)) {
                return Err(format!("requests addressed to host {host:?} are not served here; add it to server.allowed_hosts"));
            }
        }
        Ok(())
    }

    /// The Origin check, for requests that can act (see the module documentation). The request's
    /// own origin is the listener's scheme and the `Host`, or what a trusted proxy says of them.
    fn check_origin(&self, headers: &HeaderMap, forwarded: Option<&Forwarded>) -> Result<(), String> {
        let Some(given) = headers.get(header::ORIGIN) else { return Ok(()) };
        if self.any_origin {
            return Ok(());
        }
        let text = given.to_str().unwrap_or("");
        let Some(origin) = parse_origin(text) else {
            return Err(format!("requests from origin {text:?} are not allowed; add it to server.allowed_origins"));
        };
        let scheme = forwarded.and_then(|f| f.scheme).unwrap_or(self.scheme);
        let host = forwarded.and_then(|f| f.host.as_deref()).or_else(|| headers.get(header::HOST).and_then(|h| h.to_str().ok()));
        let own = host.and_then(|h| parse_origin(&format!("{scheme}://{h}")));
        if own.as_ref() == Some(&origin) || self.origins.contains(&origin) {
            return Ok(());
        }
        Err(format!("requests from origin {text:?} are not allowed; add it to server.allowed_origins"))
    }
}

/// The Fetch Metadata check (module documentation), for requests that can act: `Err` with the
/// reason for a request a page could have sent without reading the answer. An `Origin` that is
/// present is judged by `check_origin`.
fn check_fetch_metadata(headers: &HeaderMap, path: &str) -> Result<(), String> {
    let text = |name: &str| headers.get(name).map(|v| v.to_str().unwrap_or("\u{fffd}").to_ascii_lowercase());
    if let Some(site) = text("sec-fetch-site").filter(|s| s == "cross-site" || s == "same-site") {
        if !headers.contains_key(header::ORIGIN) {
            return Err(format!(
                "a {site} request without Origin (one a page can send without reading the answer) cannot act here; pages of allowed origins use fetch, EventSource or WebSocket, which send Origin"
            ));
        }
    }
    if path == "/ws" || path == "/sse" {
        if let Some(dest) = text("sec-fetch-dest").filter(|d| d != "empty" && !(path == "/ws" && d == "websocket")) {
            return Err(format!("{path} is not opened by a browser's {dest:?} request; use EventSource, fetch or WebSocket"));
        }
    }
    Ok(())
}

/// Whether a request can change something or open a session: the Origin check applies to it.
fn can_act(method: &Method, path: &str) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) || path == "/ws" || path == "/sse"
}

/// The routes a page of an allowed origin other than the gateway's uses cross-origin, which the
/// browser allows only with CORS: `GET /sse` and `POST /sse/{id}/frames` (a stream and its
/// frames), `POST /topics/{topic}/events` (publishing from a page), and the client's files
/// (`GET /static/ackgate.js`, `ackgate.min.js` and its map: imported by `<script type="module">`,
/// always a CORS request).
fn is_cross_origin_route(path: &str) -> bool {
    let publish = path.strip_prefix("/topics/").and_then(|rest| rest.strip_suffix("/events")).is_some_and(|topic| !topic.is_empty() && !topic.contains('/'));
    let client_file = path.strip_prefix("/static/").is_some_and(|file| super::console::CLIENT_FILES.contains(&file));
    path == "/sse" || path.starts_with("/sse/") || publish || client_file
}

/// CORS for those routes, for an Origin the check allows: the preflight of a POST (JSON with
/// `Authorization`, an `Idempotency-Key`) is answered here, and the answers name the origin.
async fn cors(exposure: &Exposure, request: Request, next: Next) -> Response {
    if let Err(message) = exposure.check_origin(request.headers(), request.extensions().get::<Forwarded>()) {
        return ApiError::new(StatusCode::FORBIDDEN, ErrorCode::Forbidden, message).into_response();
    }
    let origin = request.headers()[header::ORIGIN].clone();
    let mut response = if request.method() == Method::OPTIONS {
        let mut preflight = StatusCode::NO_CONTENT.into_response();
        let headers = preflight.headers_mut();
        headers.insert(header::ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static("GET, POST"));
        headers.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, HeaderValue::from_static("authorization, content-type, idempotency-key, last-event-id"));
        headers.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("600"));
        preflight
    } else {
        next.run(request).await
    };
    let headers = response.headers_mut();
    headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    // Appended: the answer may vary by other headers too.
    headers.append(header::VARY, HeaderValue::from_static("origin"));
    response
}

/// Middleware: refuses with 403 `forbidden` what the checks refuse, before auth and routing.
pub async fn guard(State(app): State<AppState>, request: Request, next: Next) -> Response {
    let exposure = &*app.exposure.get();
    let forwarded = request.extensions().get::<Forwarded>();
    let mut verdict = exposure.check_host(request.headers(), request.uri(), forwarded);
    if verdict.is_ok() && can_act(request.method(), request.uri().path()) {
        verdict = check_fetch_metadata(request.headers(), request.uri().path()).and_then(|()| exposure.check_origin(request.headers(), forwarded));
    }
    match verdict {
        Ok(()) if is_cross_origin_route(request.uri().path()) && request.headers().contains_key(header::ORIGIN) => cors(exposure, request, next).await,
        Ok(()) => next.run(request).await,
        Err(message) => {
            // Anyone's page can make these: once a second, with the count left out.
            static REFUSALS: Throttled = Throttled::new();
            if let Some(suppressed) = REFUSALS.allow() {
                tracing::info!(method = %request.method(), path = request.uri().path(), reason = %message.escape_debug(), suppressed, "refused by the Origin, Fetch Metadata or Host check");
            }
            ApiError::new(StatusCode::FORBIDDEN, ErrorCode::Forbidden, message).into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exposure(listen: &str, tls: bool, origins: &[&str], hosts: &[&str]) -> Exposure {
        let mut config = Config::default();
        config.server.listen = listen.into();
        if tls {
            config.server.tls_cert = "cert.pem".into();
        }
        config.server.allowed_origins = origins.iter().map(|s| s.to_string()).collect();
        config.server.allowed_hosts = hosts.iter().map(|s| s.to_string()).collect();
        config.server.public_url = "https://gw.example.com".into();
        config.cluster.peers = vec!["http://10.0.0.8:8080".into()];
        Exposure::from_config(&config)
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        pairs.iter().map(|(k, v)| (k.parse().unwrap(), v.parse().unwrap())).collect()
    }

    #[test]
    fn origins_are_normalized() {
        assert_eq!(parse_origin("HTTP://LocalHost"), parse_origin("http://localhost:80"));
        assert_eq!(parse_origin("https://a.example/"), parse_origin("https://a.example:443"));
        assert_ne!(parse_origin("http://a.example"), parse_origin("https://a.example"));
        assert_eq!(parse_origin("http://[::1]:8080").unwrap().host, "[::1]");
        for bad in ["null", "", "a.example", "http://", "http://a:b", "http://a.example/path", "http://u@a.example", "ftp://a.example"] {
            assert_eq!(parse_origin(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn same_origin_and_listed_origins_pass_others_do_not() {
        let e = exposure("127.0.0.1:8080", false, &["https://app.example"], &[]);
        let own = headers(&[("host", "127.0.0.1:8080"), ("origin", "http://127.0.0.1:8080")]);
        assert!(e.check_origin(&own, None).is_ok());
        assert!(e.check_origin(&headers(&[("host", "127.0.0.1:8080")]), None).is_ok(), "no Origin: not a browser");
        assert!(e.check_origin(&headers(&[("host", "127.0.0.1:8080"), ("origin", "https://app.example")]), None).is_ok());
        assert!(e.check_origin(&headers(&[("host", "127.0.0.1:8080"), ("origin", "http://10.0.0.8:8080")]), None).is_ok(), "a peer instance's page");
        assert!(e.check_origin(&headers(&[("host", "127.0.0.1:8080"), ("origin", "https://gw.example.com")]), None).is_ok(), "the public_url's page");
        for evil in ["https://evil.example", "http://127.0.0.1:9999", "https://127.0.0.1:8080", "null", "https://app.example.evil.example"] {
            assert!(e.check_origin(&headers(&[("host", "127.0.0.1:8080"), ("origin", evil)]), None).is_err(), "{evil}");
        }
        let tls = exposure("127.0.0.1:8443", true, &[], &[]);
        assert!(tls.check_origin(&headers(&[("host", "localhost:8443"), ("origin", "https://localhost:8443")]), None).is_ok());
        assert!(tls.check_origin(&headers(&[("host", "localhost:8443"), ("origin", "http://localhost:8443")]), None).is_err());
        let any = exposure("127.0.0.1:8080", false, &["*"], &[]);
        assert!(any.check_origin(&headers(&[("host", "127.0.0.1:8080"), ("origin", "https://evil.example")]), None).is_ok());
    }

    #[test]
    fn a_loopback_listener_serves_only_loopback_names_and_the_listed_hosts() {
        let e = exposure("127.0.0.1:8080", false, &[], &["gw.internal", "other.internal:9000"]);
        let uri = Uri::from_static("/topics");
        for ok in ["localhost:8080", "127.0.0.1", "[::1]:8080", "LOCALHOST", "gw.example.com", "gw.internal:1234", "other.internal:9000"] {
            assert!(e.check_host(&headers(&[("host", ok)]), &uri, None).is_ok(), "{ok}");
        }
        for refused in ["evil.example", "evil.example:8080", "127.0.0.1.evil.example", "other.internal:9001", "localhost.evil.example"] {
            assert!(e.check_host(&headers(&[("host", refused)]), &uri, None).is_err(), "{refused}");
        }
        assert!(e.check_host(&HeaderMap::new(), &uri, None).is_ok(), "no Host at all: HTTP/1.0, not a browser");
    }

    #[test]
    fn behind_a_trusted_proxy_the_pages_scheme_and_host_are_the_proxys() {
        let e = exposure("127.0.0.1:8080", false, &[], &[]);
        let uri = Uri::from_static("/ws");
        let proxied = Forwarded { client: "203.0.113.9".parse().unwrap(), scheme: Some("https"), host: Some("localhost:8443".into()) };
        let page = headers(&[("host", "127.0.0.1:8080"), ("origin", "https://localhost:8443")]);
        assert!(e.check_origin(&page, None).is_err(), "without the proxy's word an https page is another origin");
        assert!(e.check_origin(&page, Some(&proxied)).is_ok());
        let evil = headers(&[("host", "127.0.0.1:8080"), ("origin", "https://evil.example")]);
        assert!(e.check_origin(&evil, Some(&proxied)).is_err());
        let rebound = Forwarded { host: Some("evil.example".into()), ..proxied.clone() };
        assert!(e.check_host(&headers(&[("host", "127.0.0.1:8080")]), &uri, Some(&rebound)).is_err(), "the proxy's Host is checked");
        assert!(e.check_host(&headers(&[("host", "127.0.0.1:8080")]), &uri, Some(&proxied)).is_ok());
        // A rebinding page on the proxy's host sends its own Host, and whatever X-Forwarded-Host.
        assert!(e.check_host(&headers(&[("host", "evil.example:8080")]), &uri, Some(&proxied)).is_err(), "the real Host is checked too");
    }

    #[test]
    fn elsewhere_the_host_check_applies_only_when_hosts_are_listed() {
        let open = exposure("0.0.0.0:8080", false, &[], &[]);
        let uri = Uri::from_static("/");
        assert!(open.check_host(&headers(&[("host", "anything.example")]), &uri, None).is_ok());
        let listed = exposure("0.0.0.0:8080", false, &[], &["gw.internal"]);
        assert!(listed.check_host(&headers(&[("host", "gw.internal:8080")]), &uri, None).is_ok());
        assert!(listed.check_host(&headers(&[("host", "evil.example")]), &uri, None).is_err());
    }

    #[test]
    fn fetch_metadata_refuses_what_a_page_sends_blind() {
        let blind = [
            ("/sse", &[("sec-fetch-site", "cross-site"), ("sec-fetch-dest", "image")][..]),
            ("/sse", &[("sec-fetch-site", "same-site"), ("sec-fetch-dest", "empty")]),
            ("/sse", &[("sec-fetch-site", "same-origin"), ("sec-fetch-dest", "iframe")]),
            ("/sse", &[("sec-fetch-site", "none"), ("sec-fetch-dest", "document")]),
            ("/sse", &[("sec-fetch-dest", "websocket")]),
            ("/ws", &[("sec-fetch-site", "CROSS-SITE"), ("sec-fetch-dest", "websocket")]),
            ("/topics/t/events", &[("sec-fetch-site", "cross-site")]),
        ];
        for (path, pairs) in blind {
            assert!(check_fetch_metadata(&headers(pairs), path).is_err(), "{path} {pairs:?}");
        }
        let fine = [
            ("/sse", &[][..]),
            ("/sse", &[("sec-fetch-site", "same-origin"), ("sec-fetch-dest", "empty")]),
            ("/sse", &[("sec-fetch-site", "cross-site"), ("sec-fetch-dest", "empty"), ("origin", "https://app.example")]),
            ("/ws", &[("sec-fetch-site", "same-origin"), ("sec-fetch-dest", "websocket"), ("origin", "http://127.0.0.1:8080")]),
            ("/topics/t/events", &[("sec-fetch-site", "same-origin"), ("sec-fetch-dest", "empty")]),
        ];
        for (path, pairs) in fine {
            assert!(check_fetch_metadata(&headers(pairs), path).is_ok(), "{path} {pairs:?}");
        }
    }

    #[test]
    fn only_requests_that_can_act_are_origin_checked() {
        assert!(can_act(&Method::POST, "/topics/t/events"));
        assert!(can_act(&Method::DELETE, "/topics/t"));
        assert!(can_act(&Method::PUT, "/admin/offsets/t/c/0"));
        assert!(can_act(&Method::GET, "/ws"));
        assert!(!can_act(&Method::GET, "/topics"));
        assert!(!can_act(&Method::GET, "/metrics"));
    }
}

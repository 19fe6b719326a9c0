//! The requests ackgate itself makes: an identity provider's key set (`auth.jwks_url`, read in
//! `auth`), the peers' `/readyz` (`cluster`) and their admin lists (`cluster_scope`), and the
//! OTLP exports of spans (`telemetry`). One request over http:// or https:// (verified
//! against a given PEM file of authorities, or the system's), bounded in time and size.
//!
//! HTTP/1.0 on purpose: a server must not answer it with a chunked body, so the body is
//! everything after the head, up to the close.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// A key set bigger than this is refused (a JWKS holds a few keys: a few KiB).
const MAX_BYTES: u64 = 1024 * 1024;

/// A peer's admin list bigger than this is refused (an offsets page is at most 10,000 rows; the
/// session list is not paged: 100,000 sessions are ~35 MB).
const MAX_ADMIN_BYTES: u64 = 128 * 1024 * 1024;

/// The body of `GET url` when it answers 200 within `timeout` (connect to last byte).
pub async fn get(url: &str, ca_file: &str, timeout: Duration) -> Result<Vec<u8>, String> {
    ok_body(get_any(url, ca_file, timeout).await?, url)
}

/// `get` of a peer's admin route, with `Authorization: Bearer <admin_token>` when one is set.
pub async fn get_admin(url: &str, ca_file: &str, timeout: Duration, admin_token: &str) -> Result<Vec<u8>, String> {
    let bearer = Some(admin_token).filter(|t| !t.is_empty());
    let request = Request { method: "GET", url, ca_file, bearer, body: None, content_type: JSON, max_bytes: MAX_ADMIN_BYTES };
    ok_body(request.send_within(timeout).await?, url)
}

/// A change at a peer's admin route (`PUT`, `DELETE`) with the admin token and a JSON body:
/// its status and body, whatever the status.
pub async fn send_admin(method: &'static str, url: &str, ca_file: &str, timeout: Duration, admin_token: &str, body: &[u8]) -> Result<(u16, Vec<u8>), String> {
    let bearer = Some(admin_token).filter(|t| !t.is_empty());
    let request = Request { method, url, ca_file, bearer, body: Some(body), content_type: JSON, max_bytes: MAX_BYTES };
    request.send_within(timeout).await
}

/// `GET url`: its status and body, whatever the status (a peer's `/readyz` says why it is not
/// ready in a 503's body).
pub async fn get_any(url: &str, ca_file: &str, timeout: Duration) -> Result<(u16, Vec<u8>), String> {
    let request = Request { method: "GET", url, ca_file, bearer: None, body: None, content_type: JSON, max_bytes: MAX_BYTES };
    request.send_within(timeout).await
}

/// `POST url` of `body` as `content_type` (an OTLP export): its status and body.
pub async fn post(url: &str, ca_file: &str, timeout: Duration, content_type: &'static str, body: &[u8]) -> Result<(u16, Vec<u8>), String> {
    let request = Request { method: "POST", url, ca_file, bearer: None, body: Some(body), content_type, max_bytes: MAX_BYTES };
    request.send_within(timeout).await
}

const JSON: &str = "application/json";

fn ok_body((status, body): (u16, Vec<u8>), url: &str) -> Result<Vec<u8>, String> {
    match status {
        200 => Ok(body),
        _ => Err(format!("GET {url}: HTTP {status}")),
    }
}

/// One HTTP/1.0 request.
struct Request<'a> {
    method: &'static str,
    url: &'a str,
    ca_file: &'a str,
    bearer: Option<&'a str>,
    body: Option<&'a [u8]>,
    content_type: &'static str,
    max_bytes: u64,
}

impl Request<'_> {
    async fn send_within(&self, timeout: Duration) -> Result<(u16, Vec<u8>), String> {
        let (method, url) = (self.method, self.url);
        tokio::time::timeout(timeout, self.send()).await.map_err(|_| format!("{method} {url}: no answer within {timeout:?}"))?
    }

    async fn send(&self) -> Result<(u16, Vec<u8>), String> {
        let (method, url) = (self.method, self.url);
        let (tls, rest) = match (url.strip_prefix("https://"), url.strip_prefix("http://")) {
            (Some(rest), _) => (true, rest),
            (None, Some(rest)) => (false, rest),
            _ => return Err(format!("{url:?} is not an http:// or https:// URL")),
        };
        let (authority, path) = rest.split_once('/').map_or((rest, "/".to_string()), |(a, p)| (a, format!("/{p}")));
        let host = authority.rsplit_once(':').filter(|(_, port)| port.parse::<u16>().is_ok()).map_or(authority, |(host, _)| host);
        let address =
            if authority.contains(':') && !authority.ends_with(']') { authority.to_string() } else { format!("{authority}:{}", if tls { 443 } else { 80 }) };
        let tcp = TcpStream::connect(&address).await.map_err(|e| format!("{method} {url}: connecting to {address}: {e}"))?;
        let authorization = self.bearer.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
        let content = self.body.map(|b| format!("Content-Type: {}\r\nContent-Length: {}\r\n", self.content_type, b.len())).unwrap_or_default();
        let mut request =
            format!("{method} {path} HTTP/1.0\r\nHost: {authority}\r\nAccept: application/json\r\nUser-Agent: ackgate\r\n{authorization}{content}\r\n")
                .into_bytes();
        request.extend_from_slice(self.body.unwrap_or_default());
        let response = if tls {
            let stream = super::tls::connect_verified(tcp, host, self.ca_file).await.map_err(|e| format!("{method} {url}: {e}"))?;
            exchange(stream, &request, self.max_bytes).await
        } else {
            exchange(tcp, &request, self.max_bytes).await
        }
        .map_err(|e| format!("{method} {url}: {e}"))?;
        let at = response.windows(4).position(|w| w == b"\r\n\r\n").ok_or_else(|| format!("{method} {url}: no whole answer"))?;
        let head = String::from_utf8_lossy(&response[..at]);
        let mut status_line = head.split_whitespace();
        let (version, status) = (status_line.next().unwrap_or(""), status_line.next().unwrap_or("?"));
        if !version.starts_with("HTTP/") {
            return Err(format!("{method} {url}: not an HTTP answer"));
        }
        let status: u16 = status.parse().map_err(|_| format!("{method} {url}: no status in the answer"))?;
        if (300..400).contains(&status) {
            // Redirects are not followed: name the URL they point to.
            let location =
                head.lines().find_map(|l| l.split_once(':').filter(|(k, _)| k.trim().eq_ignore_ascii_case("location")).map(|(_, v)| v.trim().to_string()));
            return Err(format!("{method} {url}: HTTP {status}{}", location.map(|l| format!(" (to {l}; set that URL)")).unwrap_or_default()));
        }
        let body = response[at + 4..].to_vec();
        // A body cut short (a connection lost, a TLS close without close_notify) is not an answer.
        let length = head
            .lines()
            .find_map(|l| l.split_once(':').filter(|(k, _)| k.trim().eq_ignore_ascii_case("content-length")).and_then(|(_, v)| v.trim().parse::<usize>().ok()));
        if length.is_some_and(|n| n != body.len()) {
            return Err(format!("{method} {url}: the body is cut short ({} of {} bytes)", body.len(), length.unwrap_or(0)));
        }
        Ok((status, body))
    }
}

async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, request: &[u8], max_bytes: u64) -> std::io::Result<Vec<u8>> {
    stream.write_all(request).await?;
    let mut response = Vec::new();
    let read = (&mut stream).take(max_bytes + 1).read_to_end(&mut response).await;
    // A TLS server may close without close_notify: what arrived is the answer.
    if let Err(e) = read {
        if e.kind() != std::io::ErrorKind::UnexpectedEof || response.is_empty() {
            return Err(e);
        }
    }
    if response.len() as u64 > max_bytes {
        return Err(std::io::Error::other(format!("the answer is over {max_bytes} bytes")));
    }
    Ok(response)
}

//! The GETs ackgate itself makes: an identity provider's key set (`auth.jwks_url`, read in
//! `auth`), the peers' `/readyz` (`cluster`) and their admin lists (`cluster_scope`). One request over http:// or https:// (verified
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
    tokio::time::timeout(timeout, fetch_unbounded(url, ca_file, None, MAX_BYTES)).await.map_err(|_| format!("GET {url}: no answer within {timeout:?}"))?
}

/// `get` of a peer's admin route, with `Authorization: Bearer <admin_token>` when one is set.
pub async fn get_admin(url: &str, ca_file: &str, timeout: Duration, admin_token: &str) -> Result<Vec<u8>, String> {
    let bearer = Some(admin_token).filter(|t| !t.is_empty());
    tokio::time::timeout(timeout, fetch_unbounded(url, ca_file, bearer, MAX_ADMIN_BYTES))
        .await
        .map_err(|_| format!("GET {url}: no answer within {timeout:?}"))?
}

async fn fetch_unbounded(url: &str, ca_file: &str, bearer: Option<&str>, max_bytes: u64) -> Result<Vec<u8>, String> {
    let (tls, rest) = match (url.strip_prefix("https://"), url.strip_prefix("http://")) {
        (Some(rest), _) => (true, rest),
        (None, Some(rest)) => (false, rest),
        _ => return Err(format!("{url:?} is not an http:// or https:// URL")),
    };
    let (authority, path) = rest.split_once('/').map_or((rest, "/".to_string()), |(a, p)| (a, format!("/{p}")));
    let host = authority.rsplit_once(':').filter(|(_, port)| port.parse::<u16>().is_ok()).map_or(authority, |(host, _)| host);
    let address =
        if authority.contains(':') && !authority.ends_with(']') { authority.to_string() } else { format!("{authority}:{}", if tls { 443 } else { 80 }) };
    let tcp = TcpStream::connect(&address).await.map_err(|e| format!("GET {url}: connecting to {address}: {e}"))?;
    let authorization = bearer.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    let request = format!("GET {path} HTTP/1.0\r\nHost: {authority}\r\nAccept: application/json\r\nUser-Agent: ackgate\r\n{authorization}\r\n");
    let response = if tls {
        let stream = super::tls::connect_verified(tcp, host, ca_file).await.map_err(|e| format!("GET {url}: {e}"))?;
        exchange(stream, &request, max_bytes).await
    } else {
        exchange(tcp, &request, max_bytes).await
    }
    .map_err(|e| format!("GET {url}: {e}"))?;
    let at = response.windows(4).position(|w| w == b"\r\n\r\n").ok_or_else(|| format!("GET {url}: no whole answer"))?;
    let head = String::from_utf8_lossy(&response[..at]);
    let mut status_line = head.split_whitespace();
    let (version, status) = (status_line.next().unwrap_or(""), status_line.next().unwrap_or("?"));
    if !version.starts_with("HTTP/") {
        return Err(format!("GET {url}: not an HTTP answer"));
    }
    if status != "200" {
        // Redirects are not followed: name the URL they point to.
        let location =
            head.lines().find_map(|l| l.split_once(':').filter(|(k, _)| k.trim().eq_ignore_ascii_case("location")).map(|(_, v)| v.trim().to_string()));
        return Err(format!("GET {url}: HTTP {status}{}", location.map(|l| format!(" (to {l}; set that URL)")).unwrap_or_default()));
    }
    let body = response[at + 4..].to_vec();
    // A body cut short (a connection lost, a TLS close without close_notify) is not an answer.
    let length = head
        .lines()
        .find_map(|l| l.split_once(':').filter(|(k, _)| k.trim().eq_ignore_ascii_case("content-length")).and_then(|(_, v)| v.trim().parse::<usize>().ok()));
    if length.is_some_and(|n| n != body.len()) {
        return Err(format!("GET {url}: the body is cut short ({} of {} bytes)", body.len(), length.unwrap_or(0)));
    }
    Ok(body)
}

async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, request: &str, max_bytes: u64) -> std::io::Result<Vec<u8>> {
    stream.write_all(request.as_bytes()).await?;
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

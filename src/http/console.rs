//! The browser console (`GET /`) and its files under `/static/`: plain HTML, CSS and JS from the
//! repository's `static/`, and the JS client (`/static/ackgate.js`) from its package in
//! `clients/js/` (one source), with its minified build beside it (`/static/ackgate.min.js` and its
//! source map, made by `node clients/js/build.mjs --served` into `static/`), compiled into the
//! binary so it serves them without any other file and loads nothing from the internet.

use std::io::Write as _;
use std::sync::OnceLock;

use axum::extract::Path;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use super::error::ApiError;

/// `(name, content type, content)` of every file served under `/static/`.
const FILES: [(&str, &str, &str); 6] = [
    ("index.html", "text/html; charset=utf-8", include_str!("../../static/index.html")),
    ("console.js", "text/javascript; charset=utf-8", include_str!("../../static/console.js")),
    ("ackgate.js", "text/javascript; charset=utf-8", include_str!("../../clients/js/ackgate.js")),
    ("ackgate.min.js", "text/javascript; charset=utf-8", include_str!("../../static/ackgate.min.js")),
    ("ackgate.min.js.map", "application/json; charset=utf-8", include_str!("../../static/ackgate.min.js.map")),
    ("console.css", "text/css; charset=utf-8", include_str!("../../static/console.css")),
];

/// The client's files, which pages of other origins import (CORS: `http::exposure`).
pub const CLIENT_FILES: [&str; 3] = ["ackgate.js", "ackgate.min.js", "ackgate.min.js.map"];

/// A file as served: its gzip form and its ETag, made once.
struct Prepared {
    gzipped: Vec<u8>,
    etag: String,
}

fn prepared() -> &'static [Prepared] {
    static PREPARED: OnceLock<Vec<Prepared>> = OnceLock::new();
    PREPARED.get_or_init(|| {
        FILES
            .iter()
            .map(|(_, _, content)| {
                let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
                let gzipped = gzip.write_all(content.as_bytes()).and_then(|()| gzip.finish()).unwrap_or_default();
                // FNV-1a of the content: the same binary always names a file the same.
                let hash = content.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
                Prepared { gzipped, etag: format!("\"{hash:016x}\"") }
            })
            .collect()
    })
}

/// Whether the client takes gzip (`Accept-Encoding`; `q=0` refuses it; an entry naming gzip
/// decides over `*`).
fn accepts_gzip(headers: &HeaderMap) -> bool {
    let weight = |coding: &str| {
        let mut parts = coding.split(';').map(str::trim);
        let name = parts.next().unwrap_or("").to_ascii_lowercase();
        let q = parts.find_map(|p| p.strip_prefix("q=")).map_or(Some(1.0), |q| q.trim().parse::<f32>().ok()).unwrap_or(0.0);
        (name, q)
    };
    let codings: Vec<(String, f32)> =
        headers.get_all(header::ACCEPT_ENCODING).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')).map(weight).collect();
    let named = codings.iter().find(|(name, _)| name == "gzip").or_else(|| codings.iter().find(|(name, _)| name == "*"));
    named.is_some_and(|(_, q)| *q > 0.0)
}

/// The file, gzipped when the client takes it, 304 when its `If-None-Match` names the ETag.
fn serve(name: &str, request: &HeaderMap) -> Response {
    let Some(at) = FILES.iter().position(|(n, _, _)| *n == name) else {
        return ApiError::not_found(format!("no static file {name}")).into_response();
    };
    let (_, content_type, content) = FILES[at];
    let Prepared { gzipped, etag } = &prepared()[at];
    let gzip = accepts_gzip(request) && !gzipped.is_empty();
    // The gzip form is another representation: another tag (a shared cache must not answer a
    // client that takes no gzip with it).
    let etag = if gzip { format!("{}-gz\"", etag.trim_end_matches('"')) } else { etag.clone() };
    let headers = [
        (header::CONTENT_TYPE, content_type),
        // Cached, but asked again each time (the ETag makes that a 304): a new gateway's files are
        // taken at once.
        (header::CACHE_CONTROL, "no-cache"),
        (header::ETAG, etag.as_str()),
        // The client's answer names the requesting origin (CORS): caches must key on it too.
        (header::VARY, if CLIENT_FILES.contains(&name) { "accept-encoding, origin" } else { "accept-encoding" }),
        // Only its own files, never framed by another site (clickjacking the ack and term
        // buttons), and no content sniffing. Connections may go to other instances: the
        // page follows a takeover to wherever /session/recommend names.
        (header::CONTENT_SECURITY_POLICY, "default-src 'self'; img-src 'self' data:; connect-src 'self' http: https: ws: wss:; frame-ancestors 'none'"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    ];
    let matches = request.get_all(header::IF_NONE_MATCH).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')).any(|tag| {
        let tag = tag.trim();
        tag == "*" || tag.trim_start_matches("W/") == etag
    });
    if matches {
        return (StatusCode::NOT_MODIFIED, headers).into_response();
    }
    if gzip {
        return (headers, [(header::CONTENT_ENCODING, "gzip")], gzipped.clone()).into_response();
    }
    (headers, content).into_response()
}

#[utoipa::path(
    get,
    path = "/",
    operation_id = "console",
    tag = "console",
    summary = "The browser console",
    responses(
        (status = 200, description = "HTML page", body = String, content_type = "text/html"),
    )
)]
pub async fn index(headers: HeaderMap) -> Response {
    serve("index.html", &headers)
}

#[utoipa::path(
    get,
    path = "/static/{file}",
    operation_id = "static_file",
    tag = "console",
    summary = "A file of the console: index.html, console.js, console.css, ackgate.js (the JS client, clients/js), or ackgate.min.js and ackgate.min.js.map (its minified build and source map)",
    params(("file" = String, Path, description = "file name", pattern = r"^[A-Za-z0-9._-]+$", min_length = 1, max_length = 64, example = "ackgate.js")),
    responses(
        (status = 200, description = "the file", body = String, content_type = "text/javascript"),
        (status = 404, description = "not_found: no such file", body = crate::http::schemas::ErrorBody),
    )
)]
pub async fn static_file(Path(name): Path<String>, headers: HeaderMap) -> Response {
    serve(&name, &headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        pairs.iter().map(|(k, v)| (axum::http::HeaderName::from_static(k), v.parse().unwrap())).collect()
    }

    #[test]
    fn gzip_is_taken_unless_refused() {
        assert!(accepts_gzip(&headers(&[("accept-encoding", "gzip, deflate, br")])));
        assert!(accepts_gzip(&headers(&[("accept-encoding", "br;q=1.0, gzip;q=0.8")])));
        assert!(accepts_gzip(&headers(&[("accept-encoding", "*")])));
        assert!(!accepts_gzip(&headers(&[("accept-encoding", "gzip;q=0")])));
        assert!(!accepts_gzip(&headers(&[("accept-encoding", "gzip; q=0.000")])));
        assert!(accepts_gzip(&headers(&[("accept-encoding", "gzip;q=0.5")])));
        assert!(!accepts_gzip(&headers(&[("accept-encoding", "identity")])));
        assert!(!accepts_gzip(&headers(&[("accept-encoding", "*, gzip;q=0")])), "gzip named decides over *");
        assert!(!accepts_gzip(&HeaderMap::new()));
    }

    #[test]
    fn the_client_is_served_gzipped_with_an_etag_and_304_when_unchanged() {
        let plain = serve("ackgate.js", &HeaderMap::new());
        assert_eq!(plain.status(), StatusCode::OK);
        assert!(plain.headers().get(header::CONTENT_ENCODING).is_none());
        let etag = plain.headers()[header::ETAG].to_str().unwrap().to_string();
        let gzipped = serve("ackgate.js", &headers(&[("accept-encoding", "gzip")]));
        assert_eq!(gzipped.headers()[header::CONTENT_ENCODING], "gzip");
        let gz_etag = gzipped.headers()[header::ETAG].to_str().unwrap().to_string();
        assert_ne!(gz_etag, etag, "the gzip form is another representation");
        let again = serve("ackgate.js", &headers(&[("if-none-match", &etag)]));
        assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
        let again = serve("ackgate.js", &headers(&[("if-none-match", &gz_etag), ("accept-encoding", "gzip")]));
        assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
        assert_eq!(serve("ackgate.js", &headers(&[("if-none-match", "\"0000000000000000\"")])).status(), StatusCode::OK);
        assert_ne!(prepared()[0].etag, prepared()[2].etag, "files differ, so do their tags");
        let unzipped = {
            use std::io::Read as _;
            let mut text = String::new();
            flate2::read::GzDecoder::new(&prepared()[2].gzipped[..]).read_to_string(&mut text).unwrap();
            text
        };
        assert_eq!(unzipped, FILES[2].2);
    }
}

//! The browser console (`GET /`) and its files under `/static/`: plain HTML, CSS and JS from the
//! repository's `static/`, and the JS client (`/static/ackgate.js`) from its package in
//! `clients/js/` (one source), compiled into the binary so it serves them without any other file
//! and loads nothing from the internet.

use axum::extract::Path;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;

/// `(name, content type, content)` of every file served under `/static/`.
const FILES: [(&str, &str, &str); 4] = [
    ("index.html", "text/html; charset=utf-8", include_str!("../../static/index.html")),
    ("console.js", "text/javascript; charset=utf-8", include_str!("../../static/console.js")),
    ("ackgate.js", "text/javascript; charset=utf-8", include_str!("../../clients/js/ackgate.js")),
    ("console.css", "text/css; charset=utf-8", include_str!("../../static/console.css")),
];

fn serve(name: &str) -> Response {
    match FILES.iter().find(|(n, _, _)| *n == name) {
        Some((_, content_type, content)) => (
            [
                (header::CONTENT_TYPE, *content_type),
                (header::CACHE_CONTROL, "no-cache"),
                // Only its own files, never framed by another site (clickjacking the ack and term
                // buttons), and no content sniffing. Connections may go to other instances: the
                // page follows a takeover to wherever /session/recommend names.
                (header::CONTENT_SECURITY_POLICY, "default-src 'self'; img-src 'self' data:; connect-src 'self' http: https: ws: wss:; frame-ancestors 'none'"),
                (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            ],
            *content,
        )
            .into_response(),
        None => ApiError::not_found(format!("no static file {name}")).into_response(),
    }
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
pub async fn index() -> Response {
    serve("index.html")
}

#[utoipa::path(
    get,
    path = "/static/{file}",
    operation_id = "static_file",
    tag = "console",
    summary = "A file of the console: index.html, console.js, console.css, or ackgate.js (the JS client, clients/js)",
    params(("file" = String, Path, description = "file name", pattern = r"^[A-Za-z0-9._-]+$", min_length = 1, max_length = 64, example = "ackgate.js")),
    responses(
        (status = 200, description = "the file", body = String, content_type = "text/javascript"),
        (status = 404, description = "not_found: no such file", body = crate::http::schemas::ErrorBody),
    )
)]
pub async fn static_file(Path(name): Path<String>) -> Response {
    serve(&name)
}

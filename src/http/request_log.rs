//! Request ids and one log line per HTTP request: at info for an operator's change, at debug for
//! any other success, and for a refused or failed one at most one line a second per status and
//! route, with how many were left out.
//!
//! Every request runs inside a `http` span carrying its `request_id` (the caller's
//! `x-request-id` when it sends a sane one, else a new one), so any log line a handler writes can
//! be matched to the request; the id is echoed in the `x-request-id` response header.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

use crate::core::log_throttle::ThrottledByKind;

const REQUEST_ID: &str = "x-request-id";

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Whether a request that succeeded is worth a line at info: an operator's change (a reset, a
/// removal, a redrive, a drain, a topic created or deleted) is the audit trail of what was done
/// to the data. Everything else that succeeded (reads, probes, scrapes, publishes, sessions
/// opening, an SSE session's frames) is logged at debug: anyone can make those at any rate, and
/// one line each would drown the lines that matter (a WebSocket's frames are not logged either).
fn is_operator_change(method: &axum::http::Method, route: Option<&str>) -> bool {
    let Some(route) = route else { return false };
    let changes = !matches!(*method, axum::http::Method::GET | axum::http::Method::HEAD | axum::http::Method::OPTIONS);
    changes && (route.starts_with("/admin/") || route == "/topics" || route == "/topics/{topic}")
}

/// The lines of refused and failed requests, per status and route (`None`: no route matched).
fn refused_lines() -> &'static ThrottledByKind<(u16, Option<String>)> {
    static LINES: OnceLock<ThrottledByKind<(u16, Option<String>)>> = OnceLock::new();
    LINES.get_or_init(ThrottledByKind::default)
}

fn request_id(request: &Request) -> String {
    let given = request.headers().get(REQUEST_ID).and_then(|v| v.to_str().ok());
    match given {
        Some(id) if !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_graphic()) => id.to_string(),
        // Process id plus a counter: unique per instance, cheap, and sortable in a log.
        _ => format!("{:x}-{:x}", std::process::id(), NEXT_ID.fetch_add(1, Ordering::Relaxed)),
    }
}

pub async fn log_request(request: Request, next: Next) -> Response {
    let id = request_id(&request);
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let route = request.extensions().get::<MatchedPath>().map(|p| p.as_str().to_string());
    // `trace_id` is recorded by a handler that traces the request (a publish).
    let span = tracing::info_span!("http", request_id = %id, trace_id = tracing::field::Empty);
    let started = Instant::now();
    let mut response = next.run(request).instrument(span.clone()).await;
    let status = response.status().as_u16();
    let elapsed_us = started.elapsed().as_micros() as u64;
    let _entered = span.enter();
    if status < 400 && is_operator_change(&method, route.as_deref()) {
        tracing::info!(%method, path, status, elapsed_us, "http request");
    } else if status < 400 {
        tracing::debug!(%method, path, status, elapsed_us, "http request");
    } else if let Some(suppressed) = refused_lines().allow((status, route)) {
        // Anyone can make these: once a second per status and route, with the count left out.
        if status >= 500 {
            tracing::warn!(%method, path, status, elapsed_us, suppressed, "http request");
        } else {
            tracing::info!(%method, path, status, elapsed_us, suppressed, "http request");
        }
    }
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(REQUEST_ID, value);
    }
    response
}

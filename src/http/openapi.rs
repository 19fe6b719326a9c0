//! The OpenAPI 3 document: every route (`#[utoipa::path]` on its handler), every body and error
//! (`schemas`), and the WebSocket frames as `ClientFrame` / `ServerFrame` components referenced
//! by the `/ws` route. Printed by `ackgate openapi` and kept in the repository as
//! `openapi/openapi.json` (a test fails when they differ); `GET /openapi.json` serves it for the
//! running configuration (without security requirements when `auth.admin_token` is empty).

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::schemas::*;
use super::AppState;
use super::{console, dead_letters, drain, gaps, groups, health, metrics, offsets, recommend, reload, sessions, sse, topics, ws};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "ackgate",
        description = "HTTP/WebSocket gateway: reliable, acknowledged push delivery from a durable log. \
            The WebSocket protocol is described by the ClientFrame and ServerFrame schemas.",
        license(name = "Apache-2.0")
    ),
    paths(
        topics::publish, topics::list, topics::create, topics::delete,
        offsets::list, offsets::client_view, offsets::reset, offsets::delete,
        sessions::list, sessions::detail, sessions::disconnect,
        dead_letters::list, dead_letters::redrive, dead_letters::delete, gaps::list, groups::list, groups::view, groups::reset, groups::delete, drain::drain, reload::reload, recommend::recommend,
        health::healthz, health::readyz, metrics::scrape, console::index, console::static_file, ws::upgrade, sse::open, sse::frames, document_route,
    ),
    components(schemas(ClientFrame, ServerFrame, SubscribedPartition, GapRange, StartFromSchema, ResumeSchema, ShareOrderSchema, Req)),
    modifiers(&AdminToken)
)]
struct ApiDoc;

struct AdminToken;

impl Modify for AdminToken {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        let bearer = HttpBuilder::new().scheme(HttpAuthScheme::Bearer).description(Some("auth.admin_token, when set")).build();
        components.add_security_scheme("admin_token", SecurityScheme::Http(bearer));
    }
}

/// The document as pretty JSON with a trailing newline (the form kept in the repository).
pub fn document() -> String {
    let text = ApiDoc::openapi().to_pretty_json().expect("the OpenAPI document serializes");
    // utoipa 5.5 writes the Link object's `operationId` in snake case, which no tool reads. A
    // quote-colon pair cannot occur inside a JSON string (its quotes are escaped), so this
    // replaces keys only.
    let mut text = text.replace("\"operation_id\": ", "\"operationId\": ");
    text.push('\n');
    text
}

/// The document for a gateway running without `auth.admin_token`: no route needs a credential,
/// so none names a security requirement (a client generated from it, or a fuzzer, would
/// otherwise send a token nobody asked for, or expect 401s that never come).
fn document_without_auth() -> String {
    let mut doc: serde_json::Value = serde_json::from_str(&document()).expect("the document is JSON");
    if let Some(paths) = doc["paths"].as_object_mut() {
        for operation in paths.values_mut().filter_map(|item| item.as_object_mut()).flat_map(|item| item.values_mut()) {
            if let Some(operation) = operation.as_object_mut() {
                operation.remove("security");
            }
        }
    }
    if let Some(components) = doc["components"].as_object_mut() {
        components.remove("securitySchemes");
    }
    let mut text = serde_json::to_string_pretty(&doc).expect("the document serializes");
    text.push('\n');
    text
}

#[utoipa::path(get, path = "/openapi.json", operation_id = "openapi_document", tag = "health", summary = "This OpenAPI document, for the running configuration (no security requirements when auth.admin_token is empty)", responses((status = 200, description = "OpenAPI 3 JSON")))]
pub async fn document_route(State(app): State<AppState>) -> Response {
    let document = if app.config.auth.admin_token.is_empty() { document_without_auth() } else { document() };
    ([(header::CONTENT_TYPE, "application/json")], document).into_response()
}

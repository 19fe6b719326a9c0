//! `?scope=cluster` on the admin list routes (`/admin/offsets`, `/admin/sessions`,
//! `/admin/dead-letters`, `/admin/gaps`, `/admin/groups`): offsets, sessions, dead letters and
//! gaps live on each instance, so an operator of three instances would otherwise ask each. This
//! instance answers as it would alone, asks every `cluster.peers` instance the same question
//! (with the admin token, in parallel, at most `PEER_TIMEOUT` each) and merges the rows, each
//! with its `instance`, plus `unreachable`: the peers that did not answer, with why.
//!
//! A page (`limit`, `after`) is a page of each instance: the merged answer has no `next` but
//! `next_by_instance`, each instance's `after` for its next page (ask that instance with
//! `scope=local` and that `after`: sent with `scope=cluster` it would apply to every instance).
//! `scope=local` answers for this
//! instance only, its rows named, and is what a peer is asked, so a question never goes round;
//! without `scope` the answer is as it always was.

use std::time::Duration;

use axum::body::{to_bytes, Body};
use axum::extract::{Request, State};
use axum::http::{header, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value};

use super::error::ApiError;
use super::AppState;
use crate::core::protocol::ErrorCode;

/// How long a peer may take to answer; a slower one is named in `unreachable`.
const PEER_TIMEOUT: Duration = Duration::from_secs(3);

/// The most of this instance's own answer read back to merge (a page of offsets is at most
/// 10,000 rows; the session list is not paged: 100,000 sessions are ~35 MB).
const MAX_LOCAL_BYTES: usize = 128 * 1024 * 1024;

/// What `scope` asks of a request: for `cluster` the peers too. `path_and_query` is the request
/// without `scope`, answered here; `asked_as` the same with `scope=local`, what a peer is asked.
struct Scoped {
    cluster: bool,
    path_and_query: String,
    asked_as: String,
}

/// `None` without `scope` (the request goes on as it is); `Err` is the answer to a bad one.
#[allow(clippy::result_large_err)]
fn scoped(uri: &Uri) -> Result<Option<Scoped>, Response> {
    let Ok((scope, rest)) = split_scope(uri) else {
        return Err(ApiError::bad_request("scope given more than once").into_response());
    };
    let cluster = match scope.as_deref() {
        None => return Ok(None),
        Some("local") => false,
        Some("cluster") => true,
        Some(other) => return Err(ApiError::bad_request(format!("scope must be local or cluster, got {other:?}")).into_response()),
    };
    let path_and_query = match &rest {
        Some(query) => format!("{}?{query}", uri.path()),
        None => uri.path().to_string(),
    };
    let asked_as = format!("{path_and_query}{}scope=local", if rest.is_some() { "&" } else { "?" });
    Ok(Some(Scoped { cluster, path_and_query, asked_as }))
}

/// This instance's answer, read back as a JSON object to add the peers' to.
#[allow(clippy::result_large_err)]
async fn local_object(local: Response) -> Result<Map<String, Value>, Response> {
    let Ok(body) = to_bytes(local.into_body(), MAX_LOCAL_BYTES).await else {
        let message = format!("this instance's answer is over {MAX_LOCAL_BYTES} bytes, too large to merge: ask with filters, or each instance alone");
        return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, ErrorCode::Unavailable, message).into_response());
    };
    match serde_json::from_slice::<Value>(&body) {
        Ok(Value::Object(answer)) => Ok(answer),
        _ => Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, ErrorCode::Unavailable, "this instance's answer is not a JSON object").into_response()),
    }
}

/// Middleware of the admin list routes: takes `scope` out of the query and, for `cluster`, merges
/// the peers' answers into this instance's.
pub async fn scope(State(app): State<AppState>, mut request: Request, next: Next) -> Response {
    let Scoped { cluster, path_and_query, asked_as } = match scoped(request.uri()) {
        Ok(Some(scoped)) => scoped,
        Ok(None) => return next.run(request).await,
        Err(refused) => return refused,
    };
    match path_and_query.parse::<Uri>() {
        Ok(uri) => *request.uri_mut() = uri,
        Err(e) => return ApiError::bad_request(format!("bad query: {e}")).into_response(),
    }
    let local = next.run(request).await;
    if local.status() != StatusCode::OK {
        return local;
    }
    let local = match local_object(local).await {
        Ok(local) => local,
        Err(refused) => return refused,
    };
    let mut merged = Merged::new(local, &app.dispatcher.instance);
    if !cluster {
        // `scope=local`, as a peer is asked: this instance's rows, named.
        return json_response(merged.finish_local());
    }
    // Each peer answers for itself, its rows named by its own instance id.
    let peers = app.cluster.peers();
    let asked = peers.iter().map(|(url, _)| {
        let url = format!("{url}{asked_as}");
        let (ca_file, token) = (app.cluster.ca_file(), app.config.auth.admin_token.as_str());
        async move {
            let body = super::fetch::get_admin(&url, ca_file, PEER_TIMEOUT, token).await?;
            match serde_json::from_slice::<Value>(&body) {
                Ok(Value::Object(answer)) => Ok(answer),
                _ => Err(format!("GET {url}: not a JSON object")),
            }
        }
    });
    let answers = futures_util::future::join_all(asked).await;
    for ((url, instance), answer) in peers.iter().zip(answers) {
        match answer {
            // A row of an older peer without `instance` is named by the id its probe read, or
            // its URL.
            Ok(answer) => merged.add(answer, instance.as_deref().unwrap_or(url)),
            Err(why) => {
                tracing::warn!(peer = %url, error = %why, "a peer did not answer a cluster-scoped admin list");
                merged.unreachable.push(Value::String(url.clone()));
            }
        }
    }
    json_response(merged.finish())
}

fn json_response(body: Value) -> Response {
    let mut response = Response::new(Body::from(body.to_string()));
    response.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/json"));
    response
}

/// The most of a change's body forwarded to the peers (a reset body is a few bytes).
const MAX_CHANGE_BODY: usize = 64 * 1024;

/// Middleware of an admin change of a client's records (`PUT /admin/offsets/{topic}/{client_id}/
/// {partition}`, `DELETE /admin/offsets/{topic}/{client_id}`, `POST /admin/dead-letters/redrive`):
/// with `?scope=cluster` it is made here and then at every peer (with `scope=local` and the admin
/// token), so the records every instance holds agree, and a client that lands anywhere (with or
/// without its token: a reset steps the record's epoch and fences tokens made before) starts
/// where the operator set it. A redrive reaches the dead letters each instance recorded.
/// The answer is this instance's, plus `peers`: each peer's URL, status and answer, and
/// `unreachable`. A peer that answers 409 (the client is live there) is named with it; the change
/// is not undone here.
pub async fn scope_change(State(app): State<AppState>, request: Request, next: Next) -> Response {
    let Scoped { cluster, path_and_query, asked_as } = match scoped(request.uri()) {
        Ok(Some(scoped)) => scoped,
        Ok(None) => return next.run(request).await,
        Err(refused) => return refused,
    };
    let (mut parts, body) = request.into_parts();
    let Ok(body) = to_bytes(body, MAX_CHANGE_BODY).await else {
        return ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, ErrorCode::LimitExceeded, format!("a change's body is at most {MAX_CHANGE_BODY} bytes"))
            .into_response();
    };
    match path_and_query.parse::<Uri>() {
        Ok(uri) => parts.uri = uri,
        Err(e) => return ApiError::bad_request(format!("bad query: {e}")).into_response(),
    }
    let method: &'static str = match parts.method {
        axum::http::Method::DELETE => "DELETE",
        axum::http::Method::POST => "POST",
        _ => "PUT",
    };
    let local = next.run(Request::from_parts(parts, Body::from(body.clone()))).await;
    if !cluster || local.status() != StatusCode::OK {
        return local;
    }
    let mut answer = match local_object(local).await {
        Ok(answer) => answer,
        Err(refused) => return refused,
    };
    let peers = app.cluster.peers();
    let sent = peers.iter().map(|(url, _)| {
        let url = format!("{url}{asked_as}");
        let (ca_file, token, body) = (app.cluster.ca_file(), app.config.auth.admin_token.as_str(), &body);
        async move { super::fetch::send_admin(method, &url, ca_file, PEER_TIMEOUT, token, body).await }
    });
    let outcomes = futures_util::future::join_all(sent).await;
    let mut answered = Vec::new();
    let mut unreachable = Vec::new();
    for ((url, _), outcome) in peers.iter().zip(outcomes) {
        match outcome {
            Ok((status, body)) => {
                let peer_answer = serde_json::from_slice::<Value>(&body).unwrap_or(Value::Null);
                if status != 200 {
                    tracing::warn!(peer = %url, status, answer = %peer_answer, "a peer refused a cluster-scoped change of a client's records");
                }
                answered.push(serde_json::json!({"url": url, "status": status, "answer": peer_answer}));
            }
            Err(why) => {
                tracing::warn!(peer = %url, error = %why, "a peer did not answer a cluster-scoped change of a client's records");
                unreachable.push(Value::String(url.clone()));
            }
        }
    }
    answer.insert("peers".into(), Value::Array(answered));
    answer.insert("unreachable".into(), Value::Array(unreachable));
    json_response(Value::Object(answer))
}

/// `scope`'s value, and the query without it; `Err` when `scope` is given twice.
#[allow(clippy::type_complexity)]
fn split_scope(uri: &Uri) -> Result<(Option<String>, Option<String>), ()> {
    let Some(query) = uri.query() else { return Ok((None, None)) };
    let mut scope = None;
    let mut twice = false;
    let rest: Vec<&str> = query
        .split('&')
        .filter(|pair| match pair.split_once('=').map_or((*pair, ""), |(k, v)| (k, v)) {
            ("scope", value) => {
                twice |= scope.replace(value.to_string()).is_some();
                false
            }
            _ => !pair.is_empty(),
        })
        .collect();
    if twice {
        return Err(());
    }
    Ok((scope, (!rest.is_empty()).then(|| rest.join("&"))))
}

/// Rows of several instances' answers of one list route.
struct Merged {
    /// The list's field (`sessions`, `offsets`, ...): the one array of this instance's answer.
    field: Option<String>,
    rows: Vec<Value>,
    next_by_instance: Map<String, Value>,
    unreachable: Vec<Value>,
}

impl Merged {
    fn new(local: Map<String, Value>, instance: &str) -> Self {
        let field = local.iter().find(|(_, v)| v.is_array()).map(|(k, _)| k.clone());
        let mut merged = Self { field, rows: Vec::new(), next_by_instance: Map::new(), unreachable: Vec::new() };
        merged.add(local, instance);
        merged
    }

    fn add(&mut self, mut answer: Map<String, Value>, instance: &str) {
        let Some(field) = &self.field else { return };
        let rows = match answer.remove(field) {
            Some(Value::Array(rows)) => rows,
            _ => Vec::new(),
        };
        if let Some(next) = answer.remove("next") {
            // Named as the instance names its own rows (a peer asked with scope=local does).
            let named = rows.first().and_then(|r| r["instance"].as_str()).unwrap_or(instance);
            self.next_by_instance.insert(named.to_string(), next);
        }
        for mut row in rows {
            if let Value::Object(fields) = &mut row {
                // A row that names its instance already (a group's hub) keeps it.
                fields.entry("instance").or_insert_with(|| Value::String(instance.to_string()));
            }
            self.rows.push(row);
        }
    }

    /// One instance's answer with its rows named and its `next` as it was.
    fn finish_local(self) -> Value {
        let next = self.next_by_instance.values().next().cloned();
        let mut out = Map::new();
        if let Some(field) = self.field {
            out.insert(field, Value::Array(self.rows));
        }
        if let Some(next) = next {
            out.insert("next".into(), next);
        }
        Value::Object(out)
    }

    fn finish(self) -> Value {
        let mut out = Map::new();
        if let Some(field) = self.field {
            out.insert(field, Value::Array(self.rows));
        }
        if !self.next_by_instance.is_empty() {
            out.insert("next_by_instance".into(), Value::Object(self.next_by_instance));
        }
        out.insert("unreachable".into(), Value::Array(self.unreachable));
        Value::Object(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn scope_is_taken_out_of_the_query_and_the_rest_kept() {
        let uri: Uri = "/admin/offsets?topic=t&scope=cluster&limit=5".parse().unwrap();
        assert_eq!(split_scope(&uri), Ok((Some("cluster".into()), Some("topic=t&limit=5".into()))));
        let uri: Uri = "/admin/sessions?scope=local".parse().unwrap();
        assert_eq!(split_scope(&uri), Ok((Some("local".into()), None)));
        assert_eq!(split_scope(&"/admin/sessions".parse().unwrap()), Ok((None, None)));
        assert_eq!(split_scope(&"/admin/sessions?scope=local&scope=cluster".parse().unwrap()), Err(()));
    }

    #[test]
    fn rows_are_merged_with_their_instance_and_pages_named_per_instance() {
        let local = json!({"dead_letters": [{"offset": 1}], "next": "a"});
        let mut merged = Merged::new(local.as_object().unwrap().clone(), "gw-a");
        merged.add(json!({"dead_letters": [{"offset": 2}, {"offset": 3, "instance": "hub"}]}).as_object().unwrap().clone(), "gw-b");
        merged.unreachable.push(json!("http://gw-c"));
        assert_eq!(
            merged.finish(),
            json!({
                "dead_letters": [{"offset": 1, "instance": "gw-a"}, {"offset": 2, "instance": "gw-b"}, {"offset": 3, "instance": "hub"}],
                "next_by_instance": {"gw-a": "a"},
                "unreachable": ["http://gw-c"],
            })
        );
    }
}

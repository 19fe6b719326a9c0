//! `?scope=cluster` on the admin list routes (`/admin/offsets`, `/admin/sessions`,
//! `/admin/dead-letters`, `/admin/gaps`, `/admin/groups`): offsets, sessions, dead letters and
//! gaps live on each instance, so an operator of three instances would otherwise ask each. This
//! instance answers as it would alone, asks every `cluster.peers` instance the same question
//! (with the admin token, in parallel, at most `PEER_TIMEOUT` each) and merges the rows, each
//! with its `instance`, plus `unreachable`: the peers that did not answer, with why.
//!
//! A page (`limit`, `after`) is a page of each instance: the merged answer has no `next` but
//! `next_by_instance`, each instance's `after` for its next page. `scope=local` answers for this
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

/// How long a peer may take to answer; a slower one is named in `unreachable`.
const PEER_TIMEOUT: Duration = Duration::from_secs(3);

/// The most of this instance's own answer read back to merge (a page is at most 1,000 rows).
const MAX_LOCAL_BYTES: usize = 32 * 1024 * 1024;

/// Middleware of the admin list routes: takes `scope` out of the query and, for `cluster`, merges
/// the peers' answers into this instance's.
pub async fn scope(State(app): State<AppState>, mut request: Request, next: Next) -> Response {
    let (scope, rest) = split_scope(request.uri());
    let cluster = match scope.as_deref() {
        None => return next.run(request).await,
        Some("local") => false,
        Some("cluster") => true,
        Some(other) => return ApiError::bad_request(format!("scope must be local or cluster, got {other:?}")).into_response(),
    };
    let path_and_query = match &rest {
        Some(query) => format!("{}?{query}", request.uri().path()),
        None => request.uri().path().to_string(),
    };
    match path_and_query.parse::<Uri>() {
        Ok(uri) => *request.uri_mut() = uri,
        Err(e) => return ApiError::bad_request(format!("bad query: {e}")).into_response(),
    }
    let local = next.run(request).await;
    if local.status() != StatusCode::OK {
        return local;
    }
    let Ok(body) = to_bytes(local.into_body(), MAX_LOCAL_BYTES).await else {
        return ApiError::bad_request("this instance's answer could not be read back to merge").into_response();
    };
    let Ok(Value::Object(local)) = serde_json::from_slice::<Value>(&body) else {
        return ApiError::bad_request("this instance's answer is not a JSON object").into_response();
    };
    let mut merged = Merged::new(local, &app.dispatcher.instance);
    if !cluster {
        // `scope=local`, as a peer is asked: this instance's rows, named.
        return json_response(merged.finish_local());
    }
    // Each peer answers for itself, its rows named by its own instance id.
    let asked_as = format!("{path_and_query}{}scope=local", if rest.is_some() { "&" } else { "?" });
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

/// `scope`'s value, and the query without it.
fn split_scope(uri: &Uri) -> (Option<String>, Option<String>) {
    let Some(query) = uri.query() else { return (None, None) };
    let mut scope = None;
    let rest: Vec<&str> = query
        .split('&')
        .filter(|pair| match pair.split_once('=').map_or((*pair, ""), |(k, v)| (k, v)) {
            ("scope", value) => {
                scope = Some(value.to_string());
                false
            }
            _ => !pair.is_empty(),
        })
        .collect();
    (scope, (!rest.is_empty()).then(|| rest.join("&")))
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
        if let Some(next) = answer.remove("next") {
            self.next_by_instance.insert(instance.to_string(), next);
        }
        let Some(Value::Array(rows)) = answer.remove(field) else { return };
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
        assert_eq!(split_scope(&uri), (Some("cluster".into()), Some("topic=t&limit=5".into())));
        let uri: Uri = "/admin/sessions?scope=local".parse().unwrap();
        assert_eq!(split_scope(&uri), (Some("local".into()), None));
        assert_eq!(split_scope(&"/admin/sessions".parse().unwrap()), (None, None));
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

//! `POST /admin/reload`: read the config file again, as SIGHUP does, and apply what may change
//! while the gateway runs (see the reload module at the crate root); a change of anything else is refused with 400,
//! naming the keys, and the settings in force stay.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value};

use super::error::ApiError;
use super::AppState;
use crate::core::protocol::ErrorCode;

/// Why a reload changed nothing.
#[derive(Debug)]
pub enum ReloadRefused {
    /// The file could not be read, parsed or validated (or a value could not be applied).
    Unreadable(String),
    /// These keys changed, and only a restart applies them.
    NotLive(Vec<String>),
    /// The gateway cannot reload now (it is shutting down).
    Unavailable(String),
}

impl std::fmt::Display for ReloadRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unreadable(why) | Self::Unavailable(why) => write!(f, "{why}"),
            Self::NotLive(keys) => write!(f, "these keys change only with a restart: {}; nothing was applied", keys.join(", ")),
        }
    }
}

/// Reads the configuration again and applies it: the keys that changed, or why nothing did.
pub trait ConfigReload: Send + Sync {
    fn reload(&self) -> Result<Vec<String>, ReloadRefused>;
}

/// Runs a reload and logs its outcome (the signal handler and the route share it).
pub fn reload_and_log(reload: &dyn ConfigReload, by: &'static str) -> Result<Vec<String>, ReloadRefused> {
    let outcome = reload.reload();
    crate::core::metrics::config_reloads(outcome.is_ok()).increment(1);
    match &outcome {
        Ok(changed) if changed.is_empty() => tracing::info!(by, "config reloaded: nothing changed"),
        Ok(changed) => tracing::info!(by, changed = changed.join(", "), "config reloaded"),
        Err(e) => tracing::error!(by, error = %e, "config reload refused; the settings in force stay"),
    }
    outcome
}

#[utoipa::path(
    post,
    path = "/admin/reload",
    operation_id = "reload_config",
    tag = "sessions",
    summary = "Read the config file again (as SIGHUP): apply what can change live, refuse the rest naming the keys",
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "applied: the keys that changed (empty when none did)", body = crate::http::schemas::Reloaded),
        (status = 400, description = "bad_request: the file is unreadable or invalid, or names keys that change only with a restart; nothing was applied", body = crate::http::schemas::ErrorBody),
        (status = 401, description = "no admin token (when auth.admin_token is set)", body = crate::http::schemas::ErrorBody),
        (status = 403, description = "wrong admin token", body = crate::http::schemas::ErrorBody),
        (status = 503, description = "unavailable: the gateway is shutting down", body = crate::http::schemas::ErrorBody),
    )
)]
pub async fn reload(State(app): State<AppState>) -> Result<Json<Value>, ApiError> {
    let reloader = app.reload.clone();
    // Reading and parsing a file: off the async workers.
    let unavailable = |why: String| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, ErrorCode::Unavailable, why);
    let outcome = tokio::task::spawn_blocking(move || reload_and_log(reloader.as_ref(), "POST /admin/reload"))
        .await
        .map_err(|e| unavailable(format!("the reload stopped: {e}")))?;
    match outcome {
        Ok(changed) => Ok(Json(json!({"changed": changed}))),
        Err(ReloadRefused::Unavailable(why)) => Err(unavailable(why)),
        Err(e) => Err(ApiError::bad_request(e.to_string())),
    }
}

//! `/api/v1/subscriptions`: the subscriptions' list and pages as JSON, and
//! their changes as POSTs with JSON bodies. A signing secret is in the
//! answer of the POST that made it (create, rotate), and in no other.
//! A refused field answers 400 `{"error": "url: ...", "field": "url"}`.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{json, Value};

use super::super::subscriptions::replay::{apply, fingerprint, instant, plan, window};
use super::super::subscriptions::{
    create as make, field_of, find, rotate as renew, set_disabled, state, TenantParam, RECENT,
};
use super::super::{check_post, operator, App, Caller, Refusal};
use super::{body, reader, to_json};
use crate::services::subscriptions::replay::Plan;
use crate::services::subscriptions::Request;
use crate::store::subscriptions::Subscription;
use crate::store::StoreError;

/// The answer: `value` with `status`, or the refusal, its field named.
fn answer(result: Result<(StatusCode, Value), Refusal>) -> Response {
    match result {
        Ok((status, v)) => (status, Json(v)).into_response(),
        Err(r) => {
            let mut v = json!({"error": r.message});
            if let Some(field) = field_of(&r.message) {
                v["field"] = Value::String(field.into());
            }
            (r.status, Json(v)).into_response()
        }
    }
}

/// A subscription (shown) with its `state`.
fn described(s: &Subscription) -> Result<Value, Refusal> {
    let mut v = to_json(s)?;
    v["state"] = Value::String(state(s));
    Ok(v)
}

/// A body that may be empty (`{}` then).
fn optional_body<T: serde::de::DeserializeOwned + Default>(bytes: &Bytes) -> Result<T, Refusal> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        Ok(T::default())
    } else {
        body(bytes)
    }
}

/// `GET /api/v1/subscriptions?tenant=`.
pub async fn list(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<TenantParam>,
) -> Response {
    answer(
        async {
            reader(&caller)?;
            let all = app
                .store
                .subscriptions(q.tenant())
                .await
                .map_err(StoreError::from)?;
            let shown: Result<Vec<Value>, Refusal> = all
                .into_iter()
                .map(super::super::subscriptions::shown)
                .map(|s| described(&s))
                .collect();
            Ok((StatusCode::OK, Value::Array(shown?)))
        }
        .await,
    )
}

/// `GET /api/v1/subscriptions/{id}`.
pub async fn detail(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Response {
    answer(
        async {
            reader(&caller)?;
            let s = find(&app, &id).await?;
            let deliveries = app.store.subscription_deliveries(&id, RECENT).await?;
            Ok((
                StatusCode::OK,
                json!({"subscription": described(&s)?, "deliveries": deliveries}),
            ))
        }
        .await,
    )
}

/// `POST /api/v1/subscriptions` (no `Debug`: its headers may hold a
/// credential).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    url: String,
    tenant: Option<String>,
    #[serde(default)]
    event_types: Vec<String>,
    /// Name → value.
    #[serde(default)]
    headers: BTreeMap<String, String>,
    /// `50/s`, `600/min`, ...
    rate: Option<String>,
    description: Option<String>,
}

impl CreateBody {
    fn request(self) -> Result<Request, Refusal> {
        let mut headers = Vec::with_capacity(self.headers.len());
        for (name, value) in self.headers {
            if name.contains(':') {
                return Err(Refusal::bad(format!(
                    "headers: {name:?} is not a header name"
                )));
            }
            headers.push(format!("{name}: {value}"));
        }
        Ok(Request {
            url: self.url,
            tenant: self.tenant,
            event_types: self.event_types,
            headers,
            rate: self.rate,
            description: self.description,
        })
    }
}

pub async fn create(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Response {
    answer(
        async {
            check_post(&caller, &headers, None)?;
            let user = operator(&caller)?;
            let req = body::<CreateBody>(&bytes)?.request()?;
            let (id, secret) = make(&app, &user, &req).await?;
            let s = find(&app, &id).await?;
            Ok((
                StatusCode::CREATED,
                json!({"id": id, "secret": secret.expose(), "subscription": described(&s)?}),
            ))
        }
        .await,
    )
}

/// `POST /api/v1/subscriptions/{id}/disable` (and `enable`, which takes no
/// field).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct DisableBody {
    reason: String,
}

async fn disable_or_enable(
    app: Arc<App>,
    caller: Caller,
    headers: HeaderMap,
    id: String,
    bytes: Bytes,
    disable: bool,
) -> Response {
    answer(
        async {
            check_post(&caller, &headers, None)?;
            let user = operator(&caller)?;
            let b: DisableBody = optional_body(&bytes)?;
            set_disabled(&app, &user, &id, disable, &b.reason).await?;
            let s = find(&app, &id).await?;
            Ok((StatusCode::OK, described(&s)?))
        }
        .await,
    )
}

pub async fn disable(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Path(id): Path<String>,
    bytes: Bytes,
) -> Response {
    disable_or_enable(app, caller, headers, id, bytes, true).await
}

pub async fn enable(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Path(id): Path<String>,
    bytes: Bytes,
) -> Response {
    disable_or_enable(app, caller, headers, id, bytes, false).await
}

/// `POST /api/v1/subscriptions/{id}/rotate`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RotateBody {
    /// How long the replaced secret signs as well; default 24h.
    grace: Option<String>,
}

pub async fn rotate(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Path(id): Path<String>,
    bytes: Bytes,
) -> Response {
    answer(
        async {
            check_post(&caller, &headers, None)?;
            let user = operator(&caller)?;
            let b: RotateBody = optional_body(&bytes)?;
            let grace = b.grace.as_deref().unwrap_or("24h");
            let (secret, grace) = renew(&app, &user, &id, grace).await?;
            let s = find(&app, &id).await?;
            Ok((
                StatusCode::OK,
                json!({
                    "id": id, "secret": secret.expose(),
                    "grace": humantime::format_duration(grace).to_string(),
                    "previous_secret_until": s.previous_secret_until,
                }),
            ))
        }
        .await,
    )
}

/// `POST /api/v1/subscriptions/{id}/replay`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct ReplayBody {
    since: String,
    until: Option<String>,
    event_type: Option<String>,
    /// Count only (the first step): answers the plan, its `until` and its
    /// `fingerprint`.
    dry_run: bool,
    /// From the dry run: what it counted.
    fingerprint: Option<String>,
}

fn counted(plan: &Plan) -> Value {
    json!({
        "dry_run": true, "plan": plan, "since": instant(plan.since),
        "until": instant(plan.until), "fingerprint": fingerprint(plan),
    })
}

pub async fn replay(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Path(id): Path<String>,
    bytes: Bytes,
) -> Response {
    answer(
        async {
            check_post(&caller, &headers, None)?;
            let user = operator(&caller)?;
            let b: ReplayBody = body(&bytes)?;
            if !b.dry_run && (b.until.is_none() || b.fingerprint.is_none()) {
                return Err(Refusal::bad(
                    "until and fingerprint come from the dry run: send {\"dry_run\": true, ...} first",
                ));
            }
            let until = b.until.as_deref().unwrap_or("");
            let w = window(&id, &b.since, until, b.event_type.as_deref())?;
            let plan = plan(&app, w).await?;
            if b.dry_run {
                return Ok((StatusCode::OK, counted(&plan)));
            }
            if b.fingerprint.as_deref() != Some(fingerprint(&plan).as_str()) {
                let mut again = counted(&plan);
                again["error"] = Value::String(
                    "what the window holds changed since the dry run: this is a new count, \
                     and nothing was replayed"
                        .into(),
                );
                return Ok((StatusCode::CONFLICT, again));
            }
            let (made, again) = apply(&app, &user, &plan).await?;
            Ok((
                StatusCode::OK,
                json!({"plan": plan, "first_deliveries": made, "sent_again": again}),
            ))
        }
        .await,
    )
}

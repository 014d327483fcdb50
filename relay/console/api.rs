//! The JSON API under `/api/v1/`: the pages' data and actions, for
//! automation. Authenticated by the session cookie (then POSTs need the
//! `x-csrf-token` header) or HTTP Basic with a console user's password;
//! open without either only where the console is (loopback, no users).
//! Errors are `{"error": "..."}` with the HTTP status.
//!
//! - [`subscriptions`]: the subscriptions, their pages and their changes.

mod subscriptions;

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use super::actions::{
    confirmed, dry_run_of, keep, label, set_paused, start, ActionParams, Confirmed, DryRun,
};
use super::auth::User;
use super::pages::{answer, detail, provider_key, schedule_rows, Cursor, GroupRow, KeyParam};
use super::params::FilterParams;
use super::{check_post, operator, refusal, App, Caller, Refusal};
use crate::store::operator::Known;

pub fn router() -> Router<Arc<App>> {
    Router::new()
        .route("/overview", get(overview))
        .route("/intents", get(intents))
        .route("/intents/{id}", get(intent))
        .route("/failures", get(failures))
        .route("/schedules", get(schedules))
        .route("/lookup", get(lookup))
        .route("/destinations", get(destinations))
        .route("/destinations/pause", post(pause))
        .route("/destinations/resume", post(resume))
        .route("/actions", post(act))
        .route("/actions/{job}", get(job))
        .route(
            "/subscriptions",
            get(subscriptions::list).post(subscriptions::create),
        )
        .route("/subscriptions/{id}", get(subscriptions::detail))
        .route("/subscriptions/{id}/disable", post(subscriptions::disable))
        .route("/subscriptions/{id}/enable", post(subscriptions::enable))
        .route("/subscriptions/{id}/rotate", post(subscriptions::rotate))
        .route("/subscriptions/{id}/replay", post(subscriptions::replay))
}

fn reply(result: Result<Value, Refusal>) -> Response {
    match result {
        Ok(v) => Json(v).into_response(),
        Err(r) => refusal(r),
    }
}

fn reader(caller: &Caller) -> Result<User, Refusal> {
    caller.user.clone().ok_or_else(|| {
        Refusal::new(
            StatusCode::UNAUTHORIZED,
            "log in, or send HTTP Basic credentials of a console user",
        )
    })
}

fn to_json(v: impl serde::Serialize) -> Result<Value, Refusal> {
    serde_json::to_value(v)
        .map_err(|e| Refusal::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
}

async fn overview(State(app): State<Arc<App>>, Extension(caller): Extension<Caller>) -> Response {
    reply(
        async {
            reader(&caller)?;
            let stats = app.store.stats().await?;
            let (hour, day) = app.attempt_charts().await?;
            Ok(json!({"stats": stats, "attempts_last_hour": hour, "attempts_last_day": day}))
        }
        .await,
    )
}

async fn intents(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Query(filter): Query<FilterParams>,
    Query(cursor): Query<Cursor>,
) -> Response {
    reply(
        async {
            reader(&caller)?;
            let search = app.search(&filter).map_err(Refusal::bad)?;
            let (before, limit) = cursor.parse().map_err(Refusal::bad)?;
            to_json(app.store.search(&search, before, limit).await?)
        }
        .await,
    )
}

async fn intent(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Response {
    reply(
        async {
            reader(&caller)?;
            let id: i64 = id.parse().map_err(|_| {
                Refusal::new(StatusCode::NOT_FOUND, format!("{id:?} is not an intent id"))
            })?;
            let d = detail(&app, id).await?;
            Ok(json!({
                "intent": d.intent, "provider_key": provider_key(&d.intent),
                "attempts": d.attempts, "actions": d.actions,
            }))
        }
        .await,
    )
}

async fn failures(State(app): State<Arc<App>>, Extension(caller): Extension<Caller>) -> Response {
    reply(
        async {
            reader(&caller)?;
            let mut groups = app.store.failure_groups().await?;
            groups.extend(app.store.rejected_groups().await?);
            let groups: Vec<Value> = groups
                .into_iter()
                .map(GroupRow::new)
                .map(|g| {
                    let mut v = to_json(&g.group).unwrap_or(Value::Null);
                    v["filter"] =
                        to_json(FilterParams::of(&g.group.search())).unwrap_or(Value::Null);
                    v["query"] = Value::String(g.query);
                    v
                })
                .collect();
            Ok(Value::Array(groups))
        }
        .await,
    )
}

async fn schedules(State(app): State<Arc<App>>, Extension(caller): Extension<Caller>) -> Response {
    reply(
        async {
            reader(&caller)?;
            Ok(Value::Array(schedule_rows(&app).await?))
        }
        .await,
    )
}

async fn lookup(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<KeyParam>,
) -> Response {
    reply(
        async {
            reader(&caller)?;
            if q.key.is_empty() {
                return Err(Refusal::bad("key is missing: /api/v1/lookup?key=..."));
            }
            let known = app.store.lookup_key(&q.key).await?;
            let verdict = answer(&known).verdict;
            Ok(match known {
                Known::Live(intent) => {
                    let intent = app.masked(*intent);
                    json!({"source": "live", "verdict": verdict, "intent": intent})
                }
                Known::Ledger(entry) => {
                    json!({"source": "ledger", "verdict": verdict, "entry": entry})
                }
            })
        }
        .await,
    )
}

async fn destinations(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
) -> Response {
    reply(
        async {
            reader(&caller)?;
            let rows = crate::services::health::list(&app.store, &app.health)
                .await
                .map_err(crate::store::StoreError::from)?;
            to_json(rows)
        }
        .await,
    )
}

/// A JSON body, with an error that says what is wrong with it.
fn body<T: serde::de::DeserializeOwned>(bytes: &Bytes) -> Result<T, Refusal> {
    serde_json::from_slice(bytes)
        .map_err(|e| Refusal::bad(format!("the body is not the JSON expected: {e}")))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DestinationBody {
    destination: String,
    #[serde(default)]
    reason: String,
}

async fn pause_or_resume(
    app: Arc<App>,
    caller: Caller,
    headers: HeaderMap,
    bytes: Bytes,
    pause: bool,
) -> Response {
    reply(
        async {
            check_post(&caller, &headers, None)?;
            let user = operator(&caller)?;
            let b: DestinationBody = body(&bytes)?;
            let name = set_paused(&app, &user, &b.destination, pause, &b.reason).await?;
            Ok(json!({"destination": name, "paused": pause}))
        }
        .await,
    )
}

async fn pause(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Response {
    pause_or_resume(app, caller, headers, bytes, true).await
}

async fn resume(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Response {
    pause_or_resume(app, caller, headers, bytes, false).await
}

/// `POST /api/v1/actions`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ActionBody {
    action: String,
    #[serde(default)]
    new_effect: bool,
    #[serde(default)]
    force: bool,
    resolve_as: Option<String>,
    reference: Option<String>,
    reason: Option<String>,
    #[serde(default)]
    filter: FilterParams,
    /// Count only (the first step): answers `count`, `up_to` and
    /// `selection`, and keeps the set it counted.
    #[serde(default)]
    dry_run: bool,
    /// From the dry run: the newest id when it counted...
    up_to: Option<i64>,
    /// ...and how many it counted (else 409 with a new dry run).
    expected: Option<i64>,
    /// From the dry run: the set it counted (without it, the caller's
    /// newest dry run of the same action, filter and `up_to`).
    selection: Option<String>,
    /// Optional: the same nonce twice starts one job.
    nonce: Option<String>,
}

/// A dry run's answer, its set kept under `selection`.
fn dry_run_answer(app: &App, user: &User, b: &ActionBody, run: &DryRun) -> Result<Value, Refusal> {
    let selection = keep(app, user, run)?;
    let states: Vec<&str> = run
        .search
        .as_ref()
        .map(|s| s.states.iter().map(|s| s.as_sql()).collect())
        .unwrap_or_default();
    Ok(json!({
        "dry_run": true, "action": label(&run.change), "description": b.filter.describe(),
        "filter": run.fixed, "states": states, "count": run.count(), "up_to": run.up_to,
        "selection": selection,
    }))
}

async fn act(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Response {
    let result = async {
        check_post(&caller, &headers, None)?;
        let user = operator(&caller)?;
        let b: ActionBody = body(&bytes)?;
        let flag = |v: bool| v.then(|| "on".to_string());
        let params = ActionParams {
            action: b.action.clone(),
            new_effect: flag(b.new_effect),
            force: flag(b.force),
            resolve_as: b.resolve_as.clone(),
            reference: b.reference.clone(),
            reason: b.reason.clone(),
        };
        if b.dry_run {
            let run = dry_run_of(&app, &b.filter, &params, false).await?;
            return Ok((StatusCode::OK, dry_run_answer(&app, &user, &b, &run)?));
        }
        let (Some(up_to), Some(expected)) = (b.up_to, b.expected) else {
            return Err(Refusal::bad(
                "up_to and expected come from the dry run: send {\"dry_run\": true, ...} first",
            ));
        };
        // a nonce names one request of one user: the same nonce with another
        // body (or from another user) is another request
        let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes));
        let nonce = match &b.nonce {
            Some(n) => format!("api:{}:{n}:{digest}", user.name),
            None => match super::auth::random_token() {
                Some(t) => format!("api:{t}"),
                None => {
                    return Err(Refusal::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "no randomness for the job's nonce",
                    ))
                }
            },
        };
        if let Some(id) = app.jobs.by_nonce(&nonce) {
            return Ok((StatusCode::ACCEPTED, to_json(app.jobs.get(id))?));
        }
        let token = b.selection.as_deref();
        match confirmed(&app, &user, &b.filter, &params, token, up_to, expected)? {
            Confirmed::Go {
                change,
                selection,
                token,
            } => {
                let id = start(&app, &user, &b.filter, change, selection, &token, &nonce);
                Ok((StatusCode::ACCEPTED, to_json(app.jobs.get(id))?))
            }
            Confirmed::Again(why) => {
                let run = dry_run_of(&app, &b.filter, &params, true).await?;
                let mut again = dry_run_answer(&app, &user, &b, &run)?;
                again["error"] = Value::String(why);
                Ok((StatusCode::CONFLICT, again))
            }
        }
    }
    .await;
    match result {
        Ok((status, v)) => (status, Json(v)).into_response(),
        Err(r) => refusal(r),
    }
}

async fn job(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Response {
    reply(
        async {
            reader(&caller)?;
            let job = id
                .parse()
                .ok()
                .and_then(|id| app.jobs.get(id))
                .ok_or_else(|| Refusal::new(StatusCode::NOT_FOUND, format!("no action {id}")))?;
            to_json(job)
        }
        .await,
    )
}

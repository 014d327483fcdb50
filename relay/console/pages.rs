//! The HTML pages (contract paths: `/`, `/intents`, `/intents/{id}`,
//! `/failures`, `/schedules`, `/lookup`), and `/destinations`, `/login`.

use std::sync::Arc;

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::http::header::{CONTENT_TYPE, LOCATION};
use axum::http::{StatusCode, Uri};
use axum::response::{Html, IntoResponse, Response};
use axum::Extension;
use chrono::{DateTime, Utc};
use serde::Deserialize;

use super::auth::User;
use super::params::FilterParams;
use super::view::{self, Chart};
use super::{App, Caller, Refusal};
use crate::kinds::Kind;
use crate::store::console::{FailureGroup, Page, SCAN_WINDOW};
use crate::store::operator::{Action, Attempt, Intent, Known};
use crate::store::{IntentState, STATES};

/// What the frame of every page shows.
pub struct Layout {
    pub nav: &'static str,
    pub user: Option<String>,
    pub role: &'static str,
    pub can_act: bool,
    pub csrf: String,
    pub open: bool,
}

impl Layout {
    pub fn new(app: &App, caller: &Caller, nav: &'static str) -> Layout {
        Layout {
            nav,
            user: caller.user.as_ref().map(|u| u.name.clone()),
            role: caller.user.as_ref().map(|u| u.role.as_str()).unwrap_or(""),
            can_act: caller.user.as_ref().is_some_and(User::can_act),
            csrf: caller.csrf(),
            open: app.auth.open(),
        }
    }
}

/// Helpers the templates call.
pub trait Helpers {
    fn ago(&self, t: &DateTime<Utc>) -> String {
        view::ago(*t)
    }
    fn when(&self, t: &DateTime<Utc>) -> String {
        view::when(*t)
    }
}

/// A template as a response (a failure to render is a 500 and a log line).
pub fn render(t: impl Template) -> Response {
    match t.render() {
        Ok(html) => Html(html).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "console: a template failed to render");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "the page failed to render",
            )
                .into_response()
        }
    }
}

#[derive(Template)]
#[template(path = "error.html")]
struct ErrorPage {
    layout: Layout,
    status: String,
    message: String,
}

/// A refusal as a page.
pub fn refuse(app: &App, caller: &Caller, r: Refusal) -> Response {
    let status = r.status;
    let mut response = render(ErrorPage {
        layout: Layout::new(app, caller, ""),
        status: status.to_string(),
        message: r.message,
    });
    *response.status_mut() = status;
    response
}

/// The signed-in user, or a redirect to the login page.
pub fn signed_in(caller: &Caller, uri: &Uri) -> Result<User, Box<Response>> {
    caller.user.clone().ok_or_else(|| {
        let next = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
        let target = format!(
            "/login?{}",
            serde_urlencoded::to_string([("next", next)]).unwrap_or_default()
        );
        Box::new((StatusCode::SEE_OTHER, [(LOCATION, target)]).into_response())
    })
}

macro_rules! sign_in {
    ($caller:expr, $uri:expr) => {
        match signed_in(&$caller, &$uri) {
            Ok(user) => user,
            Err(redirect) => return *redirect,
        }
    };
}
pub(crate) use sign_in;

macro_rules! or_refuse {
    ($app:expr, $caller:expr, $result:expr) => {
        match $result {
            Ok(v) => v,
            Err(e) => return refuse(&$app, &$caller, Refusal::from(e)),
        }
    };
}

// ---- overview ----------------------------------------------------------

pub struct CountCell {
    pub state: &'static str,
    pub count: i64,
}

pub struct CountRow {
    pub kind: String,
    pub cells: Vec<CountCell>,
}

#[derive(Template)]
#[template(path = "overview.html")]
struct OverviewPage {
    layout: Layout,
    states: Vec<&'static str>,
    counts: Vec<CountRow>,
    due: i64,
    oldest_due: String,
    expired_leases: i64,
    blocked_keys: i64,
    stranded: i64,
    duplicates: i64,
    failures: i64,
    /// One line per relay whose deliveries wait for standbys.
    standby_waits: Vec<String>,
    charts: Vec<Chart>,
}

/// Counts by kind × state, one row per kind.
pub fn count_rows(stats: &crate::store::stats::Stats) -> Vec<CountRow> {
    let mut kinds: Vec<String> = stats.by_state.iter().map(|r| r.kind.clone()).collect();
    kinds.dedup();
    kinds
        .into_iter()
        .map(|kind| CountRow {
            cells: STATES
                .iter()
                .map(|s| CountCell {
                    state: s,
                    count: stats
                        .by_state
                        .iter()
                        .find(|r| r.kind == kind && r.state.as_sql() == *s)
                        .map_or(0, |r| r.count),
                })
                .collect(),
            kind,
        })
        .collect()
}

/// The two attempt charts: the last hour by minute, the last day by 15 minutes.
pub async fn charts(app: &App) -> Result<Vec<Chart>, crate::store::StoreError> {
    let (hour, day) = app.attempt_charts().await?;
    Ok(vec![
        Chart::new("Attempts, last hour (per minute)", &hour, 60),
        Chart::new("Attempts, last day (per 15 minutes)", &day, 900),
    ])
}

pub async fn overview(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
) -> Response {
    sign_in!(caller, uri);
    let stats = or_refuse!(app, caller, app.store.stats().await);
    let charts = or_refuse!(app, caller, charts(&app).await);
    let failures = stats
        .by_state
        .iter()
        .filter(|r| matches!(r.state, IntentState::Dead | IntentState::Ambiguous))
        .map(|r| r.count)
        .sum();
    render(OverviewPage {
        layout: Layout::new(&app, &caller, "overview"),
        states: STATES.to_vec(),
        counts: count_rows(&stats),
        due: stats.due.iter().map(|d| d.due).sum(),
        oldest_due: stats
            .due
            .iter()
            .map(|d| d.oldest_due_seconds)
            .fold(None, |m: Option<f64>, s| Some(m.map_or(s, |m| m.max(s))))
            .map_or("—".into(), view::seconds),
        expired_leases: stats.expired_leases,
        blocked_keys: stats.blocked_ordering_keys,
        stranded: stats.stranded_ordering_intents,
        duplicates: stats.duplicate_enqueues,
        failures,
        standby_waits: stats.standby_waits.iter().map(|w| w.describe()).collect(),
        charts,
    })
}

// ---- intents -----------------------------------------------------------

#[derive(Template)]
#[template(path = "intents.html")]
struct IntentsPage {
    layout: Layout,
    states: Vec<&'static str>,
    filter: FilterParams,
    query: String,
    problem: String,
    page: Page,
    window: i64,
}
impl Helpers for IntentsPage {}

impl IntentsPage {
    fn selected(&self, state: &str) -> bool {
        self.filter.state.as_deref() == Some(state)
    }
}

/// `before` beside the filter.
#[derive(Debug, Default, Deserialize)]
pub struct Cursor {
    pub before: Option<String>,
    pub limit: Option<String>,
}

impl Cursor {
    pub fn parse(&self) -> Result<(Option<i64>, i64), String> {
        let before = match self.before.as_deref().filter(|s| !s.is_empty()) {
            None => None,
            Some(b) => Some(
                b.parse()
                    .map_err(|_| format!("before {b:?} is not an id"))?,
            ),
        };
        let limit = match self.limit.as_deref().filter(|s| !s.is_empty()) {
            None => 50,
            Some(l) => l
                .parse::<i64>()
                .ok()
                .filter(|l| (1..=500).contains(l))
                .ok_or_else(|| format!("limit {l:?} must be a number from 1 to 500"))?,
        };
        Ok((before, limit))
    }
}

pub async fn intents(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
    Query(filter): Query<FilterParams>,
    Query(cursor): Query<Cursor>,
) -> Response {
    sign_in!(caller, uri);
    let empty = Page {
        intents: Vec::new(),
        next_before: None,
        window_ended_at: None,
    };
    let (page, problem) = match (app.search(&filter), cursor.parse()) {
        (Ok(search), Ok((before, limit))) => (
            or_refuse!(app, caller, app.store.search(&search, before, limit).await),
            String::new(),
        ),
        (Err(e), _) | (_, Err(e)) => (empty, e),
    };
    let query = filter.query();
    render(IntentsPage {
        layout: Layout::new(&app, &caller, "intents"),
        states: STATES.to_vec(),
        filter,
        query,
        problem,
        page,
        window: SCAN_WINDOW,
    })
}

#[derive(Template)]
#[template(path = "intent.html")]
struct IntentPage {
    layout: Layout,
    intent: Intent,
    delivered: bool,
    provider_key: String,
    destination: String,
    effects: usize,
    replays: usize,
    attempts: Vec<Attempt>,
    actions: Vec<Action>,
    payload: String,
    response: Option<String>,
    trace_id: String,
    /// The trace id is the application's (else derived from the key).
    trace_from_app: bool,
    trace_link: Option<String>,
}
impl Helpers for IntentPage {}

impl IntentPage {
    fn took(&self, a: &Attempt) -> String {
        a.finished_at
            .map(|f| format!("{} ms", (f - a.started_at).num_milliseconds()))
            .unwrap_or_else(|| "—".into())
    }
    fn detail(&self, a: &Action) -> String {
        a.detail.as_ref().map(|d| d.to_string()).unwrap_or_default()
    }
}

/// The key the provider sees for this intent, as the provider names it.
pub fn provider_key(intent: &Intent) -> String {
    match Kind::parse(&intent.kind) {
        Some(kind) => kind.provider_key(&intent.key, intent.key_generation),
        None => "— (no relay delivers this kind)".into(),
    }
}

/// An intent, its attempts and its operator actions, payload masked.
pub struct Detail {
    pub intent: Intent,
    pub attempts: Vec<Attempt>,
    pub actions: Vec<Action>,
}

pub async fn detail(app: &App, id: i64) -> Result<Detail, crate::store::StoreError> {
    let intent = app.masked(app.store.find_id(id).await?);
    Ok(Detail {
        attempts: app.store.attempts(id).await?,
        actions: app.store.actions(id).await?,
        intent,
    })
}

pub async fn intent(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
    Path(id): Path<String>,
) -> Response {
    sign_in!(caller, uri);
    let Ok(id) = id.parse::<i64>() else {
        return refuse(
            &app,
            &caller,
            Refusal::new(StatusCode::NOT_FOUND, format!("{id:?} is not an intent id")),
        );
    };
    let d = or_refuse!(app, caller, detail(&app, id).await);
    let destination = crate::config::destinations::destination_of(
        &d.intent.kind,
        d.intent.destination.as_deref(),
        &d.intent.payload.0,
        &app.health.endpoints,
    )
    .or(d.intent.destination.clone())
    .unwrap_or_else(|| "—".into());
    let trace_id = d.intent.trace_id();
    let trace_link = app
        .console
        .trace_url
        .as_deref()
        .and_then(|t| crate::config::console::trace_link(t, &trace_id).ok());
    render(IntentPage {
        trace_from_app: d.intent.traceparent.is_some(),
        trace_link,
        trace_id,
        layout: Layout::new(&app, &caller, "intents"),
        delivered: d.intent.state == IntentState::Delivered,
        provider_key: provider_key(&d.intent),
        destination,
        effects: d
            .attempts
            .iter()
            // a success refused as stale (cancelled meanwhile) was an effect too
            .filter(|a| a.outcome == "delivered" && !a.replayed)
            .count(),
        replays: d.attempts.iter().filter(|a| a.replayed).count(),
        payload: view::pretty(&d.intent.payload.0),
        response: d.intent.response.as_ref().map(view::pretty),
        attempts: d.attempts,
        actions: d.actions,
        intent: d.intent,
    })
}

// ---- failures ----------------------------------------------------------

/// A failure group with its links.
pub struct GroupRow {
    pub group: FailureGroup,
    pub label: &'static str,
    pub query: String,
    pub action: String,
    pub action_label: &'static str,
}

impl GroupRow {
    pub fn new(group: FailureGroup) -> GroupRow {
        let query = FilterParams::of(&group.search()).query();
        let (label, action, action_label) = match group.state {
            IntentState::Ambiguous => (
                "ambiguous",
                "resolve&resolve_as=redeliver".to_string(),
                "Redeliver all",
            ),
            IntentState::Pending => ("failing", "retry".to_string(), "Retry all now"),
            IntentState::Rejected => ("rejected", "retry".to_string(), "Retry all"),
            _ => ("dead", "retry".to_string(), "Retry all"),
        };
        GroupRow {
            group,
            label,
            query,
            action,
            action_label,
        }
    }
}

#[derive(Template)]
#[template(path = "failures.html")]
struct FailuresPage {
    layout: Layout,
    groups: Vec<GroupRow>,
    /// Rejected intents, apart: they will not be tried again by themselves.
    rejected: Vec<GroupRow>,
}
impl Helpers for FailuresPage {}

pub async fn failures(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
) -> Response {
    sign_in!(caller, uri);
    let groups = or_refuse!(app, caller, app.store.failure_groups().await);
    let rejected = or_refuse!(app, caller, app.store.rejected_groups().await);
    render(FailuresPage {
        layout: Layout::new(&app, &caller, "failures"),
        groups: groups.into_iter().map(GroupRow::new).collect(),
        rejected: rejected.into_iter().map(GroupRow::new).collect(),
    })
}

// ---- schedules, destinations, lookup -----------------------------------

pub struct ScheduleRow {
    pub name: String,
    pub cron: String,
    pub kind: String,
    pub last: String,
    pub next: String,
    /// Relays disagree about the schedule: which configuration wins, and
    /// which stand aside.
    pub disagreement: Option<String>,
}

#[derive(Template)]
#[template(path = "schedules.html")]
struct SchedulesPage {
    layout: Layout,
    rows: Vec<ScheduleRow>,
}

/// The configured schedules with their last and next ticks, and the
/// configurations relays run for each: more than one, or one other than
/// this console's, is a disagreement (the first wins).
pub async fn schedule_rows(app: &App) -> Result<Vec<serde_json::Value>, Refusal> {
    let schedules = &app.schedules;
    let marks = app.store.schedule_watermarks().await?;
    let now = Utc::now();
    let mut rows = Vec::with_capacity(schedules.len());
    for s in schedules {
        let last = marks.iter().find(|(n, _)| *n == s.name).map(|(_, t)| *t);
        let live = app.store.schedule_configs(&s.name, now).await?;
        let mine = s.fingerprint();
        let disagree = live.len() > 1 || live.iter().any(|c| c.fingerprint != mine);
        let configurations: Vec<serde_json::Value> = live
            .iter()
            .enumerate()
            .map(|(i, c)| {
                serde_json::json!({
                    "definition": c.definition, "fingerprint": c.fingerprint,
                    "seen_by": c.seen_by, "first_seen": c.first_seen, "wins": i == 0,
                })
            })
            .collect();
        rows.push(serde_json::json!({
            "name": s.name, "cron": s.expression, "kind": s.kind,
            "destination": s.destination, "last_tick": last, "next": s.upcoming(now, 3),
            "relays_disagree": disagree, "configurations": configurations,
        }));
    }
    Ok(rows)
}

/// One line on a disagreement about a schedule, from its row.
fn disagreement(row: &serde_json::Value) -> Option<String> {
    if row["relays_disagree"] != serde_json::Value::Bool(true) {
        return None;
    }
    let configs = row["configurations"].as_array()?;
    let describe = |c: &serde_json::Value| {
        format!(
            "{} (relay {})",
            c["definition"].as_str().unwrap_or(""),
            c["seen_by"].as_str().unwrap_or("?")
        )
    };
    let winner = configs.first().map(describe)?;
    let aside: Vec<String> = configs.iter().skip(1).map(describe).collect();
    Some(if aside.is_empty() {
        format!("Relays run another configuration than this console's: {winner}.")
    } else {
        format!(
            "Relays disagree: {winner} wins and alone enqueues ticks; standing aside: {}.",
            aside.join("; ")
        )
    })
}

pub async fn schedules(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
) -> Response {
    sign_in!(caller, uri);
    let rows = match schedule_rows(&app).await {
        Ok(r) => r,
        Err(e) => return refuse(&app, &caller, e),
    };
    let text = |v: &serde_json::Value| v.as_str().unwrap_or("").to_string();
    let time = |v: &serde_json::Value| {
        v.as_str()
            .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
            .map(|t| view::when(t.with_timezone(&Utc)))
            .unwrap_or_else(|| "—".into())
    };
    render(SchedulesPage {
        layout: Layout::new(&app, &caller, "schedules"),
        rows: rows
            .iter()
            .map(|r| ScheduleRow {
                name: text(&r["name"]),
                cron: text(&r["cron"]),
                kind: text(&r["kind"]),
                last: time(&r["last_tick"]),
                next: r["next"]
                    .as_array()
                    .map(|a| a.iter().map(time).collect::<Vec<_>>().join(", "))
                    .unwrap_or_default(),
                disagreement: disagreement(r),
            })
            .collect(),
    })
}

#[derive(Template)]
#[template(path = "destinations.html")]
struct DestinationsPage {
    layout: Layout,
    rows: Vec<crate::services::health::Destination>,
}
impl Helpers for DestinationsPage {}

pub async fn destinations(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
) -> Response {
    sign_in!(caller, uri);
    let rows = match crate::services::health::list(&app.store, &app.health).await {
        Ok(r) => r,
        Err(e) => return refuse(&app, &caller, crate::store::StoreError::from(e).into()),
    };
    render(DestinationsPage {
        layout: Layout::new(&app, &caller, "destinations"),
        rows,
    })
}

/// The "did it happen?" answer.
pub struct Answer {
    pub verdict: String,
    pub verdict_class: &'static str,
    pub state: String,
    pub kind: String,
    pub provider_ref: String,
    pub source: &'static str,
    pub link: Option<i64>,
}

pub fn answer(known: &Known) -> Answer {
    let (state, kind, provider_ref, source, link) = match known {
        Known::Live(i) => (
            i.state,
            i.kind.clone(),
            i.provider_ref.clone(),
            "the live table",
            Some(i.id),
        ),
        Known::Ledger(e) => (
            e.state,
            e.kind.clone(),
            e.provider_ref.clone(),
            "the ledger (the intent was purged)",
            None,
        ),
    };
    // the effect happened although the intent is not delivered: when, and why
    let anyway = match known {
        Known::Live(i) if i.happened_anyway() => i.effect_at.map(|at| {
            let why = if i.effect_accepted == Some(true) {
                format!("it was delivered, then an operator retried it and it became {state}")
            } else {
                format!(
                    "the provider answered success to a request that was in flight when it \
                     became {state}"
                )
            };
            (at, why)
        }),
        Known::Ledger(e) if e.happened_anyway() => e.effect_at.map(|at| {
            (
                at,
                "a provider answered success to one of its attempts before it was purged"
                    .to_string(),
            )
        }),
        _ => None,
    };
    let (verdict, class) = match state {
        _ if anyway.is_some() => {
            let (at, why) = anyway.unwrap_or_default();
            (
                format!(
                    "Yes: the effect happened ({}), although the intent is {state}: {why}.",
                    view::when(at)
                ),
                "yes",
            )
        }
        IntentState::Delivered => ("Yes: the effect happened.".into(), "yes"),
        IntentState::Rejected => (
            "No: the provider refused it, and it will not be tried again.".into(),
            "no",
        ),
        IntentState::Cancelled => ("No: an operator cancelled it.".into(), "no"),
        IntentState::Dead => (
            "No: it failed until its retries ran out; an operator can retry it.".into(),
            "no",
        ),
        IntentState::Ambiguous => (
            "Unknown: the outcome was lost; an operator must check at the provider.".into(),
            "maybe",
        ),
        IntentState::Pending | IntentState::Claimed => {
            ("Not yet: it is queued or in flight.".into(), "maybe")
        }
    };
    Answer {
        verdict,
        verdict_class: class,
        state: state.as_sql().into(),
        kind,
        provider_ref: provider_ref.unwrap_or_else(|| "—".into()),
        source,
        link,
    }
}

#[derive(Template)]
#[template(path = "lookup.html")]
struct LookupPage {
    layout: Layout,
    key: String,
    answer: Option<Answer>,
}

#[derive(Debug, Default, Deserialize)]
pub struct KeyParam {
    #[serde(default)]
    pub key: String,
}

pub async fn lookup(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
    Query(q): Query<KeyParam>,
) -> Response {
    sign_in!(caller, uri);
    let answer = if q.key.is_empty() {
        None
    } else {
        match app.store.lookup_key(&q.key).await {
            Ok(known) => Some(answer(&known)),
            Err(crate::store::StoreError::NotFound(_)) => None,
            Err(e) => return refuse(&app, &caller, e.into()),
        }
    };
    render(LookupPage {
        layout: Layout::new(&app, &caller, "lookup"),
        key: q.key,
        answer,
    })
}

// ---- static ------------------------------------------------------------

pub async fn css() -> Response {
    (
        [(CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("static/console.css"),
    )
        .into_response()
}

pub async fn js() -> Response {
    (
        [(CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("static/console.js"),
    )
        .into_response()
}

pub async fn not_found(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
) -> Response {
    if uri.path().starts_with("/api/") {
        return super::refusal(Refusal::new(StatusCode::NOT_FOUND, "no such path"));
    }
    refuse(
        &app,
        &caller,
        Refusal::new(StatusCode::NOT_FOUND, format!("no page at {}", uri.path())),
    )
}

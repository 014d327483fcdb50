//! Actions: retry (same key), retry as a new effect, cancel, resolve, on one
//! intent (`id`) or on every intent a filter or failure group matches.
//!
//! Always two steps: `GET /actions/new?action=...&<filter>` is the dry run
//! (it counts, changes nothing, and keeps the set of intents it counted,
//! see [`super::selections`]); its form posts to `POST /actions`, which
//! starts the job over that set and redirects to its progress
//! (`/actions/{job}`). The job changes only intents of the set, skipping
//! those that left the filter meanwhile. When the set is not kept any more,
//! or the confirmation does not match it, a new dry run is shown.

use std::sync::Arc;

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::http::header::LOCATION;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Form};
use serde::Deserialize;

use super::auth::User;
use super::jobs::{Job, Plan};
use super::pages::{refuse, render, sign_in, signed_in, Helpers, Layout};
use super::params::FilterParams;
use super::selections::{Selection, KEPT_FOR, MAX_SELECTED};
use super::{check_post, operator, App, Caller, Refusal};
use crate::store::console::Search;
use crate::store::operator::{Change, Resolution, RetryOptions};

/// An action as a form or query string names it.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
#[serde(default)]
pub struct ActionParams {
    /// retry | cancel | resolve
    pub action: String,
    /// Retry as a new effect (a new provider key).
    pub new_effect: Option<String>,
    /// Retry delivered intents too (re-send).
    pub force: Option<String>,
    /// delivered | redeliver | reject (for resolve)
    pub resolve_as: Option<String>,
    pub reference: Option<String>,
    pub reason: Option<String>,
}

fn on(v: &Option<String>) -> bool {
    matches!(v.as_deref(), Some("on" | "true" | "1" | "yes"))
}

fn text(v: &Option<String>) -> Option<String> {
    v.as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
}

impl ActionParams {
    /// The change, with `reason` required for a rejection only when
    /// `final_step` (the dry run may come without it).
    pub fn change(&self, final_step: bool) -> Result<Change, String> {
        match self.action.as_str() {
            "retry" => Ok(Change::Retry(RetryOptions {
                new_effect: on(&self.new_effect),
                force: on(&self.force),
            })),
            "cancel" => Ok(Change::Cancel),
            "resolve" => match self.resolve_as.as_deref().unwrap_or("") {
                "delivered" => Ok(Change::Resolve(Resolution::Delivered {
                    reference: text(&self.reference),
                })),
                "redeliver" => Ok(Change::Resolve(Resolution::Redeliver)),
                "reject" => match text(&self.reason) {
                    Some(reason) => Ok(Change::Resolve(Resolution::Reject { reason })),
                    None if !final_step => Ok(Change::Resolve(Resolution::Reject {
                        reason: String::new(),
                    })),
                    None => Err("a rejection needs a reason".into()),
                },
                other => Err(format!(
                    "resolve_as {other:?} must be delivered, redeliver or reject"
                )),
            },
            other => Err(format!("action {other:?} must be retry, cancel or resolve")),
        }
    }
}

/// What a change is called on buttons and in the job list.
pub fn label(change: &Change) -> String {
    match change {
        Change::Retry(how) => match (how.new_effect, how.force) {
            (false, false) => "Retry (same key)".into(),
            (true, false) => "Retry as a new effect".into(),
            (false, true) => "Re-send (same key, delivered too)".into(),
            (true, true) => "Re-send as a new effect (delivered too)".into(),
        },
        Change::Cancel => "Cancel".into(),
        Change::Resolve(Resolution::Delivered { .. }) => "Resolve as delivered".into(),
        Change::Resolve(Resolution::Redeliver) => "Resolve: redeliver (same key)".into(),
        Change::Resolve(Resolution::Reject { .. }) => "Resolve as rejected".into(),
    }
}

/// What the confirmation warns about, if anything.
fn note(change: &Change) -> &'static str {
    match change {
        Change::Retry(RetryOptions { new_effect: true, .. }) => {
            "A new effect gets a new provider key: the provider will perform it again even where it already did (e.g. charge again). Recorded."
        }
        Change::Retry(RetryOptions { force: true, .. }) => crate::store::operator::RESEND_DELIVERED,
        Change::Resolve(Resolution::Delivered { .. }) => {
            "Only when you have checked at the provider that the effect happened."
        }
        Change::Cancel => "A delivery in flight is fenced off, but its request may already have left.",
        _ => "",
    }
}

/// A dry run: the intents the change would touch now.
pub struct DryRun {
    pub change: Change,
    /// The filter as counted: relative times fixed to instants.
    pub fixed: FilterParams,
    /// The search narrowed to the states the change applies to (None: none).
    pub search: Option<Search>,
    /// The newest intent id when it counted.
    pub up_to: i64,
    /// The intents counted, in id order: the only ones its confirmation
    /// may change.
    pub ids: Vec<i64>,
}

impl DryRun {
    pub fn count(&self) -> i64 {
        self.ids.len() as i64
    }
}

pub async fn dry_run_of(
    app: &App,
    filter: &FilterParams,
    action: &ActionParams,
    final_step: bool,
) -> Result<DryRun, Refusal> {
    let asked = app.search(filter).map_err(Refusal::bad)?;
    let change = action.change(final_step).map_err(Refusal::bad)?;
    if asked.id.is_none() && asked.states.is_empty() {
        // "retry everything of kind email" would also re-send what was
        // cancelled or rejected on purpose, and pull scheduled intents forward
        return Err(Refusal::bad(
            "a bulk action needs the states it acts on in its filter (state=dead, or state=dead,ambiguous)",
        ));
    }
    // read back as the confirmation will read it, so that both compare equal
    let fixed = FilterParams::of(&asked);
    let search = app
        .search(&fixed)
        .map_err(Refusal::bad)?
        .for_change(&change);
    let up_to = app.store.newest_id().await?;
    let ids = match &search {
        Some(s) => app.store.select_search(s, up_to, MAX_SELECTED + 1).await?,
        None => Vec::new(),
    };
    if ids.len() as i64 > MAX_SELECTED {
        return Err(Refusal::bad(format!(
            "more than {MAX_SELECTED} intents match: a bulk action acts on at most that many; \
             narrow the filter (since and until, kind, host) and act on it in parts"
        )));
    }
    Ok(DryRun {
        change,
        fixed,
        search,
        up_to,
        ids,
    })
}

/// Keep `run`'s set for its confirmation: the token that names it.
pub fn keep(app: &App, user: &User, run: &DryRun) -> Result<String, Refusal> {
    let token = super::auth::random_token().ok_or_else(|| {
        Refusal::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "no randomness for the dry run's token",
        )
    })?;
    if let Some(search) = run.search.as_ref().filter(|_| !run.ids.is_empty()) {
        app.selections.keep(
            &token,
            Selection::new(
                &user.name,
                label(&run.change),
                search.clone(),
                run.up_to,
                run.ids.clone(),
            ),
        );
    }
    Ok(token)
}

/// What a confirmation confirms.
// one value per confirmed request, moved once: its size costs nothing
#[allow(clippy::large_enum_variant)]
pub enum Confirmed {
    /// Its dry run's set (kept under `token`), to change as `change`.
    Go {
        change: Change,
        selection: Selection,
        token: String,
    },
    /// Nothing it can act on: why, for a new dry run's page or answer.
    Again(String),
}

/// Check a confirmation of `action` over `filter` against its dry run (the
/// one `token` names, else `user`'s newest of the same action, filter and
/// `up_to`), which must have counted `expected` intents.
pub fn confirmed(
    app: &App,
    user: &User,
    filter: &FilterParams,
    action: &ActionParams,
    token: Option<&str>,
    up_to: i64,
    expected: i64,
) -> Result<Confirmed, Refusal> {
    let change = action.change(true).map_err(Refusal::bad)?;
    let search = app
        .search(filter)
        .map_err(Refusal::bad)?
        .for_change(&change);
    let Some(search) = search else {
        return Err(Refusal::new(
            StatusCode::CONFLICT,
            "nothing to do: no intent matches",
        ));
    };
    let name = label(&change);
    let found = match token.filter(|t| !t.is_empty()) {
        Some(t) => app.selections.get(t).map(|s| (t.to_string(), s)),
        None => app.selections.find(&user.name, &name, &search, up_to),
    };
    let Some((token, selection)) = found else {
        return Ok(Confirmed::Again(format!(
            "The dry run this confirms is not kept any more (a dry run is kept for {} minutes, \
             and not across a restart of the console): this is a new one.",
            KEPT_FOR.as_secs() / 60
        )));
    };
    if !selection.confirms(&user.name, &name, &search, up_to) {
        return Ok(Confirmed::Again(
            "The confirmation does not match its dry run (another action, filter or user): this is a new dry run.".into(),
        ));
    }
    if selection.ids.len() as i64 != expected {
        return Ok(Confirmed::Again(format!(
            "The dry run counted {}, the confirmation says {expected}: confirm the count of this new dry run.",
            selection.ids.len()
        )));
    }
    Ok(Confirmed::Go {
        change,
        selection,
        token,
    })
}

#[derive(Template)]
#[template(path = "confirm.html")]
struct ConfirmPage {
    layout: Layout,
    label: String,
    filter: String,
    query: String,
    note: String,
    count: i64,
    batch: i64,
    up_to: i64,
    nonce: String,
    hidden: Vec<(String, String)>,
    needs_reason: bool,
    needs_reference: bool,
    reason: String,
    reference: String,
}

fn confirm_page(
    app: &App,
    caller: &Caller,
    filter: &FilterParams,
    action: &ActionParams,
    run: &DryRun,
    again: Option<String>,
) -> Response {
    let user = match operator(caller) {
        Ok(u) => u,
        Err(r) => return refuse(app, caller, r),
    };
    // the confirmation names its dry run's set by the form's nonce
    let nonce = match keep(app, &user, run) {
        Ok(t) => t,
        Err(r) => return refuse(app, caller, r),
    };
    // relative times (since=90m) as the instants the dry run counted with
    let mut hidden: Vec<(String, String)> =
        serde_urlencoded::from_str(&run.fixed.query()).unwrap_or_default();
    for (name, value) in [
        ("action", Some(action.action.clone())),
        ("new_effect", action.new_effect.clone()),
        ("force", action.force.clone()),
        ("resolve_as", action.resolve_as.clone()),
    ] {
        if let Some(v) = value.filter(|v| !v.is_empty()) {
            hidden.push((name.into(), v));
        }
    }
    let mut note = note(&run.change).to_string();
    if let Some(s) = &run.search {
        let states: Vec<&str> = s.states.iter().map(|s| s.as_sql()).collect();
        note = format!(
            "It acts on intents that are {} now, and only on those counted here: one that leaves the filter before its turn is skipped, one that joins it later is left alone. {note}",
            states.join(" or ")
        );
    }
    if let Some(why) = again {
        note = format!("{why} {note}");
    }
    render(ConfirmPage {
        layout: Layout::new(app, caller, "actions"),
        label: label(&run.change),
        filter: filter.describe(),
        query: filter.query(),
        note,
        count: run.count(),
        batch: i64::from(app.console.batch_size),
        up_to: run.up_to,
        nonce,
        hidden,
        needs_reason: matches!(run.change, Change::Resolve(Resolution::Reject { .. })),
        needs_reference: matches!(run.change, Change::Resolve(Resolution::Delivered { .. })),
        reason: text(&action.reason).unwrap_or_default(),
        reference: text(&action.reference).unwrap_or_default(),
    })
}

/// `GET /actions/new`: the dry run and the confirmation form.
pub async fn dry_run(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
    Query(filter): Query<FilterParams>,
    Query(action): Query<ActionParams>,
) -> Response {
    sign_in!(caller, uri);
    if let Err(r) = operator(&caller) {
        return refuse(&app, &caller, r);
    }
    match dry_run_of(&app, &filter, &action, false).await {
        Ok(run) => confirm_page(&app, &caller, &filter, &action, &run, None),
        Err(r) => refuse(&app, &caller, r),
    }
}

/// The confirmation's own fields.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Confirmation {
    pub csrf: Option<String>,
    /// Names the dry run's set, and starts one job however often it is sent.
    pub nonce: Option<String>,
    pub up_to: Option<String>,
    pub expected: Option<String>,
}

fn number(v: &Option<String>, name: &str) -> Result<i64, Refusal> {
    v.as_deref()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| Refusal::bad(format!("{name} is missing: start from the dry run")))
}

/// Start the confirmed job over `selection` as `user`, once per `nonce`:
/// the job's id. The set is forgotten: a second confirmation of the same
/// dry run finds none and is shown a new dry run.
pub fn start(
    app: &App,
    user: &User,
    filter: &FilterParams,
    change: Change,
    selection: Selection,
    token: &str,
    nonce: &str,
) -> u64 {
    app.selections.forget(token);
    let store = app.store.acting_as(&user.actor());
    let plan = Plan {
        action: label(&change),
        filter: filter.describe(),
        query: filter.query(),
        expected: selection.ids.len() as i64,
        ids: selection.ids,
        batch: app.console.batch_size as usize,
        search: selection.search,
        change,
    };
    tracing::info!(
        user = %user.name,
        action = %plan.action,
        filter = %plan.filter,
        count = plan.expected,
        "console: bulk action confirmed"
    );
    app.jobs.start(store, plan, nonce)
}

/// `POST /actions`: check the confirmation against its dry run, then start
/// the job (or show a new dry run).
pub async fn confirm(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Form(form): Form<Vec<(String, String)>>,
) -> Response {
    let encoded = serde_urlencoded::to_string(&form).unwrap_or_default();
    let parse = || -> Result<(FilterParams, ActionParams, Confirmation), String> {
        Ok((
            serde_urlencoded::from_str(&encoded).map_err(|e| e.to_string())?,
            serde_urlencoded::from_str(&encoded).map_err(|e| e.to_string())?,
            serde_urlencoded::from_str(&encoded).map_err(|e| e.to_string())?,
        ))
    };
    let (filter, action, conf) = match parse() {
        Ok(p) => p,
        Err(e) => return refuse(&app, &caller, Refusal::bad(e)),
    };
    if let Err(r) = check_post(&caller, &headers, conf.csrf.as_deref()) {
        return refuse(&app, &caller, r);
    }
    let user = match operator(&caller) {
        Ok(u) => u,
        Err(r) => return refuse(&app, &caller, r),
    };
    let (up_to, expected) = match (
        number(&conf.up_to, "up_to"),
        number(&conf.expected, "expected"),
    ) {
        (Ok(u), Ok(e)) => (u, e),
        (Err(r), _) | (_, Err(r)) => return refuse(&app, &caller, r),
    };
    let nonce = conf.nonce.unwrap_or_default();
    if nonce.len() < 16 {
        return refuse(
            &app,
            &caller,
            Refusal::bad("the confirmation has no nonce: start from the dry run"),
        );
    }
    // submitted twice (a double click, a reload that resends): the first job
    if let Some(job) = app.jobs.by_nonce(&nonce) {
        return (
            StatusCode::SEE_OTHER,
            [(LOCATION, format!("/actions/{job}"))],
        )
            .into_response();
    }
    let check = confirmed(&app, &user, &filter, &action, Some(&nonce), up_to, expected);
    match check {
        Ok(Confirmed::Go {
            change,
            selection,
            token,
        }) => {
            let job = start(&app, &user, &filter, change, selection, &token, &nonce);
            (
                StatusCode::SEE_OTHER,
                [(LOCATION, format!("/actions/{job}"))],
            )
                .into_response()
        }
        Ok(Confirmed::Again(why)) => match dry_run_of(&app, &filter, &action, true).await {
            Ok(run) => confirm_page(&app, &caller, &filter, &action, &run, Some(why)),
            Err(r) => refuse(&app, &caller, r),
        },
        Err(r) => refuse(&app, &caller, r),
    }
}

#[derive(Template)]
#[template(path = "job.html")]
struct JobPage {
    layout: Layout,
    job: Job,
}
impl Helpers for JobPage {}

pub async fn progress(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
    Path(id): Path<String>,
) -> Response {
    sign_in!(caller, uri);
    match id.parse().ok().and_then(|id| app.jobs.get(id)) {
        Some(job) => render(JobPage {
            layout: Layout::new(&app, &caller, "actions"),
            job,
        }),
        None => refuse(
            &app,
            &caller,
            Refusal::new(
                StatusCode::NOT_FOUND,
                format!("no action {id} (actions are kept while this console runs)"),
            ),
        ),
    }
}

#[derive(Template)]
#[template(path = "jobs.html")]
struct JobsPage {
    layout: Layout,
    jobs: Vec<Job>,
}
impl Helpers for JobsPage {}

pub async fn recent(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
) -> Response {
    sign_in!(caller, uri);
    render(JobsPage {
        layout: Layout::new(&app, &caller, "actions"),
        jobs: app.jobs.recent(100),
    })
}

// ---- destinations ------------------------------------------------------

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct DestinationForm {
    pub csrf: String,
    pub destination: String,
    pub reason: String,
}

/// Pause or resume a destination as the caller (the reason names them:
/// the database records its own role as the actor).
pub async fn set_paused(
    app: &App,
    user: &User,
    destination: &str,
    pause: bool,
    reason: &str,
) -> Result<String, Refusal> {
    if pause {
        let reason = if reason.trim().is_empty() {
            format!("paused from the console by {}", user.name)
        } else {
            format!("{} (console user {})", reason.trim(), user.name)
        };
        crate::services::health::pause(&app.store, &app.health, destination, Some(&reason))
            .await
            .map_err(|e| Refusal::bad(format!("{e:#}")))
    } else {
        crate::services::health::resume(&app.store, &app.health, destination)
            .await
            .map(|(d, _)| d)
            .map_err(|e| Refusal::bad(format!("{e:#}")))
    }
}

async fn pause_or_resume(
    app: Arc<App>,
    caller: Caller,
    headers: HeaderMap,
    form: DestinationForm,
    pause: bool,
) -> Response {
    if let Err(r) = check_post(&caller, &headers, Some(&form.csrf)) {
        return refuse(&app, &caller, r);
    }
    let user = match operator(&caller) {
        Ok(u) => u,
        Err(r) => return refuse(&app, &caller, r),
    };
    match set_paused(&app, &user, &form.destination, pause, &form.reason).await {
        Ok(_) => (StatusCode::SEE_OTHER, [(LOCATION, "/destinations")]).into_response(),
        Err(r) => refuse(&app, &caller, r),
    }
}

pub async fn pause(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Form(form): Form<DestinationForm>,
) -> Response {
    pause_or_resume(app, caller, headers, form, true).await
}

pub async fn resume(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Form(form): Form<DestinationForm>,
) -> Response {
    pause_or_resume(app, caller, headers, form, false).await
}

//! A subscription's replay, in two steps as every bulk action: the dry run
//! (`GET /subscriptions/{id}/replay?since=&until=&event_type=`) counts the
//! events of the window and fixes it (`until` now, when not given); its
//! confirmation (`POST` to the same path) counts that window again and
//! acts only when it finds exactly the events and deliveries the dry run
//! counted (their [`fingerprint`]); otherwise it shows the new count.

use std::sync::Arc;

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::Response;
use axum::{Extension, Form};
use chrono::{DateTime, SecondsFormat, SubsecRound, Utc};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::super::auth::User;
use super::super::pages::{refuse, render, sign_in, signed_in, Layout};
use super::super::params::time;
use super::super::{check_post, operator, App, Caller, Refusal};
use super::{database, find};
use crate::services::subscriptions::replay::Plan;
use crate::services::subscriptions::{check_pattern, replay as service};
use crate::store::replay::Window;

/// A replay's window as a form or a query string gives it.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct ReplayForm {
    pub csrf: String,
    /// RFC 3339, `YYYY-MM-DD[THH:MM]` (UTC), or a duration ago (`24h`).
    pub since: String,
    /// Likewise; empty: now.
    pub until: String,
    /// An event type or `prefix.*`; empty: every type the subscription has.
    pub event_type: String,
    /// From the dry run: what it counted.
    pub fingerprint: String,
}

/// A time as a dry run fixes it (to the microsecond, as Postgres keeps it).
pub fn instant(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// The window `since`..`until` (empty: now) of `event_type` for
/// subscription `id`, checked; each error names its field.
pub fn window(
    id: &str,
    since: &str,
    until: &str,
    event_type: Option<&str>,
) -> Result<Window, Refusal> {
    let at = |field: &str, text: &str| {
        time(text.trim())
            .map(|t| t.trunc_subsecs(6))
            .map_err(|e| Refusal::bad(format!("{field}: {e}")))
    };
    if since.trim().is_empty() {
        return Err(Refusal::bad(
            "since: the window's start is missing (24h, or 2026-12-01T09:30:00Z)",
        ));
    }
    let since = at("since", since)?;
    let until = match until.trim() {
        "" => Utc::now().trunc_subsecs(6),
        t => at("until", t)?,
    };
    if since >= until {
        return Err(Refusal::bad("since: must be before until"));
    }
    let event_type = event_type.map(str::trim).filter(|t| !t.is_empty());
    if let Some(p) = event_type {
        check_pattern(p).map_err(|e| Refusal::bad(format!("event_type: {e}")))?;
    }
    Ok(Window {
        subscription: id.to_string(),
        since,
        until,
        event_type: event_type.map(String::from),
    })
}

/// What replaying `window` would do now. The subscription must exist and
/// be enabled (a disabled one's deliveries would be refused).
pub async fn plan(app: &App, window: Window) -> Result<Plan, Refusal> {
    let s = find(app, &window.subscription).await?;
    if s.disabled_at.is_some() {
        return Err(Refusal::new(
            StatusCode::CONFLICT,
            format!(
                "subscription {} is disabled: enable it first, or its deliveries would be refused",
                s.id
            ),
        ));
    }
    service::plan(&app.store, window).await.map_err(|e| {
        match e.downcast::<crate::store::StoreError>() {
            Ok(e) => Refusal::from(e),
            Err(e) => Refusal::bad(format!("{e:#}")),
        }
    })
}

/// What a plan counted, event by event and delivery by delivery: a
/// confirmation acts only on a plan of the same fingerprint.
pub fn fingerprint(plan: &Plan) -> String {
    let mut h = Sha256::new();
    h.update(plan.subscription.as_bytes());
    for (name, ids) in [("first", &plan.first), ("again", &plan.again)] {
        h.update(name.as_bytes());
        for id in ids {
            h.update(id.to_be_bytes());
        }
    }
    h.update((plan.on_their_way as u64).to_be_bytes());
    hex::encode(&h.finalize()[..16])
}

/// Do what `plan` counted, as `user`: (first deliveries made, deliveries
/// sent again).
pub async fn apply(app: &App, user: &User, plan: &Plan) -> Result<(u64, u64), Refusal> {
    let store = app.store.acting_as(&user.actor());
    let (made, again) = service::apply(&store, plan).await.map_err(|e| match e {
        crate::store::StoreError::Database(e) => database(&e),
        e => Refusal::from(e),
    })?;
    tracing::info!(
        user = %user.name,
        subscription = %plan.subscription,
        since = %instant(plan.since),
        until = %instant(plan.until),
        first = made,
        again,
        "console: replay"
    );
    Ok((made, again))
}

#[derive(Template)]
#[template(path = "subscription_replay.html")]
struct ReplayPage {
    layout: Layout,
    plan: Plan,
    since: String,
    until: String,
    event_type: String,
    fingerprint: String,
    /// Why this is a new count, when it is one.
    note: String,
    /// Done: (first deliveries made, sent again).
    done: Option<(u64, u64)>,
}

impl ReplayPage {
    fn to_act_on(&self) -> usize {
        self.plan.first_deliveries + self.plan.sent_again
    }

    fn skipped(&self) -> u64 {
        let (made, again) = self.done.unwrap_or_default();
        (self.to_act_on() as u64).saturating_sub(made + again)
    }
}

fn page(app: &App, caller: &Caller, plan: Plan, note: &str, done: Option<(u64, u64)>) -> Response {
    render(ReplayPage {
        layout: Layout::new(app, caller, "subscriptions"),
        since: instant(plan.since),
        until: instant(plan.until),
        event_type: plan.event_type.clone().unwrap_or_default(),
        fingerprint: fingerprint(&plan),
        note: note.to_string(),
        done,
        plan,
    })
}

/// `GET /subscriptions/{id}/replay`: the dry run.
pub async fn dry_run(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
    Path(id): Path<String>,
    Query(form): Query<ReplayForm>,
) -> Response {
    sign_in!(caller, uri);
    let counted = async {
        operator(&caller)?;
        let w = window(&id, &form.since, &form.until, Some(&form.event_type))?;
        plan(&app, w).await
    }
    .await;
    match counted {
        Ok(plan) => page(&app, &caller, plan, "", None),
        Err(r) => refuse(&app, &caller, r),
    }
}

/// `POST /subscriptions/{id}/replay`: the confirmation.
pub async fn confirm(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(form): Form<ReplayForm>,
) -> Response {
    let result = async {
        check_post(&caller, &headers, Some(&form.csrf))?;
        let user = operator(&caller)?;
        if form.until.trim().is_empty() || form.fingerprint.is_empty() {
            return Err(Refusal::bad(
                "until and fingerprint come from the dry run: start from it",
            ));
        }
        let w = window(&id, &form.since, &form.until, Some(&form.event_type))?;
        let plan = plan(&app, w).await?;
        if fingerprint(&plan) != form.fingerprint {
            return Ok((plan, None));
        }
        let done = apply(&app, &user, &plan).await?;
        Ok((plan, Some(done)))
    }
    .await;
    match result {
        Ok((plan, None)) => page(
            &app,
            &caller,
            plan,
            "What the window holds changed since the dry run (an event, or a delivery's state): \
             this is a new count, and nothing was replayed yet.",
            None,
        ),
        Ok((plan, done)) => page(&app, &caller, plan, "", done),
        Err(r) => refuse(&app, &caller, r),
    }
}

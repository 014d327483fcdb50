//! Subscriptions in the console: the list (`/subscriptions`) and one
//! subscription's page (`/subscriptions/{id}`), and what the pages and the
//! API share: the changes, each as the CLI makes it
//! (`services::subscriptions`), with their errors as refusals.
//!
//! - [`forms`]: create, disable, enable, rotate the secret.
//! - [`replay`]: a replay's dry run and its confirmation.
//!
//! A signing secret is shown once, on the page (or in the API answer) of
//! the request that made it, and never again; a header's value and a URL's
//! secrets (`outbox_providers::redact`) are on no page.

pub mod forms;
pub mod replay;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, Uri};
use axum::response::Response;
use axum::Extension;
use outbox_providers::redact::urls_in;
use outbox_providers::Secret;
use serde::Deserialize;

use super::auth::User;
use super::pages::{refuse, render, sign_in, signed_in, Helpers, Layout};
use super::{App, Caller, Refusal};
use crate::services::subscriptions::{self as service, Request};
use crate::store::subscription_pages::Delivery;
use crate::store::subscriptions::Subscription;
use crate::store::StoreError;

/// How many of its deliveries a subscription's page shows.
pub const RECENT: i64 = 50;

/// A subscription as the console shows it: its URL and last error
/// redacted; it holds no secret and, of its headers, only their names.
pub fn shown(mut s: Subscription) -> Subscription {
    s.url = urls_in(&s.url);
    s.last_error = s.last_error.as_deref().map(urls_in);
    s
}

/// enabled, disabled, paused, or failing since when (as the CLI says it).
pub fn state(s: &Subscription) -> String {
    match (&s.disabled_at, &s.failing_since) {
        (Some(_), _) => "disabled".into(),
        (None, _) if s.health == "paused" => "paused".into(),
        (None, Some(since)) => format!("failing since {}", super::view::when(*since)),
        (None, None) => "enabled".into(),
    }
}

/// The class of [`state`]'s chip.
fn state_class(s: &Subscription) -> &'static str {
    match (&s.disabled_at, &s.failing_since) {
        (Some(_), _) => "disabled",
        (None, _) if s.health == "paused" => "paused",
        (None, Some(_)) => "failing",
        (None, None) => "enabled",
    }
}

fn types(s: &Subscription) -> String {
    if s.event_types.is_empty() {
        "(every type)".into()
    } else {
        s.event_types.join(", ")
    }
}

/// The subscription `id` (shown), or 404.
pub async fn find(app: &App, id: &str) -> Result<Subscription, Refusal> {
    app.store
        .subscription(id)
        .await
        .map_err(StoreError::from)?
        .map(shown)
        .ok_or_else(|| {
            Refusal::new(
                StatusCode::NOT_FOUND,
                format!("no subscription has id {id:?}"),
            )
        })
}

/// Why this console cannot make subscriptions or rotate their secrets (no
/// sealing key, or one that does not parse), if it cannot.
pub fn key_problem(app: &App) -> Option<String> {
    match app.subscribing.subscriptions.key() {
        Ok(Some(_)) => None,
        Ok(None) => Some(
            "secret_key: this console has no [subscriptions] secret_key (nor \
             OUTBOX_RELAY__SUBSCRIPTIONS__SECRET_KEY, nor its _FILE), so it cannot make \
             subscriptions or rotate their secrets: give it the relays' sealing key"
                .into(),
        ),
        Err(e) => Some(format!("{e:#}")),
    }
}

fn no_key(app: &App) -> Result<(), Refusal> {
    match key_problem(app) {
        Some(why) => Err(Refusal::new(StatusCode::SERVICE_UNAVAILABLE, why)),
        None => Ok(()),
    }
}

/// The field a refusal's message names (`url: ...`), if any.
pub fn field_of(message: &str) -> Option<&'static str> {
    const FIELDS: [&str; 9] = [
        "url",
        "tenant",
        "event_types",
        "headers",
        "rate",
        "description",
        "grace",
        "reason",
        "secret_key",
    ];
    let (name, _) = message.split_once(": ")?;
    FIELDS.into_iter().find(|f| *f == name)
}

/// The database's failure of a change: its role may not make it (the
/// `outbox_console` role reads subscriptions only), or it could not
/// answer (logged).
pub fn database(e: &sqlx::Error) -> Refusal {
    if let sqlx::Error::Database(d) = e {
        if d.code().as_deref() == Some("42501") {
            return Refusal::new(
                StatusCode::FORBIDDEN,
                format!(
                    "the console's database role may not make this change ({}): run the console \
                     as a role that may change subscriptions",
                    d.message()
                ),
            );
        }
    }
    tracing::warn!(error = %e, "console: database error");
    Refusal::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "the database could not answer; see the console's log",
    )
}

/// A change's failure: the database's as [`database`] says; any other is
/// the request's, 400, its field named as the console's forms and the API
/// name it.
fn refused(e: anyhow::Error) -> Refusal {
    if let Some(e) = e.chain().find_map(|c| c.downcast_ref::<sqlx::Error>()) {
        return database(e);
    }
    let text = format!("{e:#}");
    let text = match text.split_once(": ") {
        Some(("event-types", rest)) => format!("event_types: {rest}"),
        Some(("header", rest)) => format!("headers: {rest}"),
        _ => text,
    };
    Refusal::bad(text)
}

/// Make the subscription `req` asks for as `user`: its id and its signing
/// secret, which nothing shows again.
pub async fn create(app: &App, user: &User, req: &Request) -> Result<(String, Secret), Refusal> {
    no_key(app)?;
    let (id, secret) = service::add(&app.store, &app.subscribing, req)
        .await
        .map_err(refused)?;
    tracing::info!(user = %user.name, subscription = %id, "console: subscription made");
    Ok((id, secret))
}

/// Disable subscription `id` (with `reason`, or one naming `user`), or
/// enable it.
pub async fn set_disabled(
    app: &App,
    user: &User,
    id: &str,
    disable: bool,
    reason: &str,
) -> Result<(), Refusal> {
    let reason = match reason.trim() {
        _ if !disable => None,
        "" => Some(format!("disabled from the console by {}", user.name)),
        r => Some(format!("{r} (console user {})", user.name)),
    };
    if reason.as_ref().is_some_and(|r| r.chars().count() > 1000) {
        return Err(Refusal::bad("reason: at most 1000 characters"));
    }
    let found = app
        .store
        .set_subscription_disabled(id, reason.as_deref())
        .await
        .map_err(|e| database(&e))?;
    if !found {
        return Err(Refusal::new(
            StatusCode::NOT_FOUND,
            format!("no subscription has id {id:?}"),
        ));
    }
    let done = if disable { "disabled" } else { "enabled" };
    tracing::info!(user = %user.name, subscription = %id, "console: subscription {done}");
    Ok(())
}

/// A new signing secret for subscription `id`; the replaced one signs as
/// well for `grace` (`24h`; `0s`: not at all).
pub async fn rotate(
    app: &App,
    user: &User,
    id: &str,
    grace: &str,
) -> Result<(Secret, Duration), Refusal> {
    let grace =
        crate::units::parse_duration(grace).map_err(|e| Refusal::bad(format!("grace: {e}")))?;
    no_key(app)?;
    let secret = service::rotate(&app.store, &app.subscribing, id, grace)
        .await
        .map_err(refused)?
        .ok_or_else(|| {
            Refusal::new(
                StatusCode::NOT_FOUND,
                format!("no subscription has id {id:?}"),
            )
        })?;
    tracing::info!(user = %user.name, subscription = %id, "console: subscription's secret rotated");
    Ok((secret, grace))
}

// ---- forms submitted once ----------------------------------------------

/// How long a form's nonce is remembered, and how many at most.
const ONCE_FOR: Duration = Duration::from_secs(3600);
const ONCE_KEPT: usize = 1000;

/// Each form's request (by user and nonce): what it made (None: at work),
/// and when it came.
type Taken = HashMap<String, (Option<String>, Instant)>;

/// Forms that make something once (a subscription, a secret): the same
/// form sent again (a double click, a reload) makes nothing more, and is
/// pointed at what the first one made.
#[derive(Debug, Clone, Default)]
pub struct Once {
    done: Arc<Mutex<Taken>>,
}

impl Once {
    fn lock(&self) -> MutexGuard<'_, Taken> {
        // its holders only touch the map: nothing is left half-changed
        self.done.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Take `nonce` for `user`'s form; `Err` when it was taken already,
    /// with the subscription its request made (None: still at work).
    pub fn take(&self, user: &User, nonce: &str) -> Result<(), Option<String>> {
        let key = format!("{}\n{nonce}", user.name);
        let mut done = self.lock();
        done.retain(|_, (_, at)| at.elapsed() < ONCE_FOR);
        if let Some((made, _)) = done.get(&key) {
            return Err(made.clone());
        }
        if done.len() >= ONCE_KEPT {
            let oldest = done
                .iter()
                .min_by_key(|(_, (_, at))| *at)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                done.remove(&k);
            }
        }
        done.insert(key, (None, Instant::now()));
        Ok(())
    }

    /// The request of `nonce` made `id`.
    pub fn made(&self, user: &User, nonce: &str, id: &str) {
        let key = format!("{}\n{nonce}", user.name);
        if let Some(entry) = self.lock().get_mut(&key) {
            entry.0 = Some(id.to_string());
        }
    }

    /// The request of `nonce` was refused: the form may be sent again.
    pub fn release(&self, user: &User, nonce: &str) {
        self.lock().remove(&format!("{}\n{nonce}", user.name));
    }
}

/// A form's nonce (random), or "" when the OS gives no randomness (the
/// form is then refused when sent).
pub fn nonce() -> String {
    super::auth::random_token().unwrap_or_default()
}

// ---- pages -------------------------------------------------------------

/// A row of the list.
pub struct Row {
    pub id: String,
    pub tenant: String,
    pub types: String,
    pub url: String,
    pub state: String,
    pub state_class: &'static str,
    pub delivered: i64,
    pub pending: i64,
    pub failed: i64,
}

impl Row {
    fn of(s: &Subscription) -> Row {
        Row {
            id: s.id.clone(),
            tenant: s.tenant.clone().unwrap_or_else(|| "—".into()),
            types: types(s),
            url: s.url.clone(),
            state: state(s),
            state_class: state_class(s),
            delivered: s.delivered,
            pending: s.pending,
            failed: s.failed,
        }
    }
}

#[derive(Template)]
#[template(path = "subscriptions.html")]
struct ListPage {
    layout: Layout,
    tenant: String,
    rows: Vec<Row>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct TenantParam {
    pub tenant: Option<String>,
}

impl TenantParam {
    pub fn tenant(&self) -> Option<&str> {
        self.tenant
            .as_deref()
            .map(str::trim)
            .filter(|t| !t.is_empty())
    }
}

/// `GET /subscriptions`.
pub async fn list(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
    Query(q): Query<TenantParam>,
) -> Response {
    sign_in!(caller, uri);
    let all = match app.store.subscriptions(q.tenant()).await {
        Ok(all) => all,
        Err(e) => return refuse(&app, &caller, StoreError::from(e).into()),
    };
    render(ListPage {
        layout: Layout::new(&app, &caller, "subscriptions"),
        tenant: q.tenant().unwrap_or("").to_string(),
        rows: all.into_iter().map(shown).map(|s| Row::of(&s)).collect(),
    })
}

#[derive(Template)]
#[template(path = "subscription.html")]
struct DetailPage {
    layout: Layout,
    s: Subscription,
    row: Row,
    headers: String,
    rate: String,
    deliveries: Vec<Delivery>,
    recent: i64,
    nonce: String,
    key_problem: Option<String>,
}
impl Helpers for DetailPage {}

/// `GET /subscriptions/{id}`.
pub async fn detail(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
    Path(id): Path<String>,
) -> Response {
    sign_in!(caller, uri);
    let s = match find(&app, &id).await {
        Ok(s) => s,
        Err(r) => return refuse(&app, &caller, r),
    };
    let deliveries = match app.store.subscription_deliveries(&id, RECENT).await {
        Ok(d) => d,
        Err(e) => return refuse(&app, &caller, e.into()),
    };
    render(DetailPage {
        layout: Layout::new(&app, &caller, "subscriptions"),
        row: Row::of(&s),
        headers: if s.header_names.is_empty() {
            "—".into()
        } else {
            s.header_names.join(", ")
        },
        rate: s.rate.map_or("—".into(), |r| format!("{r}/s")),
        deliveries,
        recent: RECENT,
        nonce: nonce(),
        key_problem: key_problem(&app),
        s,
    })
}

//! `outbox-relay console`: the operator web UI, organised around incidents.
//!
//! A process of its own (it can run under its own database role), serving
//! server-rendered pages (askama templates, which escape everything they
//! print) and the same data and actions as JSON under `/api/v1/`. Reads
//! work without JavaScript; the little there is (`static/console.js`) only
//! refreshes a bulk action's progress in place.
//!
//! - [`auth`]: sessions, logins, CSRF tokens, the same-origin check
//!   (`[console]` itself, its users and password hashes, are
//!   `config::console`).
//! - [`login`]: `/login` and `/logout`.
//! - [`params`]: the filter as query parameters.
//! - [`pages`]: the HTML pages.
//! - [`actions`]: dry run, confirmation, bulk jobs, single-intent actions.
//! - [`jobs`]: bulk actions running in batches.
//! - [`selections`]: the sets dry runs counted, until they are confirmed.
//! - [`api`]: the JSON API.
//! - [`view`]: masking, ages, chart bars.
//! - [`charts`]: the attempt charts, settled buckets kept.
//! - [`subscriptions`]: the subscriptions' pages and changes.
//!
//! Every change of intents goes through the store's operator functions,
//! the same as the CLI's, recorded in `outbox.operator_actions` as
//! `console:<user>`; a subscription's goes through
//! `services::subscriptions`, as the CLI's, and the console's log names
//! the user.

pub mod actions;
pub mod api;
pub mod auth;
pub mod charts;
pub mod jobs;
pub mod login;
pub mod pages;
pub mod params;
pub mod selections;
pub mod subscriptions;
pub mod view;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, REFERRER_POLICY, SET_COOKIE,
    X_CONTENT_TYPE_OPTIONS, X_FRAME_OPTIONS,
};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use tokio::net::TcpListener;

pub use crate::config::console::{ConsoleSection, ConsoleUser, Role};

use crate::config::HealthSettings;
use crate::config::{Config, Schedule};
use crate::kinds::Kind;
use crate::store::console::Bucket;
use crate::store::operator::Intent;
use crate::store::Store;
use auth::{Auth, User};

/// What every handler is handed.
pub struct App {
    store: Store,
    /// `[console]`.
    console: ConsoleSection,
    /// The configured schedules, parsed.
    schedules: Vec<Schedule>,
    health: HealthSettings,
    auth: Auth,
    jobs: jobs::Jobs,
    selections: selections::Selections,
    charts: charts::ChartCache,
    /// What subscriptions are made with: `[subscriptions]` (the sealing
    /// key) and `[webhook]` (the destination guard their URLs pass).
    subscribing: Config,
    /// The subscription forms already sent.
    once: subscriptions::Once,
}

impl App {
    /// The console's app, handed the sections of `config` it reads.
    pub fn new(store: Store, config: Config) -> anyhow::Result<Arc<App>> {
        let health = config.health()?;
        let schedules = config.schedules()?;
        let auth = Auth::new(&config.console);
        let subscribing = Config {
            subscriptions: config.subscriptions.clone(),
            webhook: config.webhook.clone(),
            ..Config::default()
        };
        Ok(Arc::new(App {
            store,
            console: config.console,
            schedules,
            health,
            auth,
            jobs: jobs::Jobs::default(),
            selections: selections::Selections::default(),
            charts: charts::ChartCache::default(),
            subscribing,
            once: subscriptions::Once::default(),
        }))
    }

    pub(crate) fn mask(&self) -> &[String] {
        &self.console.mask
    }

    /// `intent` with its payload and the provider's answer masked
    /// (`console.mask`) and the URLs of its webhook and its last error
    /// redacted (the one rule, `outbox_providers::redact`), as every page
    /// and API answer shows it.
    pub(crate) fn masked(&self, mut intent: Intent) -> Intent {
        intent.payload.0 = view::mask(&intent.payload.0, self.mask());
        if Kind::parse(&intent.kind) == Some(Kind::Webhook) {
            view::redact_url(&mut intent.payload.0);
        }
        intent.last_error = intent
            .last_error
            .map(|e| outbox_providers::redact::urls_in(&e));
        intent.response = intent.response.as_ref().map(|r| view::mask(r, self.mask()));
        intent
    }

    /// Attempts per minute over the last hour, and per 15 minutes over the
    /// last day.
    pub(crate) async fn attempt_charts(
        &self,
    ) -> Result<(Vec<Bucket>, Vec<Bucket>), crate::store::StoreError> {
        Ok((
            self.charts.buckets(&self.store, 3600, 60).await?,
            self.charts.buckets(&self.store, 86_400, 900).await?,
        ))
    }

    /// The search `filter` asks for, as this console reads it: a host also
    /// matches the webhook endpoints whose origin it is, and a payload
    /// filter may not name a masked field (it would let anyone who can read
    /// the console test a masked value, one guess at a time).
    pub fn search(
        &self,
        filter: &params::FilterParams,
    ) -> Result<crate::store::console::Search, String> {
        let mut search = filter.search()?;
        if let Some(host) = search.host.as_deref() {
            let host = view::host_filter(host);
            search.host_names = self
                .health
                .endpoints
                .iter()
                .filter(|(_, origin)| view::host_forms(origin).contains(&host))
                .map(|(name, _)| name.clone())
                .collect();
            search.host = Some(host);
        }
        if let Some(field) = search
            .payload
            .as_ref()
            .and_then(|p| view::masked_field_in(p, self.mask()))
        {
            return Err(format!(
                "the payload filter names {field:?}, a masked field (console.mask): it cannot be searched"
            ));
        }
        Ok(search)
    }
}

/// Who is asking (set by the gate for every request).
#[derive(Debug, Clone)]
pub struct Caller {
    /// Logged in (or `local` without login); None: must log in.
    pub user: Option<User>,
    /// The session's token and CSRF token; None for an API call without a
    /// session cookie.
    pub session: Option<(String, String)>,
    /// Authenticated by HTTP Basic (API only): no cookie, so no CSRF token.
    pub basic: bool,
}

impl Caller {
    pub fn csrf(&self) -> String {
        self.session
            .as_ref()
            .map(|(_, c)| c.clone())
            .unwrap_or_default()
    }
}

/// Why a request is refused, as a page or as JSON.
#[derive(Debug)]
pub struct Refusal {
    pub status: StatusCode,
    pub message: String,
}

impl Refusal {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Refusal {
            status,
            message: message.into(),
        }
    }

    pub fn bad(message: impl Into<String>) -> Self {
        Refusal::new(StatusCode::BAD_REQUEST, message)
    }
}

/// A refusal as JSON.
pub fn refusal(r: Refusal) -> Response {
    (
        r.status,
        axum::Json(serde_json::json!({"error": r.message})),
    )
        .into_response()
}

impl From<crate::store::StoreError> for Refusal {
    fn from(e: crate::store::StoreError) -> Self {
        use crate::store::StoreError;
        match &e {
            StoreError::NotFound(_) => Refusal::new(StatusCode::NOT_FOUND, e.to_string()),
            StoreError::InvalidState { .. } => Refusal::new(StatusCode::CONFLICT, e.to_string()),
            _ => {
                tracing::warn!(error = %e, "console: database error");
                Refusal::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the database could not answer; see the console's log",
                )
            }
        }
    }
}

/// Check a state-changing request: same origin, and either the session's
/// CSRF token or (API only) Basic credentials with a JSON body.
pub fn check_post(
    caller: &Caller,
    headers: &HeaderMap,
    token: Option<&str>,
) -> Result<(), Refusal> {
    if !auth::same_origin(headers) {
        return Err(Refusal::new(
            StatusCode::FORBIDDEN,
            "refused: the request comes from another site",
        ));
    }
    let json = headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    let header_token = headers.get("x-csrf-token").and_then(|v| v.to_str().ok());
    match (&caller.session, token.or(header_token)) {
        (Some((_, expected)), Some(given)) if auth::same_token(expected, given) => Ok(()),
        // Basic credentials, or no session on the open (loopback) console:
        // a JSON body needs a CORS preflight no other site gets through
        (None, _) if json => Ok(()),
        _ if caller.basic && json => Ok(()),
        // no session to hold a token: only the content type can vouch
        _ if caller.basic || caller.session.is_none() => Err(Refusal::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "refused: send the body as JSON with Content-Type: application/json \
             (a request without a signed-in session's form token must be JSON: \
             another site's form cannot send JSON)",
        )),
        _ => Err(Refusal::new(
            StatusCode::FORBIDDEN,
            "refused: this request carries no valid CSRF token (reload the page and try again)",
        )),
    }
}

/// The caller must be an operator.
pub fn operator(caller: &Caller) -> Result<User, Refusal> {
    match &caller.user {
        Some(u) if u.can_act() => Ok(u.clone()),
        Some(u) => Err(Refusal::new(
            StatusCode::FORBIDDEN,
            format!(
                "{} is a viewer: viewers cannot change intents, destinations or subscriptions",
                u.name
            ),
        )),
        None => Err(Refusal::new(StatusCode::UNAUTHORIZED, "log in first")),
    }
}

/// Sessions, Basic credentials and the response headers every answer carries.
async fn gate(State(app): State<Arc<App>>, mut req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    // Without login the console trusts whoever reaches it on loopback; a
    // page of another site whose name resolves to 127.0.0.1 (DNS
    // rebinding) reaches it too, but names itself in Host: only a loopback
    // name is served.
    if app.auth.open() && !auth::loopback_host(req.headers()) {
        return (
            StatusCode::MISDIRECTED_REQUEST,
            "this console has no login and answers only to a loopback address \
             (127.0.0.1, [::1] or localhost) in the Host header",
        )
            .into_response();
    }
    let api = path.starts_with("/api/");
    let mut set_cookie = None;
    let caller = if path.starts_with("/static/") {
        Caller {
            user: None,
            session: None,
            basic: false,
        }
    } else if api && auth::cookie(req.headers(), auth::COOKIE_NAME).is_none() {
        // an API client: Basic credentials, or nothing (open console only)
        match app.auth.basic(req.headers()).await {
            Some(Ok(user)) => Caller {
                user: Some(user),
                session: None,
                basic: true,
            },
            Some(Err(_)) => {
                return refusal(Refusal::new(
                    StatusCode::UNAUTHORIZED,
                    "wrong user name or password",
                ))
            }
            None => Caller {
                user: app.auth.open().then(|| User {
                    name: "local".into(),
                    role: Role::Operator,
                }),
                session: None,
                basic: false,
            },
        }
    } else {
        let Some(visit) = app.auth.visit(req.headers()) else {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                "the console cannot make a session: the OS random number generator failed",
            )
                .into_response();
        };
        if visit.fresh {
            set_cookie = Some(app.auth.set_cookie(&visit.token));
        }
        Caller {
            user: visit.session.user.clone(),
            session: Some((visit.token, visit.session.csrf)),
            basic: false,
        }
    };
    req.extensions_mut().insert(caller);
    let mut response = next.run(req).await;
    let h = response.headers_mut();
    if let Some(cookie) = set_cookie {
        h.append(SET_COOKIE, cookie);
    }
    h.insert(
        CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
             connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    if !path.starts_with("/static/") {
        h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}

/// The console's routes.
pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/", get(pages::overview))
        .route("/intents", get(pages::intents))
        .route("/intents/{id}", get(pages::intent))
        .route("/failures", get(pages::failures))
        .route("/schedules", get(pages::schedules))
        .route("/lookup", get(pages::lookup))
        .route("/destinations", get(pages::destinations))
        .route("/destinations/pause", post(actions::pause))
        .route("/destinations/resume", post(actions::resume))
        .route(
            "/subscriptions",
            get(subscriptions::list).post(subscriptions::forms::made),
        )
        .route("/subscriptions/new", get(subscriptions::forms::new))
        .route("/subscriptions/{id}", get(subscriptions::detail))
        .route(
            "/subscriptions/{id}/disable",
            post(subscriptions::forms::disable),
        )
        .route(
            "/subscriptions/{id}/enable",
            post(subscriptions::forms::enable),
        )
        .route(
            "/subscriptions/{id}/rotate",
            post(subscriptions::forms::rotated),
        )
        .route(
            "/subscriptions/{id}/replay",
            get(subscriptions::replay::dry_run).post(subscriptions::replay::confirm),
        )
        .route("/actions", get(actions::recent).post(actions::confirm))
        .route("/actions/new", get(actions::dry_run))
        .route("/actions/{job}", get(actions::progress))
        .route("/login", get(login::login_form).post(login::login))
        .route("/logout", post(login::logout))
        .route("/static/console.css", get(pages::css))
        .route("/static/console.js", get(pages::js))
        .nest("/api/v1", api::router())
        .fallback(pages::not_found)
        .layer(axum::middleware::from_fn_with_state(app.clone(), gate))
        .with_state(app)
}

/// Serve the console on `listener` until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    app: Arc<App>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(app))
        .with_graceful_shutdown(shutdown)
        .await
}

/// Whether the console may listen on `addr` with these settings: without
/// users, only on loopback.
pub fn check_exposure(section: &ConsoleSection, addr: SocketAddr) -> anyhow::Result<()> {
    if section.users.is_empty() && !addr.ip().is_loopback() {
        anyhow::bail!(
            "console.addr {addr} is not a loopback address and no [[console.users]] are configured: \
             anyone who can reach it could act as an operator. Add users (with password hashes from \
             `outbox-relay console --hash-password`) or listen on 127.0.0.1"
        );
    }
    Ok(())
}

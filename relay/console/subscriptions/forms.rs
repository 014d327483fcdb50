//! The forms that change a subscription: create (`/subscriptions/new`,
//! then `POST /subscriptions`), disable, enable, and rotate its secret.
//! Each POST carries the session's CSRF token and is an operator's; those
//! that make a secret show it on their answer's page, once, and carry a
//! nonce so that the same form sent twice makes one.

use std::sync::Arc;

use askama::Template;
use axum::extract::{Path, State};
use axum::http::header::LOCATION;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Form};
use serde::Deserialize;

use super::super::pages::{refuse, render, sign_in, signed_in, Layout};
use super::super::{check_post, operator, App, Caller, Refusal};
use super::{create, field_of, key_problem, nonce, rotate, set_disabled};
use crate::services::subscriptions::Request;

/// The create form's fields, as typed (no `Debug`: its headers may hold a
/// credential).
#[derive(Clone, Default, Deserialize)]
#[serde(default)]
pub struct NewForm {
    pub csrf: String,
    pub nonce: String,
    pub url: String,
    pub tenant: String,
    /// Exact names or `prefix.*`, separated by commas, spaces or lines.
    pub event_types: String,
    /// One `Name: value` a line.
    pub headers: String,
    pub rate: String,
    pub description: String,
}

fn given(text: &str) -> Option<String> {
    Some(text.trim())
        .filter(|t| !t.is_empty())
        .map(String::from)
}

impl NewForm {
    /// The request the form makes.
    pub fn request(&self) -> Request {
        Request {
            url: self.url.trim().to_string(),
            tenant: given(&self.tenant),
            event_types: self
                .event_types
                .split(|c: char| c == ',' || c.is_whitespace())
                .filter(|t| !t.is_empty())
                .map(String::from)
                .collect(),
            headers: self
                .headers
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(String::from)
                .collect(),
            rate: given(&self.rate),
            description: given(&self.description),
        }
    }
}

#[derive(Template)]
#[template(path = "subscription_new.html")]
struct NewPage {
    layout: Layout,
    form: NewForm,
    nonce: String,
    error: String,
    field: &'static str,
    key_problem: Option<String>,
}

fn new_page(app: &App, caller: &Caller, form: NewForm, refusal: Option<Refusal>) -> Response {
    let (status, error) =
        refusal.map_or((StatusCode::OK, String::new()), |r| (r.status, r.message));
    let nonce = if form.nonce.is_empty() {
        nonce()
    } else {
        form.nonce.clone()
    };
    let mut response = render(NewPage {
        layout: Layout::new(app, caller, "subscriptions"),
        field: field_of(&error).unwrap_or(""),
        key_problem: key_problem(app),
        error,
        nonce,
        form,
    });
    *response.status_mut() = status;
    response
}

/// `GET /subscriptions/new`: the create form.
pub async fn new(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
) -> Response {
    sign_in!(caller, uri);
    if let Err(r) = operator(&caller) {
        return refuse(&app, &caller, r);
    }
    new_page(&app, &caller, NewForm::default(), None)
}

#[derive(Template)]
#[template(path = "subscription_secret.html")]
struct SecretPage {
    layout: Layout,
    id: String,
    /// Made (else rotated).
    made: bool,
    secret: String,
    grace: String,
}

fn see(path: String) -> Response {
    (StatusCode::SEE_OTHER, [(LOCATION, path)]).into_response()
}

/// `POST /subscriptions`: make it, and show its secret once; a refused
/// field shows the form again, as typed, with the error naming it.
pub async fn made(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Form(form): Form<NewForm>,
) -> Response {
    if let Err(r) = check_post(&caller, &headers, Some(&form.csrf)) {
        return refuse(&app, &caller, r);
    }
    let user = match operator(&caller) {
        Ok(u) => u,
        Err(r) => return refuse(&app, &caller, r),
    };
    if form.nonce.len() < 16 {
        return refuse(
            &app,
            &caller,
            Refusal::bad("the form has no nonce: open it again (/subscriptions/new)"),
        );
    }
    // sent again (a double click, a reload): what the first one made
    if let Err(made) = app.once.take(&user, &form.nonce) {
        return see(made.map_or("/subscriptions".into(), |id| format!("/subscriptions/{id}")));
    }
    match create(&app, &user, &form.request()).await {
        Ok((id, secret)) => {
            app.once.made(&user, &form.nonce, &id);
            render(SecretPage {
                layout: Layout::new(&app, &caller, "subscriptions"),
                id,
                made: true,
                secret: secret.expose().to_string(),
                grace: String::new(),
            })
        }
        Err(r) => {
            app.once.release(&user, &form.nonce);
            new_page(&app, &caller, form, Some(r))
        }
    }
}

/// The disable, enable and rotate forms' fields.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ChangeForm {
    pub csrf: String,
    pub reason: String,
    pub grace: String,
    pub nonce: String,
}

async fn disable_or_enable(
    app: Arc<App>,
    caller: Caller,
    headers: HeaderMap,
    id: String,
    form: ChangeForm,
    disable: bool,
) -> Response {
    if let Err(r) = check_post(&caller, &headers, Some(&form.csrf)) {
        return refuse(&app, &caller, r);
    }
    let user = match operator(&caller) {
        Ok(u) => u,
        Err(r) => return refuse(&app, &caller, r),
    };
    match set_disabled(&app, &user, &id, disable, &form.reason).await {
        Ok(()) => see(format!("/subscriptions/{id}")),
        Err(r) => refuse(&app, &caller, r),
    }
}

/// `POST /subscriptions/{id}/disable`.
pub async fn disable(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(form): Form<ChangeForm>,
) -> Response {
    disable_or_enable(app, caller, headers, id, form, true).await
}

/// `POST /subscriptions/{id}/enable`.
pub async fn enable(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(form): Form<ChangeForm>,
) -> Response {
    disable_or_enable(app, caller, headers, id, form, false).await
}

/// `POST /subscriptions/{id}/rotate`: a new secret, shown once.
pub async fn rotated(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(form): Form<ChangeForm>,
) -> Response {
    if let Err(r) = check_post(&caller, &headers, Some(&form.csrf)) {
        return refuse(&app, &caller, r);
    }
    let user = match operator(&caller) {
        Ok(u) => u,
        Err(r) => return refuse(&app, &caller, r),
    };
    if form.nonce.len() < 16 {
        return refuse(
            &app,
            &caller,
            Refusal::bad("the form has no nonce: open the subscription's page again"),
        );
    }
    // sent twice, it would replace the secret it just made, and the one
    // still signing for the grace window with it
    if app.once.take(&user, &form.nonce).is_err() {
        return see(format!("/subscriptions/{id}"));
    }
    let grace = if form.grace.trim().is_empty() {
        "24h"
    } else {
        form.grace.trim()
    };
    match rotate(&app, &user, &id, grace).await {
        Ok((secret, grace)) => {
            app.once.made(&user, &form.nonce, &id);
            render(SecretPage {
                layout: Layout::new(&app, &caller, "subscriptions"),
                id,
                made: false,
                secret: secret.expose().to_string(),
                grace: humantime::format_duration(grace).to_string(),
            })
        }
        Err(r) => {
            app.once.release(&user, &form.nonce);
            refuse(&app, &caller, r)
        }
    }
}

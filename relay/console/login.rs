//! `/login` and `/logout`: the form, the password check, the session
//! cookie, and the way back to the page the visitor came from (only ever a
//! path on this site).

use std::sync::Arc;

use askama::Template;
use axum::extract::{Query, State};
use axum::http::header::{LOCATION, SET_COOKIE};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Form};
use serde::Deserialize;

use super::auth::LoginError;
use super::pages::{refuse, render, Layout};
use super::{check_post, App, Caller};

#[derive(Template)]
#[template(path = "login.html")]
struct LoginPage {
    layout: Layout,
    next: String,
    failure: String,
}

#[derive(Debug, Default, Deserialize)]
pub struct NextParam {
    #[serde(default)]
    pub next: String,
}

/// Only a path on this site: never `//host`, a scheme, a backslash, or a
/// control or space character (a browser drops tabs and newlines from a
/// Location, which can turn `/\t/host` into `//host`).
fn local_path(next: &str) -> String {
    let plain = next.chars().all(|c| c.is_ascii_graphic() && c != '\\');
    if plain && next.starts_with('/') && !next.starts_with("//") {
        next.to_string()
    } else {
        "/".into()
    }
}

pub async fn login_form(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<NextParam>,
) -> Response {
    if caller.user.is_some() {
        return (StatusCode::SEE_OTHER, [(LOCATION, local_path(&q.next))]).into_response();
    }
    render(LoginPage {
        layout: Layout::new(&app, &caller, ""),
        next: local_path(&q.next),
        failure: String::new(),
    })
}

#[derive(Debug, Default, Deserialize)]
pub struct LoginForm {
    #[serde(default)]
    user: String,
    #[serde(default)]
    password: String,
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    next: String,
}

pub async fn login(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Response {
    if let Err(r) = check_post(&caller, &headers, Some(&form.csrf)) {
        return refuse(&app, &caller, r);
    }
    let old = caller
        .session
        .as_ref()
        .map(|(t, _)| t.clone())
        .unwrap_or_default();
    match app.auth.login(&old, &form.user, &form.password).await {
        Ok((token, _)) => {
            tracing::info!(user = %form.user, "console: logged in");
            (
                StatusCode::SEE_OTHER,
                [
                    (LOCATION, local_path(&form.next)),
                    (
                        SET_COOKIE,
                        app.auth
                            .set_cookie(&token)
                            .to_str()
                            .unwrap_or("")
                            .to_string(),
                    ),
                ],
            )
                .into_response()
        }
        Err(e) => {
            tracing::info!(user = %form.user, "console: a login failed");
            let failure = match e {
                LoginError::Wrong => "Wrong user name or password.",
                LoginError::LockedOut => "Too many failed logins for this user: wait a minute.",
                LoginError::Busy => "The console is busy checking other logins: try again.",
            };
            let mut r = render(LoginPage {
                layout: Layout::new(&app, &caller, ""),
                next: local_path(&form.next),
                failure: failure.into(),
            });
            *r.status_mut() = StatusCode::UNAUTHORIZED;
            r
        }
    }
}

#[derive(Debug, Default, Deserialize)]
pub struct CsrfForm {
    #[serde(default)]
    pub csrf: String,
}

pub async fn logout(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Form(form): Form<CsrfForm>,
) -> Response {
    if let Err(r) = check_post(&caller, &headers, Some(&form.csrf)) {
        return refuse(&app, &caller, r);
    }
    if let Some((token, _)) = &caller.session {
        app.auth.logout(token);
    }
    (StatusCode::SEE_OTHER, [(LOCATION, "/login")]).into_response()
}

#[cfg(test)]
mod tests {
    use super::local_path;

    #[test]
    fn a_login_redirects_only_within_the_site() {
        assert_eq!(local_path("/intents?state=dead"), "/intents?state=dead");
        for bad in [
            "//evil.example",
            "/\t/evil.example",
            "/\\evil.example",
            "https://evil.example",
            "/\n/x",
            "",
            "intents",
            "/é",
        ] {
            assert_eq!(local_path(bad), "/", "{bad:?}");
        }
    }
}

//! Who is asking, and may they: sessions, logins, CSRF tokens, the
//! same-origin check, and HTTP Basic for the JSON API.
//!
//! - A session is a random 256-bit token in an `HttpOnly`, `SameSite=Strict`
//!   cookie; the server keeps the session (user, role, CSRF token, expiry)
//!   in memory, so a restart logs everyone out. Every visitor gets one, so
//!   that the login form has a CSRF token too; logging in replaces it (no
//!   session fixation).
//! - Without `[[console.users]]` (loopback only) every session is the
//!   operator `local`.
//! - Every POST must carry the session's CSRF token (form field `csrf` or
//!   header `x-csrf-token`) and, when the browser says where it comes from
//!   (`Origin`, `Sec-Fetch-Site`), come from this origin. The API may
//!   instead authenticate with HTTP Basic (no cookie, so no CSRF token),
//!   and then must send JSON, which a cross-site form cannot.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::http::header::{COOKIE, HOST, ORIGIN};
use axum::http::{HeaderMap, HeaderValue};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::console::{verify_password, ConsoleSection, ConsoleUser, Role};

/// The session cookie's name.
pub const COOKIE_NAME: &str = "outbox_console";
/// Sessions kept at most; past it, visitors who never logged in go first.
const MAX_SESSIONS: usize = 10_000;
/// Failed logins per user name within [`LOCKOUT`] before it is refused for that long.
const MAX_FAILURES: u32 = 5;
/// Unknown user names whose failures are remembered (the oldest is
/// forgotten past it): they are locked out like configured names, so that
/// a lockout does not tell which names exist, but no number of them can
/// lock out a configured name.
const MAX_STRANGERS: usize = 10_000;
const LOCKOUT: Duration = Duration::from_secs(60);
/// How long a verified Basic credential is remembered (Argon2 is slow on purpose).
const BASIC_CACHE: Duration = Duration::from_secs(300);
/// How long a password check may wait for its turn before it is refused.
const CHECK_WAIT: Duration = Duration::from_secs(5);

/// A logged-in user (or `local`, without login).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub role: Role,
}

impl User {
    /// How operator actions record this user.
    pub fn actor(&self) -> String {
        format!("console:{}", self.name)
    }

    pub fn can_act(&self) -> bool {
        self.role == Role::Operator
    }
}

#[derive(Debug, Clone)]
pub struct Session {
    pub user: Option<User>,
    pub csrf: String,
    expires: Instant,
    /// Made by a login (not a visitor's, nor the open console's `local`).
    logged_in: bool,
}

/// The request's session: its token, and what it holds.
#[derive(Debug, Clone)]
pub struct Visit {
    pub token: String,
    pub session: Session,
    /// The session is new: the response must set its cookie.
    pub fresh: bool,
}

#[derive(Debug, Default)]
struct State {
    sessions: HashMap<String, Session>,
    /// Failed logins of configured user names (as many entries as users).
    failures: HashMap<String, (u32, Instant)>,
    /// Failed logins of other names, at most [`MAX_STRANGERS`].
    strangers: HashMap<String, (u32, Instant)>,
    basic: HashMap<[u8; 32], (User, Instant)>,
}

/// The console's authority: its users and sessions.
#[derive(Debug, Clone)]
pub struct Auth {
    /// Password checks at once (each Argon2 check takes 19 MiB and a core
    /// for tens of milliseconds): more wait, up to [`CHECK_WAIT`].
    checks: Arc<tokio::sync::Semaphore>,
    users: Arc<Vec<ConsoleUser>>,
    ttl: Duration,
    secure: bool,
    state: Arc<Mutex<State>>,
}

/// Why a login failed.
#[derive(Debug, PartialEq, Eq)]
pub enum LoginError {
    Wrong,
    LockedOut,
    /// Too many password checks are waiting: try again shortly.
    Busy,
}

impl Auth {
    pub fn new(section: &ConsoleSection) -> Self {
        Auth {
            checks: Arc::new(tokio::sync::Semaphore::new(2)),
            users: Arc::new(section.users.clone()),
            ttl: section.session_ttl.0,
            secure: section.secure_cookies,
            state: Arc::new(Mutex::new(State::default())),
        }
    }

    /// No users configured: no login (the server refuses this off loopback).
    pub fn open(&self) -> bool {
        self.users.is_empty()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // its holders only touch maps: a panic cannot leave them half-changed
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new session, or None when the OS gives no randomness for its tokens.
    fn new_session(&self, user: Option<User>) -> Option<(String, Session)> {
        let logged_in = user.is_some();
        let user = user.or_else(|| {
            self.open().then(|| User {
                name: "local".into(),
                role: Role::Operator,
            })
        });
        let session = Session {
            user,
            csrf: random_token()?,
            expires: Instant::now() + self.ttl,
            logged_in,
        };
        let token = random_token()?;
        let mut state = self.lock();
        if state.sessions.len() >= MAX_SESSIONS {
            let now = Instant::now();
            state.sessions.retain(|_, s| s.expires > now);
        }
        if state.sessions.len() >= MAX_SESSIONS {
            // full of live sessions: the oldest tenth of the visitors' go
            // first (a flood of cookie-less requests), then the oldest logins
            let mut by_age: Vec<(bool, Instant, String)> = state
                .sessions
                .iter()
                .map(|(t, s)| (s.logged_in, s.expires, t.clone()))
                .collect();
            by_age.sort();
            for (_, _, t) in by_age.into_iter().take(MAX_SESSIONS / 10) {
                state.sessions.remove(&t);
            }
        }
        state.sessions.insert(token.clone(), session.clone());
        Some((token, session))
    }

    /// The session the request's cookie names, or a new one.
    /// None: no new session can be made (see [`random_token`]).
    pub fn visit(&self, headers: &HeaderMap) -> Option<Visit> {
        if let Some(token) = cookie(headers, COOKIE_NAME) {
            let state = self.lock();
            if let Some(s) = state.sessions.get(&token) {
                if s.expires > Instant::now() {
                    return Some(Visit {
                        token,
                        session: s.clone(),
                        fresh: false,
                    });
                }
            }
        }
        let (token, session) = self.new_session(None)?;
        Some(Visit {
            token,
            session,
            fresh: true,
        })
    }

    /// Check a user name and password; on success the old session is
    /// dropped and a new one (new token, new CSRF token) returned.
    pub async fn login(
        &self,
        old_token: &str,
        name: &str,
        password: &str,
    ) -> Result<(String, Session), LoginError> {
        self.admit(name)?;
        let user = self.users.iter().find(|u| u.name == name).cloned();
        // an unknown name costs the same time as a wrong password
        let hash = user
            .as_ref()
            .map(|u| u.password_hash.expose().to_string())
            .unwrap_or_else(|| DUMMY_HASH.to_string());
        let password = password.to_string();
        let Ok(Ok(_permit)) =
            tokio::time::timeout(CHECK_WAIT, self.checks.clone().acquire_owned()).await
        else {
            return Err(LoginError::Busy);
        };
        let ok = tokio::task::spawn_blocking(move || verify_password(&password, &hash))
            .await
            .unwrap_or(false);
        match user.filter(|_| ok) {
            Some(u) => {
                let mut state = self.lock();
                state.failures.remove(name);
                state.sessions.remove(old_token);
                drop(state);
                self.new_session(Some(User {
                    name: u.name,
                    role: u.role,
                }))
                .ok_or(LoginError::Busy)
            }
            None => Err(LoginError::Wrong),
        }
    }

    /// Count a login attempt of `name` before its password is checked, so
    /// that parallel guesses cannot all pass the lockout while the first is
    /// being verified: LockedOut when `name` failed [`MAX_FAILURES`] times
    /// within [`LOCKOUT`]. A configured name is counted apart from all
    /// others, so failures of other names never lock it out; other names
    /// are remembered up to [`MAX_STRANGERS`], the oldest forgotten first.
    fn admit(&self, name: &str) -> Result<(), LoginError> {
        let configured = self.users.iter().any(|u| u.name == name);
        let mut state = self.lock();
        let now = Instant::now();
        let counts = if configured {
            &mut state.failures
        } else {
            let strangers = &mut state.strangers;
            if strangers.len() >= MAX_STRANGERS && !strangers.contains_key(name) {
                strangers.retain(|_, (_, t)| t.elapsed() < LOCKOUT);
                if strangers.len() >= MAX_STRANGERS {
                    let oldest = strangers
                        .iter()
                        .min_by_key(|(_, (_, t))| *t)
                        .map(|(n, _)| n.clone());
                    if let Some(n) = oldest {
                        strangers.remove(&n);
                    }
                }
            }
            strangers
        };
        let entry = counts.entry(name.to_string()).or_insert((0, now));
        if entry.1.elapsed() >= LOCKOUT {
            *entry = (0, now);
        }
        if entry.0 >= MAX_FAILURES {
            return Err(LoginError::LockedOut);
        }
        entry.0 += 1;
        entry.1 = now;
        Ok(())
    }

    pub fn logout(&self, token: &str) {
        self.lock().sessions.remove(token);
    }

    /// HTTP Basic credentials (`Authorization: Basic ...`), for the API.
    pub async fn basic(&self, headers: &HeaderMap) -> Option<Result<User, LoginError>> {
        let value = headers
            .get(axum::http::header::AUTHORIZATION)?
            .to_str()
            .ok()?;
        let encoded = value.strip_prefix("Basic ")?;
        let decoded = base64_decode(encoded.trim())?;
        let text = String::from_utf8(decoded).ok()?;
        let (name, password) = text.split_once(':')?;
        let digest: [u8; 32] = Sha256::digest(text.as_bytes()).into();
        {
            let state = self.lock();
            if let Some((user, at)) = state.basic.get(&digest) {
                if at.elapsed() < BASIC_CACHE {
                    return Some(Ok(user.clone()));
                }
            }
        }
        let result = self.login("", name, password).await;
        let (token, session) = match result {
            Ok(r) => r,
            Err(e) => return Some(Err(e)),
        };
        self.logout(&token);
        let user = session.user?;
        let mut state = self.lock();
        state.basic.retain(|_, (_, at)| at.elapsed() < BASIC_CACHE);
        if state.basic.len() < MAX_SESSIONS {
            state.basic.insert(digest, (user.clone(), Instant::now()));
        }
        Some(Ok(user))
    }

    /// The `Set-Cookie` value for a session token.
    pub fn set_cookie(&self, token: &str) -> HeaderValue {
        let secure = if self.secure { "; Secure" } else { "" };
        HeaderValue::from_str(&format!(
            "{COOKIE_NAME}={token}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}{secure}",
            self.ttl.as_secs()
        ))
        // a token is hex (random_token): were it not, the cookie is cleared
        .unwrap_or_else(|_| HeaderValue::from_static("outbox_console=; Path=/; Max-Age=0"))
    }
}

/// A hash no password matches in practice, verified for unknown user names.
const DUMMY_HASH: &str =
    "$argon2id$v=19$m=19456,t=2,p=1$c29tZXNhbHRzb21lc2FsdA$RdescudvJCsgt3ub+b+dWRWJTmaaJObG4mDGTxzTQHo";

/// 32 random bytes from the OS, hex; None (and a log line) when the OS
/// gives none: without its randomness there is no safe token, and the
/// request that wanted one is refused.
pub fn random_token() -> Option<String> {
    let mut bytes = [0u8; 32];
    match getrandom::fill(&mut bytes) {
        Ok(()) => Some(hex::encode(bytes)),
        Err(e) => {
            tracing::error!(error = %e, "console: the OS random number generator failed");
            None
        }
    }
}

/// Constant-time equality of two tokens.
pub fn same_token(a: &str, b: &str) -> bool {
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

/// The named cookie's value.
pub fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_string())
}

/// Whether a state-changing request comes from this origin, as far as the
/// browser says: `Sec-Fetch-Site` must be `same-origin` (or `none`, typed by
/// the user), and `Origin`, when sent, must be this host. A client that
/// sends neither (curl, a script) is judged by its token alone.
pub fn same_origin(headers: &HeaderMap) -> bool {
    if let Some(site) = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()) {
        if site != "same-origin" && site != "none" {
            return false;
        }
    }
    match headers.get(ORIGIN).and_then(|v| v.to_str().ok()) {
        None => true,
        Some(origin) => {
            let host = headers
                .get(HOST)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            !host.is_empty()
                && (origin == format!("http://{host}") || origin == format!("https://{host}"))
        }
    }
}

/// Whether the request's Host names this machine's loopback (127.0.0.0/8,
/// [::1] or localhost, any port).
pub fn loopback_host(headers: &HeaderMap) -> bool {
    let Some(host) = headers.get(HOST).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(n, port)| {
            if port.chars().all(|c| c.is_ascii_digit()) {
                n
            } else {
                host
            }
        }),
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn base64_decode(text: &str) -> Option<Vec<u8>> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.decode(text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn the_origin_check_refuses_other_sites() {
        assert!(same_origin(&headers(&[])));
        assert!(same_origin(&headers(&[
            ("host", "127.0.0.1:9188"),
            ("origin", "http://127.0.0.1:9188")
        ])));
        assert!(!same_origin(&headers(&[
            ("host", "127.0.0.1:9188"),
            ("origin", "http://evil.example")
        ])));
        assert!(!same_origin(&headers(&[("sec-fetch-site", "cross-site")])));
        assert!(!same_origin(&headers(&[("sec-fetch-site", "same-site")])));
        assert!(same_origin(&headers(&[("sec-fetch-site", "same-origin")])));
        assert!(
            !same_origin(&headers(&[("origin", "http://127.0.0.1:9188")])),
            "no host"
        );
    }

    #[test]
    fn only_loopback_names_are_loopback_hosts() {
        for ok in [
            "127.0.0.1:9188",
            "127.1.2.3",
            "localhost:80",
            "LOCALHOST",
            "[::1]:9188",
            "[::1]",
        ] {
            assert!(loopback_host(&headers(&[("host", ok)])), "{ok}");
        }
        for bad in [
            "evil.example:9188",
            "127.0.0.1.evil.example",
            "10.0.0.1:9188",
            "[::2]:1",
            "localhost.evil",
        ] {
            assert!(!loopback_host(&headers(&[("host", bad)])), "{bad}");
        }
        assert!(!loopback_host(&headers(&[])));
    }

    #[test]
    fn cookies_and_tokens() {
        let h = headers(&[("cookie", "a=1; outbox_console=abc; b=2")]);
        assert_eq!(cookie(&h, COOKIE_NAME).as_deref(), Some("abc"));
        assert_eq!(cookie(&h, "c"), None);
        assert!(same_token("abc", "abc"));
        assert!(!same_token("abc", "abd"));
        assert!(!same_token("abc", "ab"));
        assert_eq!(random_token().unwrap().len(), 64);
        assert_ne!(random_token(), random_token());
        assert_eq!(base64_decode("YWxpY2U6cHc=").unwrap(), b"alice:pw");
        assert!(base64_decode("**").is_none());
    }

    #[tokio::test]
    async fn no_number_of_other_names_locks_out_a_user_and_five_failures_do() {
        let section = ConsoleSection {
            users: vec![ConsoleUser {
                name: "alice".into(),
                role: Role::Operator,
                password_hash: outbox_providers::Secret::new(
                    crate::config::console::hash_password("alice-password-1").unwrap(),
                ),
            }],
            ..ConsoleSection::default()
        };
        let auth = Auth::new(&section);
        // what 10,050 Basic-auth requests with unknown names count
        for i in 0..MAX_STRANGERS + 50 {
            assert_eq!(auth.admit(&format!("nobody-{i}")), Ok(()), "{i}");
        }
        assert!(auth.lock().strangers.len() <= MAX_STRANGERS, "bounded");
        assert!(
            auth.login("", "alice", "alice-password-1").await.is_ok(),
            "alice's correct password still works"
        );
        // an unknown name is locked out like a known one (no hint which exist)
        for _ in 0..MAX_FAILURES {
            assert_eq!(auth.admit("mallory"), Ok(()));
        }
        assert_eq!(auth.admit("mallory"), Err(LoginError::LockedOut));
        // five wrong passwords lock alice out, her right one included
        for _ in 0..MAX_FAILURES {
            assert_eq!(
                auth.login("", "alice", "wrong").await.err(),
                Some(LoginError::Wrong)
            );
        }
        assert_eq!(
            auth.login("", "alice", "alice-password-1").await.err(),
            Some(LoginError::LockedOut)
        );
    }

    #[test]
    fn the_dummy_hash_parses() {
        assert!(argon2::password_hash::PasswordHash::new(DUMMY_HASH).is_ok());
    }
}

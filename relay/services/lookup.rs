//! `GET /v1/intents/{key}` on the metrics listener: did this operation
//! happen? Read-only, from the live table or the ledger, so a client whose
//! retry window has closed can ask instead of retrying blindly.
//!
//! Who may ask: anyone who can reach `relay.metrics_addr`, unless
//! `relay.lookup_token` is set (then `Authorization: Bearer <token>`,
//! compared in constant time) or `relay.lookup = false` (then the path is
//! 404 like any unknown one). An intent is found by its exact key only,
//! never by its numeric id, so the ids cannot be walked to list intents.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, MethodRouter};
use outbox_providers::Secret;
use serde_json::json;

use crate::config::RelaySection;
use crate::store::operator::Known;
use crate::store::{Store, StoreError};

/// Whether the endpoint answers, and to whom.
#[derive(Debug, Clone)]
pub struct Access {
    /// `relay.lookup`: false turns the endpoint off.
    pub enabled: bool,
    /// `relay.lookup_token`: when set, requests must carry it as a bearer
    /// token. A [`Secret`], so it never reaches a log line.
    pub token: Option<Secret>,
}

impl Access {
    pub fn from_config(relay: &RelaySection) -> Self {
        Access {
            enabled: relay.lookup,
            token: relay.lookup_token.clone(),
        }
    }

    /// Anyone who can reach `bound` from another host may ask.
    pub fn open_beyond_this_host(&self, bound: SocketAddr) -> bool {
        self.enabled && self.token.is_none() && !bound.ip().is_loopback()
    }

    /// For the start-up log: off, behind the token, or open.
    pub fn describe(&self, bound: SocketAddr) -> &'static str {
        match (self.enabled, &self.token) {
            (false, _) => "off (relay.lookup = false)",
            (true, Some(_)) => "behind the bearer token (relay.lookup_token)",
            (true, None) if !self.open_beyond_this_host(bound) => "open to this host",
            (true, None) => {
                "open to anyone who can reach this address: set relay.lookup_token \
                 (OUTBOX_RELAY_LOOKUP_TOKEN) or relay.lookup = false"
            }
        }
    }
}

struct Lookup {
    store: Store,
    access: Access,
}

/// The route's handler with its own state, for any router's state `S`.
pub fn route<S: Clone + Send + Sync + 'static>(store: Store, access: Access) -> MethodRouter<S> {
    get(answer).with_state(Arc::new(Lookup { store, access }))
}

async fn answer(
    State(lookup): State<Arc<Lookup>>,
    headers: HeaderMap,
    Path(key): Path<String>,
) -> Response {
    if !lookup.access.enabled {
        return StatusCode::NOT_FOUND.into_response();
    }
    if let Some(token) = &lookup.access.token {
        if !authorized(&headers, token) {
            return (
                StatusCode::UNAUTHORIZED,
                [
                    (WWW_AUTHENTICATE, "Bearer"),
                    (CONTENT_TYPE, "application/json"),
                ],
                json!({"error": "this endpoint needs Authorization: Bearer <relay.lookup_token>"})
                    .to_string(),
            )
                .into_response();
        }
    }
    let mut body = match lookup.store.lookup_key(&key).await {
        // `effect_happened`: a provider answered success, even where the
        // intent is not delivered (cancelled while that request was in
        // flight); `effect_at` is when
        Ok(Known::Live(i)) => json!({
            "source": "live", "key": i.key, "id": i.id, "kind": i.kind, "state": i.state,
            "attempts": i.attempts, "provider_ref": i.provider_ref,
            "last_error": i.last_error.map(|e| outbox_providers::redact::urls_in(&e)),
            "created_at": i.created_at, "updated_at": i.updated_at, "delivered_at": i.delivered_at,
            "effect_happened": i.state == crate::state::IntentState::Delivered || i.effect_at.is_some(),
            "effect_at": i.effect_at.or(i.delivered_at),
        }),
        // the ledger remembers whether the effect happened, and when (its
        // `last_error` is redacted as read: `Store::lookup_key`)
        Ok(Known::Ledger(e)) => json!({
            "source": "ledger", "key": e.key, "id": e.intent_id, "kind": e.kind, "state": e.state,
            "provider_ref": e.provider_ref, "last_error": e.last_error, "created_at": e.created_at,
            "completed_at": e.completed_at, "purged_at": e.purged_at,
            "effect_happened": e.effect().is_some(), "effect_at": e.effect(),
        }),
        Err(StoreError::NotFound(_)) => {
            return (
                StatusCode::NOT_FOUND,
                [(CONTENT_TYPE, "application/json")],
                json!({"error": "no intent has this key", "key": key}).to_string(),
            )
                .into_response()
        }
        Err(err) => {
            // the database's words stay in the log, not in an answer to
            // whoever asked
            tracing::warn!(error = %err, "intent lookup failed");
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                [(CONTENT_TYPE, "application/json")],
                json!({"error": "the database did not answer"}).to_string(),
            )
                .into_response();
        }
    };
    // an event: which subscriptions got it, and when
    if body["source"] == "live" && body["kind"] == crate::kinds::Kind::Event.name() {
        let id = body["id"].as_i64().unwrap_or_default();
        match lookup.store.event_deliveries(id).await {
            Ok(deliveries) => {
                body["deliveries"] = json!(deliveries
                    .iter()
                    .map(|d| json!({
                        "subscription": d.subscription_id, "key": d.key,
                        "state": d.state.as_deref().unwrap_or("purged"),
                        "delivered_at": d.delivered_at, "made_at": d.made_at,
                    }))
                    .collect::<Vec<_>>());
            }
            Err(err) => {
                tracing::warn!(error = %err, "event deliveries lookup failed");
                return (
                    StatusCode::SERVICE_UNAVAILABLE,
                    [(CONTENT_TYPE, "application/json")],
                    json!({"error": "the database did not answer"}).to_string(),
                )
                    .into_response();
            }
        }
    }
    ([(CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

/// The request's `Authorization: Bearer <token>` is `expected`.
fn authorized(headers: &HeaderMap, expected: &Secret) -> bool {
    let Some(value) = headers.get(AUTHORIZATION) else {
        return false;
    };
    let value = value.as_bytes();
    let Some(space) = value.iter().position(|b| *b == b' ') else {
        return false;
    };
    let (scheme, rest) = value.split_at(space);
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return false;
    }
    let given = rest.trim_ascii();
    constant_time_eq(given, expected.expose().as_bytes())
}

/// `given == expected` in a time that depends on `expected`'s length only,
/// not on where the first difference is.
fn constant_time_eq(given: &[u8], expected: &[u8]) -> bool {
    let mut diff = u8::from(given.len() != expected.len());
    for (i, e) in expected.iter().enumerate() {
        diff |= given.get(i).copied().unwrap_or(0) ^ e;
    }
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_eq_is_equality() {
        for (a, b, want) in [
            ("", "", true),
            ("token", "token", true),
            ("token", "tokem", false),
            ("tok", "token", false),
            ("tokens", "token", false),
            ("token\0", "token", false),
            ("", "token", false),
        ] {
            assert_eq!(
                constant_time_eq(a.as_bytes(), b.as_bytes()),
                want,
                "{a:?} {b:?}"
            );
        }
    }

    #[test]
    fn only_the_bearer_token_authorizes() {
        let token = Secret::new("0123456789abcdef");
        for (header, want) in [
            (Some("Bearer 0123456789abcdef"), true),
            (Some("bearer 0123456789abcdef"), true),
            (Some("Bearer   0123456789abcdef "), true),
            (Some("Bearer 0123456789abcdeF"), false),
            (Some("Bearer 0123456789abcde"), false),
            (Some("Bearer"), false),
            (Some("Basic 0123456789abcdef"), false),
            (Some("0123456789abcdef"), false),
            (None, false),
        ] {
            let mut headers = HeaderMap::new();
            if let Some(h) = header {
                headers.insert(AUTHORIZATION, h.parse().unwrap());
            }
            assert_eq!(authorized(&headers, &token), want, "{header:?}");
        }
    }

    #[test]
    fn access_never_prints_the_token() {
        let access = Access {
            enabled: true,
            token: Some(Secret::new("0123456789abcdef")),
        };
        assert!(!format!("{access:?}").contains("0123456789abcdef"));
    }
}

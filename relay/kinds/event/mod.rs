//! `event`: one event an application published (`outbox.publish`). Its
//! effect is its expansion: a `webhook` delivery per subscription that
//! matches it, made in one transaction and keyed by
//! `derive_key(event key, 'subscription ' || id)`, so expanding it again
//! (a lost completion, a lease taken over) makes no second delivery.

mod batch;
mod section;

use std::sync::Arc;
use std::time::Duration;

use outbox_providers::{AmbiguityPolicy, Delivery, Outcome, Provider};
use serde_json::Value;

pub use section::EventSection;

use super::{Destination, Spec};

pub(super) const SPEC: Spec = Spec {
    schema: include_str!("../../../schema/kinds/event.json"),
    docs: "guides/events.md",
    destination: Destination::OwnName,
    http_status: false,
    check: |payload, _| check(payload),
    provider_key: |key, _| format!("each delivery: derive_key({key:?}, 'subscription ' || id)"),
};

/// An event's payload as `outbox.publish` writes it:
/// `{"type": "order.paid", "tenant": "acme" | null, "data": <any JSON>}`.
fn check(payload: &Value) -> Result<(), String> {
    let obj = payload
        .as_object()
        .ok_or("an event's payload must be a JSON object (outbox.publish writes it)")?;
    if let Some(unknown) = obj
        .keys()
        .find(|k| !matches!(k.as_str(), "type" | "tenant" | "data"))
    {
        return Err(format!(
            "an event's payload has an unknown field {unknown:?} (expected type, tenant, data)"
        ));
    }
    match obj.get("type") {
        Some(Value::String(t)) if valid_event_type(t) => {}
        Some(Value::String(t)) => {
            return Err(format!(
                "event type {t:?} is not a dotted name (letters, digits, _ and -, at most 200 characters)"
            ))
        }
        _ => return Err("an event's payload needs \"type\", a string".into()),
    }
    match obj.get("tenant") {
        None | Some(Value::Null) => {}
        Some(Value::String(t)) if (1..=200).contains(&t.chars().count()) => {}
        Some(_) => return Err("an event's \"tenant\" must be 1 to 200 characters, or null".into()),
    }
    if !obj.contains_key("data") {
        return Err("an event's payload needs \"data\"".into());
    }
    Ok(())
}

/// A dotted name of letters, digits, `_` and `-` (`order.paid`), as
/// `outbox.valid_event_type` has it.
pub fn valid_event_type(t: &str) -> bool {
    t.len() <= 200
        && !t.is_empty()
        && t.split('.').all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        })
}

/// What one expansion did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expanded {
    /// Subscriptions that match the event now.
    pub matched: u32,
    /// Deliveries this expansion made (the others were made before).
    pub created: u32,
}

/// Why an expansion did not happen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExpandError {
    /// Nothing was written (the transaction did not commit): try again.
    NotDone(String),
    /// The commit's answer was lost: it may have happened.
    Unknown(String),
    /// There is no such event to expand.
    NoEvent(String),
}

/// Expands events into their deliveries (the store does, in one
/// transaction that ends within `budget`): each event's id with what its
/// expansion did, or None when it is no event.
#[async_trait::async_trait]
pub trait Expand: Send + Sync {
    async fn expand(
        &self,
        events: &[i64],
        budget: Duration,
    ) -> Result<Vec<(i64, Option<Expanded>)>, ExpandError>;
}

/// The `event` kind's provider: the expansion, through [`Expand`], of the
/// events expanded at once in one statement ([`batch`]).
pub struct EventProvider {
    batcher: batch::Batcher,
    timeout: Duration,
}

impl EventProvider {
    pub fn new(expander: Arc<dyn Expand>, timeout: Duration) -> EventProvider {
        EventProvider {
            batcher: batch::Batcher::new(expander),
            timeout,
        }
    }
}

#[async_trait::async_trait]
impl Provider for EventProvider {
    fn kind(&self) -> &'static str {
        super::Kind::Event.name()
    }

    async fn deliver(&self, d: &Delivery<'_>) -> Outcome {
        if let Err(reason) = check(d.payload) {
            return Outcome::invalid(reason);
        }
        let deadline = tokio::time::Instant::now() + d.time_left(self.timeout);
        match self.batcher.expand(d.intent_id, deadline).await {
            Ok(e) => Outcome::Delivered {
                reference: Some(format!(
                    "{} of {} matching subscriptions",
                    e.created, e.matched
                )),
                replayed: e.matched > 0 && e.created == 0,
                status: None,
            },
            Err(ExpandError::NotDone(reason)) => Outcome::Transient {
                reason,
                status: None,
                retry_after: None,
            },
            Err(ExpandError::Unknown(reason)) => Outcome::Ambiguous {
                reason,
                status: None,
            },
            Err(ExpandError::NoEvent(reason)) => Outcome::invalid(reason),
        }
    }

    /// Expanding again makes no second delivery of any pair: safe.
    fn on_ambiguous(&self) -> AmbiguityPolicy {
        AmbiguityPolicy::Redeliver
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn event_types_are_dotted_names() {
        for ok in ["order.paid", "a", "invoice.line-item_added.v2"] {
            assert!(valid_event_type(ok), "{ok}");
        }
        for bad in ["", ".a", "a.", "a..b", "a b", "a.*", "ä", &"x".repeat(201)] {
            assert!(!valid_event_type(bad), "{bad}");
        }
    }

    #[test]
    fn an_event_payload_is_checked_with_a_reason() {
        check(&json!({"type": "a.b", "tenant": null, "data": {}})).unwrap();
        check(&json!({"type": "a.b", "tenant": "acme", "data": [1]})).unwrap();
        for (payload, says) in [
            (json!([1]), "JSON object"),
            (
                json!({"type": "a", "data": 1, "x": 1}),
                "unknown field \"x\"",
            ),
            (json!({"data": 1}), "needs \"type\""),
            (json!({"type": "a b", "data": 1}), "not a dotted name"),
            (json!({"type": "a", "tenant": "", "data": 1}), "tenant"),
            (json!({"type": "a"}), "needs \"data\""),
        ] {
            let err = check(&payload).unwrap_err();
            assert!(err.contains(says), "{payload}: {err}");
        }
    }
}

//! The closed set of things that can happen to one delivery attempt.

use std::time::Duration;

/// What one attempt produced. Providers map every response, error and timeout
/// to exactly one of these; the relay maps it to the intent's next state.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The effect is confirmed. `reference` is the provider's id for it.
    Delivered {
        reference: Option<String>,
        /// The provider reported this as a replay of an earlier success
        /// (e.g. `Idempotent-Replayed: true`): no new effect happened now.
        replayed: bool,
        status: Option<u16>,
    },
    /// A deliberate, repeatable refusal (410 Gone, card declined, mailbox does
    /// not exist, a payload we cannot use). Re-evaluating gives the same answer.
    Rejected {
        reason: String,
        status: Option<u16>,
        /// An excerpt of the provider's answer, kept with the intent.
        response: Option<serde_json::Value>,
    },
    /// Nothing happened, or something failed that may succeed later (5xx,
    /// 429, connection refused). Never terminal on its own.
    Transient {
        reason: String,
        status: Option<u16>,
        /// The provider asked us to wait at least this long.
        retry_after: Option<Duration>,
    },
    /// The provider is up and answered that the one place this message goes
    /// cannot take it now: an AMQP exchange that does not exist, a queue
    /// full to its limit that nacks, a NATS subject no stream takes.
    /// Retried like a transient failure, but it says nothing against the
    /// provider as a whole: it is an answer, and counts towards no breaker.
    TargetUnavailable { reason: String, status: Option<u16> },
    /// The effect may or may not have happened (the request was sent and the
    /// answer was lost). Resolved by reconcile or by the kind's policy.
    Ambiguous { reason: String, status: Option<u16> },
    /// Our side is misconfigured (the provider refused our credentials):
    /// retrying cannot help until an operator fixes it. Ends `dead`.
    Misconfigured { reason: String, status: Option<u16> },
    /// Not attempted: the provider is saturated here (e.g. too many requests
    /// in flight to one host). Back to pending after `retry_after`, without
    /// spending an attempt of the retry budget.
    Deferred {
        reason: String,
        retry_after: Duration,
    },
}

impl Outcome {
    /// The outcome class as stored in `outbox.attempts.outcome`.
    pub fn class(&self) -> &'static str {
        match self {
            Outcome::Delivered { .. } => "delivered",
            Outcome::Rejected { .. } => "rejected",
            Outcome::Transient { .. } | Outcome::TargetUnavailable { .. } => "transient",
            Outcome::Ambiguous { .. } => "ambiguous",
            Outcome::Misconfigured { .. } => "rejected",
            Outcome::Deferred { .. } => "deferred",
        }
    }

    pub fn status(&self) -> Option<u16> {
        match self {
            Outcome::Delivered { status, .. }
            | Outcome::Rejected { status, .. }
            | Outcome::Transient { status, .. }
            | Outcome::TargetUnavailable { status, .. }
            | Outcome::Ambiguous { status, .. }
            | Outcome::Misconfigured { status, .. } => *status,
            Outcome::Deferred { .. } => None,
        }
    }

    /// The readable reason, for everything but a delivery.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Outcome::Delivered { .. } => None,
            Outcome::Rejected { reason, .. }
            | Outcome::Transient { reason, .. }
            | Outcome::TargetUnavailable { reason, .. }
            | Outcome::Ambiguous { reason, .. }
            | Outcome::Misconfigured { reason, .. }
            | Outcome::Deferred { reason, .. } => Some(reason),
        }
    }

    fn reason_mut(&mut self) -> Option<&mut String> {
        match self {
            Outcome::Delivered { .. } => None,
            Outcome::Rejected { reason, .. }
            | Outcome::Transient { reason, .. }
            | Outcome::TargetUnavailable { reason, .. }
            | Outcome::Ambiguous { reason, .. }
            | Outcome::Misconfigured { reason, .. }
            | Outcome::Deferred { reason, .. } => Some(reason),
        }
    }

    /// The outcome with every URL in its reason shown by the one rule
    /// ([`crate::redact`]): what the relay records, logs and exports.
    pub fn redacted(mut self) -> Self {
        if let Some(reason) = self.reason_mut() {
            *reason = crate::redact::urls_in(reason);
        }
        self
    }

    /// Shorthand for a rejection of the payload before any network call.
    /// Reasons quote the offending value; a long one is clipped (to
    /// [`MAX_REASON_CHARS`]) so a hostile payload cannot turn `last_error`
    /// and the logs into a copy of itself.
    pub fn invalid(reason: impl Into<String>) -> Self {
        Outcome::Rejected {
            reason: clip(reason.into()),
            status: None,
            response: None,
        }
    }
}

/// The longest reason [`Outcome::invalid`] keeps, in characters.
pub const MAX_REASON_CHARS: usize = 1000;

fn clip(reason: String) -> String {
    let total = reason.chars().count();
    if total <= MAX_REASON_CHARS {
        return reason;
    }
    let kept: String = reason.chars().take(MAX_REASON_CHARS - 40).collect();
    format!("{kept}… (clipped; {total} characters in all)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_reasons_are_clipped() {
        let short = Outcome::invalid("email \"to\" address \"x\" is invalid");
        assert_eq!(
            short.reason(),
            Some("email \"to\" address \"x\" is invalid")
        );
        let long = Outcome::invalid(format!("address {:?} is invalid", "é".repeat(100_000)));
        let reason = long.reason().unwrap();
        assert!(
            reason.chars().count() <= MAX_REASON_CHARS,
            "{}",
            reason.len()
        );
        assert!(reason.starts_with("address \"ééé"));
        assert!(
            reason.ends_with("(clipped; 100021 characters in all)"),
            "{reason}"
        );
    }
}

/// The provider's answer to "what happened to this intent?".
#[derive(Debug, Clone, PartialEq)]
pub enum Reconciled {
    /// The effect exists; this is its reference.
    Found { reference: String },
    /// The provider can prove the effect does not exist: deliver again.
    Absent,
    /// The provider cannot find it, but dedupes a redelivery under the same
    /// key right now (JetStream, inside the stream's duplicate window):
    /// deliver again at once.
    Deduped,
    /// The provider cannot tell.
    Unknown,
}

/// What to do with an ambiguous outcome that reconcile cannot settle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AmbiguityPolicy {
    /// Deliver again under the same idempotency key: safe when the receiver
    /// dedupes on it (Standard Webhooks receivers dedupe on `webhook-id`).
    Redeliver,
    /// Park the intent as `ambiguous` for an operator to resolve.
    Park,
}

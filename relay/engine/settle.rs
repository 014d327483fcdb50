//! An outcome settled into the row the store writes: the attempt record
//! and the intent's next state. Pure.

use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox_providers::{AmbiguityPolicy, Outcome};

use crate::config::RetryPolicy;
use crate::engine::transition::{self, Next};
use crate::state::AttemptOutcome;
use crate::store::{Claimed, Completion};

/// Turn an outcome into the row the store writes: the attempt record and the
/// intent's next state. Pure; `unit` in `[0, 1)` is the jitter draw.
pub fn settle(
    claim: &Claimed,
    outcome: &Outcome,
    policy: &RetryPolicy,
    on_ambiguous: AmbiguityPolicy,
    started_at: DateTime<Utc>,
    finished_at: DateTime<Utc>,
    unit: f64,
) -> Completion {
    let in_round = (claim.attempt - claim.attempts_base).max(1) as u32;
    let next = transition::next(outcome, in_round, policy, on_ambiguous, unit);
    let (provider_ref, replayed, response) = match outcome {
        Outcome::Delivered {
            reference,
            replayed,
            ..
        } => (reference.clone(), *replayed, None),
        Outcome::Rejected { response, .. } => (None, false, response.clone()),
        _ => (None, false, None),
    };
    let error = match (&next, outcome.reason()) {
        (Next::Dead, Some(r)) => Some(format!("{r}; gave up after {in_round} attempts")),
        (_, r) => r.map(str::to_string),
    };
    let run_after = match next {
        Next::Retry(delay) | Next::Defer(delay) => Some(retry_at(finished_at, delay)),
        _ => None,
    };
    Completion {
        id: claim.id,
        kind: claim.kind.clone(),
        delivered_before: claim.delivered_before,
        operator_replay: claim.attempts_base > 0 && claim.attempt == claim.attempts_base + 1,
        fence: claim.fence,
        attempt: claim.attempt,
        key_generation: claim.key_generation,
        started_at,
        finished_at,
        outcome: AttemptOutcome::of(outcome),
        status: outcome.status().map(i32::from),
        provider_ref,
        error,
        replayed,
        uncounted: matches!(next, Next::Defer(_)),
        state: next.state(),
        run_after,
        response,
        log_batch: claim.log_batch,
    }
}

/// The longest a retry is put off, whatever a provider asks for.
pub const MAX_RETRY_DELAY: Duration = Duration::from_secs(30 * 24 * 3600);

/// `from + delay`, with the delay capped at [`MAX_RETRY_DELAY`]: checked
/// arithmetic, so no answer can overflow the clock.
pub fn retry_at(from: DateTime<Utc>, delay: Duration) -> DateTime<Utc> {
    let delay = delay.min(MAX_RETRY_DELAY);
    chrono::Duration::from_std(delay)
        .ok()
        .and_then(|d| from.checked_add_signed(d))
        .unwrap_or(from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::IntentState;

    fn claim(attempt: i32, base: i32) -> Claimed {
        Claimed {
            id: 7,
            key: "k".into(),
            kind: "webhook".into(),
            destination: None,
            payload: serde_json::json!({}),
            payload_text: "{}".into(),
            body: None,
            payload_error: None,
            attempt,
            attempts_base: base,
            fence: 3,
            key_generation: 0,
            created_at: Utc::now(),
            delivered_before: false,
            claimed_at: std::time::Instant::now(),
            wal_target: None,
            log_batch: None,
            recovered_from: None,
            previous_attempt_at: None,
            traceparent: None,
            tracestate: None,
            ordering_key: None,
        }
    }

    fn policy() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 3,
            schedule: vec![Duration::from_secs(10)],
            jitter: 0.0,
        }
    }

    #[test]
    fn a_retry_is_scheduled_from_the_end_of_the_attempt() {
        let t = Utc::now();
        let out = Outcome::Transient {
            reason: "HTTP 503".into(),
            status: Some(503),
            retry_after: None,
        };
        let c = settle(
            &claim(1, 0),
            &out,
            &policy(),
            AmbiguityPolicy::Park,
            t,
            t,
            0.0,
        );
        assert_eq!(
            (c.state, c.outcome, c.status),
            (IntentState::Pending, AttemptOutcome::Transient, Some(503))
        );
        assert_eq!(c.run_after, Some(t + chrono::Duration::seconds(10)));
        assert_eq!(c.error.as_deref(), Some("HTTP 503"));
        assert_eq!((c.id, c.fence, c.attempt), (7, 3, 1));
    }

    #[test]
    fn the_budget_counts_from_the_last_operator_retry() {
        let t = Utc::now();
        let out = Outcome::Transient {
            reason: "HTTP 503".into(),
            status: Some(503),
            retry_after: None,
        };
        let dead = settle(
            &claim(3, 0),
            &out,
            &policy(),
            AmbiguityPolicy::Park,
            t,
            t,
            0.0,
        );
        assert_eq!(dead.state, IntentState::Dead);
        assert!(dead.error.unwrap().contains("gave up after 3 attempts"));
        let retried = settle(
            &claim(5, 3),
            &out,
            &policy(),
            AmbiguityPolicy::Park,
            t,
            t,
            0.0,
        );
        assert_eq!(retried.state, IntentState::Pending);
    }

    #[test]
    fn an_absurd_retry_after_is_capped_not_overflowed() {
        let t = Utc::now();
        let out = Outcome::Transient {
            reason: "HTTP 429".into(),
            status: Some(429),
            retry_after: Some(Duration::from_secs(99_999_999_999_999)),
        };
        let c = settle(
            &claim(1, 0),
            &out,
            &policy(),
            AmbiguityPolicy::Park,
            t,
            t,
            0.5,
        );
        assert_eq!(c.state, IntentState::Pending);
        assert_eq!(
            c.run_after,
            Some(t + chrono::Duration::from_std(MAX_RETRY_DELAY).unwrap())
        );
        assert_eq!(
            retry_at(DateTime::<Utc>::MAX_UTC, Duration::from_secs(1)),
            DateTime::<Utc>::MAX_UTC
        );
    }

    #[test]
    fn deliveries_and_rejections_keep_their_evidence() {
        let t = Utc::now();
        let d = Outcome::Delivered {
            reference: Some("msg_1".into()),
            replayed: true,
            status: Some(200),
        };
        let c = settle(
            &claim(1, 0),
            &d,
            &policy(),
            AmbiguityPolicy::Park,
            t,
            t,
            0.0,
        );
        assert_eq!(
            (c.state, c.provider_ref.as_deref(), c.replayed, c.run_after),
            (IntentState::Delivered, Some("msg_1"), true, None)
        );
        let r = Outcome::Rejected {
            reason: "HTTP 410".into(),
            status: Some(410),
            response: Some(serde_json::json!({"status": 410})),
        };
        let c = settle(
            &claim(1, 0),
            &r,
            &policy(),
            AmbiguityPolicy::Park,
            t,
            t,
            0.0,
        );
        assert_eq!(
            (c.state, c.error.as_deref()),
            (IntentState::Rejected, Some("HTTP 410"))
        );
        assert_eq!(c.response, Some(serde_json::json!({"status": 410})));
    }
}

//! From an attempt's outcome to the intent's next state: pure functions.

use std::time::Duration;

use outbox_providers::{AmbiguityPolicy, Outcome};

use crate::config::RetryPolicy;
use crate::state::IntentState;

/// The intent's next state.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    Delivered,
    Rejected,
    /// Back to pending, due after this delay.
    Retry(Duration),
    /// Back to pending after this delay, the attempt not counted.
    Defer(Duration),
    /// The retry budget is spent.
    Dead,
    /// Parked for an operator: the effect may or may not have happened.
    Ambiguous,
}

impl Next {
    /// The intent's state after this step.
    pub fn state(&self) -> IntentState {
        match self {
            Next::Delivered => IntentState::Delivered,
            Next::Rejected => IntentState::Rejected,
            Next::Retry(_) | Next::Defer(_) => IntentState::Pending,
            Next::Dead => IntentState::Dead,
            Next::Ambiguous => IntentState::Ambiguous,
        }
    }
}

/// Decide the next state. `attempt_in_round` counts attempts since the last
/// operator retry (1 for the first); `unit` is a random number in `[0, 1)`
/// for jitter. Only a delivery or a deliberate rejection is terminal on its
/// own; a transient failure is terminal only when the budget is spent.
pub fn next(
    outcome: &Outcome,
    attempt_in_round: u32,
    policy: &RetryPolicy,
    on_ambiguous: AmbiguityPolicy,
    unit: f64,
) -> Next {
    let retry = |asked: Option<Duration>| {
        if attempt_in_round >= policy.max_attempts {
            Next::Dead
        } else {
            // A receiver's Retry-After replaces the schedule's step: it knows
            // when it will be ready.
            let base = asked.unwrap_or_else(|| policy.backoff(attempt_in_round));
            Next::Retry(policy.jittered(base, unit))
        }
    };
    match outcome {
        Outcome::Delivered { .. } => Next::Delivered,
        Outcome::Rejected { .. } => Next::Rejected,
        Outcome::Misconfigured { .. } => Next::Dead,
        Outcome::Deferred { retry_after, .. } => Next::Defer(policy.jittered(*retry_after, unit)),
        Outcome::Transient { retry_after, .. } => retry(*retry_after),
        Outcome::TargetUnavailable { .. } => retry(None),
        Outcome::Ambiguous { .. } => match on_ambiguous {
            AmbiguityPolicy::Park => Next::Ambiguous,
            AmbiguityPolicy::Redeliver => retry(None),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn transient(retry_after: Option<Duration>) -> Outcome {
        Outcome::Transient {
            reason: "503".into(),
            status: Some(503),
            retry_after,
        }
    }

    #[test]
    fn backoff_follows_the_schedule_then_repeats_the_last_step() {
        let p = RetryPolicy {
            max_attempts: 10,
            schedule: vec![secs(5), secs(300), secs(1800)],
            jitter: 0.0,
        };
        assert_eq!(p.backoff(0), secs(5));
        assert_eq!(p.backoff(1), secs(5));
        assert_eq!(p.backoff(2), secs(300));
        assert_eq!(p.backoff(3), secs(1800));
        assert_eq!(p.backoff(9), secs(1800));
        let empty = RetryPolicy {
            schedule: vec![],
            ..p
        };
        assert_eq!(empty.backoff(3), Duration::ZERO);
    }

    #[test]
    fn jitter_stretches_within_bounds() {
        let p = RetryPolicy::default();
        assert_eq!(p.jittered(secs(10), 0.0), secs(10));
        assert_eq!(p.jittered(secs(10), 0.5), secs(11));
        assert!(p.jittered(secs(10), 0.999) < secs(12));
        assert_eq!(p.jittered(secs(10), 7.0), secs(12));
        assert_eq!(p.jittered(Duration::ZERO, 0.9), Duration::ZERO);
    }

    #[test]
    fn transition_table() {
        let p = RetryPolicy {
            max_attempts: 3,
            schedule: vec![secs(5), secs(60)],
            jitter: 0.0,
        };
        let delivered = Outcome::Delivered {
            reference: Some("r".into()),
            replayed: false,
            status: Some(200),
        };
        let rejected = Outcome::invalid("no");
        let ambiguous = Outcome::Ambiguous {
            reason: "lost after DATA".into(),
            status: None,
        };
        use AmbiguityPolicy::*;
        let cases = [
            (&delivered, 1, Park, Next::Delivered),
            (&delivered, 3, Park, Next::Delivered),
            (&rejected, 1, Redeliver, Next::Rejected),
            (&transient(None), 1, Park, Next::Retry(secs(5))),
            (&transient(None), 2, Park, Next::Retry(secs(60))),
            (&transient(None), 3, Park, Next::Dead),
            (&transient(Some(secs(2))), 1, Park, Next::Retry(secs(2))),
            (&transient(Some(secs(2))), 3, Park, Next::Dead),
            (&ambiguous, 1, Park, Next::Ambiguous),
            (&ambiguous, 3, Park, Next::Ambiguous),
            (&ambiguous, 1, Redeliver, Next::Retry(secs(5))),
            (&ambiguous, 3, Redeliver, Next::Dead),
            (
                &Outcome::Misconfigured {
                    reason: "401".into(),
                    status: Some(401),
                },
                1,
                Redeliver,
                Next::Dead,
            ),
            (
                &Outcome::Deferred {
                    reason: "busy".into(),
                    retry_after: secs(1),
                },
                3,
                Park,
                Next::Defer(secs(1)),
            ),
        ];
        for (outcome, attempt, policy, expected) in cases {
            assert_eq!(
                next(outcome, attempt, &p, policy, 0.0),
                expected,
                "{outcome:?} at attempt {attempt} with {policy:?}"
            );
        }
    }

    #[test]
    fn a_transient_failure_is_never_terminal_before_the_budget_is_spent() {
        let p = RetryPolicy::default();
        for attempt in 1..p.max_attempts {
            let n = next(&transient(None), attempt, &p, AmbiguityPolicy::Park, 0.3);
            assert!(matches!(n, Next::Retry(_)), "attempt {attempt}: {n:?}");
        }
    }

    /// The Mermaid block of docs/concepts/state-machine.md, as (from, to) pairs.
    fn drawn_edges() -> std::collections::BTreeSet<(String, String)> {
        let doc = include_str!("../../docs/concepts/state-machine.md");
        let block = doc
            .split("```mermaid")
            .nth(1)
            .and_then(|rest| rest.split("```").next())
            .expect("a mermaid block");
        block
            .lines()
            .filter_map(|l| l.split(':').next())
            .filter_map(|l| l.split_once("-->"))
            .map(|(a, b)| (a.trim().to_string(), b.trim().to_string()))
            .collect()
    }

    #[test]
    fn the_state_machine_document_matches_the_code() {
        use crate::state::{CANCELLABLE, PURGEABLE, RESOLVABLE, RETRYABLE};
        use IntentState::*;
        let edge = |a: &str, b: IntentState| (a.to_string(), b.as_sql().to_string());
        let mut code = std::collections::BTreeSet::new();
        code.insert(edge("[*]", Pending));
        code.insert(edge("pending", Claimed));
        // every case of the transition function, inside and past the budget
        let p = RetryPolicy {
            max_attempts: 3,
            schedule: vec![secs(1)],
            jitter: 0.0,
        };
        let outcomes = [
            Outcome::Delivered {
                reference: None,
                replayed: false,
                status: None,
            },
            Outcome::invalid("no"),
            transient(None),
            Outcome::Ambiguous {
                reason: "?".into(),
                status: None,
            },
            Outcome::Misconfigured {
                reason: "401".into(),
                status: Some(401),
            },
            Outcome::Deferred {
                reason: "busy".into(),
                retry_after: secs(1),
            },
        ];
        for o in &outcomes {
            for attempt in [1, 3] {
                for policy in [AmbiguityPolicy::Park, AmbiguityPolicy::Redeliver] {
                    code.insert(edge("claimed", next(o, attempt, &p, policy, 0.0).state()));
                }
            }
        }
        // the sweeper's reclaim and a claim handed back unattempted
        code.insert(edge("claimed", Claimed));
        code.insert(edge("claimed", Pending));
        // operators
        for s in CANCELLABLE {
            code.insert(edge(s.as_sql(), Cancelled));
        }
        for s in RETRYABLE {
            code.insert(edge(s.as_sql(), Pending));
        }
        for s in RESOLVABLE {
            for to in [Delivered, Pending, Rejected] {
                code.insert(edge(s.as_sql(), to));
            }
        }
        for s in PURGEABLE {
            code.insert((s.as_sql().to_string(), "[*]".to_string()));
        }
        let drawn = drawn_edges();
        let missing: Vec<_> = code.difference(&drawn).collect();
        let extra: Vec<_> = drawn.difference(&code).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "docs/concepts/state-machine.md is out of step with the code:\n  not drawn: {missing:?}\n  drawn, not made: {extra:?}"
        );
    }

    #[test]
    fn state_names_are_the_contract() {
        assert_eq!(Next::Retry(secs(1)).state(), IntentState::Pending);
        assert_eq!(Next::Defer(secs(1)).state(), IntentState::Pending);
        for (n, s) in [
            (Next::Delivered, IntentState::Delivered),
            (Next::Rejected, IntentState::Rejected),
            (Next::Dead, IntentState::Dead),
            (Next::Ambiguous, IntentState::Ambiguous),
        ] {
            assert_eq!(n.state(), s);
        }
    }
}

//! What to do with a claim the sweeper recovered from an expired lease.
//!
//! The previous attempt's outcome is unknown: its relay died, hung or lost
//! the database mid-delivery. Re-executing blindly is how a cleanup job
//! becomes a duplicate generator, so: ask the provider first; if it cannot
//! tell, apply the kind's policy — redeliver under the *same* idempotency key
//! (the receiver dedupes), or park the intent as `ambiguous`.

use outbox_providers::{AmbiguityPolicy, Delivery, Outcome, Provider, Reconciled};

/// The sweeper's decision for one recovered claim.
#[derive(Debug, Clone, PartialEq)]
pub enum Recovery {
    /// Reconcile settled it: this is the outcome to record.
    Settled(Outcome),
    /// Deliver again under the same key. `replay` is true when the earlier
    /// attempt may have taken effect (counted as a redelivery).
    Redeliver { replay: bool },
}

pub async fn recover(
    provider: &dyn Provider,
    delivery: &Delivery<'_>,
    previous_owner: &str,
) -> Recovery {
    match provider.reconcile(delivery).await {
        Reconciled::Found { reference } => Recovery::Settled(Outcome::Delivered {
            reference: Some(reference),
            replayed: false,
            status: None,
        }),
        Reconciled::Absent => Recovery::Redeliver { replay: false },
        // it may have happened; the provider dedupes the redelivery
        Reconciled::Deduped => Recovery::Redeliver { replay: true },
        Reconciled::Unknown => decide(provider.on_ambiguous(), previous_owner),
    }
}

/// An attempt answered ambiguously (e.g. a stored 500): ask the provider
/// before deciding. Found → delivered; proven absent → transient (retried
/// under the same key, which cannot duplicate); unknown → unchanged, for the
/// kind's policy.
pub async fn settle_ambiguous(
    provider: &dyn Provider,
    delivery: &Delivery<'_>,
    outcome: Outcome,
) -> Outcome {
    let Outcome::Ambiguous { reason, status } = &outcome else {
        return outcome;
    };
    match provider.reconcile(delivery).await {
        // the delivery is the provider's record, not this attempt's 5xx answer
        Reconciled::Found { reference } => Outcome::Delivered {
            reference: Some(reference),
            replayed: false,
            status: None,
        },
        Reconciled::Absent => Outcome::Transient {
            reason: format!(
                "{reason}; the provider shows no such effect, so it is retried under the same key"
            ),
            status: *status,
            retry_after: None,
        },
        // republish now, while the provider still dedupes it; if that is
        // not confirmed either, the kind's policy decides
        Reconciled::Deduped => match provider.deliver(delivery).await {
            Outcome::Ambiguous { .. } => outcome,
            settled => settled,
        },
        Reconciled::Unknown => outcome,
    }
}

/// The policy half of [`recover`], pure.
pub fn decide(policy: AmbiguityPolicy, previous_owner: &str) -> Recovery {
    match policy {
        AmbiguityPolicy::Redeliver => Recovery::Redeliver { replay: true },
        AmbiguityPolicy::Park => Recovery::Settled(Outcome::Ambiguous {
            reason: format!(
                "the lease held by {previous_owner} expired with no recorded outcome and the \
                 provider cannot tell whether the effect happened; resolve it with \
                 `outbox-relay resolve`"
            ),
            status: None,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_table() {
        assert_eq!(
            decide(AmbiguityPolicy::Redeliver, "r1"),
            Recovery::Redeliver { replay: true }
        );
        match decide(AmbiguityPolicy::Park, "r1") {
            Recovery::Settled(Outcome::Ambiguous { reason, .. }) => {
                assert!(
                    reason.contains("r1") && reason.contains("resolve"),
                    "{reason}"
                )
            }
            other => panic!("{other:?}"),
        }
    }
}

//! The states of an intent and the outcomes of an attempt, as types, with
//! their SQL spelling in one place (`docs/concepts/state-machine.md` draws them).

use std::fmt;

/// Where an intent is in its lifecycle (`outbox.intents.state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IntentState {
    /// Waiting to be claimed (now or at `run_after`).
    Pending,
    /// Held by a relay under a lease and a fencing token.
    Claimed,
    /// The effect is confirmed.
    Delivered,
    /// A deliberate, repeatable refusal.
    Rejected,
    /// The retry budget is spent.
    Dead,
    /// The effect may or may not have happened: for an operator.
    Ambiguous,
    /// An operator called it off.
    Cancelled,
}

impl IntentState {
    /// Every state, in lifecycle order.
    pub const ALL: [IntentState; 7] = [
        IntentState::Pending,
        IntentState::Claimed,
        IntentState::Delivered,
        IntentState::Rejected,
        IntentState::Dead,
        IntentState::Ambiguous,
        IntentState::Cancelled,
    ];

    /// The spelling in `outbox.intents.state` (the contract's names).
    pub const fn as_sql(self) -> &'static str {
        match self {
            IntentState::Pending => "pending",
            IntentState::Claimed => "claimed",
            IntentState::Delivered => "delivered",
            IntentState::Rejected => "rejected",
            IntentState::Dead => "dead",
            IntentState::Ambiguous => "ambiguous",
            IntentState::Cancelled => "cancelled",
        }
    }

    /// The same as [`IntentState::as_sql`]: the name people and scripts see.
    pub const fn as_str(self) -> &'static str {
        self.as_sql()
    }

    /// The state spelled `text`, if it is one.
    pub fn parse(text: &str) -> Option<IntentState> {
        IntentState::ALL.into_iter().find(|s| s.as_sql() == text)
    }

    /// Live: the intent still holds its ordering key (pending, claimed,
    /// ambiguous, dead).
    pub const fn is_live(self) -> bool {
        matches!(
            self,
            IntentState::Pending
                | IntentState::Claimed
                | IntentState::Ambiguous
                | IntentState::Dead
        )
    }
}

use IntentState::{Ambiguous, Cancelled, Claimed, Dead, Delivered, Pending, Rejected};

/// States an operator can cancel (a claim in flight is fenced off).
pub const CANCELLABLE: [IntentState; 4] = [Pending, Claimed, Ambiguous, Dead];
/// States an operator retry applies to: anything but a live claim
/// (`delivered` only with `--force`).
pub const RETRYABLE: [IntentState; 6] = [Pending, Delivered, Rejected, Dead, Ambiguous, Cancelled];
/// States an operator can resolve by hand.
pub const RESOLVABLE: [IntentState; 2] = [Ambiguous, Dead];
/// Terminal states retention purges into the ledger (`dead` only with
/// `include_dead`).
pub const PURGEABLE: [IntentState; 4] = [Delivered, Rejected, Cancelled, Dead];

/// The state names in lifecycle order, for argument parsers and tables.
pub const STATES: [&str; 7] = [
    IntentState::Pending.as_sql(),
    IntentState::Claimed.as_sql(),
    IntentState::Delivered.as_sql(),
    IntentState::Rejected.as_sql(),
    IntentState::Dead.as_sql(),
    IntentState::Ambiguous.as_sql(),
    IntentState::Cancelled.as_sql(),
];

/// The SQL spellings of `states`, to bind as a `text[]`.
pub fn sql_names(states: &[IntentState]) -> Vec<&'static str> {
    states.iter().map(|s| s.as_sql()).collect()
}

/// `state == "delivered"`: a state equals its SQL spelling.
impl PartialEq<&str> for IntentState {
    fn eq(&self, other: &&str) -> bool {
        self.as_sql() == *other
    }
}

impl PartialEq<str> for IntentState {
    fn eq(&self, other: &str) -> bool {
        self.as_sql() == other
    }
}

/// Read from the database (`#[sqlx(try_from = "String")]`).
impl TryFrom<String> for IntentState {
    type Error = String;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        IntentState::parse(&text).ok_or_else(|| format!("unknown intent state {text:?}"))
    }
}

impl fmt::Display for IntentState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_sql())
    }
}

/// What one attempt produced (`outbox.attempts.outcome`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AttemptOutcome {
    Delivered,
    Rejected,
    Transient,
    Ambiguous,
    /// Not attempted (a per-host limit): no attempt row is written.
    Deferred,
    /// Written by the sweeper: the lease expired with no recorded outcome.
    Lost,
}

impl AttemptOutcome {
    pub const ALL: [AttemptOutcome; 6] = [
        AttemptOutcome::Delivered,
        AttemptOutcome::Rejected,
        AttemptOutcome::Transient,
        AttemptOutcome::Ambiguous,
        AttemptOutcome::Deferred,
        AttemptOutcome::Lost,
    ];

    /// The spelling in `outbox.attempts.outcome` and the metrics' `outcome`.
    pub const fn as_sql(self) -> &'static str {
        match self {
            AttemptOutcome::Delivered => "delivered",
            AttemptOutcome::Rejected => "rejected",
            AttemptOutcome::Transient => "transient",
            AttemptOutcome::Ambiguous => "ambiguous",
            AttemptOutcome::Deferred => "deferred",
            AttemptOutcome::Lost => "lost",
        }
    }

    /// The class of a provider's outcome.
    pub fn of(outcome: &outbox_providers::Outcome) -> AttemptOutcome {
        use outbox_providers::Outcome as O;
        match outcome {
            O::Delivered { .. } => AttemptOutcome::Delivered,
            O::Rejected { .. } | O::Misconfigured { .. } => AttemptOutcome::Rejected,
            O::Transient { .. } | O::TargetUnavailable { .. } => AttemptOutcome::Transient,
            O::Ambiguous { .. } => AttemptOutcome::Ambiguous,
            O::Deferred { .. } => AttemptOutcome::Deferred,
        }
    }
}

impl fmt::Display for AttemptOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_sql())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sql_spelling_is_the_contract_and_round_trips() {
        let names: Vec<&str> = IntentState::ALL.iter().map(|s| s.as_sql()).collect();
        assert_eq!(
            names,
            [
                "pending",
                "claimed",
                "delivered",
                "rejected",
                "dead",
                "ambiguous",
                "cancelled"
            ]
        );
        for s in IntentState::ALL {
            assert_eq!(IntentState::parse(s.as_sql()), Some(s));
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_sql());
        }
        assert_eq!(IntentState::parse("done"), None);
        for o in AttemptOutcome::ALL {
            assert_eq!(serde_json::to_value(o).unwrap(), o.as_sql());
        }
    }

    #[test]
    fn the_schema_allows_exactly_these_states() {
        let schema = include_str!("../schema/0001_core.sql");
        let check = schema
            .split("CONSTRAINT intents_state_known CHECK (state IN")
            .nth(1)
            .and_then(|rest| rest.split("))").next())
            .expect("the state constraint");
        let allowed: Vec<&str> = check
            .split(',')
            .map(|s| {
                s.trim()
                    .trim_matches(|c| c == '(' || c == '\'' || c == '\n' || c == ' ')
            })
            .map(|s| s.trim_matches('\''))
            .collect();
        let ours: Vec<&str> = IntentState::ALL.iter().map(|s| s.as_sql()).collect();
        assert_eq!(allowed, ours);
    }

    #[test]
    fn live_states_are_those_that_hold_an_ordering_key() {
        let live: Vec<&str> = IntentState::ALL
            .iter()
            .filter(|s| s.is_live())
            .map(|s| s.as_sql())
            .collect();
        assert_eq!(live, ["pending", "claimed", "dead", "ambiguous"]);
    }
}

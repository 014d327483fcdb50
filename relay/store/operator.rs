//! What operators read and change. Every change is one short statement,
//! recorded in `outbox.operator_actions`, and bumps the fencing token of any
//! claim it overrides so a delivery still in flight cannot overwrite it.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{json, Value};
use sqlx::FromRow;

use super::{Store, StoreError};
use crate::state::{sql_names, IntentState, CANCELLABLE, RESOLVABLE, RETRYABLE};

/// An intent as operators see it.
#[derive(Debug, Clone, Serialize, FromRow)]
pub struct Intent {
    pub id: i64,
    pub key: String,
    pub kind: String,
    pub destination: Option<String>,
    /// Read as text: a row written around `outbox.enqueue` may hold JSON
    /// that Postgres stores but serde cannot read (nested too deep, a
    /// number beyond a double); `list` and `show` still show it.
    #[sqlx(try_from = "String")]
    pub payload: StoredPayload,
    #[sqlx(try_from = "String")]
    pub state: IntentState,
    pub attempts: i32,
    pub run_after: DateTime<Utc>,
    pub ordering_key: Option<String>,
    pub provider_ref: Option<String>,
    pub last_error: Option<String>,
    pub response: Option<Value>,
    pub owner: Option<String>,
    pub lease_expires_at: Option<DateTime<Utc>>,
    pub key_generation: i32,
    pub duplicates: i32,
    pub source: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub delivered_at: Option<DateTime<Utc>>,
    /// When a provider last answered success to an attempt of this intent,
    /// whether or not that answer was accepted: the effect happened then,
    /// even when the intent is not delivered (cancelled, or retried as a
    /// new effect, while that request was in flight).
    pub effect_at: Option<DateTime<Utc>>,
    /// Whether the attempt of `effect_at` was accepted: true when the
    /// intent was delivered by it and an operator then retried it (`retry
    /// --force`), false when its success came after the intent was
    /// cancelled or reclaimed (the completion was refused).
    pub effect_accepted: Option<bool>,
    /// The W3C trace context the application enqueued it with.
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
}

impl Intent {
    /// The trace its attempts are in: the application's, from its
    /// `traceparent`, else the one the relay derives from the key.
    pub fn trace_id(&self) -> String {
        let context = crate::observe::trace::IntentContext {
            traceparent: self.traceparent.as_deref(),
            tracestate: None,
        };
        match context.ids() {
            Some((trace, _)) => trace.to_string(),
            None => crate::observe::trace::context::derived_trace_id(&self.key).to_string(),
        }
    }

    /// The effect happened although the intent is not delivered: a
    /// provider answered success to an attempt whose completion was refused.
    pub fn happened_anyway(&self) -> bool {
        self.state != IntentState::Delivered && self.effect_at.is_some()
    }
}

/// A stored payload as JSON, or, when it cannot be read as such, a string
/// saying so.
#[derive(Debug, Clone, Serialize)]
#[serde(transparent)]
pub struct StoredPayload(pub Value);

impl From<String> for StoredPayload {
    fn from(text: String) -> Self {
        StoredPayload(serde_json::from_str(&text).unwrap_or_else(|e| {
            Value::String(format!(
                "<the stored payload ({} bytes) cannot be read as JSON: {e}>",
                text.len()
            ))
        }))
    }
}

#[derive(Debug, Clone, Serialize, FromRow)]
pub struct Attempt {
    pub attempt: i32,
    pub fence: i64,
    pub owner: String,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub outcome: String,
    pub status: Option<i32>,
    pub provider_ref: Option<String>,
    pub error: Option<String>,
    pub replayed: bool,
    pub accepted: bool,
    pub key_generation: i32,
}

#[derive(Debug, Clone, Serialize, FromRow)]
pub struct Action {
    pub action: String,
    pub detail: Option<Value>,
    pub actor: String,
    pub at: DateTime<Utc>,
}

/// How an operator settles an ambiguous intent.
#[derive(Debug, Clone, PartialEq)]
pub enum Resolution {
    /// The effect happened (checked at the provider); optionally its reference.
    Delivered { reference: Option<String> },
    /// Deliver again under the same key.
    Redeliver,
    /// It must not happen; the reason is kept.
    Reject { reason: String },
}

/// A purged intent, as the ledger remembers it.
#[derive(Debug, Clone, Serialize, FromRow)]
pub struct LedgerEntry {
    pub key: String,
    pub intent_id: i64,
    pub kind: String,
    pub destination: Option<String>,
    #[sqlx(try_from = "String")]
    pub state: IntentState,
    pub provider_ref: Option<String>,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub completed_at: DateTime<Utc>,
    pub purged_at: DateTime<Utc>,
    /// When a provider last answered success to an attempt of it (None: no
    /// effect is known to have happened; a delivered intent purged by an
    /// older relay has none recorded, and happened at `completed_at`).
    pub effect_at: Option<DateTime<Utc>>,
}

impl LedgerEntry {
    /// Whether its effect happened, and when.
    pub fn effect(&self) -> Option<DateTime<Utc>> {
        self.effect_at
            .or((self.state == IntentState::Delivered).then_some(self.completed_at))
    }

    /// The effect happened although the intent did not end delivered.
    pub fn happened_anyway(&self) -> bool {
        self.state != IntentState::Delivered && self.effect_at.is_some()
    }
}

/// What is known about a key: the live intent, or the ledger's record.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "source", rename_all = "lowercase")]
pub enum Known {
    Live(Box<Intent>),
    Ledger(LedgerEntry),
}

/// An operator change, for one intent or a batch of them.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// Pending again now (see [`RetryOptions`]).
    Retry(RetryOptions),
    /// Called off; a claim in flight is fenced off.
    Cancel,
    /// An ambiguous or dead intent settled by hand.
    Resolve(Resolution),
}

impl Change {
    /// The states this change applies to (a retry of delivered intents
    /// only when forced).
    pub fn applies_to(&self) -> Vec<IntentState> {
        match self {
            Change::Retry(how) => RETRYABLE
                .into_iter()
                .filter(|s| how.force || *s != Delivered)
                .collect(),
            Change::Cancel => CANCELLABLE.to_vec(),
            Change::Resolve(_) => RESOLVABLE.to_vec(),
        }
    }
}

/// Which intents a bulk retry touches.
#[derive(Debug, Clone)]
pub struct Filter {
    pub state: IntentState,
    pub kind: Option<String>,
}

/// How an operator retry goes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetryOptions {
    /// Perform the effect as a new operation: bumps the key generation, so
    /// the provider does not dedupe it against the earlier one (recorded).
    pub new_effect: bool,
    /// Re-send delivered intents too. Without it a delivered intent is
    /// refused ([`Store::retry`]) or left alone ([`Store::retry_selected`]):
    /// see [`RESEND_DELIVERED`].
    pub force: bool,
}

/// What re-sending a delivered intent means, for the refusal without `force`.
pub const RESEND_DELIVERED: &str =
    "a re-send reaches the provider under the same idempotency key, \
     so a provider that dedupes on it replays its first answer and one that does not performs \
     the effect again (with --new-effect the key is new and every provider performs it again); \
     pass --force to re-send it";

const INTENT_COLUMNS: &str =
    "id, key, kind, destination, payload::text AS payload, state, attempts, run_after, \
    ordering_key, provider_ref, last_error, response, owner, lease_expires_at, key_generation, \
    duplicates + (SELECT count(*) FROM outbox.enqueue_duplicates d \
                   WHERE d.intent_id = intents.id)::int AS duplicates, \
    source, created_at, updated_at, delivered_at, traceparent, tracestate, \
    (SELECT max(coalesce(a.finished_at, a.started_at)) FROM outbox.attempt_history a \
      WHERE a.intent_id = intents.id AND a.outcome = 'delivered') AS effect_at, \
    (SELECT a.accepted FROM outbox.attempt_history a \
      WHERE a.intent_id = intents.id AND a.outcome = 'delivered' \
      ORDER BY coalesce(a.finished_at, a.started_at) DESC LIMIT 1) AS effect_accepted";

/// The ledger's columns, as [`LedgerEntry`] reads them.
const LEDGER_COLUMNS: &str = "key, intent_id, kind, destination, state, provider_ref, last_error, \
    created_at, completed_at, purged_at, effect_at";

use IntentState::{Delivered, Rejected};

/// Why `intent` cannot be retried `how`, if it cannot.
fn retry_refusal(intent: &Intent, how: RetryOptions) -> Option<StoreError> {
    let why = match intent.state {
        Delivered if !how.force => RESEND_DELIVERED,
        s if Change::Retry(how).applies_to().contains(&s) => return None,
        _ => "a delivery is in flight; wait for it, or cancel it first",
    };
    Some(StoreError::InvalidState {
        id: intent.id,
        state: intent.state,
        why,
    })
}

/// The intent a reference names: a live one by id, or a purged one by its
/// key in the ledger.
#[derive(Debug, Clone, PartialEq)]
enum Named {
    Live(i64),
    Ledger(String),
}

/// What a reference may mean: `id:N` an id, `key:K` a key, a bare number
/// an id or a key, anything else a key. The whole reference is always a
/// key too (a key may itself begin with `id:` or `key:`).
fn readings(reference: &str) -> (Vec<String>, Vec<i64>) {
    let mut keys = vec![reference.to_string()];
    let mut ids = Vec::new();
    if let Some(key) = reference.strip_prefix("key:") {
        keys.push(key.to_string());
    } else if let Some(id) = reference.strip_prefix("id:") {
        ids.extend(id.parse::<i64>().ok());
    } else {
        ids.extend(reference.parse::<i64>().ok());
    }
    (keys, ids)
}

impl Store {
    /// Which intent `reference` names, live or in the ledger. A reference
    /// that names two (a number that is one intent's id and another's key)
    /// is refused with both; `id:N` and `key:K` say which.
    async fn named(&self, reference: &str) -> Result<Named, StoreError> {
        let (keys, ids) = readings(reference);
        let rows: Vec<(bool, i64, String)> = sqlx::query_as(
            // the keys' intents by id: the log has no index on the key,
            // outbox.intent_keys has
            "SELECT true, id, key FROM outbox.intents
              WHERE id = ANY($2::bigint[]
                             || ARRAY(SELECT k.intent_id FROM outbox.intent_keys k
                                       WHERE k.key = ANY($1)))
                AND (key = ANY($1) OR id = ANY($2))
             UNION ALL
             SELECT false, intent_id, key FROM outbox.ledger
              WHERE key = ANY($1) OR intent_id = ANY($2)
             ORDER BY 2",
        )
        .bind(&keys)
        .bind(&ids)
        .fetch_all(&self.pool)
        .await?;
        let mut found: Vec<(bool, i64, String)> = Vec::new();
        for row in rows {
            if !found.iter().any(|f| f.1 == row.1) {
                found.push(row);
            }
        }
        match found.len() {
            0 => Err(StoreError::NotFound(reference.to_string())),
            1 => {
                let (live, id, key) = found.remove(0);
                Ok(if live {
                    Named::Live(id)
                } else {
                    Named::Ledger(key)
                })
            }
            _ => Err(StoreError::Ambiguous {
                reference: reference.to_string(),
                candidates: found
                    .iter()
                    .map(|(live, id, key)| {
                        if *live {
                            format!("intent {id} with key {key:?} (id:{id})")
                        } else {
                            format!("purged intent {id} with key {key:?} (key:{key})")
                        }
                    })
                    .collect(),
            }),
        }
    }

    /// Find a live intent by id or key (`id:N`, `key:K`, or either; a
    /// reference that names two intents, live or purged, is refused).
    pub async fn find(&self, reference: &str) -> Result<Intent, StoreError> {
        match self.named(reference).await? {
            Named::Live(id) => self.find_id(id).await.map_err(|e| match e {
                StoreError::NotFound(_) => StoreError::NotFound(reference.to_string()),
                e => e,
            }),
            Named::Ledger(_) => Err(StoreError::NotFound(reference.to_string())),
        }
    }

    /// The intent with this id (never a key: an intent's key may be another's id).
    pub async fn find_id(&self, id: i64) -> Result<Intent, StoreError> {
        let sql = format!("SELECT {INTENT_COLUMNS} FROM outbox.intents WHERE id = $1");
        sqlx::query_as::<_, Intent>(&sql)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
            .ok_or_else(|| StoreError::NotFound(id.to_string()))
    }

    /// The live intent with this key or id, else the ledger's record of it
    /// (a reference that names two is refused, as by [`Store::find`]).
    pub async fn lookup(&self, reference: &str) -> Result<Known, StoreError> {
        let found = match self.named(reference).await? {
            Named::Live(id) => self.find_id(id).await.map(|i| Known::Live(Box::new(i))),
            Named::Ledger(key) => self.lookup_key(&key).await,
        };
        found.map_err(|e| match e {
            StoreError::NotFound(_) => StoreError::NotFound(reference.to_string()),
            e => e,
        })
    }

    /// The live intent whose key is exactly `key`, else the ledger's record
    /// of that key. Never by id: for callers that must not let anyone walk
    /// the ids (`GET /v1/intents/{key}`).
    pub async fn lookup_key(&self, key: &str) -> Result<Known, StoreError> {
        let sql = format!("SELECT {INTENT_COLUMNS} FROM outbox.intents WHERE key = $1");
        let live: Option<Intent> = sqlx::query_as(&sql)
            .bind(key)
            .fetch_optional(&self.pool)
            .await?;
        if let Some(intent) = live {
            return Ok(Known::Live(Box::new(intent)));
        }
        let entry: Option<LedgerEntry> = sqlx::query_as(&format!(
            "SELECT {LEDGER_COLUMNS} FROM outbox.ledger WHERE key = $1"
        ))
        .bind(key)
        .fetch_optional(&self.pool)
        .await?;
        // its last error as every shown URL is shown
        // (`outbox_providers::redact`): a row purged before the rule
        // may carry a URL's secrets
        entry
            .map(|mut e| {
                e.last_error = e.last_error.map(|t| outbox_providers::redact::urls_in(&t));
                Known::Ledger(e)
            })
            .ok_or_else(|| StoreError::NotFound(key.to_string()))
    }

    /// An intent's attempts, each one's error shown as every URL is shown
    /// (`outbox_providers::redact`), whenever and by whichever relay it
    /// was written.
    pub async fn attempts(&self, intent_id: i64) -> Result<Vec<Attempt>, StoreError> {
        let mut attempts: Vec<Attempt> = sqlx::query_as(
            "SELECT attempt, fence, owner, started_at, finished_at, outcome, status, provider_ref,
                    error, replayed, accepted, key_generation
               FROM outbox.attempt_history WHERE intent_id = $1 ORDER BY fence, id NULLS FIRST",
        )
        .bind(intent_id)
        .fetch_all(&self.pool)
        .await?;
        for a in &mut attempts {
            a.error = a
                .error
                .take()
                .map(|e| outbox_providers::redact::urls_in(&e));
        }
        Ok(attempts)
    }

    pub async fn actions(&self, intent_id: i64) -> Result<Vec<Action>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT action, detail, actor, at FROM outbox.operator_actions
              WHERE intent_id = $1 ORDER BY id",
        )
        .bind(intent_id)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Newest first.
    pub async fn list(
        &self,
        state: Option<&str>,
        kind: Option<&str>,
        limit: i64,
    ) -> Result<Vec<Intent>, StoreError> {
        let sql = format!(
            "SELECT {INTENT_COLUMNS} FROM outbox.intents
              WHERE ($1::text IS NULL OR state = $1) AND ($2::text IS NULL OR kind = $2)
              ORDER BY id DESC LIMIT $3"
        );
        Ok(sqlx::query_as(&sql)
            .bind(state)
            .bind(kind)
            .bind(limit)
            .fetch_all(&self.pool)
            .await?)
    }

    /// Retry one intent now. Keeps the idempotency key unless
    /// `how.new_effect`, which bumps the key generation: the provider sees a
    /// new operation. A delivered intent needs `how.force`; a live claim is
    /// refused.
    pub async fn retry(&self, reference: &str, how: RetryOptions) -> Result<Intent, StoreError> {
        let intent = self.find(reference).await?;
        if let Some(refusal) = retry_refusal(&intent, how) {
            return Err(refusal);
        }
        let changed = self.retry_ids(&[intent.id], how).await?;
        let now = self.find_id(intent.id).await?;
        if changed == 0 {
            // its state changed in between (claimed, or delivered meanwhile)
            return Err(retry_refusal(&now, how).unwrap_or(StoreError::NotFound(reference.into())));
        }
        Ok(now)
    }

    /// The intents a bulk retry `how` of `filter` would touch now, in id
    /// order: what `retry --state` counts, and the only intents
    /// [`Store::retry_selected`] may then change.
    pub async fn select_matching(
        &self,
        filter: &Filter,
        how: RetryOptions,
    ) -> Result<Vec<i64>, StoreError> {
        match filter.search().for_change(&Change::Retry(how)) {
            Some(search) => self.select_search(&search, i64::MAX, i64::MAX).await,
            None => Ok(Vec::new()),
        }
    }

    /// Retry those of `ids` (from [`Store::select_matching`]) that still
    /// match `filter`, in batches of `batch`. Returns how many were retried; the rest left
    /// the filter meanwhile. An intent that entered it after the selection
    /// is not retried. Delivered intents are left alone unless `how.force`.
    /// `progress(done)` is called after each batch.
    pub async fn retry_selected(
        &self,
        filter: &Filter,
        ids: &[i64],
        how: RetryOptions,
        batch: usize,
        mut progress: impl FnMut(u64),
    ) -> Result<u64, StoreError> {
        let change = Change::Retry(how);
        let Some(search) = filter.search().for_change(&change) else {
            return Ok(0);
        };
        let mut done = 0u64;
        for chunk in ids.chunks(batch.max(1)) {
            done += self.change_selected(&search, &change, chunk).await?;
            progress(done);
        }
        Ok(done)
    }

    /// How many intents a bulk retry would touch (its dry run).
    pub async fn count_matching(&self, filter: &Filter) -> Result<i64, StoreError> {
        self.count_search(&filter.search(), i64::MAX).await
    }

    pub(crate) async fn retry_ids(
        &self,
        ids: &[i64],
        how: RetryOptions,
    ) -> Result<u64, StoreError> {
        self.retry_ids_in(ids, how, &Change::Retry(how).applies_to())
            .await
    }

    async fn retry_ids_in(
        &self,
        ids: &[i64],
        how: RetryOptions,
        states: &[IntentState],
    ) -> Result<u64, StoreError> {
        self.track(ids).await?;
        let n: i64 = sqlx::query_scalar(
            "WITH old AS (
                 SELECT id, state FROM outbox.intent_rows
                  WHERE id = ANY($1) AND state = ANY($3) ORDER BY id FOR UPDATE),
             r AS (
                 UPDATE outbox.intent_rows i
                    SET state = 'pending', run_after = now(), attempts_base = attempts,
                        owner = NULL, lease_expires_at = NULL, fence = fence + 1,
                        -- a retry starts afresh: no lost attempt of a dead
                        -- relay is reconciled first any more
                        recover_owner = NULL, recover_at = NULL,
                        key_generation = key_generation + CASE WHEN $2 THEN 1 ELSE 0 END,
                        updated_at = now()
                   FROM old WHERE i.id = old.id
                 RETURNING i.id, i.key_generation, old.state AS was),
             a AS (
                 INSERT INTO outbox.operator_actions (intent_id, action, detail, actor)
                 SELECT id, 'retry', jsonb_build_object('new_effect', $2, 'key_generation', key_generation,
                                                        'from', was),
                        coalesce($4, current_user)
                   FROM r)
             SELECT count(*) FROM r",
        )
        .bind(ids)
        .bind(how.new_effect)
        .bind(sql_names(states))
        .bind(self.actor())
        .fetch_one(&self.pool)
        .await?;
        Ok(n as u64)
    }

    /// Cancel a pending, claimed, ambiguous or dead intent. A claim in flight
    /// is fenced off: its completion will be refused (the effect itself may
    /// still happen if the request had already left).
    pub async fn cancel(&self, reference: &str) -> Result<Intent, StoreError> {
        let intent = self.find(reference).await?;
        let changed = self.change_ids(&[intent.id], &Change::Cancel).await? > 0;
        if !changed {
            return Err(StoreError::InvalidState {
                id: intent.id,
                state: intent.state,
                why: "only pending, claimed, ambiguous or dead intents can be cancelled",
            });
        }
        self.find_id(intent.id).await
    }

    /// Settle an ambiguous (or dead) intent by hand. `$5` in the SET clauses
    /// is the resolution's argument (reference or reason).
    pub async fn resolve(&self, reference: &str, how: &Resolution) -> Result<Intent, StoreError> {
        let intent = self.find(reference).await?;
        let changed = self
            .change_ids(&[intent.id], &Change::Resolve(how.clone()))
            .await?
            > 0;
        if !changed {
            return Err(StoreError::InvalidState {
                id: intent.id,
                state: intent.state,
                why: "only ambiguous or dead intents can be resolved",
            });
        }
        self.find_id(intent.id).await
    }

    /// Apply `change` to the intents `ids` that are in a state it applies
    /// to, in one statement, each recorded in `outbox.operator_actions`.
    /// Returns how many changed. Used one id at a time by `retry`, `cancel`
    /// and `resolve`, and in batches by the console's bulk actions.
    pub async fn change_ids(&self, ids: &[i64], change: &Change) -> Result<u64, StoreError> {
        self.change_ids_in(ids, change, &[]).await
    }

    /// [`Store::change_ids`], for those of `ids` also in one of `states`
    /// (none: any state the change applies to).
    pub async fn change_ids_in(
        &self,
        ids: &[i64],
        change: &Change,
        states: &[IntentState],
    ) -> Result<u64, StoreError> {
        let within = |applies: &[IntentState]| -> Vec<IntentState> {
            applies
                .iter()
                .copied()
                .filter(|s| states.is_empty() || states.contains(s))
                .collect()
        };
        let cancel =
            "state = 'cancelled', last_error = coalesce(last_error, 'cancelled by an operator')";
        let (from, set, action, detail, arg): (&[IntentState], &str, &str, Value, Option<String>) =
            match change {
                Change::Retry(how) => return self.retry_ids_in(ids, *how, &within(&change.applies_to())).await,
                Change::Cancel => (&CANCELLABLE, cancel, "cancel", json!({}), None),
                Change::Resolve(Resolution::Delivered { reference }) => (
                    &RESOLVABLE,
                    "state = 'delivered', delivered_at = now(), provider_ref = coalesce($5, provider_ref)",
                    "resolve",
                    json!({"as": Delivered, "ref": reference}),
                    reference.clone(),
                ),
                Change::Resolve(Resolution::Redeliver) => (
                    &RESOLVABLE,
                    "state = 'pending', run_after = now(), attempts_base = attempts",
                    "resolve",
                    json!({"as": "redeliver"}),
                    None,
                ),
                Change::Resolve(Resolution::Reject { reason }) => (
                    &RESOLVABLE,
                    "state = 'rejected', last_error = $5",
                    "resolve",
                    json!({"as": Rejected, "reason": reason}),
                    Some(format!("rejected by an operator: {reason}")),
                ),
            };
        self.track(ids).await?;
        let sql = format!(
            "WITH old AS (
                 SELECT id, state FROM outbox.intent_rows
                  WHERE id = ANY($1) AND state = ANY($2) ORDER BY id FOR UPDATE),
             t AS (
                 UPDATE outbox.intent_rows i SET {set}, owner = NULL, lease_expires_at = NULL,
                        recover_owner = NULL, recover_at = NULL,
                        fence = fence + 1, updated_at = now()
                   FROM old WHERE i.id = old.id
                 RETURNING i.id, old.state AS was, $5::text AS arg),
             a AS (
                 INSERT INTO outbox.operator_actions (intent_id, action, detail, actor)
                 SELECT id, $3, $4 || jsonb_build_object('from', was), coalesce($6, current_user)
                   FROM t)
             SELECT count(*) FROM t"
        );
        let n: i64 = sqlx::query_scalar(&sql)
            .bind(ids)
            .bind(sql_names(&within(from)))
            .bind(action)
            .bind(detail)
            .bind(arg)
            .bind(self.actor())
            .fetch_one(&self.pool)
            .await?;
        Ok(n as u64)
    }
}

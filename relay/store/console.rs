//! What the console reads beyond the CLI's reads: intents by any filter
//! (keyset pages), failures grouped into incidents, attempts per minute,
//! and bulk changes to everything a filter matches, in batches.
//!
//! Every filter is served by an index or bounded: `state` and `kind` use
//! `intents_unsettled` (every state but `delivered`, which most rows are in
//! and which the primary-key walk finds), the page walks the primary key
//! downwards from its cursor, and the filters no index serves (key prefix, host, error text,
//! class, time range, payload containment) are applied to at most
//! [`SCAN_WINDOW`] rows per page. A page that reached the end of its window
//! says where it stopped, and the next page continues from there.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::{FromRow, Postgres, QueryBuilder};

use super::operator::{Change, Filter};
use super::{Store, StoreError};
use crate::state::IntentState;

/// How many rows one page reads at most to apply the filters no index serves.
pub const SCAN_WINDOW: i64 = 50_000;

/// Which intents: every field is optional, and all given must match.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Search {
    /// Any of these states (empty: any state).
    pub states: Vec<IntentState>,
    pub kind: Option<String>,
    /// The key starts with this.
    pub key_prefix: Option<String>,
    /// The destination: an origin (`https://api.example:8443`), its
    /// `host:port` or host alone, an endpoint name, or `smtp`, `charge`,
    /// `nats`, `amqp`, `kafka`.
    pub host: Option<String>,
    /// Webhook endpoint names that are `host` too (their origin is it).
    pub host_names: Vec<String>,
    /// Intents without a destination (a webhook whose URL cannot be read):
    /// `host=(none)`.
    pub no_destination: bool,
    /// `last_error` contains this, ignoring case.
    pub error: Option<String>,
    /// `outbox.error_class(last_error)` is this (a failure group's class).
    pub class: Option<String>,
    /// Created at or after.
    pub since: Option<DateTime<Utc>>,
    /// Created before.
    pub until: Option<DateTime<Utc>>,
    /// The payload contains this JSON (`payload @> ...`).
    pub payload: Option<Value>,
    /// Exactly this intent.
    pub id: Option<i64>,
}

impl Filter {
    /// The same as a console search.
    pub fn search(&self) -> Search {
        Search {
            states: vec![self.state],
            kind: self.kind.clone(),
            ..Default::default()
        }
    }
}

impl Search {
    /// True when some filter needs the bounded scan.
    pub fn scans(&self) -> bool {
        self.key_prefix.is_some()
            || self.host.is_some()
            || self.no_destination
            || self.error.is_some()
            || self.class.is_some()
            || self.since.is_some()
            || self.until.is_some()
            || self.payload.is_some()
    }

    /// ` AND ...` for the filters an index serves.
    fn push_indexed(&self, q: &mut QueryBuilder<'_, Postgres>) {
        if !self.states.is_empty() {
            // written into the text, not bound: the planner then sees that
            // states other than `delivered` are all in `intents_unsettled`
            // (a state's spelling is one of a fixed few, never the caller's)
            let names: Vec<String> = self
                .states
                .iter()
                .map(|s| format!("'{}'", s.as_sql()))
                .collect();
            q.push(format!(" AND state IN ({})", names.join(", ")));
        }
        if let Some(kind) = &self.kind {
            q.push(" AND kind = ").push_bind(kind.clone());
        }
        if let Some(id) = self.id {
            q.push(" AND id = ").push_bind(id);
        }
    }

    /// The same search, narrowed to the states `change` applies to: what a
    /// bulk action counts and changes is exactly what it can change. None
    /// when the search asks only for states the change does not apply to.
    pub fn for_change(&self, change: &Change) -> Option<Search> {
        let applies = change.applies_to();
        let states: Vec<IntentState> = if self.states.is_empty() {
            applies
        } else {
            self.states
                .iter()
                .copied()
                .filter(|s| applies.contains(s))
                .collect()
        };
        (!states.is_empty()).then(|| Search {
            states,
            ..self.clone()
        })
    }

    /// ` AND ...` for the rest.
    fn push_scanned(&self, q: &mut QueryBuilder<'_, Postgres>) {
        if let Some(prefix) = &self.key_prefix {
            q.push(" AND left(key, ")
                .push_bind(prefix.chars().count() as i32)
                .push(") = ")
                .push_bind(prefix.clone());
        }
        if let Some(host) = &self.host {
            // the origin, host:port, the host alone, or an endpoint name
            let host = host.to_lowercase();
            q.push(
                " AND EXISTS (SELECT 1 FROM (SELECT lower(outbox.destination_of(kind, destination, payload)) AS d) x
                   WHERE x.d = ",
            )
            .push_bind(host.clone())
            .push(" OR regexp_replace(x.d, '^[a-z0-9+.-]*://', '') = ")
            .push_bind(host.clone())
            .push(" OR regexp_replace(x.d, '^[a-z0-9+.-]*://|:[0-9]+$', '', 'g') = ")
            .push_bind(host)
            .push(" OR x.d = ANY(")
            .push_bind(self.host_names.iter().map(|n| n.to_lowercase()).collect::<Vec<_>>())
            .push("))");
        }
        if self.no_destination {
            q.push(" AND outbox.destination_of(kind, destination, payload) IS NULL");
        }
        if let Some(error) = &self.error {
            q.push(" AND strpos(lower(last_error), ")
                .push_bind(error.to_lowercase())
                .push(") > 0");
        }
        if let Some(class) = &self.class {
            q.push(" AND outbox.error_class(last_error) = ")
                .push_bind(class.clone());
        }
        if let Some(since) = self.since {
            q.push(" AND created_at >= ").push_bind(since);
        }
        if let Some(until) = self.until {
            q.push(" AND created_at < ").push_bind(until);
        }
        if let Some(payload) = &self.payload {
            q.push(" AND payload @> ").push_bind(payload.clone());
        }
    }
}

/// An intent as a list shows it.
#[derive(Debug, Clone, Serialize, FromRow)]
pub struct Listed {
    pub id: i64,
    pub key: String,
    pub kind: String,
    #[sqlx(try_from = "String")]
    pub state: IntentState,
    pub attempts: i32,
    /// Where it goes (see [`Search::host`]).
    pub destination: Option<String>,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// One page of a search, newest first.
#[derive(Debug, Clone, Serialize)]
pub struct Page {
    pub intents: Vec<Listed>,
    /// The cursor of the next page (`before`), if there may be one.
    pub next_before: Option<i64>,
    /// The page read its whole scan window without filling up: the next
    /// page (`next_before`) continues the search below this id.
    pub window_ended_at: Option<i64>,
}

/// Failures that read as one incident.
#[derive(Debug, Clone, Serialize, FromRow)]
pub struct FailureGroup {
    /// `dead`, `ambiguous`, or `pending` (failing, will be retried).
    #[sqlx(try_from = "String")]
    pub state: IntentState,
    pub kind: String,
    pub destination: Option<String>,
    /// `outbox.error_class(last_error)`.
    pub class: String,
    pub count: i64,
    pub first_seen: DateTime<Utc>,
    pub last_seen: DateTime<Utc>,
    /// The newest intent of the group, as an example.
    pub example_id: i64,
    pub example_error: Option<String>,
}

impl FailureGroup {
    /// The search that matches exactly this group's intents.
    pub fn search(&self) -> Search {
        Search {
            states: vec![self.state],
            kind: Some(self.kind.clone()),
            host: self.destination.clone(),
            no_destination: self.destination.is_none(),
            class: Some(self.class.clone()),
            ..Search::default()
        }
    }
}

/// Attempts started in one bucket of time.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Bucket {
    pub at: DateTime<Utc>,
    pub delivered: i64,
    pub failed: i64,
}

/// At most this many failure groups are listed (the largest first).
pub const MAX_GROUPS: i64 = 200;

impl Store {
    /// One page of intents matching `search`, below the cursor `before`.
    pub async fn search(
        &self,
        search: &Search,
        before: Option<i64>,
        limit: i64,
    ) -> Result<Page, StoreError> {
        let limit = limit.clamp(1, 500);
        let mut q = QueryBuilder::new(
            "SELECT id, key, kind, state, attempts,
                    outbox.destination_of(kind, destination, payload) AS destination,
                    left(last_error, 300) AS last_error, created_at, updated_at FROM ",
        );
        if search.scans() {
            q.push("(SELECT * FROM outbox.intents WHERE true");
            search.push_indexed(&mut q);
            if let Some(b) = before {
                q.push(" AND id < ").push_bind(b);
            }
            q.push(" ORDER BY id DESC LIMIT ")
                .push_bind(SCAN_WINDOW)
                .push(") AS intents WHERE true");
            search.push_scanned(&mut q);
        } else {
            q.push("outbox.intents WHERE true");
            search.push_indexed(&mut q);
            if let Some(b) = before {
                q.push(" AND id < ").push_bind(b);
            }
        }
        q.push(" ORDER BY id DESC LIMIT ").push_bind(limit + 1);
        let mut intents: Vec<Listed> = q.build_query_as().fetch_all(&self.pool).await?;
        // each last error as every shown URL is shown
        // (`outbox_providers::redact`), one written before the rule included
        for i in &mut intents {
            i.last_error = i
                .last_error
                .take()
                .map(|e| outbox_providers::redact::urls_in(&e));
        }
        let full = intents.len() as i64 > limit;
        intents.truncate(limit as usize);
        let mut page = Page {
            next_before: if full {
                intents.last().map(|i| i.id)
            } else {
                None
            },
            intents,
            window_ended_at: None,
        };
        if !full && search.scans() {
            // did the window end before the table did?
            let mut w = QueryBuilder::new("SELECT id FROM outbox.intents WHERE true");
            search.push_indexed(&mut w);
            if let Some(b) = before {
                w.push(" AND id < ").push_bind(b);
            }
            w.push(" ORDER BY id DESC OFFSET ")
                .push_bind(SCAN_WINDOW - 1)
                .push(" LIMIT 1");
            let last: Option<i64> = w.build_query_scalar().fetch_optional(&self.pool).await?;
            if let Some(last) = last {
                page.window_ended_at = Some(last);
                page.next_before = Some(last);
            }
        }
        Ok(page)
    }

    /// How many intents match `search` with an id at most `up_to`.
    pub async fn count_search(&self, search: &Search, up_to: i64) -> Result<i64, StoreError> {
        let mut q = QueryBuilder::new("SELECT count(*) FROM outbox.intents WHERE id <= ");
        q.push_bind(up_to);
        search.push_indexed(&mut q);
        search.push_scanned(&mut q);
        Ok(q.build_query_scalar().fetch_one(&self.pool).await?)
    }

    /// The ids of the intents matching `search` with an id at most `up_to`,
    /// in id order, at most `limit` of them: the set a bulk action's dry
    /// run counts, and the only intents its confirmation may change.
    pub async fn select_search(
        &self,
        search: &Search,
        up_to: i64,
        limit: i64,
    ) -> Result<Vec<i64>, StoreError> {
        let mut q = QueryBuilder::new("SELECT id FROM outbox.intents WHERE id <= ");
        q.push_bind(up_to);
        search.push_indexed(&mut q);
        search.push_scanned(&mut q);
        q.push(" ORDER BY id LIMIT ").push_bind(limit);
        Ok(q.build_query_scalar().fetch_all(&self.pool).await?)
    }

    /// The newest intent id: the upper bound a bulk action is fixed to.
    pub async fn newest_id(&self) -> Result<i64, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT coalesce(max(id), 0) FROM outbox.intents")
                .fetch_one(&self.pool)
                .await?,
        )
    }

    /// Apply `change` to those of `ids` (one batch of a dry run's set) that
    /// still match `search`; returns how many changed. The others left the
    /// search since the dry run and are left alone; an intent outside `ids`
    /// is never looked at, whatever the search matches now. One short
    /// statement for the filter and one for the change (whose row locks
    /// check the states again), so a bulk action of any size holds no lock
    /// for long and can stop between any two batches.
    pub async fn change_selected(
        &self,
        search: &Search,
        change: &Change,
        ids: &[i64],
    ) -> Result<u64, StoreError> {
        let mut q = QueryBuilder::new("SELECT id FROM outbox.intents WHERE id = ANY(");
        q.push_bind(ids.to_vec()).push(")");
        search.push_indexed(&mut q);
        search.push_scanned(&mut q);
        let still: Vec<i64> = q.build_query_scalar().fetch_all(&self.pool).await?;
        if still.is_empty() {
            return Ok(0);
        }
        self.change_ids_in(&still, change, &search.states).await
    }

    /// Dead, ambiguous and failing (pending after a failure) intents,
    /// grouped by state, kind, destination and error class, the largest
    /// groups first. Reads only those states' rows (`intents_unsettled`),
    /// never the delivered history.
    pub async fn failure_groups(&self) -> Result<Vec<FailureGroup>, StoreError> {
        self.groups(
            "state IN ('dead', 'ambiguous') OR (state = 'pending' AND last_error IS NOT NULL)",
        )
        .await
    }

    /// Rejected intents (the provider refused them, or the relay could not
    /// send them: an unknown kind, a URL it cannot use), grouped as
    /// [`Store::failure_groups`] groups failures.
    pub async fn rejected_groups(&self) -> Result<Vec<FailureGroup>, StoreError> {
        self.groups("state = 'rejected'").await
    }

    async fn groups(&self, states: &'static str) -> Result<Vec<FailureGroup>, StoreError> {
        let sql = format!(
            "SELECT state, kind, destination, class, count(*) AS count,
                    min(updated_at) AS first_seen, max(updated_at) AS last_seen,
                    max(id) AS example_id,
                    (array_agg(left(last_error, 300) ORDER BY id DESC))[1] AS example_error
               FROM (SELECT state, kind, id, updated_at, last_error,
                            outbox.destination_of(kind, destination, payload) AS destination,
                            outbox.error_class(last_error) AS class
                       FROM outbox.intents
                      WHERE {states}) f
              GROUP BY state, kind, destination, class
              ORDER BY count(*) DESC, max(id) DESC
              LIMIT $1"
        );
        let mut groups: Vec<FailureGroup> = sqlx::query_as(&sql)
            .bind(MAX_GROUPS)
            .fetch_all(&self.pool)
            .await?;
        // the example error as every shown URL is shown
        // (`outbox_providers::redact`)
        for g in &mut groups {
            g.example_error = g
                .example_error
                .take()
                .map(|e| outbox_providers::redact::urls_in(&e));
        }
        Ok(groups)
    }

    /// Attempts per `step_secs` bucket (delivered and accepted; failed:
    /// transient, ambiguous, rejected or lost) started at or after the
    /// epoch second `from`, which is a multiple of `step_secs`: the
    /// buckets that have any, oldest first, as (bucket start in epoch
    /// seconds, delivered, failed). Reads that span of attempts through the
    /// BRIN indexes on their start (`attempts_started_brin`, and
    /// `intents_first_attempt_brin` for the first attempts kept on intents).
    pub async fn attempt_counts(
        &self,
        from: i64,
        step_secs: i64,
    ) -> Result<Vec<(i64, i64, i64)>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT (floor(extract(epoch FROM started_at))::bigint / $2) * $2 AS at,
                    count(*) FILTER (WHERE outcome = 'delivered' AND accepted) AS delivered,
                    count(*) FILTER (WHERE outcome IN ('transient', 'ambiguous', 'rejected', 'lost')) AS failed
               FROM outbox.attempt_history
              WHERE started_at >= to_timestamp($1)
              GROUP BY 1 ORDER BY 1",
        )
        .bind(from)
        .bind(step_secs)
        .fetch_all(&self.pool)
        .await?)
    }
}

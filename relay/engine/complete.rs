//! The completer: writes completions in batches, fenced, and never drops one
//! that can be recorded.
//!
//! Delivery tasks send their completion here and wait for the write. Whatever
//! has arrived since the last write goes out in one statement, so under load
//! one round trip completes many intents.
//!
//! Two kinds of failure are told apart:
//!
//! - The database is away or busy (connection lost, restart, serialization
//!   failure): the same batch is retried with backoff, so an effect that
//!   happened is recorded once the database is back. The statement is
//!   fenced and idempotent, so a retry after an unknown commit result is
//!   harmless, and completions that the lost commit did record are counted
//!   as written, not as fencing rejections.
//! - The batch holds a row the database refuses (a data or integrity
//!   error): retrying it would refuse it forever and wedge every completion
//!   behind it. The batch is split until the refused row stands alone, and
//!   that row is written once more in a safe form (its provider text
//!   replaced by a note). A completion whose intent no longer exists is
//!   dropped and counted.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::kinds::Kind;
use crate::observe::metrics::kind_label;
use crate::state::IntentState;
use crate::store::{sqlstate, Completion, Store, Written};

/// A completion and the channel that tells its task whether it was accepted.
pub type Pending = (Completion, oneshot::Sender<bool>);

/// Where delivery tasks hand their completions: the completer's inbox.
#[derive(Debug, Clone)]
pub struct Sink {
    tx: mpsc::UnboundedSender<Pending>,
}

impl Sink {
    /// Hand `completion` to the completer and wait until it is written.
    /// True when the database accepted it (its fence still held).
    pub async fn write(&self, completion: Completion) -> bool {
        let (ack, written) = oneshot::channel();
        if self.tx.send((completion, ack)).is_err() {
            return false;
        }
        written.await.unwrap_or(false)
    }
}

/// What the completer shares with the rest of the engine: its statement in
/// progress (for the supervisor), its tally (for the summary line) and its
/// statement counts.
#[derive(Debug, Default, Clone)]
pub struct Gauges {
    pub progress: Arc<Progress>,
    pub tally: Arc<Tally>,
    pub batches: Arc<BatchCounts>,
}

/// Start the completer: it writes batches of up to `max_batch` and ends
/// when every [`Sink`] clone is dropped.
pub fn start(
    store: Store,
    owner: String,
    max_batch: usize,
    gauges: Gauges,
) -> (Sink, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(run(
        store,
        owner,
        rx,
        max_batch,
        gauges.batches,
        gauges.progress,
        gauges.tally,
    ));
    (Sink { tx }, task)
}
/// How many statements the engine's claims and completions took and how
/// many intents they carried: intents per statement is what the database's
/// cost per intent depends on most (the README's ceiling by batch size).
/// Also exported as the histograms `outbox_claim_batch_size` and
/// `outbox_completion_batch_size`.
#[derive(Debug, Default)]
pub struct BatchCounts {
    claims: AtomicU64,
    claimed: AtomicU64,
    writes: AtomicU64,
    written: AtomicU64,
}

/// A reading of [`BatchCounts`].
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Batches {
    /// Claim statements that claimed at least one intent, and those intents.
    pub claims: u64,
    pub claimed: u64,
    /// Completion statements, and the completions they wrote.
    pub writes: u64,
    pub written: u64,
}

impl Batches {
    /// Mean intents per claim statement (0 when none claimed anything).
    pub fn per_claim(&self) -> f64 {
        self.claimed as f64 / self.claims.max(1) as f64
    }

    /// Mean completions per completion statement (0 when none was written).
    pub fn per_write(&self) -> f64 {
        self.written as f64 / self.writes.max(1) as f64
    }
}

impl BatchCounts {
    /// A claim statement returned `n` intents (an empty claim is not counted).
    pub fn claimed(&self, n: usize) {
        if n > 0 {
            self.claims.fetch_add(1, Ordering::Relaxed);
            self.claimed.fetch_add(n as u64, Ordering::Relaxed);
            metrics::histogram!("outbox_claim_batch_size").record(n as f64);
        }
    }

    /// A completion statement wrote `n` completions.
    pub fn written(&self, n: usize) {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.written.fetch_add(n as u64, Ordering::Relaxed);
        metrics::histogram!("outbox_completion_batch_size").record(n as f64);
    }

    /// The counts so far.
    pub fn read(&self) -> Batches {
        Batches {
            claims: self.claims.load(Ordering::Relaxed),
            claimed: self.claimed.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            written: self.written.load(Ordering::Relaxed),
        }
    }
}

/// What the supervisor reads to tell a completer that is stuck from one that
/// waits for the database: the start of the statement in progress, in
/// milliseconds since the epoch (0 when none is running).
#[derive(Debug, Default)]
pub struct Progress {
    statement_since_ms: AtomicI64,
}

impl Progress {
    /// How long the statement in progress has been running.
    pub fn statement_age(&self) -> Option<Duration> {
        let since = self.statement_since_ms.load(Ordering::Relaxed);
        (since > 0).then(|| Duration::from_millis((now_ms() - since).max(0) as u64))
    }

    fn start(&self) {
        self.statement_since_ms.store(now_ms(), Ordering::Relaxed);
    }

    fn end(&self) {
        self.statement_since_ms.store(0, Ordering::Relaxed);
    }
}

/// What the completer wrote since the last summary: the daemon's periodic
/// log line reads and resets it.
#[derive(Debug, Default)]
pub struct Tally {
    pub delivered: AtomicU64,
    pub rejected: AtomicU64,
    pub retried: AtomicU64,
    pub dead: AtomicU64,
    pub ambiguous: AtomicU64,
    pub replays: AtomicU64,
    pub fenced: AtomicU64,
}

/// A reading of [`Tally`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub delivered: u64,
    pub rejected: u64,
    pub retried: u64,
    pub dead: u64,
    pub ambiguous: u64,
    pub replays: u64,
    pub fenced: u64,
}

impl Tally {
    /// The counts since the last call, and start again from zero.
    pub fn take(&self) -> Counts {
        let take = |a: &AtomicU64| a.swap(0, Ordering::Relaxed);
        Counts {
            delivered: take(&self.delivered),
            rejected: take(&self.rejected),
            retried: take(&self.retried),
            dead: take(&self.dead),
            ambiguous: take(&self.ambiguous),
            replays: take(&self.replays),
            fenced: take(&self.fenced),
        }
    }

    fn count(&self, c: &Completion, accepted: bool) {
        let add = |a: &AtomicU64| {
            a.fetch_add(1, Ordering::Relaxed);
        };
        if c.uncounted {
            return;
        }
        if !accepted {
            return add(&self.fenced);
        }
        if c.replayed || c.operator_replay {
            add(&self.replays);
        }
        match c.state {
            IntentState::Delivered => add(&self.delivered),
            IntentState::Rejected => add(&self.rejected),
            IntentState::Dead => add(&self.dead),
            IntentState::Ambiguous => add(&self.ambiguous),
            _ => add(&self.retried),
        }
    }
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

async fn run(
    store: Store,
    owner: String,
    mut rx: mpsc::UnboundedReceiver<Pending>,
    max_batch: usize,
    batches: Arc<BatchCounts>,
    progress: Arc<Progress>,
    tally: Arc<Tally>,
) {
    let mut batch: Vec<Pending> = Vec::with_capacity(max_batch);
    let writer = Writer {
        store: &store,
        owner: &owner,
        progress: &progress,
    };
    while let Some(first) = rx.recv().await {
        batch.push(first);
        while batch.len() < max_batch {
            match rx.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        let (completions, acks): (Vec<Completion>, Vec<_>) = batch.drain(..).unzip();
        let written = writer.write(&completions).await;
        batches.written(completions.len());
        let accepted: HashMap<i64, _> = written
            .accepted
            .into_iter()
            .map(|a| (a.id, a.created_at))
            .collect();
        let now = chrono::Utc::now();
        for (c, ack) in completions.iter().zip(acks) {
            if written.gone.contains(&c.id) {
                metrics::counter!("outbox_completions_dropped_total", "reason" => "intent_gone")
                    .increment(1);
                tracing::warn!(
                    intent = c.id,
                    outcome = %c.outcome,
                    "completion dropped: the intent no longer exists (cancelled and purged while its attempt was in flight)"
                );
                let _ = ack.send(false);
                continue;
            }
            let created_at = accepted.get(&c.id).copied();
            record_metrics(c, created_at.is_some(), now, created_at);
            tally.count(c, created_at.is_some());
            let _ = ack.send(created_at.is_some());
        }
    }
}

/// Is this error about the rows (refused whatever the retry), rather than
/// about the database being reachable? SQLSTATE classes 22 (data
/// exception: a NUL in text, `\u0000` in jsonb, a value out of range), 23
/// (integrity: a foreign key to an intent purged meanwhile) and 54 (a
/// program limit).
pub fn is_data_error(err: &sqlx::Error) -> bool {
    sqlstate(err).is_some_and(|s| s.starts_with("22") || s.starts_with("23") || s.starts_with("54"))
}

struct Writer<'a> {
    store: &'a Store,
    owner: &'a str,
    progress: &'a Progress,
}

impl Writer<'_> {
    /// Write a batch: retried while the database is away, split when it
    /// refuses a row.
    async fn write(&self, completions: &[Completion]) -> Written {
        match self.until_written(completions).await {
            Ok(written) => written,
            Err(err) => self.split(completions, err).await,
        }
    }

    /// Retry until the statement succeeds or fails on the data itself.
    async fn until_written(&self, completions: &[Completion]) -> Result<Written, sqlx::Error> {
        let mut delay = Duration::from_millis(50);
        let mut failures = 0u32;
        loop {
            self.progress.start();
            let result = self.store.complete(self.owner, completions).await;
            self.progress.end();
            match result {
                Ok(mut written) => {
                    if failures > 0 {
                        tracing::info!(
                            failures,
                            n = completions.len(),
                            "completions written after the database came back"
                        );
                        self.count_earlier_commit(completions, &mut written).await;
                    }
                    return Ok(written);
                }
                Err(err) if is_data_error(&err) => return Err(err),
                Err(err) => {
                    failures += 1;
                    if failures == 1 || failures.is_multiple_of(20) {
                        tracing::warn!(error = %err, n = completions.len(), failures, "cannot write completions; retrying");
                    }
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    /// After a failed try, an earlier run of the statement may have
    /// committed without the acknowledgement arriving: what it recorded is
    /// written, not refused by a fence.
    async fn count_earlier_commit(&self, completions: &[Completion], written: &mut Written) {
        let missing: Vec<Completion> = completions
            .iter()
            .filter(|c| {
                !written.gone.contains(&c.id) && !written.accepted.iter().any(|a| a.id == c.id)
            })
            .cloned()
            .collect();
        if missing.is_empty() {
            return;
        }
        match self.store.already_completed(&missing).await {
            Ok(earlier) => written.accepted.extend(earlier),
            Err(err) => {
                tracing::warn!(error = %err, "could not check for completions an earlier try recorded")
            }
        }
    }

    /// The database refused something in `completions`: halve until the
    /// refused row stands alone, then write it in a safe form.
    async fn split(&self, completions: &[Completion], err: sqlx::Error) -> Written {
        if completions.len() > 1 {
            let (a, b) = completions.split_at(completions.len() / 2);
            let mut written = Box::pin(self.write(a)).await;
            let rest = Box::pin(self.write(b)).await;
            written.accepted.extend(rest.accepted);
            written.gone.extend(rest.gone);
            return written;
        }
        let Some(c) = completions.first() else {
            return Written::default();
        };
        let code = sqlstate(&err).unwrap_or_default();
        tracing::error!(intent = c.id, sqlstate = %code, error = %err,
            "the database refused this completion; writing it without the provider's text");
        metrics::counter!("outbox_completions_sanitised_total", "kind" => kind_label(&c.kind))
            .increment(1);
        let safe = safe_form(c, &code);
        match self.until_written(std::slice::from_ref(&safe)).await {
            Ok(written) => written,
            Err(err) => {
                // Not even the bare outcome can be stored: record nothing
                // rather than wedge every completion behind this one. The
                // lease expires and the sweeper reconciles the intent.
                metrics::counter!("outbox_completions_dropped_total", "reason" => "refused")
                    .increment(1);
                tracing::error!(intent = c.id, error = %err,
                    "completion dropped: the database refuses even its safe form; the sweeper will reconcile the intent");
                Written::default()
            }
        }
    }
}

/// The completion with everything the provider said replaced by a note.
fn safe_form(c: &Completion, sqlstate: &str) -> Completion {
    let note = format!(
        "the provider's answer could not be stored (SQLSTATE {sqlstate}) and was dropped; outcome {}",
        c.outcome
    );
    Completion {
        error: Some(note),
        response: None,
        provider_ref: c.provider_ref.as_ref().map(|r| {
            r.chars()
                .filter(|ch| ch.is_ascii_graphic())
                .take(200)
                .collect()
        }),
        ..c.clone()
    }
}

fn record_metrics(
    c: &Completion,
    accepted: bool,
    now: chrono::DateTime<chrono::Utc>,
    created_at: Option<chrono::DateTime<chrono::Utc>>,
) {
    let kind = kind_label(&c.kind);
    if c.uncounted {
        metrics::counter!("outbox_deferrals_total", "kind" => kind).increment(1);
        return;
    }
    metrics::counter!("outbox_attempts_total", "kind" => kind, "outcome" => c.outcome.as_sql())
        .increment(1);
    if !accepted {
        metrics::counter!("outbox_fencing_rejections_total").increment(1);
        tracing::warn!(
            intent = c.id,
            fence = c.fence,
            outcome = %c.outcome,
            "completion refused: the lease had moved on (stale worker); the attempt is kept with accepted = false"
        );
        return;
    }
    if c.replayed {
        metrics::counter!("outbox_replays_total", "kind" => kind, "source" => "provider")
            .increment(1);
    }
    if c.operator_replay {
        metrics::counter!("outbox_replays_total", "kind" => kind, "source" => "operator")
            .increment(1);
    }
    // A 5xx is never terminal, but only an HTTP status is an HTTP status:
    // an SMTP 550 is a deliberate "no such mailbox".
    if matches!(c.state, IntentState::Delivered | IntentState::Rejected)
        && Kind::parse(&c.kind).is_some_and(Kind::reports_http_status)
        && c.status.is_some_and(|s| s >= 500)
    {
        metrics::counter!("outbox_invariant_violations_total", "kind" => kind).increment(1);
        tracing::error!(intent = c.id, status = c.status, state = %c.state,
            "invariant violated: a 5xx answer was stored as terminal");
    }
    if c.state == IntentState::Delivered && !c.delivered_before {
        metrics::counter!("outbox_delivered_total", "kind" => kind).increment(1);
        if let Some(created) = created_at {
            let latency = (now - created).to_std().unwrap_or_default();
            metrics::histogram!("outbox_delivery_latency_seconds", "kind" => kind)
                .record(latency.as_secs_f64());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::AttemptOutcome;

    #[test]
    fn the_safe_form_keeps_the_outcome_and_drops_the_text() {
        let c = Completion {
            id: 1,
            kind: "webhook".into(),
            delivered_before: false,
            operator_replay: false,
            fence: 2,
            attempt: 1,
            key_generation: 0,
            started_at: chrono::Utc::now(),
            finished_at: chrono::Utc::now(),
            outcome: AttemptOutcome::Rejected,
            status: Some(422),
            provider_ref: Some("ref\u{0}1".into()),
            error: Some("bad\u{0}".into()),
            replayed: false,
            uncounted: false,
            state: IntentState::Rejected,
            run_after: None,
            response: Some(serde_json::json!({"body": "\u{0}"})),
            log_batch: None,
        };
        let s = safe_form(&c, "22P05");
        assert_eq!(
            (s.state, s.outcome, s.status, s.fence),
            (
                IntentState::Rejected,
                AttemptOutcome::Rejected,
                Some(422),
                2
            )
        );
        assert_eq!(s.response, None);
        assert_eq!(s.provider_ref.as_deref(), Some("ref1"));
        assert!(s.error.unwrap().contains("SQLSTATE 22P05"));
    }
}

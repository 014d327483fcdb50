//! Performing one claimed intent's effect and settling its next state.
//!
//! A delivery task holds a claim permit from the claim until its completion
//! is written, and a delivery slot only while the effect is in progress, so
//! claiming, delivering and completing overlap. While the database is
//! unreachable, completions wait, claim permits run out and the relay stops
//! claiming by itself.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use futures_util::FutureExt;
use outbox_providers::{AmbiguityPolicy, Delivery, Outcome, ProviderSet};
use tokio::sync::{watch, Semaphore};
use tracing::Instrument;

use crate::config::RetryPolicy;
use crate::engine::budget::{ClaimBudget, Permit};
use crate::engine::complete::Sink;
use crate::engine::reconcile::{self, Recovery};
use crate::engine::room::{self, Aside, NoRoom, Rooms};
use crate::engine::settle::settle;
use crate::engine::standbys::Standbys;
use crate::engine::supervisor::panic_message;
use crate::kinds::Kind;
use crate::observe::metrics::kind_label;
use crate::observe::trace::{Identity, IntentContext, Tracer};
use crate::services::health::{Admit, Gate};
use crate::state::IntentState;
use crate::store::{Claimed, Completion, Store};

/// What delivering needs to know about time and retries.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How long a claim is held: an attempt must fit in what is left.
    pub lease: Duration,
    /// The longest any attempt may take; with less lease left a claim is
    /// handed back rather than started.
    pub max_attempt_time: Duration,
    /// Each kind's attempt budget (its provider timeout; reconcile searches
    /// run within it).
    pub attempt_times: HashMap<String, Duration>,
    /// Retry policies by kind, and the one for other kinds.
    pub policies: HashMap<String, RetryPolicy>,
    pub default_policy: RetryPolicy,
}

impl Settings {
    /// The budget one attempt of `kind` is held to.
    pub fn attempt_budget(&self, kind: &str) -> Duration {
        self.attempt_times.get(kind).copied().unwrap_or(self.lease)
    }

    /// The time an attempt of `kind` needs from the lease.
    pub fn attempt_time(&self, kind: &str) -> Duration {
        self.attempt_budget(kind).min(self.max_attempt_time)
    }

    pub fn retry_policy(&self, kind: &str) -> &RetryPolicy {
        self.policies.get(kind).unwrap_or(&self.default_policy)
    }
}

/// Performs claimed intents: the providers, the delivery slots, the
/// settings, where completions go and the budget their permits come from.
pub struct Deliverer {
    providers: ProviderSet,
    settings: Settings,
    /// One permit per effect in progress (`relay.concurrency`).
    slots: Arc<Semaphore>,
    budget: Arc<ClaimBudget>,
    sink: Sink,
    /// Hands back claims that will not be attempted.
    store: Store,
    /// Turns true when shutdown begins: claims not yet started are handed back.
    stopping: watch::Receiver<bool>,
    /// Destination health: limits, breakers, pauses.
    gate: Arc<Gate>,
    /// The span of each attempt, and the trace context it sends.
    tracer: Tracer,
    /// The wait for standbys before each effect.
    standbys: Arc<Standbys>,
    /// Room per destination (`webhook.max_in_flight_per_host`), waited
    /// for before a delivery slot.
    rooms: Rooms,
}

impl Deliverer {
    pub fn new(
        providers: ProviderSet,
        settings: Settings,
        concurrency: usize,
        budget: Arc<ClaimBudget>,
        sink: Sink,
        store: Store,
        stopping: watch::Receiver<bool>,
    ) -> Deliverer {
        let store_for_standbys = store.clone();
        let rooms = Rooms::with_min_waiting(budget.batch_size());
        // no limits, breakers off: replaced by the engine's (with_gate)
        let gate = Arc::new(Gate::new(
            Default::default(),
            store.clone(),
            String::new(),
            settings.max_attempt_time,
        ));
        Deliverer {
            providers,
            settings,
            slots: Arc::new(Semaphore::new(concurrency)),
            budget,
            sink,
            store,
            stopping,
            gate,
            tracer: Tracer::off(),
            standbys: Standbys::off(store_for_standbys),
            rooms,
        }
    }

    /// Export a span of every attempt.
    pub fn with_tracer(mut self, tracer: Tracer) -> Deliverer {
        self.tracer = tracer;
        self
    }

    /// Destination health for this relay's attempts.
    pub fn with_gate(mut self, gate: Arc<Gate>) -> Deliverer {
        self.gate = gate;
        self
    }

    /// Wait for `standbys` before each effect.
    pub fn with_standbys(mut self, standbys: Arc<Standbys>) -> Deliverer {
        self.standbys = standbys;
        self
    }

    /// The congested destinations a claim of the log sets aside.
    pub fn aside(&self) -> Aside {
        self.rooms.aside()
    }

    /// A claim set `n` intents of the destination `name` aside.
    pub fn set_aside(&self, name: &str, n: u64) {
        self.rooms.set_aside(name, n)
    }

    /// The kinds this relay delivers.
    pub fn kinds(&self) -> Vec<&'static str> {
        self.providers.kinds()
    }

    /// Start delivering a claim: it waits for a delivery slot (counted as
    /// queued meanwhile), then runs [`run_one`].
    pub fn spawn(self: &Arc<Self>, claim: Claimed, permit: Permit) {
        self.budget.queue();
        tokio::spawn(run_one(self.clone(), claim, permit));
    }

    /// Hand back claims that will not be worked on (shutdown, or too little
    /// lease left): pending again, the attempt not counted.
    pub async fn release(&self, claims: &[Claimed]) {
        for claim in claims {
            if let Some(previous) = &claim.recovered_from {
                keep_recovery(self, claim, previous).await;
            }
        }
        let ids: Vec<(i64, i64)> = claims.iter().map(|c| (c.id, c.fence)).collect();
        match self.store.release(&ids).await {
            Ok(n) => tracing::info!(n, "handed back claims not yet started"),
            Err(err) => {
                tracing::warn!(error = %err, "could not hand back claims; their leases will expire")
            }
        }
    }
}

/// Wait for a delivery slot, deliver one claim, hand the completion to the
/// completer and wait until it is written; the claim permit is released only
/// then. A claim that cannot start in time — shutdown began, or too little of
/// its lease is left for a whole attempt — is handed back without an attempt.
async fn run_one(d: Arc<Deliverer>, claim: Claimed, permit: Permit) {
    let mut stopping = d.stopping.clone();
    // the intent's commit must be on enough standbys before its effect;
    // past the moment the lease leaves for an attempt, the claim goes back
    if d.standbys.needed() > 0 && !wait_for_standbys(&d, &claim).await {
        d.budget.dequeue();
        d.release(std::slice::from_ref(&claim)).await;
        drop(permit);
        d.budget.task_finished();
        return;
    }
    // room at the destination first: a burst to one receiver queues here
    // without holding a delivery slot
    let (room, no_room) = match enter_room(&d, &claim).await {
        Some(Ok(room)) => (Some(room), None),
        Some(Err(reason)) => (None, Some(reason)),
        None => (None, None),
    };
    let slot = tokio::select! {
        biased;
        _ = stopping.wait_for(|s| *s) => None,
        slot = d.slots.clone().acquire_owned() => slot.ok(),
    };
    d.budget.dequeue();
    let lease_left = d.settings.lease.saturating_sub(claim.claimed_at.elapsed());
    // room for the attempt, the gate's check before it, and a margin
    let enough =
        lease_left > d.settings.attempt_time(&claim.kind) + GATE_TIME + Duration::from_millis(500);
    if !enough && slot.is_some() {
        tracing::warn!(
            intent = claim.id,
            lease_left = %humantime::format_duration(lease_left),
            "too little of the lease is left for a whole attempt; handing the claim back"
        );
    }
    let Some(slot) = slot.filter(|_| enough) else {
        d.release(std::slice::from_ref(&claim)).await;
        drop(permit);
        d.budget.task_finished();
        return;
    };
    let span = tracing::info_span!(
        "deliver",
        intent = claim.id,
        key = %claim.key,
        kind = %claim.kind,
        attempt = claim.attempt,
        outcome = tracing::field::Empty,
        trace_id = tracing::field::Empty,
        span_id = tracing::field::Empty,
    );
    async move {
        let started = Utc::now();
        let clock = Instant::now();
        let (outcome, completion) = attempt_guarded(&d, &claim, no_room, started).await;
        drop(slot);
        drop(room);
        let elapsed = clock.elapsed();
        metrics::histogram!("outbox_attempt_duration_seconds", "kind" => kind_label(&claim.kind))
            .record(elapsed.as_secs_f64());
        tracing::Span::current().record("outcome", outcome.class());
        log_outcome(&claim, &outcome, &completion, elapsed);
        let due = completion.run_after;
        let accepted = d.sink.write(completion).await;
        if let Some(at) = due.filter(|_| accepted) {
            // written: the claim loop wakes for it when it comes due, not
            // only at its next poll
            let delay = (at - Utc::now()).to_std().unwrap_or_default();
            d.budget.due().at(tokio::time::Instant::now() + delay);
        }
        drop(permit);
        d.budget.task_finished();
    }
    .instrument(span)
    .await
}

/// The attempt and the settling of its outcome, inside one guard.
///
/// A provider that panics must not kill the task silently: its claim
/// would sit until the lease expired and be redelivered into the same
/// panic, forever, and `run --once` would wait for it. Whether the
/// effect happened is unknown: ambiguous, parked for an operator. An
/// outcome that cannot be settled (a provider's absurd Retry-After) is as
/// unknown as a provider that panicked.
async fn attempt_guarded(
    d: &Deliverer,
    claim: &Claimed,
    no_room: Option<NoRoom>,
    started: chrono::DateTime<Utc>,
) -> (Outcome, Completion) {
    let policy = d.settings.retry_policy(&claim.kind);
    let guarded = AssertUnwindSafe(async {
        let (outcome, on_ambiguous) = attempt(d, claim, no_room).await;
        let completion = settle(
            claim,
            &outcome,
            policy,
            on_ambiguous,
            started,
            Utc::now(),
            fastrand::f64(),
        );
        (outcome, completion)
    });
    match guarded.catch_unwind().await {
        Ok(done) => done,
        Err(panic) => {
            let what = outbox_providers::redact::urls_in(&panic_message(&*panic));
            tracing::error!(panic = %what, "the provider panicked; parking the intent");
            let outcome = Outcome::Ambiguous {
                reason: format!(
                    "the {} provider panicked ({what}); whether the effect happened is unknown",
                    claim.kind
                ),
                status: None,
            };
            let completion = settle(
                claim,
                &outcome,
                policy,
                AmbiguityPolicy::Park,
                started,
                Utc::now(),
                0.0,
            );
            (outcome, completion)
        }
    }
}

/// Room for the claim at its destination, when its provider bounds the
/// deliveries in flight there: waited for within [`room::PATIENCE`] and
/// what the lease leaves beyond a whole attempt (counted meanwhile as
/// queued for a delivery slot, so the claim budget's bound on claims
/// waiting holds; at most as many wait per destination as may be in
/// flight there). `Err` with the reason to defer and when; `None` when no
/// bound applies or the relay is stopping.
async fn enter_room(
    d: &Deliverer,
    claim: &Claimed,
) -> Option<Result<tokio::sync::OwnedSemaphorePermit, NoRoom>> {
    if claim.payload_error.is_some() {
        return None;
    }
    let limit = d
        .providers
        .get(&claim.kind)?
        .in_flight_limit(&delivery_of(claim, None))?;
    let room_for_attempt =
        d.settings.attempt_time(&claim.kind) + GATE_TIME + Duration::from_millis(500);
    let patience = d
        .settings
        .lease
        .saturating_sub(claim.claimed_at.elapsed())
        .saturating_sub(room_for_attempt)
        .min(room::PATIENCE);
    let mut stopping = d.stopping.clone();
    tokio::select! {
        biased;
        _ = stopping.wait_for(|s| *s) => None,
        entered = d.rooms.enter(&limit, patience, || stored_name(claim)) => Some(entered),
    }
}

/// The claim's destination as the database names it, which a claim of the
/// log sets aside while it is congested.
fn stored_name(claim: &Claimed) -> Option<String> {
    crate::config::destinations::stored_destination_of(
        &claim.kind,
        claim.destination.as_deref(),
        &claim.payload,
    )
}

/// What a provider is handed of a claim (`deadline`: the attempt's end).
fn delivery_of(claim: &Claimed, deadline: Option<std::time::Instant>) -> Delivery<'_> {
    Delivery {
        intent_id: claim.id,
        key: &claim.key,
        kind: &claim.kind,
        destination: claim.destination.as_deref(),
        ordering_key: claim.ordering_key.as_deref(),
        payload: &claim.payload,
        payload_text: Some(&claim.payload_text),
        body: claim.body_text(),
        attempt: claim.attempt,
        key_generation: claim.key_generation,
        previous_attempt_at: claim.previous_attempt_at.map(std::time::SystemTime::from),
        deadline,
        trace: None,
    }
}

/// Wait until the standbys hold the claim's intent, or give up (shutdown,
/// or too little lease left for an attempt after the wait).
async fn wait_for_standbys(d: &Deliverer, claim: &Claimed) -> bool {
    let room = d.settings.attempt_time(&claim.kind) + GATE_TIME + Duration::from_millis(500);
    let wait_until = claim.claimed_at + d.settings.lease.saturating_sub(room);
    let mut stopping = d.stopping.clone();
    d.standbys
        .wait(claim.wal_target, async move {
            tokio::select! {
                _ = stopping.wait_for(|s| *s) => {}
                _ = tokio::time::sleep_until(wait_until.into()) => {}
            }
        })
        .await
}

/// The most the gate's database work may take per attempt, before it and
/// after it.
const GATE_TIME: Duration = Duration::from_secs(1);

/// How long after an attempt's deadline the relay stops waiting for a
/// provider that overran its own timers (within the half second of lease
/// an attempt keeps beyond its budget). A provider answers by the
/// deadline itself, classifying its own timeout, so this timer never
/// decides an outcome a provider could.
const BACKSTOP: Duration = Duration::from_millis(250);

/// The attempt, if its destination may be called now (else deferred, no
/// attempt spent), and what it showed of the destination's health.
async fn attempt(
    d: &Deliverer,
    claim: &Claimed,
    no_room: Option<NoRoom>,
) -> (Outcome, AmbiguityPolicy) {
    if let Some(reason) = &claim.payload_error {
        // nothing can have been sent for it: no attempt ever had a payload
        return (Outcome::invalid(reason.clone()), AmbiguityPolicy::Park);
    }
    let Some(provider) = d.providers.get(&claim.kind) else {
        let outcome = Outcome::invalid(format!(
            "unknown kind {:?}: no live relay knows it (this one delivers {})",
            claim.kind,
            d.providers.kinds().join(", ")
        ));
        return (outcome, AmbiguityPolicy::Park);
    };
    if let Some(NoRoom {
        reason,
        retry_after,
    }) = no_room
    {
        // the destination stayed at its bound: deferred like the
        // provider's own check defers, no attempt spent
        if let Some(previous) = &claim.recovered_from {
            keep_recovery(d, claim, previous).await;
        }
        let outcome = Outcome::Deferred {
            reason,
            retry_after,
        };
        return (outcome, provider.on_ambiguous());
    }
    // the gate's database work is bounded: past it, wait and try again
    let admitted = tokio::time::timeout(
        GATE_TIME,
        d.gate
            .admit(&claim.kind, claim.destination.as_deref(), &claim.payload),
    )
    .await
    .unwrap_or_else(|_| Admit::Wait {
        class: "slow",
        reason: "destination health could not be read in time; trying again shortly".into(),
        after: Duration::from_secs(1),
    });
    if let Admit::Wait {
        class,
        reason,
        after,
    } = admitted
    {
        // a recovered claim waits like any other (a paused destination
        // receives nothing) and stays recovered: the attempt whose outcome
        // was lost is asked about when a claim of it gets through
        if let Some(previous) = &claim.recovered_from {
            keep_recovery(d, claim, previous).await;
        }
        metrics::counter!("outbox_destination_deferrals_total", "kind" => kind_label(&claim.kind), "reason" => class)
            .increment(1);
        let outcome = Outcome::Deferred {
            reason,
            retry_after: after,
        };
        return (outcome, provider.on_ambiguous());
    }
    if claim.recovered_from.is_some() {
        if let Err(err) = d.store.recovery_started(claim.id, claim.fence).await {
            tracing::warn!(error = %err, "could not record that the recovery started");
        }
    }
    let (outcome, policy) = attempt_at(d, claim, provider).await;
    // what the destination did is recorded beside the completion, not
    // before it: the completion does not wait for the gate's database work
    if d.gate.has_news(&admitted, &outcome) {
        let gate = d.gate.clone();
        let seen = outcome.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(GATE_TIME, gate.record(&admitted, &seen)).await;
        });
    }
    (outcome, policy)
}

/// Mark a recovered claim's intent as still to be reconciled before it is
/// deferred ([`Store::keep_recovery`]).
async fn keep_recovery(d: &Deliverer, claim: &Claimed, previous: &str) {
    let kept = d
        .store
        .keep_recovery(claim.id, claim.fence, previous, claim.previous_attempt_at)
        .await;
    if let Err(err) = kept {
        // the deferral's own write will most likely fail the same way, and
        // the lease then expires into a new recovery
        tracing::warn!(error = %err, "could not keep the recovery of a deferred claim");
    }
}

/// The attempt itself: reconcile first when the claim was recovered from an
/// expired lease, then deliver under the intent's derived key.
async fn attempt_at(
    d: &Deliverer,
    claim: &Claimed,
    provider: &Arc<dyn outbox_providers::Provider>,
) -> (Outcome, AmbiguityPolicy) {
    // Every provider call of this attempt (reconcile searches included)
    // runs within one budget, the one the lease was sized for. The provider
    // holds the only timer that decides: it knows whether a request went
    // out. The relay's timer is a backstop past the deadline, for a provider
    // that overruns its own.
    let budget = d.settings.attempt_budget(&claim.kind);
    let deadline = tokio::time::Instant::now() + budget;
    let backstop = deadline + BACKSTOP;
    let delivery = delivery_of(claim, Some(deadline.into_std()));
    let who = Identity {
        id: claim.id,
        key: &claim.key,
        kind: &claim.kind,
        attempt: claim.attempt,
        fence: claim.fence,
        context: IntentContext {
            traceparent: claim.traceparent.as_deref(),
            tracestate: claim.tracestate.as_deref(),
        },
    };
    let policy = provider.on_ambiguous();
    if let Some(settled) = reconcile_recovered(d, claim, provider, &who, &delivery, backstop).await
    {
        return (settled, policy);
    }
    if tokio::time::Instant::now() >= deadline {
        // nothing was sent: the reconcile used the whole budget
        let outcome = Outcome::Transient {
            reason: format!(
                "reconciling the expired lease took the attempt's whole budget ({budget:?}); nothing was sent"
            ),
            status: None,
            retry_after: None,
        };
        return (outcome, policy);
    }
    let span = d.tracer.attempt(&who, || provider.span_shape(&delivery));
    let log = tracing::Span::current();
    log.record("trace_id", span.trace_id());
    log.record("span_id", span.span_id());
    let delivery = Delivery {
        trace: span.headers(),
        ..delivery
    };
    let http_status = Kind::parse(&claim.kind).is_some_and(Kind::reports_http_status);
    let attempted_at = std::time::SystemTime::now();
    // a reason is recorded, logged and exported with its URLs redacted,
    // whichever provider wrote it
    let outcome = tokio::time::timeout_at(backstop, provider.deliver(&delivery))
        .await
        .unwrap_or_else(|_| Outcome::Ambiguous {
            reason: format!(
                "the {} provider did not answer within the attempt's budget ({budget:?}, reconcile included); whether it took effect is unknown",
                claim.kind
            ),
            status: None,
        })
        .redacted();
    if let Outcome::Ambiguous { .. } = &outcome {
        let unsettled = outcome.clone();
        // the attempt that answered ambiguously is the one just made
        let delivery = Delivery {
            previous_attempt_at: Some(attempted_at),
            ..delivery
        };
        let settled = tokio::time::timeout_at(
            backstop,
            reconcile::settle_ambiguous(provider.as_ref(), &delivery, outcome),
        )
        .await
        .unwrap_or(unsettled)
        .redacted();
        metrics::counter!("outbox_reconcile_total", "kind" => kind_label(&claim.kind), "result" => settled.class())
            .increment(1);
        span.end(&settled, http_status);
        return (settled, policy);
    }
    span.end(&outcome, http_status);
    (outcome, policy)
}

/// Reconcile a claim recovered from an expired lease, within the attempt's
/// backstop: the outcome the provider settles it to, or `None` to deliver
/// again under the same key.
async fn reconcile_recovered(
    d: &Deliverer,
    claim: &Claimed,
    provider: &Arc<dyn outbox_providers::Provider>,
    who: &Identity<'_>,
    delivery: &Delivery<'_>,
    backstop: tokio::time::Instant,
) -> Option<Outcome> {
    let previous = claim.recovered_from.as_deref()?;
    let policy = provider.on_ambiguous();
    let span = d.tracer.reconcile(who, previous);
    let log = tracing::Span::current();
    log.record("trace_id", span.trace_id());
    log.record("span_id", span.span_id());
    let recovered = tokio::time::timeout_at(
        backstop,
        reconcile::recover(provider.as_ref(), delivery, previous),
    )
    .await
    // no answer in time is no answer: the kind's policy decides
    .unwrap_or_else(|_| reconcile::decide(policy, previous));
    let recovered = match recovered {
        Recovery::Settled(outcome) => Recovery::Settled(outcome.redacted()),
        redeliver => redeliver,
    };
    match &recovered {
        Recovery::Settled(outcome) => span.end_reconcile(outcome.class(), outcome.reason()),
        Recovery::Redeliver { .. } => span.end_reconcile("redeliver", None),
    }
    match recovered {
        Recovery::Settled(outcome) => {
            metrics::counter!("outbox_reconcile_total", "kind" => kind_label(&claim.kind), "result" => outcome.class())
                .increment(1);
            Some(outcome)
        }
        Recovery::Redeliver { replay } => {
            if replay {
                metrics::counter!("outbox_replays_total", "kind" => kind_label(&claim.kind), "source" => "redelivery")
                    .increment(1);
            }
            tracing::info!(previous_owner = %previous, "redelivering under the same key after an expired lease");
            None
        }
    }
}

fn log_outcome(
    claim: &Claimed,
    outcome: &Outcome,
    completion: &Completion,
    elapsed: std::time::Duration,
) {
    let ms = elapsed.as_millis() as u64;
    match outcome {
        Outcome::Delivered { replayed, .. } => {
            tracing::debug!(ms, replayed, "delivered")
        }
        Outcome::Transient { reason, .. } | Outcome::TargetUnavailable { reason, .. } => {
            tracing::info!(ms, next = %completion.state, run_after = completion.run_after.map(|t| t.to_rfc3339()), reason = %reason, "transient failure")
        }
        Outcome::Rejected { reason, .. } => tracing::warn!(ms, reason = %reason, "rejected"),
        Outcome::Ambiguous { reason, .. } => {
            tracing::warn!(ms, next = %completion.state, reason = %reason, "ambiguous outcome")
        }
        Outcome::Misconfigured { reason, .. } => {
            tracing::error!(ms, reason = %reason, "provider refused our configuration; intent is dead")
        }
        Outcome::Deferred { reason, .. } => tracing::debug!(reason = %reason, "deferred"),
    }
    if completion.state == IntentState::Dead {
        tracing::warn!(
            attempts = claim.attempt,
            "retries exhausted: intent is dead"
        );
    }
}

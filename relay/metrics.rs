//! Prometheus metrics, queue gauges and the health endpoints.
//!
//! One listener at `relay.metrics_addr` serves `/metrics`, `/healthz`
//! (the process is alive) and `/readyz` (the database answers, the schema is
//! current, and the relay is not shutting down).
//!
//! A broken idempotency layer fails by doing extra work successfully, so
//! every kind of extra work has its own counter: replays are counted by
//! source (`enqueue`, `provider`, `redelivery`, `operator`) and never in
//! `outbox_delivered_total`, which counts each intent's first confirmed
//! effect once.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::state::{AttemptOutcome, IntentState};
use crate::store::Store;

/// The process-wide recorder (installed once).
pub fn recorder() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let handle = PrometheusBuilder::new()
                .set_buckets(&[
                    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                    30.0, 60.0, 300.0, 3600.0,
                ])
                .expect("static buckets")
                .set_buckets_for_metric(
                    Matcher::Suffix("_batch_size".into()),
                    &[
                        1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 10_000.0,
                    ],
                )
                .expect("static buckets")
                .install_recorder()
                .expect("the metrics recorder is installed once per process");
            describe();
            zero();
            handle
        })
        .clone()
}

/// The `kind` label for an intent's kind: a kind this product knows, or
/// `other`. Applications choose kind names; labels must stay bounded.
pub fn kind_label(kind: &str) -> &'static str {
    outbox_providers::KNOWN_KINDS
        .iter()
        .find(|k| **k == kind)
        .copied()
        .unwrap_or("other")
}

/// How many distinct `client` label values (the enqueue's `p_source`) are
/// reported; later ones are counted as `other`.
pub const MAX_CLIENT_LABELS: usize = 32;

/// The `client` label for an enqueue source: the first
/// [`MAX_CLIENT_LABELS`] distinct sources this process sees, then `other`.
pub fn client_label(source: Option<&str>) -> String {
    static SEEN: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());
    let Some(source) = source else {
        return "unknown".into();
    };
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if seen.contains(source) {
        return source.to_string();
    }
    if seen.len() < MAX_CLIENT_LABELS {
        seen.insert(source.to_string());
        return source.to_string();
    }
    "other".into()
}

/// Create the counters that alerts watch at 0, so their first increment is
/// visible to `rate()` and `increase()`.
fn zero() {
    metrics::counter!("outbox_fencing_rejections_total").absolute(0);
    for kind in outbox_providers::KNOWN_KINDS {
        metrics::counter!("outbox_invariant_violations_total", "kind" => *kind).absolute(0);
        metrics::counter!("outbox_delivered_total", "kind" => *kind).absolute(0);
        for source in ["enqueue", "provider", "redelivery", "operator"] {
            metrics::counter!("outbox_replays_total", "kind" => *kind, "source" => source)
                .absolute(0);
        }
        for outcome in [
            AttemptOutcome::Delivered,
            AttemptOutcome::Rejected,
            AttemptOutcome::Transient,
            AttemptOutcome::Ambiguous,
        ] {
            metrics::counter!("outbox_attempts_total", "kind" => *kind, "outcome" => outcome.as_sql())
                .absolute(0);
        }
    }
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        "outbox_delivered_total",
        "First confirmed effect of an intent, once each"
    );
    describe_counter!(
        "outbox_duplicate_enqueues_total",
        "Duplicate enqueues by enqueuing client (the p_source of outbox.enqueue)"
    );
    describe_counter!("outbox_replays_total", "Work that did not produce a new effect, by source: enqueue | provider | redelivery | operator");
    describe_counter!(
        "outbox_attempts_total",
        "Delivery attempts by outcome: delivered | rejected | transient | ambiguous"
    );
    describe_counter!(
        "outbox_fencing_rejections_total",
        "Completions refused because the lease had moved on"
    );
    describe_counter!(
        "outbox_leases_expired_total",
        "Claims taken over by the sweeper after their lease expired"
    );
    describe_counter!("outbox_reconcile_total", "Reconcile decisions by result");
    describe_counter!(
        "outbox_deferrals_total",
        "Deliveries deferred without an attempt (per-host limit)"
    );
    describe_counter!(
        "outbox_invariant_violations_total",
        "Attempts that would have stored a 5xx or a timeout as terminal (must stay 0)"
    );
    describe_counter!(
        "outbox_destination_deferrals_total",
        "Deliveries held back by destination health (reason: paused, breaker, slow, limit)"
    );
    // outbox_destination_state and outbox_destination_pending: see
    // crate::destination_gauges
    describe_gauge!("outbox_intents", "Intents by kind and state");
    describe_gauge!(
        "outbox_schedule_configurations",
        "Configurations relays run for a schedule (more than 1: they disagree; the newest wins)"
    );
    describe_gauge!(
        "outbox_schedule_standing_aside",
        "1 when another configuration of the schedule wins and this relay enqueues none of its ticks"
    );
    describe_gauge!(
        "outbox_listen_active",
        "1 when enqueue notifications reach this relay, 0 when it delivers by polling"
    );
    describe_gauge!(
        "outbox_blocked_ordering_keys",
        "Ordering keys whose oldest live intent is dead or ambiguous"
    );
    describe_gauge!(
        "outbox_stranded_ordering_intents",
        "Intents waiting with no live intent ahead in their ordering key (the sweeper promotes them on its next pass)"
    );
    describe_gauge!(
        "outbox_oldest_due_seconds",
        Unit::Seconds,
        "Age of the oldest due pending intent"
    );
    describe_histogram!(
        "outbox_attempt_duration_seconds",
        Unit::Seconds,
        "Duration of one delivery attempt"
    );
    describe_histogram!(
        "outbox_delivery_latency_seconds",
        Unit::Seconds,
        "From enqueue to delivered"
    );
    describe_histogram!(
        "outbox_claim_batch_size",
        Unit::Count,
        "Intents per claim statement (claims that found none are not counted)"
    );
    describe_histogram!(
        "outbox_completion_batch_size",
        Unit::Count,
        "Completions per completion statement"
    );
}

/// Readiness inputs shared with the daemon.
#[derive(Debug, Default)]
pub struct Health {
    pub shutting_down: AtomicBool,
    /// Set by the supervisor when a task died or got stuck: the relay is
    /// broken and on its way out.
    failure: Mutex<Option<String>>,
}

impl Health {
    /// Mark the relay broken, naming why.
    pub fn fail(&self, why: &str) {
        let mut failure = self.failure.lock().unwrap_or_else(|e| e.into_inner());
        failure.get_or_insert_with(|| why.to_string());
    }

    /// Why the relay is broken, if it is.
    pub fn failure(&self) -> Option<String> {
        self.failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

#[derive(Clone)]
struct Served {
    handle: PrometheusHandle,
    store: Store,
    health: Arc<Health>,
}

/// Bind `addr` (port 0 picks one). Returns the bound address and the
/// server, which runs until it is dropped: it answers (`/readyz` 503)
/// through the whole shutdown. `lookup` says who may ask
/// `GET /v1/intents/{key}` ([`crate::lookup`]).
pub async fn serve(
    addr: SocketAddr,
    store: Store,
    health: Arc<Health>,
    lookup: crate::lookup::Access,
) -> anyhow::Result<(
    SocketAddr,
    impl std::future::Future<Output = ()> + Send + 'static,
)> {
    let served = Served {
        handle: recorder(),
        store,
        health,
    };
    let app = axum::Router::new()
        .route("/metrics", get(render))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .route(
            "/v1/intents/{*key}",
            crate::lookup::route(served.store.clone(), lookup),
        )
        .with_state(served);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on relay.metrics_addr {addr}: {e}"))?;
    let bound = listener.local_addr()?;
    let server = async move {
        if let Err(err) = axum::serve(listener, app).await {
            tracing::error!(error = %err, "metrics listener stopped");
        }
    };
    Ok((bound, server))
}

async fn render(State(s): State<Served>) -> String {
    let mut text = s.handle.render();
    text.push_str(&crate::destination_gauges::render());
    text
}

async fn ready(State(s): State<Served>) -> (StatusCode, String) {
    if let Some(why) = s.health.failure() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("broken: {why}; the relay is stopping\n"),
        );
    }
    if s.health.shutting_down.load(Ordering::SeqCst) {
        return (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n".into());
    }
    let check = tokio::time::timeout(Duration::from_secs(2), s.store.migrations_current()).await;
    match check {
        Ok(Ok(true)) => (StatusCode::OK, "ready\n".into()),
        Ok(Ok(false)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "schema not current: run `outbox-relay migrate`\n".into(),
        ),
        Ok(Err(e)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("database unreachable: {e}\n"),
        ),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "database did not answer within 2s\n".into(),
        ),
    }
}

/// The states `outbox_intents` reports (terminal history is counted by the
/// counters, not rescanned every few seconds).
pub const GAUGED_STATES: [IntentState; 4] = [
    IntentState::Pending,
    IntentState::Claimed,
    IntentState::Ambiguous,
    IntentState::Dead,
];

/// Refresh the queue gauges from one cheap query. Kinds seen before keep
/// being reported (at 0) after they drain.
pub async fn refresh_gauges(store: &Store) -> Result<(), sqlx::Error> {
    let s = store.stats_for_gauges().await?;
    metrics::gauge!("outbox_blocked_ordering_keys").set(s.blocked as f64);
    metrics::gauge!("outbox_stranded_ordering_intents").set(s.stranded as f64);
    // known kinds by name, every other kind summed as `other`
    let labels = outbox_providers::KNOWN_KINDS
        .iter()
        .copied()
        .chain(["other"]);
    for label in labels {
        for state in GAUGED_STATES {
            let n: i64 = s
                .counts
                .iter()
                .filter(|r| kind_label(&r.0) == label && r.1 == state.as_sql())
                .map(|r| r.2)
                .sum();
            metrics::gauge!("outbox_intents", "kind" => label, "state" => state.as_sql())
                .set(n as f64);
        }
        let oldest = s
            .oldest
            .iter()
            .filter(|r| kind_label(&r.0) == label)
            .map(|r| r.1)
            .fold(0.0, f64::max);
        metrics::gauge!("outbox_oldest_due_seconds", "kind" => label).set(oldest);
    }
    Ok(())
}

/// Refresh the gauges every `every` until `stop` turns true.
pub async fn gauges_loop(
    store: Store,
    every: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        if let Err(err) = refresh_gauges(&store).await {
            tracing::debug!(error = %err, "gauge refresh failed");
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

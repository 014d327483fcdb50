//! The Prometheus recorder, every metric's description, and the bounded
//! labels (`kind`, `client`). The endpoint that serves them is
//! `services::endpoint`; the queue gauges are `services::gauges`.
//!
//! A broken idempotency layer fails by doing extra work successfully, so
//! every kind of extra work has its own counter: replays are counted by
//! source (`enqueue`, `provider`, `redelivery`, `operator`) and never in
//! `outbox_delivered_total`, which counts each intent's first confirmed
//! effect once.

use std::collections::BTreeSet;
use std::sync::{Mutex, OnceLock};

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::kinds::Kind;
use crate::state::AttemptOutcome;

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
    Kind::parse(kind).map_or("other", Kind::name)
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
    metrics::counter!("outbox_spans_dropped_total").absolute(0);
    for kind in &Kind::names() {
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
    describe_counters();
    describe_gauges();
    describe_histograms();
}

/// The counters' help texts.
fn describe_counters() {
    use metrics::describe_counter;
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
        "Deliveries deferred without an attempt (a per-host limit or destination health)"
    );
    describe_counter!(
        "outbox_spans_dropped_total",
        "Trace spans of attempts dropped: the export queue was full or the collector refused a batch"
    );
    describe_counter!(
        "outbox_completions_sanitised_total",
        "Completions the database refused as written, taken once the provider's text was dropped"
    );
    describe_counter!(
        "outbox_completions_dropped_total",
        "Completions with no claim left to record them on (intent_gone, refused)"
    );
    describe_counter!(
        "outbox_invariant_violations_total",
        "Attempts that would have stored a 5xx or a timeout as terminal (must stay 0)"
    );
    describe_counter!(
        "outbox_destination_deferrals_total",
        "Deliveries held back by destination health (reason: paused, breaker, slow, limit)"
    );
}

/// The gauges' help texts.
fn describe_gauges() {
    use metrics::{describe_gauge, Unit};
    // outbox_destination_state and outbox_destination_pending: see
    // crate::observe::destination_gauges
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
        "outbox_oldest_xmin_age_transactions",
        Unit::Count,
        "Transaction ids assigned since the oldest xmin of each holder of the database's xmin horizon (holder: transaction, prepared, replication_slot, standby): vacuum keeps every row they deleted"
    );
    describe_gauge!(
        "outbox_oldest_xmin_age_seconds",
        Unit::Seconds,
        "Age of the oldest transaction holding back the xmin horizon (holder: transaction, prepared); other roles' sessions count only with pg_read_all_stats"
    );
    describe_gauge!(
        "outbox_oldest_due_seconds",
        Unit::Seconds,
        "Age of the oldest due pending intent"
    );
}

/// The histograms' help texts.
fn describe_histograms() {
    use metrics::{describe_histogram, Unit};
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

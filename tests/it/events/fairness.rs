//! One tenant's backlog at a slow endpoint does not hold back another
//! tenant's deliveries: the slow subscription is congested, so the claims
//! set its deliveries aside, each at its turn, and reach the others.
//!
//! The backlog is made as a burst (100,000 events published at once and
//! expanded), so the test first waits for the relay to meet it all, as it
//! meets a backlog that builds up over time: up to 5,000 intents a claim.

use std::time::{Duration, Instant};

use outbox_relay::config::Dur;
use serde_json::json;

use super::*;
use crate::common::{engine, wait_for, Receiver, Reply, TestDb};

/// The slow tenant's backlog.
const BACKLOG: i64 = 100_000;

/// Deliveries of the subscription that have their row: those a claim set
/// aside (or that went through a retry).
const WITH_ROWS: &str = "AND EXISTS (SELECT 1 FROM outbox.intent_rows t WHERE t.id = d.intent_id)";

/// How many deliveries the expansion made for `subscription` (and that
/// meet `also`), a quarter of a second from now. The waits count the
/// tables the expansion and the claims write rather than the view: a count
/// of 100,000 ids through `outbox.intents` reads the whole log, and on two
/// cores one poll took seconds of the server's time (most of it JIT
/// compilation), taken from the relay under test. A count of 100,000 rows
/// of the tables is not free either, hence four a second.
async fn deliveries_of(db: &TestDb, subscription: &str, also: &str) -> i64 {
    tokio::time::sleep(Duration::from_millis(250)).await;
    sqlx::query_scalar(&format!(
        "SELECT count(*) FROM outbox.event_deliveries d WHERE d.subscription_id = $1 {also}"
    ))
    .bind(subscription)
    .fetch_one(db.pool())
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_100k_deliveries_to_a_slow_endpoint_do_not_delay_another_tenants() {
    let db = TestDb::new().await;
    let slow = Receiver::start(|_, _| Reply::status(200).after(Duration::from_millis(1500))).await;
    let fast = Receiver::ok().await;
    let (acme, _) = subscribe(&db, &["--url", &slow.url("/acme"), "--tenant", "acme"]).await;
    subscribe(&db, &["--url", &fast.url("/globex"), "--tenant", "globex"]).await;
    // the backlog: acme's events, published in transactions of 10,000
    for chunk in 0..BACKLOG / 10_000 {
        sqlx::query(
            "SELECT count(*) FROM outbox.publish_many(
                 ARRAY(SELECT 'acme-' || g FROM generate_series($1, $1 + 9999) g),
                 array_fill('order.paid'::text, ARRAY[10000]),
                 ARRAY(SELECT jsonb_build_object('order', g) FROM generate_series($1, $1 + 9999) g),
                 array_fill('acme'::text, ARRAY[10000]))",
        )
        .bind(chunk * 10_000)
        .fetch_one(db.pool())
        .await
        .unwrap();
    }
    // the relay's defaults where they matter here: 64 deliveries in
    // flight, 32 of them to one destination at most
    let mut cfg = events_config();
    cfg.relay.concurrency = 64;
    cfg.relay.lease = Dur(Duration::from_secs(30));
    cfg.webhook.max_in_flight_per_host = 32;
    cfg.webhook.timeout = Dur(Duration::from_secs(5));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(engine(db.store.clone(), &cfg).run(async {
        let _ = stopped.await;
    }));

    // every event expanded: acme has its backlog of deliveries
    let expanded = wait_for(Duration::from_secs(240), || async {
        deliveries_of(&db, &acme, "").await == BACKLOG
    })
    .await;
    assert!(expanded, "acme's events were not all expanded");
    // and the relay has met them all: each delivery not sent yet was set
    // aside at its turn (a claim looks at up to 5,000 at a time)
    let met = Instant::now();
    let set_aside = wait_for(Duration::from_secs(120), || async {
        deliveries_of(&db, &acme, WITH_ROWS).await > BACKLOG - 1_000
    })
    .await;
    assert!(set_aside, "acme's deliveries were not set aside");
    eprintln!(
        "acme's {BACKLOG} deliveries were met in {:?}",
        met.elapsed()
    );

    // globex publishes behind acme's backlog; its delivery comes at once
    let published = Instant::now();
    publish(
        &db,
        "globex-1",
        "order.paid",
        json!({"order": 1}),
        Some("globex"),
    )
    .await
    .unwrap();
    let arrived = wait_for(Duration::from_secs(60), || async {
        !fast.requests().is_empty()
    })
    .await;
    let took = published.elapsed();
    // where the time went: from the event's commit to its claim, its
    // expansion into globex's delivery, and from that to the delivery's
    // attempt (a leg is None while its attempt's start is not recorded:
    // the receiver may answer before the relay records the attempt)
    let legs: Option<(Option<f64>, Option<f64>, Option<f64>)> = sqlx::query_as(
        "SELECT extract(epoch FROM e.first_attempt_started_at - e.created_at)::float8,
                extract(epoch FROM d.created_at - e.first_attempt_started_at)::float8,
                extract(epoch FROM d.first_attempt_started_at - d.created_at)::float8
           FROM outbox.intents e
           JOIN outbox.event_deliveries x ON x.event_id = e.id
           JOIN outbox.intents d ON d.id = x.intent_id
          WHERE e.key = 'globex-1'",
    )
    .fetch_optional(db.pool())
    .await
    .unwrap();
    eprintln!("globex's delivery arrived in {took:?} (to claim, expansion, to attempt: {legs:?})");
    let acme_pending = db
        .count(&format!(
            "state IN ('pending', 'claimed') AND id IN (SELECT intent_id FROM outbox.event_deliveries
                                                         WHERE subscription_id = '{acme}')"
        ))
        .await;
    let _ = stop.send(());
    running.await.unwrap().unwrap();

    assert!(
        arrived,
        "globex's delivery never arrived behind acme's backlog"
    );
    assert!(
        took < Duration::from_secs(1),
        "globex's delivery took {took:?} behind acme's backlog \
         (seconds from the event to its claim, to its expansion, to the delivery's attempt: {legs:?})"
    );
    assert!(
        acme_pending > BACKLOG - 5_000,
        "acme's backlog was still there: {acme_pending} pending"
    );
    // acme's endpoint was kept at its bound meanwhile
    assert!(slow.max_in_flight() <= 32, "{}", slow.max_in_flight());
    // and its deliveries wait, set aside, with the reason
    let aside = db
        .count("state = 'pending' AND last_error LIKE 'deferred: its destination is congested%'")
        .await;
    assert!(aside > 0, "no delivery was set aside");
}

//! Leases, fencing, crashes, shutdown and several relays on one database.

use std::time::{Duration, Instant};

use crate::common;
use crate::common::{
    config, engine, run_until, spawn_relay, terminate, wait_for, Receiver, Reply, TestDb,
};
use outbox_providers::AmbiguityPolicy;
use outbox_relay::config::Dur;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_completion_after_the_lease_moved_on_changes_nothing_and_is_counted() {
    let db = TestDb::new().await;
    // The first request is held 4s, longer than relay A's 2s lease (a lease
    // an attempt can still start in: the gate's check and a margin fit).
    let rx = Receiver::start(|_, nth| {
        if nth == 1 {
            Reply::status(200).after(Duration::from_millis(4000))
        } else {
            Reply::status(200)
        }
    })
    .await;
    let id = db
        .enqueue("slow", "webhook", json!({"url": rx.url("/"), "body": 1}))
        .await;

    // Relay A: a lease shorter than its request timeout (a misconfiguration
    // that config validation refuses; built by hand here to force the race),
    // and no sweeper of its own.
    let mut cfg_a = config();
    cfg_a.relay.lease = Dur(Duration::from_secs(2));
    cfg_a.webhook.timeout = Dur(Duration::from_secs(10));
    cfg_a.relay.sweep_interval = Dur(Duration::from_secs(3600));
    cfg_a.relay.name = Some("relay-a".into());
    // and as if stalled: it starts the attempt whatever is left of its lease
    let engine_a =
        outbox_relay::EngineConfig::from_config(&cfg_a).with_max_attempt_time(Duration::ZERO);
    let (stop_a, stopped_a) = tokio::sync::oneshot::channel::<()>();
    let a = tokio::spawn(
        outbox_relay::Engine::new(
            db.store.clone(),
            outbox_relay::engine::providers(&cfg_a, &crate::common::context(&db.store, &cfg_a))
                .unwrap(),
            engine_a,
        )
        .run(async {
            let _ = stopped_a.await;
        }),
    );
    assert!(
        wait_for(Duration::from_secs(10), || async {
            rx.requests().len() == 1
        })
        .await
    );

    // Relay B, with its own pool, sweeps the expired lease and redelivers.
    let mut cfg_b = config();
    cfg_b.relay.name = Some("relay-b".into());
    let pool = db.pool().clone();
    run_until(
        engine(db.another_store().await, &cfg_b),
        Duration::from_secs(15),
        || {
            let pool = pool.clone();
            async move {
                let stale: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM outbox.attempt_history WHERE NOT accepted",
                )
                .fetch_one(&pool)
                .await
                .unwrap();
                stale == 1
            }
        },
    )
    .await;
    let _ = stop_a.send(());
    a.await.unwrap().unwrap();

    let intent = db.store.find("slow").await.unwrap();
    assert_eq!(intent.state, "delivered");
    assert!(intent.owner.is_none());
    let reqs = rx.requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(
        reqs[0].webhook_id(),
        reqs[1].webhook_id(),
        "redelivered under the same key"
    );

    let attempts = db.store.attempts(id).await.unwrap();
    assert_eq!(attempts.len(), 2, "{attempts:?}");
    let late = &attempts[0];
    assert_eq!(
        (late.owner.as_str(), late.outcome.as_str(), late.accepted),
        ("relay-a", "delivered", false)
    );
    assert!(
        late.error
            .as_deref()
            .unwrap()
            .contains("after the lease had expired"),
        "{late:?}"
    );
    let winner = &attempts[1];
    assert_eq!(
        (
            winner.owner.as_str(),
            winner.outcome.as_str(),
            winner.accepted
        ),
        ("relay-b", "delivered", true)
    );
    assert!(winner.fence > late.fence);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_delivery_then_the_sweeper_redelivers_under_the_same_key() {
    let db = TestDb::new().await;
    // The first request never gets an answer in time: the relay is killed
    // while it waits.
    let rx = Receiver::start(|_, nth| {
        if nth == 1 {
            Reply::status(200).after(Duration::from_secs(30))
        } else {
            Reply::status(200)
        }
    })
    .await;
    db.enqueue("crash", "webhook", json!({"url": rx.url("/"), "body": 1}))
        .await;
    let cfg_file = common::config_file(common::SUBPROCESS_CONFIG);
    let mut relay = spawn_relay(&db, &cfg_file, "doomed-relay");
    assert!(
        wait_for(Duration::from_secs(20), || async {
            rx.requests().len() == 1
        })
        .await
    );
    relay.kill().await.unwrap(); // SIGKILL
    assert_eq!(
        db.state("crash").await,
        "claimed",
        "the claim outlives its relay"
    );

    let store = db.store.clone();
    run_until(
        engine(db.another_store().await, &config()),
        Duration::from_secs(20),
        || {
            let store = store.clone();
            async move { store.find("crash").await.unwrap().state == "delivered" }
        },
    )
    .await;
    let reqs = rx.requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[0].webhook_id(), reqs[1].webhook_id());
    let intent = db.store.find("crash").await.unwrap();
    let attempts = db.store.attempts(intent.id).await.unwrap();
    let lost = &attempts[0];
    assert_eq!(
        (lost.owner.as_str(), lost.outcome.as_str()),
        ("doomed-relay", "lost")
    );
    assert!(lost
        .error
        .as_deref()
        .unwrap()
        .contains("lease held by doomed-relay expired"));
    assert_eq!(attempts[1].outcome, "delivered");
    assert_eq!(
        db.count("state = 'claimed'").await,
        0,
        "nothing left claimed"
    );
    std::fs::remove_file(cfg_file).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_park_policy_an_expired_lease_becomes_ambiguous_not_a_redelivery() {
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    db.enqueue("parked", "webhook", json!({"url": rx.url("/"), "body": 1}))
        .await;
    // A relay claims with a 100ms lease and dies before doing anything else.
    let claims = db.store.claim("dead-relay", 10, 100, &[]).await.unwrap();
    assert_eq!(claims.len(), 1);
    tokio::time::sleep(Duration::from_millis(150)).await;

    let mut cfg = config();
    cfg.webhook.on_ambiguous = AmbiguityPolicy::Park;
    engine(db.store.clone(), &cfg).run_once().await.unwrap();
    let intent = db.store.find("parked").await.unwrap();
    assert_eq!(intent.state, "ambiguous");
    let reason = intent.last_error.unwrap();
    assert!(
        reason.contains("dead-relay") && reason.contains("outbox-relay resolve"),
        "{reason}"
    );
    assert!(rx.requests().is_empty(), "parking never re-executes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_the_delivery_in_flight_finish() {
    let db = TestDb::new().await;
    let rx = Receiver::start(|_, _| Reply::status(200).after(Duration::from_millis(1500))).await;
    db.enqueue(
        "inflight",
        "webhook",
        json!({"url": rx.url("/"), "body": 1}),
    )
    .await;
    let cfg_file = common::config_file(common::SUBPROCESS_CONFIG);
    let mut relay = spawn_relay(&db, &cfg_file, "graceful");
    assert!(
        wait_for(Duration::from_secs(20), || async {
            rx.requests().len() == 1
        })
        .await
    );
    let status = terminate(&mut relay).await;
    assert!(status.success(), "clean exit: {status:?}");
    let intent = db.store.find("inflight").await.unwrap();
    assert_eq!(
        intent.state, "delivered",
        "finished and recorded before exit"
    );
    assert_eq!(intent.attempts, 1);
    std::fs::remove_file(cfg_file).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_handed_back_at_shutdown_do_not_count_an_attempt() {
    let db = TestDb::new().await;
    db.enqueue(
        "handback",
        "webhook",
        json!({"url": "http://127.0.0.1:9/", "body": 1}),
    )
    .await;
    let claims = db
        .store
        .claim("stopping-relay", 10, 60_000, &[])
        .await
        .unwrap();
    assert_eq!(db.store.find("handback").await.unwrap().attempts, 1);
    let released = db
        .store
        .release(&[(claims[0].id, claims[0].fence)])
        .await
        .unwrap();
    assert_eq!(released, 1);
    let i = db.store.find("handback").await.unwrap();
    assert_eq!(
        (i.state.as_str(), i.attempts, i.owner),
        ("pending", 0, None)
    );
    // a stale hand-back (old fence) changes nothing
    let again = db.store.claim("next-relay", 10, 60_000, &[]).await.unwrap();
    assert_eq!(
        db.store
            .release(&[(claims[0].id, claims[0].fence)])
            .await
            .unwrap(),
        0
    );
    assert_eq!(db.state("handback").await, "claimed");
    assert!(again[0].fence > claims[0].fence);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_relays_drain_5000_intents_and_each_webhook_arrives_once() {
    const N: i64 = 5000;
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    sqlx::query(
        "SELECT outbox.enqueue('bulk-' || g, 'webhook',
                               jsonb_build_object('url', $1::text, 'body', jsonb_build_object('n', g)))
           FROM generate_series(1, $2::int) g",
    )
    .bind(rx.url("/bulk"))
    .bind(N as i32)
    .execute(db.pool())
    .await
    .unwrap();
    // no relay dies here, so no lease should expire: a long one keeps a
    // starved machine (four debug-built relays and Postgres on two shared
    // cores) from turning a slow completion into a redelivery
    let cfg_file = common::config_file(
        &common::SUBPROCESS_CONFIG.replace("lease = \"4s\"", "lease = \"10s\""),
    );
    let mut relays: Vec<_> = (0..4)
        .map(|i| spawn_relay(&db, &cfg_file, &format!("relay-{i}")))
        .collect();
    let delivered = wait_for(Duration::from_secs(120), || async {
        db.count("state = 'delivered'").await == N
    })
    .await;
    for r in &mut relays {
        assert!(terminate(r).await.success());
    }
    assert!(
        delivered,
        "all {N} delivered; states: {:?}",
        db.store.stats().await.unwrap().by_state
    );

    let counts = rx.counts_by_id();
    assert_eq!(
        counts.len(),
        N as usize,
        "every intent reached the receiver"
    );
    let repeated: Vec<_> = counts.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        repeated.is_empty(),
        "webhook-ids seen more than once: {repeated:?}"
    );
    let owners: Vec<(String, i64)> = sqlx::query_as(
        "SELECT owner, count(*) FROM outbox.attempt_history GROUP BY owner ORDER BY owner",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    assert_eq!(
        owners.iter().map(|o| o.1).sum::<i64>(),
        N,
        "one attempt per intent: {owners:?}"
    );
    assert!(owners.len() >= 2, "the work was shared: {owners:?}");
    std::fs::remove_file(cfg_file).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_relays_leases_are_recovered_during_a_backlog_not_after_it() {
    let db = TestDb::new().await;
    // every request takes 100 ms and 4 are in flight: 400 intents are a
    // backlog of about 10 s
    let rx = Receiver::start(|_, _| Reply::status(200).after(Duration::from_millis(100))).await;
    for i in 0..3 {
        db.enqueue(
            &format!("orphan-{i}"),
            "webhook",
            json!({"url": rx.url("/orphan"), "body": i}),
        )
        .await;
    }
    // a relay claims the three and dies: its leases run out in 200 ms
    let orphans = db.store.claim("dead-relay", 3, 200, &[]).await.unwrap();
    assert_eq!(orphans.len(), 3);
    sqlx::query(
        "SELECT outbox.enqueue('backlog-' || g, 'webhook', jsonb_build_object('url', $1::text, 'body', g))
           FROM generate_series(1, 400) g",
    )
    .bind(rx.url("/backlog"))
    .execute(db.pool())
    .await
    .unwrap();

    let mut cfg = config();
    cfg.relay.concurrency = 4;
    cfg.relay.batch_size = 8;
    let started = Instant::now();
    let orphans_done = || async {
        db.count("key LIKE 'orphan-%' AND state = 'delivered'")
            .await
            == 3
    };
    run_until(
        engine(db.store.clone(), &cfg),
        Duration::from_secs(30),
        orphans_done,
    )
    .await;
    let backlog_left = db
        .count("key LIKE 'backlog-%' AND state <> 'delivered'")
        .await;
    assert!(
        backlog_left > 100,
        "the orphans waited for the backlog: recovered after {:?} with {backlog_left} of the backlog left",
        started.elapsed()
    );
}

/// A recovered claim deferred at the gate keeps its recovery mark (the
/// lost attempt is reconciled first whenever it is claimed again); an
/// operator's retry or cancel starts afresh and clears it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_retry_clears_the_recovery_mark() {
    use outbox_relay::store::operator::RetryOptions;
    let db = TestDb::new().await;
    for key in ["marked-retry", "marked-new-effect", "marked-cancel"] {
        db.enqueue(key, "webhook", json!({"url": "http://127.0.0.1:9/"}))
            .await;
    }
    let claimed = db.store.claim("relay-b", 10, 60_000, &[]).await.unwrap();
    assert_eq!(claimed.len(), 3);
    for c in &claimed {
        // relay-a's attempt was lost; relay-b's recovery is deferred
        assert!(db
            .store
            .keep_recovery(c.id, c.fence, "relay-a", Some(chrono::Utc::now()))
            .await
            .unwrap());
    }
    sqlx::query("UPDATE outbox.intents SET state = 'dead', owner = NULL, lease_expires_at = NULL")
        .execute(db.pool())
        .await
        .unwrap();
    db.store
        .retry("marked-retry", RetryOptions::default())
        .await
        .unwrap();
    db.store
        .retry(
            "marked-new-effect",
            RetryOptions {
                new_effect: true,
                force: false,
            },
        )
        .await
        .unwrap();
    db.store.cancel("marked-cancel").await.unwrap();
    let marked: Vec<String> = sqlx::query_scalar(
        "SELECT key FROM outbox.intents WHERE recover_owner IS NOT NULL OR recover_at IS NOT NULL",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    assert!(marked.is_empty(), "still marked for recovery: {marked:?}");
    let again = db.store.claim("relay-c", 10, 60_000, &[]).await.unwrap();
    assert_eq!(again.len(), 2);
    for c in &again {
        assert_eq!(
            (c.recovered_from.as_deref(), c.previous_attempt_at),
            (None, None),
            "{}: a retried intent was claimed as a recovery",
            c.key
        );
    }
}

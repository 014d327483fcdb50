//! Drill: the database disappears for 30 s while a relay is delivering.
//! The relay keeps running, reports not-ready, reconnects by itself, and
//! records every effect that happened meanwhile once the database is back:
//! nothing lost, nothing delivered twice.

use std::time::{Duration, Instant};

use crate::common;
use crate::common::proxy::Proxy;
use crate::common::{terminate, wait_for, Receiver, Reply, TestDb};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_30s_database_outage_during_delivery_loses_nothing() {
    const N: i64 = 200;
    let db = TestDb::new().await;
    let rx = Receiver::start(|_, _| Reply::status(200).after(Duration::from_millis(200))).await;
    sqlx::query(
        "SELECT outbox.enqueue('outage-' || g, 'webhook', jsonb_build_object('url', $1::text, 'body', g))
           FROM generate_series(1, $2::int) g",
    )
    .bind(rx.url("/"))
    .bind(N as i32)
    .execute(db.pool())
    .await
    .unwrap();

    let mut proxy = Proxy::to_postgres().await;
    let port = common::free_port();
    let mut relay = common::relay_command(&proxy.url_for(&db))
        .arg("run")
        .env(
            "OUTBOX_RELAY__RELAY__METRICS_ADDR",
            format!("\"127.0.0.1:{port}\""),
        )
        .env("OUTBOX_RELAY__RELAY__CONCURRENCY", "8")
        .env("OUTBOX_RELAY__RELAY__BATCH_SIZE", "8")
        .env("OUTBOX_RELAY__RELAY__POLL_INTERVAL", "100ms")
        .env("OUTBOX_RELAY__RELAY__LEASE", "10s")
        .env("OUTBOX_RELAY__WEBHOOK__TIMEOUT", "2s")
        .env("RUST_LOG", "error")
        .spawn()
        .unwrap();
    let ready = |port: u16| async move {
        reqwest::get(format!("http://127.0.0.1:{port}/readyz"))
            .await
            .map(|r| r.status().as_u16())
            .unwrap_or(0)
    };

    // some delivered, many to go: the database goes away
    assert!(
        wait_for(Duration::from_secs(30), || async {
            rx.requests().len() >= 20
        })
        .await
    );
    proxy.down();
    let outage = Instant::now();
    assert!(
        wait_for(Duration::from_secs(10), || async {
            ready(port).await == 503
        })
        .await,
        "not ready while the database is away"
    );
    let seen_during = rx.requests().len();
    while outage.elapsed() < Duration::from_secs(30) {
        assert!(
            relay.try_wait().unwrap().is_none(),
            "the relay keeps running through the outage"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let seen_at_end = rx.requests().len();
    assert!(
        seen_at_end - seen_during <= 16,
        "no new claims while the database is away"
    );
    proxy.up().await;
    let back = Instant::now();

    assert!(
        wait_for(Duration::from_secs(60), || async {
            ready(port).await == 200
        })
        .await,
        "ready again"
    );
    let ready_after = back.elapsed();
    assert!(
        wait_for(Duration::from_secs(60), || async {
            db.count("state = 'delivered'").await == N
        })
        .await,
        "everything delivered after the outage: {:?}",
        db.store.stats().await.unwrap().by_state
    );
    assert!(terminate(&mut relay).await.success());

    let counts = rx.counts_by_id();
    assert_eq!(counts.len() as i64, N, "every intent took effect");
    assert!(counts.values().all(|n| *n == 1), "and none twice");
    let by_outcome: Vec<(String, bool, i64)> = sqlx::query_as(
        "SELECT outcome, accepted, count(*) FROM outbox.attempt_history GROUP BY 1, 2 ORDER BY 1, 2",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    for (outcome, accepted, n) in &by_outcome {
        match (outcome.as_str(), accepted) {
            // each effect recorded once, the in-flight ones after the outage
            ("delivered", true) => assert_eq!(*n, N, "{by_outcome:?}"),
            // a claim that committed as the connection died never reached the
            // relay: its lease expired and the sweeper recorded it as lost
            // (accepted = false: no completion arrived under that fence, see
            // CLAIM_EXPIRED_SQL) and recovered it
            ("lost", false) => assert!(*n <= 16, "{by_outcome:?}"),
            _ => panic!("unexpected attempts: {by_outcome:?}"),
        }
    }
    eprintln!(
        "\n=== outage drill: {N} webhooks, database away for {:.1?} ===\n\
         effects before the outage: {seen_during}; during it: {} (requests already in flight)\n\
         relay alive throughout, /readyz 503 during, 200 again {ready_after:.1?} after the database returned\n\
         effects in all: {} for {} intents (none twice); attempts by outcome: {by_outcome:?}",
        Duration::from_secs(30),
        seen_at_end - seen_during,
        counts.values().sum::<usize>(),
        counts.len()
    );
    proxy.down();
}

//! Intents committed many to a transaction: one wake-up claims them all,
//! and a burst to one receiver waits for room there instead of being
//! deferred to later claims (`webhook.max_in_flight_per_host`).

use std::time::Duration;

use outbox_relay::store::Store;

use crate::common::{config, engine, run_until, wait_for, Receiver, Reply, TestDb};

/// Commit `n` intents for `url` in one transaction: `n` calls of
/// `outbox.enqueue` in one statement, or one `outbox.enqueue_many`.
async fn commit_batch(store: &Store, prefix: &str, url: &str, n: i32, many: bool) {
    let statement = if many {
        "SELECT count(*) FROM outbox.enqueue_many(
             ARRAY(SELECT $1 || g FROM generate_series(1, $3) g),
             array_fill('webhook'::text, ARRAY[$3]),
             ARRAY(SELECT jsonb_build_object('url', $2::text, 'body', g) FROM generate_series(1, $3) g))"
    } else {
        "SELECT count(*) FROM (
             SELECT outbox.enqueue($1 || g, 'webhook', jsonb_build_object('url', $2::text, 'body', g))
               FROM generate_series(1, $3) g) e"
    };
    sqlx::query(statement)
        .bind(prefix)
        .bind(url)
        .bind(n)
        .execute(store.pool())
        .await
        .expect("commit the batch");
}

async fn delivered(store: &Store) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM outbox.intents WHERE state = 'delivered'")
        .fetch_one(store.pool())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_of_fifty_is_claimed_in_one_wake_up_and_none_is_deferred() {
    let db = TestDb::new().await;
    // a receiver that takes a moment, so that the per-host bound is
    // reached whatever the machine's speed: 50 claims, room for 32 (the
    // default), and as many may wait for it
    let rx = Receiver::start(|_, _| Reply::status(200).after(Duration::from_millis(40))).await;
    let mut cfg = config();
    cfg.relay.concurrency = 64;
    cfg.relay.batch_size = 100;
    // only the enqueue's NOTIFY wakes the relay within the test's time
    cfg.relay.poll_interval = outbox_relay::config::Dur(Duration::from_secs(60));
    cfg.webhook.max_in_flight_per_host = 32;
    let relay = engine(db.store.clone(), &cfg);
    let batches = relay.batch_counts();
    let url = rx.url("/orders");
    let committing = {
        let app = db.store.clone();
        let url = url.clone();
        tokio::spawn(async move {
            // the relay is idle and listening by then
            tokio::time::sleep(Duration::from_millis(500)).await;
            commit_batch(&app, "calls:", &url, 50, false).await;
            // the next transaction only once the first is delivered
            let delivered = || {
                let app = app.clone();
                async move {
                    let n: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM outbox.intents WHERE key LIKE 'calls:%' AND state = 'delivered'",
                )
                .fetch_one(app.pool())
                .await
                .unwrap();
                    n == 50
                }
            };
            assert!(wait_for(Duration::from_secs(30), delivered).await);
            commit_batch(&app, "many:", &url, 50, true).await;
        })
    };
    let store = db.store.clone();
    run_until(relay, Duration::from_secs(60), || {
        let store = store.clone();
        async move { delivered(&store).await == 100 }
    })
    .await;
    committing.await.expect("the application's transactions");

    let b = batches.read();
    assert_eq!(
        (b.claims, b.claimed),
        (2, 100),
        "each transaction of 50 is claimed by one statement: {b:?}"
    );
    // claimed once, attempted once: nothing was deferred to a later claim
    let reclaimed: Vec<(String, i64, i32)> = sqlx::query_as(
        "SELECT key, fence, attempts FROM outbox.intents WHERE fence <> 1 OR attempts <> 1 ORDER BY id",
    )
    .fetch_all(db.store.pool())
    .await
    .unwrap();
    assert!(
        reclaimed.is_empty(),
        "claimed or attempted more than once: {reclaimed:?}"
    );
    assert_eq!(rx.requests().len(), 100);
    // the bound held at the receiver all the while
    assert!(rx.max_in_flight() <= 32, "{} in flight", rx.max_in_flight());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_is_claimed_when_it_comes_due_not_at_the_next_poll() {
    let db = TestDb::new().await;
    // a webhook-id's first request fails; its retry, 50 ms later, succeeds
    let rx = Receiver::start(|_, n| {
        if n == 1 {
            Reply::status(503)
        } else {
            Reply::status(200)
        }
    })
    .await;
    let mut cfg = config();
    // nothing but the relay's own record of the retry can wake it in time
    cfg.relay.poll_interval = outbox_relay::config::Dur(Duration::from_secs(600));
    let relay = engine(db.store.clone(), &cfg);
    let store = db.store.clone();
    let url = rx.url("/retry");
    let committing = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        // two intents claimed together, so that the claim after the
        // failure is not an empty one (which asks the database when the
        // next retry is due)
        commit_batch(&store, "retry:", &url, 2, false).await;
    });
    let store = db.store.clone();
    run_until(relay, Duration::from_secs(60), || {
        let store = store.clone();
        async move { delivered(&store).await == 2 }
    })
    .await;
    committing.await.unwrap();
    // each failed once (the receiver answers 503 to a webhook-id's first
    // request) and was delivered by its retry
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT i.key, string_agg(h.outcome, ',' ORDER BY h.attempt)
           FROM outbox.intents i JOIN outbox.attempt_history h ON h.intent_id = i.id
          GROUP BY i.key ORDER BY i.key",
    )
    .fetch_all(db.store.pool())
    .await
    .unwrap();
    assert_eq!(rx.requests().len(), 4, "{rows:?}");
    assert_eq!(rows.len(), 2, "{rows:?}");
    for (key, outcomes) in &rows {
        let outcomes: Vec<&str> = outcomes.split(',').collect();
        assert!(
            outcomes.len() == 2 && outcomes[1] == "delivered",
            "{key}: {outcomes:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_to_one_fast_receiver_is_drained_without_a_deferral() {
    let db = TestDb::new().await;
    let rx = Receiver::start(|_, _| Reply::status(200)).await;
    // the bench's drain: claims of 100 run three batches ahead of 16
    // deliveries in flight, so far more than one claim's worth waits for
    // room at the receiver while it answers at once
    let mut cfg = config();
    cfg.relay.concurrency = 16;
    cfg.relay.batch_size = 100;
    cfg.webhook.max_in_flight_per_host = 16;
    const N: i32 = 3000;
    let url = rx.url("/backlog");
    for part in 0..N / 1000 {
        commit_batch(&db.store, &format!("backlog-{part}:"), &url, 1000, true).await;
    }
    let relay = engine(db.store.clone(), &cfg);
    let store = db.store.clone();
    run_until(relay, Duration::from_secs(120), || {
        let store = store.clone();
        async move { delivered(&store).await == i64::from(N) }
    })
    .await;

    // claimed once, attempted once: none was deferred to a later claim
    let reclaimed: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox.intents WHERE fence <> 1 OR attempts <> 1")
            .fetch_one(db.store.pool())
            .await
            .unwrap();
    assert_eq!(reclaimed, 0, "intents claimed or attempted more than once");
    assert_eq!(rx.requests().len(), N as usize);
    assert!(rx.max_in_flight() <= 16, "{} in flight", rx.max_in_flight());
}

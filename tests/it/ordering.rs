//! Ordering keys the promotion trigger leaves waiting: every intent that
//! waits with nothing live ahead of it is promoted by one sweep, whatever
//! the number of keys and wherever its key sorts, and `stats` counts them
//! until then.

use std::time::Duration;

use serde_json::json;

use crate::common::TestDb;

async fn enqueue_ordered(db: &TestDb, key: &str, ordering_key: &str) -> i64 {
    sqlx::query_scalar("SELECT id FROM outbox.enqueue($1, 'webhook', $2, NULL, now(), $3)")
        .bind(key)
        .bind(json!({"url": "http://127.0.0.1:9/", "body": {"k": key}}))
        .bind(ordering_key)
        .fetch_one(db.pool())
        .await
        .unwrap()
}

async fn waiting_state(db: &TestDb, key: &str) -> (String, bool) {
    sqlx::query_as("SELECT state, waiting FROM outbox.intents WHERE key = $1")
        .bind(key)
        .fetch_one(db.pool())
        .await
        .unwrap()
}

/// `keys` ordering keys `A0000`.., each with a head scheduled for tomorrow
/// and one follower waiting behind it; then one sweep, so that none of
/// them is noted any more.
async fn many_keys_behind_live_heads(db: &TestDb, keys: i64) {
    sqlx::query(
        "SELECT outbox.enqueue('head-' || g, 'webhook', jsonb_build_object('url', 'http://127.0.0.1:9/', 'body', g),
                               NULL, now() + interval '1 day', 'A' || lpad(g::text, 4, '0'))
           FROM generate_series(0, $1 - 1) g",
    )
    .bind(keys)
    .execute(db.pool())
    .await
    .unwrap();
    sqlx::query(
        "SELECT outbox.enqueue('next-' || g, 'webhook', jsonb_build_object('url', 'http://127.0.0.1:9/', 'body', g),
                               NULL, now(), 'A' || lpad(g::text, 4, '0'))
           FROM generate_series(0, $1 - 1) g",
    )
    .bind(keys)
    .execute(db.pool())
    .await
    .unwrap();
    assert_eq!(db.count("waiting").await, keys);
    assert_eq!(
        db.store.promote_stranded_heads(500).await.unwrap().promoted,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_racing_its_heads_cancel_is_promoted_by_one_sweep_past_1200_keys() {
    let db = TestDb::new().await;
    many_keys_behind_live_heads(&db, 1200).await;

    // the documented race, on a key that sorts after all the others: an
    // application's transaction enqueues behind the live head, the head is
    // cancelled meanwhile, then the application commits
    enqueue_ordered(&db, "z-head", "Zlast").await;
    let mut app = db.pool().begin().await.unwrap();
    sqlx::query("SELECT outbox.enqueue('r-next', 'webhook', $1, NULL, now(), 'Zlast')")
        .bind(json!({"url": "http://127.0.0.1:9/", "body": "r-next"}))
        .execute(&mut *app)
        .await
        .unwrap();
    let waits: bool = sqlx::query_scalar("SELECT waiting FROM outbox.intents WHERE key = 'r-next'")
        .fetch_one(&mut *app)
        .await
        .unwrap();
    assert!(waits, "enqueued behind a live head, r-next waits");
    db.store.cancel("z-head").await.unwrap();
    app.commit().await.unwrap();
    assert_eq!(waiting_state(&db, "r-next").await, ("pending".into(), true));
    assert!(db
        .store
        .claim("r", 10, 60_000, &[])
        .await
        .unwrap()
        .is_empty());

    let stats = db.store.stats().await.unwrap();
    assert_eq!(stats.stranded_ordering_intents, 1);
    assert_eq!(stats.blocked_ordering_keys, 0);
    // the gauge counts over the noted keys only, and sees it too
    assert_eq!(db.store.stats_for_gauges().await.unwrap().stranded, 1);

    // one sweep looks at the keys noted since the last one: r-next's
    let sweep = db.store.promote_stranded_heads(500).await.unwrap();
    assert_eq!(
        waiting_state(&db, "r-next").await,
        ("pending".into(), false)
    );
    assert_eq!((sweep.keys, sweep.promoted), (1, 1));
    assert_eq!(db.store.stats().await.unwrap().stranded_ordering_intents, 0);
    assert_eq!(db.store.stats_for_gauges().await.unwrap().stranded, 0);
    let claimed = db.store.claim("r", 10, 60_000, &[]).await.unwrap();
    assert_eq!(
        claimed.iter().map(|c| c.key.as_str()).collect::<Vec<_>>(),
        ["r-next"]
    );
    // the 1,200 followers behind their live heads still wait
    assert_eq!(db.count("waiting AND state = 'pending'").await, 1200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_keeps_a_key_whose_head_is_finishing_for_the_next_one() {
    let db = TestDb::new().await;
    enqueue_ordered(&db, "h", "k").await;
    // an application enqueues behind the live head ...
    let mut app = db.pool().begin().await.unwrap();
    sqlx::query("SELECT outbox.enqueue('w', 'webhook', $1, NULL, now(), 'k')")
        .bind(json!({"url": "http://127.0.0.1:9/", "body": "w"}))
        .execute(&mut *app)
        .await
        .unwrap();
    // ... while the head's completion runs (its trigger cannot see w yet)
    let mut finishing = db.pool().begin().await.unwrap();
    sqlx::query("UPDATE outbox.intents SET state = 'delivered' WHERE key = 'h'")
        .execute(&mut *finishing)
        .await
        .unwrap();
    app.commit().await.unwrap();
    // the sweep sees w and a live head that a transaction is changing
    let sweep = db.store.promote_stranded_heads(500).await.unwrap();
    assert_eq!(sweep.promoted, 0, "the head is still live to the sweep");
    finishing.commit().await.unwrap();
    assert_eq!(waiting_state(&db, "w").await, ("pending".into(), true));
    assert_eq!(db.store.stats().await.unwrap().stranded_ordering_intents, 1);
    let sweep = db.store.promote_stranded_heads(500).await.unwrap();
    assert_eq!(sweep.promoted, 1, "the key was kept for the next pass");
    assert_eq!(waiting_state(&db, "w").await, ("pending".into(), false));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purging_a_dead_head_and_retrying_a_cancelled_follower_are_swept_too() {
    let db = TestDb::new().await;
    enqueue_ordered(&db, "dead-head", "p").await;
    enqueue_ordered(&db, "behind", "p").await;
    sqlx::query("UPDATE outbox.intents SET state = 'dead', updated_at = now() - interval '1 day' WHERE key = 'dead-head'")
        .execute(db.pool())
        .await
        .unwrap();
    db.store
        .purge(Duration::from_secs(60), true, false, 100)
        .await
        .unwrap();
    assert_eq!(db.store.stats().await.unwrap().stranded_ordering_intents, 1);
    assert_eq!(
        db.store.promote_stranded_heads(500).await.unwrap().promoted,
        1
    );
    assert_eq!(
        waiting_state(&db, "behind").await,
        ("pending".into(), false)
    );

    // a follower cancelled while it waited, retried after its head finished
    enqueue_ordered(&db, "h2", "q").await;
    enqueue_ordered(&db, "f2", "q").await;
    db.store.cancel("f2").await.unwrap();
    db.store.cancel("h2").await.unwrap();
    db.store.retry("f2", Default::default()).await.unwrap();
    db.store.promote_stranded_heads(500).await.unwrap();
    assert_eq!(db.store.stats().await.unwrap().stranded_ordering_intents, 0);
    let claimed = db.store.claim("r", 10, 60_000, &[]).await.unwrap();
    assert!(claimed.iter().any(|c| c.key == "f2"), "{claimed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_retry_of_an_older_intent_waits_while_a_later_one_is_claimed() {
    let db = TestDb::new().await;
    enqueue_ordered(&db, "o1", "order-1").await;
    enqueue_ordered(&db, "o2", "order-1").await;
    let first = db.store.claim("r1", 10, 60_000, &[]).await.unwrap();
    assert_eq!(
        first.iter().map(|c| c.key.as_str()).collect::<Vec<_>>(),
        ["o1"]
    );
    sqlx::query("UPDATE outbox.intents SET state = 'delivered', owner = NULL, lease_expires_at = NULL WHERE key = 'o1'")
        .execute(db.pool())
        .await
        .unwrap();
    let second = db.store.claim("r1", 10, 60_000, &[]).await.unwrap();
    assert_eq!(
        second.iter().map(|c| c.key.as_str()).collect::<Vec<_>>(),
        ["o2"]
    );
    // o2 is in flight; an operator retries the delivered o1
    db.store
        .retry(
            "o1",
            outbox_relay::store::operator::RetryOptions {
                new_effect: false,
                force: true,
            },
        )
        .await
        .unwrap();
    let third = db.store.claim("r2", 10, 60_000, &[]).await.unwrap();
    assert!(third.is_empty(), "two of one key in flight: {third:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_intent_committed_late_waits_while_a_younger_one_is_claimed() {
    let db = TestDb::new().await;
    let mut slow = db.pool().begin().await.unwrap();
    let older: i64 = sqlx::query_scalar(
        "SELECT id FROM outbox.enqueue('x1', 'webhook', $1, NULL, now(), 'cart-9')",
    )
    .bind(json!({"url": "http://127.0.0.1:9/", "body": 1}))
    .fetch_one(&mut *slow)
    .await
    .unwrap();
    let younger = enqueue_ordered(&db, "x2", "cart-9").await;
    assert!(older < younger);
    let claimed = db.store.claim("r1", 10, 60_000, &[]).await.unwrap();
    assert_eq!(claimed.iter().map(|c| c.id).collect::<Vec<_>>(), [younger]);
    slow.commit().await.unwrap();
    let again = db.store.claim("r2", 10, 60_000, &[]).await.unwrap();
    assert!(again.is_empty(), "two of one key in flight: {again:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_claiming_at_once_take_one_intent_per_key() {
    let db = TestDb::new().await;
    // 50 keys, 4 intents each, the first committed last by another session
    for k in 0..50 {
        for n in 0..4 {
            enqueue_ordered(&db, &format!("k{k}-{n}"), &format!("key-{k}")).await;
        }
    }
    let stores = [
        db.another_store().await,
        db.another_store().await,
        db.another_store().await,
    ];
    let claims =
        futures_util::future::join_all(stores.iter().enumerate().map(|(i, s)| async move {
            s.claim(&format!("r{i}"), 200, 60_000, &[]).await.unwrap()
        }))
        .await;
    let mut per_key = std::collections::HashMap::<String, usize>::new();
    for c in claims.iter().flatten() {
        *per_key
            .entry(c.key.split('-').next().unwrap().to_string())
            .or_default() += 1;
    }
    assert_eq!(per_key.len(), 50, "every key's head claimed");
    assert!(per_key.values().all(|n| *n == 1), "{per_key:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_key_keeps_its_backlog_out_of_the_claim() {
    let db = TestDb::new().await;
    enqueue_ordered(&db, "head", "stuck").await;
    sqlx::query("UPDATE outbox.intents SET state = 'dead' WHERE key = 'head'")
        .execute(db.pool())
        .await
        .unwrap();
    sqlx::query(
        "SELECT outbox.enqueue('behind-' || g, 'webhook', jsonb_build_object('url', 'http://127.0.0.1:9/', 'body', g),
                               NULL, now(), 'stuck')
           FROM generate_series(1, 20000) g",
    )
    .execute(db.pool())
    .await
    .unwrap();
    db.enqueue(
        "free",
        "webhook",
        json!({"url": "http://127.0.0.1:9/", "body": 0}),
    )
    .await;
    sqlx::query("ANALYZE outbox.intents")
        .execute(db.pool())
        .await
        .unwrap();
    assert_eq!(db.count("waiting").await, 20000);
    let plan = db.store.explain_claim(100).await.unwrap().join("\n");
    let buffers: u64 = plan
        .lines()
        .find_map(|l| l.trim().strip_prefix("Buffers: shared hit="))
        .and_then(|v| v.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|v| v.parse().ok())
        .expect("the plan reports buffers");
    assert!(
        buffers < 200,
        "a claim of one intent read {buffers} buffers:\n{plan}"
    );
    let stats = db.store.stats().await.unwrap();
    assert_eq!(stats.blocked_ordering_keys, 1);
    // the head is cancelled: the next one is promoted into the claim index
    db.store.cancel("head").await.unwrap();
    let next = db.store.claim("r", 100, 60_000, &[]).await.unwrap();
    let mut keys: Vec<_> = next.iter().map(|c| c.key.as_str()).collect();
    keys.sort();
    assert_eq!(keys, ["behind-1", "free"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_left_waiting_by_a_race_is_promoted_by_the_sweeper() {
    let db = TestDb::new().await;
    enqueue_ordered(&db, "lonely", "k").await;
    // what a racing enqueue leaves: waiting, with nothing ahead of it
    sqlx::query("UPDATE outbox.intents SET waiting = true")
        .execute(db.pool())
        .await
        .unwrap();
    assert!(db
        .store
        .claim("r", 10, 60_000, &[])
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        db.store
            .promote_stranded_heads(1000)
            .await
            .unwrap()
            .promoted,
        1
    );
    assert_eq!(db.store.claim("r", 10, 60_000, &[]).await.unwrap().len(), 1);
}

//! The intent written once: a delivery at the first attempt leaves the
//! intent's log row as it was enqueued and gives it no row in
//! `outbox.intent_rows`; one that leaves that path is copied there once.

use std::time::Duration;

use chrono::Utc;
use outbox_providers::{AmbiguityPolicy, Outcome};
use outbox_relay::config::RetryPolicy;
use outbox_relay::engine::settle::settle;
use outbox_relay::store::Completion;
use serde_json::json;

use crate::common::{self, config, engine, run_once_within, Receiver, Reply, TestDb};

/// Each log row's physical place: an update of any kind (HOT included)
/// moves it.
async fn log_places(db: &TestDb) -> Vec<(i64, String)> {
    sqlx::query_as("SELECT id, ctid::text FROM outbox.intent_log ORDER BY id")
        .fetch_all(db.pool())
        .await
        .unwrap()
}

async fn count(db: &TestDb, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(db.pool()).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_writes_each_intent_once_and_keeps_no_finished_batch() {
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    for n in 0..40 {
        db.enqueue(
            &format!("once:{n}"),
            "webhook",
            json!({"url": rx.url("/once"), "body": {"n": n}}),
        )
        .await;
    }
    let before = log_places(&db).await;
    let mut cfg = config();
    // claims no larger than the room at one receiver: none is deferred
    cfg.relay.concurrency = 8;
    cfg.relay.batch_size = 8;
    run_once_within(&db, &cfg, Duration::from_secs(60)).await;

    assert_eq!(db.count("state = 'delivered' AND attempts = 1").await, 40);
    assert_eq!(rx.requests().len(), 40);
    assert_eq!(log_places(&db).await, before, "a log row was rewritten");
    assert_eq!(
        count(&db, "SELECT count(*) FROM outbox.intent_rows").await,
        0
    );
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM outbox.log_outcomes WHERE outcome = 'delivered'"
        )
        .await,
        40
    );
    assert_eq!(
        count(&db, "SELECT count(*) FROM outbox.log_batches").await,
        0,
        "a batch whose intents all have their outcome is deleted"
    );
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM outbox.attempt_history WHERE outcome = 'delivered'"
        )
        .await,
        40
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_intent_that_is_retried_is_copied_into_its_row_once() {
    let db = TestDb::new().await;
    let rx = Receiver::start(|_, nth| {
        if nth == 1 {
            Reply::status(503).header("retry-after", "1")
        } else {
            Reply::status(200)
        }
    })
    .await;
    db.enqueue(
        "retried",
        "webhook",
        json!({"url": rx.url("/"), "body": {"x": 1}}),
    )
    .await;
    let before = log_places(&db).await;
    common::run_until_state(
        engine(db.store.clone(), &config()),
        &db.store,
        "retried",
        "delivered",
        Duration::from_secs(20),
    )
    .await;

    assert_eq!(log_places(&db).await, before, "the log row was rewritten");
    let rows: Vec<(String, i32)> =
        sqlx::query_as("SELECT state, attempts FROM outbox.intent_rows WHERE key = 'retried'")
            .fetch_all(db.pool())
            .await
            .unwrap();
    assert_eq!(rows, vec![("delivered".to_string(), 2)]);
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM outbox.intents WHERE key = 'retried'"
        )
        .await,
        1,
        "the view shows the intent once"
    );
    assert_eq!(
        count(&db, "SELECT count(*) FROM outbox.log_batches").await,
        0
    );
}

/// Beside a large log the planner prices the claim of the log far above
/// the server's JIT thresholds, and compiling it cost 1.2 s of the server's
/// CPU per claim (a tenant's delivery waited a second behind another's
/// backlog at each claim). A claim's transaction turns JIT off: with every
/// threshold at zero, so that the server compiles any statement, the claim
/// as the relay runs it shows no JIT in its plan, and the same statement
/// outside that transaction does.
#[tokio::test]
async fn the_log_claim_is_never_compiled() {
    let db = TestDb::new().await;
    for statement in [
        "SELECT count(*) FROM (SELECT outbox.enqueue('jit-' || g, 'webhook',
                  jsonb_build_object('url', 'http://127.0.0.1:9/', 'body', '{}'::jsonb))
                FROM generate_series(1, 10) g) e",
        "DO $$
         BEGIN
             EXECUTE format('ALTER DATABASE %I SET jit = on', current_database());
             EXECUTE format('ALTER DATABASE %I SET jit_above_cost = 0', current_database());
             EXECUTE format('ALTER DATABASE %I SET jit_inline_above_cost = 0', current_database());
             EXECUTE format('ALTER DATABASE %I SET jit_optimize_above_cost = 0', current_database());
         END
         $$",
    ] {
        sqlx::query(statement)
            .execute(db.pool())
            .await
            .unwrap_or_else(|e| panic!("{statement}: {e}"));
    }
    // new sessions take the database's settings
    let store = db.another_store().await;
    let available: bool = sqlx::query_scalar("SELECT pg_jit_available()")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert!(
        available,
        "this server cannot compile statements (pg_jit_available() is false), so this test \
         cannot tell whether the claim is compiled: run it against a server built with LLVM"
    );

    let plan = store.explain_log_claim(100).await.unwrap().join("\n");
    assert!(
        // the open segment of a new database: the first
        plan.contains("on intent_log_0 l") && plan.contains("Insert on log_batches"),
        "the claim of the log:\n{plan}"
    );
    assert!(!plan.contains("JIT:"), "the claim was compiled:\n{plan}");

    // the same statement, in a transaction of its own
    let query = outbox_relay::store::ClaimQuery::new(100, &[]);
    let mut tx = store.pool().begin().await.unwrap();
    let plain: Vec<String> = sqlx::query_scalar(&format!("EXPLAIN (ANALYZE) {}", query.log_sql()))
        .bind(100i64)
        .bind("explain")
        .bind(60_000i64)
        .bind(Vec::<String>::new())
        .bind(Vec::<f64>::new())
        .bind(Vec::<f64>::new())
        .bind(0i64)
        .fetch_all(&mut *tx)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let plain = plain.join("\n");
    assert!(
        plain.contains("JIT:"),
        "outside the claim's transaction the server compiles it:\n{plain}"
    );
}

/// The claim of the log, planned per call and as the cached generic plan
/// (which does not know the bound limit), beside 2,000 intents waiting in
/// the log, 1,000 with rows of their own and 30,000 outcomes: it reads the
/// log after the cursor in order and probes each intent it meets. With its
/// checks as anti joins, the generic plan guessed a third of the log after
/// the cursor, hashed every outcome and sorted the log on every claim.
#[tokio::test]
async fn the_log_claim_reads_the_log_in_order_whatever_the_history() {
    let db = log_with_history().await;
    let query = outbox_relay::store::ClaimQuery::new(100, &[]);
    // with nothing set aside, and with a congested destination's intents
    // set aside (the claim then looks at more of the log)
    let mut plans = Vec::new();
    for (name, args) in [
        ("log_claim", "'{}', '{}', '{}', 0"),
        (
            "log_claim_aside",
            "'{http://127.0.0.1:9}', '{500}', '{31.25}', 5000",
        ),
    ] {
        let prepare = format!(
            "PREPARE {name}(bigint, text, bigint, text[], float8[], float8[], bigint) AS {}",
            query.log_sql()
        );
        let execute = format!("EXECUTE {name}(100, 'explain', 60000, {args})");
        plans.extend(common::plans::plans_both_ways(&db, &prepare, &execute).await);
    }
    for (mode, plan) in plans {
        reads_the_log_in_order(mode, &plan, &[]);
    }
}

/// The claim's plan reads the log in (xid, id) order and hashes no table
/// (no hash join, no hashed subplan; grouping the claim's own rows by hash
/// is fine), nor shows any of `also`.
fn reads_the_log_in_order(mode: &str, plan: &str, also: &[&str]) {
    assert!(
        plan.contains("Index Scan using intent_log_0_xid on intent_log_0 l"),
        "{mode}: the claim must read the log in (xid, id) order:\n{plan}"
    );
    for other in [
        "Hash Cond",
        "hashed SubPlan",
        "Seq Scan on log_outcomes",
        "Seq Scan on intent_rows",
        "Seq Scan on intent_log",
        "Bitmap Heap Scan on intent_log",
    ]
    .iter()
    .chain(also)
    {
        assert!(
            !crate::common::plans::beside_the_tail(plan).contains(other),
            "{mode}: {other}:\n{plan}"
        );
    }
}

/// A database beside 2,000 intents waiting in the log, 1,000 with rows of
/// their own and 30,000 outcomes, analyzed.
async fn log_with_history() -> TestDb {
    let db = TestDb::new().await;
    for statement in [
        "SELECT count(*) FROM (SELECT outbox.enqueue('log-' || g, 'webhook',
                  jsonb_build_object('url', 'http://127.0.0.1:9/', 'body', '{}'::jsonb))
                FROM generate_series(1, 2000) g) e",
        // later: each has its row at once
        "SELECT count(*) FROM (SELECT outbox.enqueue('later-' || g, 'webhook',
                  jsonb_build_object('url', 'http://127.0.0.1:9/', 'body', '{}'::jsonb),
                  p_run_after => now() + interval '1 hour')
                FROM generate_series(1, 1000) g) e",
        // the outcomes of intents delivered (and purged) before
        "INSERT INTO outbox.log_outcomes (intent_id, outcome)
         SELECT 1000000 + g, 'delivered' FROM generate_series(1, 30000) g",
        "ANALYZE outbox.intent_log, outbox.intent_rows, outbox.log_outcomes",
    ] {
        sqlx::query(statement)
            .execute(db.pool())
            .await
            .unwrap_or_else(|e| panic!("{statement}: {e}"));
    }
    db
}

/// The claim of the log that sets nothing aside (what a relay runs while
/// no destination is congested), planned per call and as the cached
/// generic plan, beside the same history: it too reads the log in order,
/// probes each intent it meets, and hashes no table.
#[tokio::test]
async fn the_plain_log_claim_reads_the_log_in_order_whatever_the_history() {
    let db = log_with_history().await;
    let query = outbox_relay::store::ClaimQuery::new(100, &[]);
    let prepare = format!(
        "PREPARE log_claim_plain(bigint, text, bigint) AS {}",
        query.log_plain_sql()
    );
    let execute = "EXECUTE log_claim_plain(100, 'explain', 60000)";
    for (mode, plan) in common::plans::plans_both_ways(&db, &prepare, execute).await {
        reads_the_log_in_order(mode, &plan, &["WindowAgg"]);
    }
}

/// A claim probes for an outcome or a batch only the intents at or below
/// the highest id an outcome or a batch holds (schema 0034): above it no
/// claim has taken any. While a transaction older than the intents stays
/// open, the cursor cannot pass the intents a claim takes, so the next
/// claim meets them again: the batch that holds them, then their outcomes,
/// keep them from being taken twice, and so does a batch written without
/// its highest id, as a relay of an earlier release writes it. The view
/// `outbox.intents` counts them as the claim sees them.
#[tokio::test]
async fn the_log_claim_takes_no_intent_twice_behind_an_open_transaction() {
    let db = TestDb::new().await;
    // holds the xmin horizon below every intent enqueued after it
    let mut older = db.pool().begin().await.unwrap();
    sqlx::query("SELECT pg_current_xact_id()")
        .execute(&mut *older)
        .await
        .unwrap();
    enqueue_unanswered(&db, "held", 12).await;
    let ids = |claims: &[outbox_relay::store::Claimed]| {
        let mut ids: Vec<i64> = claims.iter().map(|c| c.id).collect();
        ids.sort();
        ids
    };
    let first = db.store.claim("first", 4, 60_000, &[]).await.unwrap();
    assert_eq!(first.len(), 4);
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM outbox.log_batches WHERE max_id IS NOT NULL"
        )
        .await,
        1,
        "the claim writes its batch's highest id"
    );
    let second = db.store.claim("second", 4, 60_000, &[]).await.unwrap();
    assert_eq!(second.len(), 4);
    // the view reads the log as the claim does (schema 0035)
    assert_eq!(db.count("key LIKE 'held:%' AND state = 'claimed'").await, 8);
    assert_eq!(db.count("key LIKE 'held:%' AND state = 'pending'").await, 4);
    assert!(
        ids(&second).iter().all(|id| !ids(&first).contains(id)),
        "a batch's intents were taken again: {:?} then {:?}",
        ids(&first),
        ids(&second)
    );
    // the first batch delivered: its intents have outcomes, it is gone
    for statement in [
        "INSERT INTO outbox.log_outcomes (intent_id, outcome)
         SELECT unnest(ids), 'delivered' FROM outbox.log_batches WHERE owner = 'first'",
        "DELETE FROM outbox.log_batches WHERE owner = 'first'",
        // the next two intents taken by a relay that does not write max_id
        "INSERT INTO outbox.log_batches (owner, lease_expires_at, ids)
         SELECT 'earlier release', now() + interval '1 minute', array_agg(id ORDER BY id)
           FROM (SELECT id FROM outbox.intent_log WHERE key LIKE 'held:%'
                    AND id NOT IN (SELECT unnest(ids) FROM outbox.log_batches)
                    AND id NOT IN (SELECT intent_id FROM outbox.log_outcomes)
                  ORDER BY id LIMIT 2) t",
    ] {
        sqlx::query(statement)
            .execute(db.pool())
            .await
            .unwrap_or_else(|e| panic!("{statement}: {e}"));
    }
    let earlier: Vec<i64> = sqlx::query_scalar(
        "SELECT unnest(ids) FROM outbox.log_batches WHERE owner = 'earlier release'
          AND max_id = (SELECT max(x) FROM unnest(ids) x)",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    assert_eq!(
        earlier.len(),
        2,
        "the trigger fills in the batch's highest id"
    );
    let third = db.store.claim("third", 12, 60_000, &[]).await.unwrap();
    let taken: Vec<i64> = [ids(&first), ids(&second), earlier].concat();
    assert_eq!(third.len(), 2, "{:?} after {taken:?}", ids(&third));
    assert!(
        ids(&third).iter().all(|id| !taken.contains(id)),
        "an intent was taken twice: {:?} after {taken:?}",
        ids(&third)
    );
    assert_eq!(db.count("key LIKE 'held:%' AND state = 'pending'").await, 0);
    assert_eq!(db.count("key LIKE 'held:%' AND state = 'claimed'").await, 8);
    assert_eq!(
        db.count("key LIKE 'held:%' AND state = 'delivered'").await,
        4
    );
    older.rollback().await.unwrap();
}

/// A delivery at the first attempt is recorded with a plain insert guarded
/// by a probe of the outcomes. When `outbox.track` moves one of the batch's
/// intents into its row between that probe and the insert, the insert
/// meets the moved intent's outcome (23505): the completion runs again
/// passing over it, records the others in the log, and the moved one
/// through its row, and fails nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_recorded_while_track_moves_one_of_its_intents_records_each_once() {
    let db = TestDb::new().await;
    enqueue_unanswered(&db, "meanwhile", 3).await;
    let claimed = db.store.claim("writer", 3, 60_000, &[]).await.unwrap();
    assert_eq!(claimed.len(), 3);
    assert!(claimed.iter().all(|c| c.log_batch.is_some()), "{claimed:?}");
    let completions: Vec<Completion> = claimed.iter().map(delivered).collect();
    let moved = claimed[0].id;

    // track's move, not committed while the completion runs into it
    let mut mover = db.pool().begin().await.unwrap();
    sqlx::query("SELECT count(*) FROM outbox.track($1)")
        .bind(vec![moved])
        .execute(&mut *mover)
        .await
        .unwrap();
    let store = db.store.clone();
    let completing = tokio::spawn(async move { store.complete("writer", &completions).await });
    let waits = common::wait_for(Duration::from_secs(15), || async {
        count(
            &db,
            "SELECT count(*) FROM pg_stat_activity
              WHERE datname = current_database() AND wait_event_type = 'Lock'
                AND query LIKE '%INSERT INTO outbox.log_outcomes%'",
        )
        .await
            == 1
    })
    .await;
    assert!(waits, "the completion's insert never waited for the move");
    mover.commit().await.unwrap();
    let written = completing
        .await
        .unwrap()
        .expect("the completion fails nothing");

    let mut accepted: Vec<i64> = written.accepted.iter().map(|a| a.id).collect();
    accepted.sort();
    let mut all: Vec<i64> = claimed.iter().map(|c| c.id).collect();
    all.sort();
    assert_eq!(accepted, all, "each delivery is accepted once");
    let outcomes: Vec<(i64, String)> =
        sqlx::query_as("SELECT intent_id, outcome FROM outbox.log_outcomes ORDER BY intent_id")
            .fetch_all(db.pool())
            .await
            .unwrap();
    let expected: Vec<(i64, String)> = all
        .iter()
        .map(|&id| {
            (
                id,
                if id == moved { "moved" } else { "delivered" }.to_string(),
            )
        })
        .collect();
    assert_eq!(outcomes, expected);
    assert_eq!(
        count(&db, "SELECT count(*) FROM outbox.intent_rows").await,
        1,
        "only the moved intent has its row"
    );
    assert_eq!(
        db.count("key LIKE 'meanwhile:%' AND state = 'delivered'")
            .await,
        3
    );
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM outbox.attempt_history WHERE outcome = 'delivered'"
        )
        .await,
        3,
        "one attempt each"
    );
}

/// Enqueue `n` webhooks to an address nothing answers, keyed
/// `{prefix}:0` and on: intents for the statements alone.
pub(crate) async fn enqueue_unanswered(db: &TestDb, prefix: &str, n: i64) {
    for n in 0..n {
        db.enqueue(
            &format!("{prefix}:{n}"),
            "webhook",
            json!({"url": "http://127.0.0.1:9/", "body": {"n": n}}),
        )
        .await;
    }
}

/// The completion of a claim's attempt delivered now, as the relay
/// settles it.
pub(crate) fn delivered(c: &outbox_relay::store::Claimed) -> Completion {
    let outcome = Outcome::Delivered {
        reference: Some(format!("msg_{}", c.id)),
        replayed: false,
        status: Some(200),
    };
    let now = Utc::now();
    let policy = RetryPolicy::default();
    settle(c, &outcome, &policy, AmbiguityPolicy::Park, now, now, 0.0)
}

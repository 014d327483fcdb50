//! The gauges' counts come from `outbox.tallies`, kept as intents change
//! and folded by `outbox.fold_tallies()`: at every point of an intent's
//! life, and across transactions that commit while a fold runs, they agree
//! with a full count of `outbox.intents`.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;

use outbox_relay::store::tallies::{OLDEST_DUE, OLDEST_DUE_WINDOW, TALLY_BACKLOG, TALLY_COUNTS};

use crate::common::{config, run_once_within, Receiver, Reply, TestDb};

type Counts = BTreeMap<(String, String), i64>;

/// The live states by kind, counted from the view as `stats` does.
async fn counted(db: &TestDb) -> Counts {
    let rows: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT kind, state, count(*) FROM outbox.intents
          WHERE state IN ('pending', 'claimed', 'ambiguous', 'dead') GROUP BY 1, 2",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    rows.into_iter().map(|(k, s, n)| ((k, s), n)).collect()
}

/// The pending and claimed intents per destination, counted from the view.
async fn counted_backlogs(db: &TestDb) -> BTreeMap<Option<String>, i64> {
    let rows: Vec<(Option<String>, i64)> = sqlx::query_as(
        "SELECT outbox.destination_of(kind, destination, payload), count(*)
           FROM outbox.intents WHERE state IN ('pending', 'claimed') GROUP BY 1",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    rows.into_iter().collect()
}

/// The gauges' counts and backlogs agree with the full counts.
async fn assert_agree(db: &TestDb, at: &str) {
    let gauges = db.store.stats_for_gauges().await.unwrap();
    let tallied: Counts = gauges
        .counts
        .into_iter()
        .map(|(k, s, n)| ((k, s), n))
        .collect();
    assert_eq!(tallied, counted(db).await, "counts by kind and state, {at}");
    let backlogs: BTreeMap<Option<String>, i64> = db
        .store
        .destination_backlogs()
        .await
        .unwrap()
        .into_iter()
        .collect();
    assert_eq!(backlogs, counted_backlogs(db).await, "backlogs, {at}");
}

async fn exec(db: &TestDb, sql: &str) {
    sqlx::query(sql).execute(db.pool()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tallies_follow_an_intents_life_from_enqueue_to_purge() {
    let db = TestDb::new().await;
    // one receiver answers, one fails the first time (a retry gives the
    // intent its row), one takes longer than the timeout (ambiguous)
    let ok = Receiver::ok().await;
    let flaky = Receiver::start(|_, nth| {
        if nth == 1 {
            Reply::status(503)
        } else {
            Reply::status(200)
        }
    })
    .await;
    for n in 0..12 {
        let url = if n % 3 == 0 {
            flaky.url("/f")
        } else {
            ok.url("/o")
        };
        db.enqueue(&format!("w:{n}"), "webhook", json!({"url": url}))
            .await;
    }
    // behind an ordering key, later, and of a kind this relay leaves
    // alone: each has its row from its enqueue or its first claim
    for n in 0..3 {
        sqlx::query("SELECT outbox.enqueue($1, 'webhook', $2, p_ordering_key => 'k')")
            .bind(format!("ordered:{n}"))
            .bind(json!({"url": ok.url("/k")}))
            .execute(db.pool())
            .await
            .unwrap();
    }
    sqlx::query(
        "SELECT outbox.enqueue('later', 'webhook', $1, p_run_after => now() + interval '1 hour')",
    )
    .bind(json!({"url": ok.url("/later")}))
    .execute(db.pool())
    .await
    .unwrap();
    db.enqueue(
        "subject",
        "nats",
        json!({"subject": "orders.created", "body": {}}),
    )
    .await;
    assert_agree(&db, "after the enqueues").await;

    let cfg = config();
    run_once_within(&db, &cfg, Duration::from_secs(60)).await;
    assert_agree(&db, "after a drain").await;

    // an operator cancels a pending log intent through the view, and one
    // delivered intent is made dead by hand
    db.enqueue("cancel-me", "webhook", json!({"url": ok.url("/c")}))
        .await;
    exec(
        &db,
        "UPDATE outbox.intents SET state = 'cancelled' WHERE key = 'cancel-me'",
    )
    .await;
    exec(
        &db,
        "UPDATE outbox.intents SET state = 'dead', last_error = 'by hand' WHERE key = 'w:1'",
    )
    .await;
    assert_agree(&db, "after operators' changes").await;

    // deleted before any fold counted them, and after
    db.enqueue("gone:1", "webhook", json!({"url": ok.url("/g")}))
        .await;
    exec(&db, "DELETE FROM outbox.intents WHERE key = 'gone:1'").await;
    db.enqueue("gone:2", "webhook", json!({"url": ok.url("/g")}))
        .await;
    db.store.fold_tallies().await.unwrap();
    exec(&db, "DELETE FROM outbox.intents WHERE key = 'gone:2'").await;
    exec(&db, "DELETE FROM outbox.intents WHERE key = 'ordered:2'").await;
    assert_agree(&db, "after deletes").await;

    // a delete in a transaction reading an older snapshot: counted again
    db.enqueue("gone:3", "webhook", json!({"url": ok.url("/g")}))
        .await;
    let mut tx = db.pool().begin().await.unwrap();
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("DELETE FROM outbox.intents WHERE key = 'gone:3'")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let valid: bool = sqlx::query_scalar("SELECT valid FROM outbox.tally_mark")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert!(
        !valid,
        "a delete under an older snapshot asks for a recount"
    );
    assert_agree(&db, "after a delete under repeatable read").await;

    // retention: the terminal intents go, with and without rows
    let purged = db
        .store
        .purge(Duration::ZERO, true, false, 1000)
        .await
        .unwrap();
    assert!(purged >= 10, "purged {purged}");
    assert_agree(&db, "after a purge").await;

    exec(&db, "TRUNCATE outbox.log_batches").await;
    assert_agree(&db, "after a truncate").await;
    assert_eq!(
        db.state("later").await,
        "pending",
        "the later intent is live"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_that_commits_across_folds_is_counted_once() {
    let db = TestDb::new().await;
    let url = "https://receiver.invalid/hook";
    db.enqueue("before", "webhook", json!({"url": url})).await;
    db.store.fold_tallies().await.unwrap();

    // a transaction enqueues and stays open while others commit and the
    // tallies are folded twice: the others are counted once, it when it
    // commits
    let mut held = db.pool().begin().await.unwrap();
    sqlx::query("SELECT outbox.enqueue('held', 'webhook', $1)")
        .bind(json!({"url": url}))
        .execute(&mut *held)
        .await
        .unwrap();
    let held_xid: String = sqlx::query_scalar("SELECT pg_current_xact_id()::text")
        .fetch_one(&mut *held)
        .await
        .unwrap();
    for n in 0..3 {
        db.enqueue(&format!("beside:{n}"), "webhook", json!({"url": url}))
            .await;
        db.store.fold_tallies().await.unwrap();
    }
    assert_agree(&db, "while a transaction with an intent is open").await;
    let running: bool = sqlx::query_scalar(
        "SELECT $1::xid8 IN (SELECT pg_snapshot_xip(snapshot) FROM outbox.tally_mark)",
    )
    .bind(&held_xid)
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert!(running, "the last fold saw the open transaction running");
    held.commit().await.unwrap();
    assert_agree(&db, "after it commits").await;
    db.store.fold_tallies().await.unwrap();
    assert_agree(&db, "after another fold").await;
    let pending = counted(&db)
        .await
        .get(&("webhook".to_string(), "pending".to_string()))
        .copied();
    assert_eq!(pending, Some(5));

    // a rolled back enqueue is never counted
    let mut gone = db.pool().begin().await.unwrap();
    sqlx::query("SELECT outbox.enqueue('rolled-back', 'webhook', $1)")
        .bind(json!({"url": url}))
        .execute(&mut *gone)
        .await
        .unwrap();
    gone.rollback().await.unwrap();
    assert_agree(&db, "after a rollback").await;

    // a batch written without its groups, as a relay of an earlier version
    // claims: its intents' groups are read from the log
    exec(
        &db,
        "INSERT INTO outbox.log_batches (owner, lease_expires_at, ids)
         SELECT 'earlier', now() + interval '1 minute',
                ARRAY(SELECT id FROM outbox.intent_log WHERE key LIKE 'beside:%')",
    )
    .await;
    assert_agree(&db, "after a batch without its groups").await;
    let claimed = counted(&db)
        .await
        .get(&("webhook".to_string(), "claimed".to_string()))
        .copied();
    assert_eq!(claimed, Some(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fold_reads_what_changed_not_the_backlog() {
    let db = TestDb::new().await;
    exec(
        &db,
        "SELECT count(*) FROM outbox.enqueue_many(
             ARRAY(SELECT 'bulk:' || g FROM generate_series(1, 20000) g),
             array_fill('webhook'::text, ARRAY[20000]),
             ARRAY(SELECT jsonb_build_object('url', 'https://r' || (g % 7) || '.invalid/h')
                     FROM generate_series(1, 20000) g))",
    )
    .await;
    db.store.fold_tallies().await.unwrap();
    assert_agree(&db, "after the first fold").await;
    // the next fold and the gauges' reads touch the tallies, the mark and
    // the first due intents, not the 20,000 pending ones: counted in the
    // log's tuples this transaction fetched
    db.enqueue(
        "one-more",
        "webhook",
        json!({"url": "https://r1.invalid/h"}),
    )
    .await;
    // a session of its own: one that read the log before may still hold
    // those reads in the counts it has not reported
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    let folded: bool = sqlx::query_scalar("SELECT outbox.fold_tallies()")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    assert!(folded);
    for sql in [TALLY_COUNTS, TALLY_BACKLOG, OLDEST_DUE] {
        sqlx::query(sql).execute(&mut *tx).await.unwrap();
    }
    let fetched = crate::common::log_tuples_fetched(&mut tx).await;
    tx.commit().await.unwrap();
    assert!(
        fetched <= 1 + 2 * OLDEST_DUE_WINDOW,
        "a fold and the gauges' reads fetched {fetched} log tuples beside 20,000 pending"
    );
    let pending = db
        .store
        .tallied_counts()
        .await
        .unwrap()
        .into_iter()
        .find(|(k, s, _)| k == "webhook" && s == "pending")
        .map(|r| r.2);
    assert_eq!(pending, Some(20001));
}

/// A relay's gauges fold from two tasks. A fold refused because another is
/// running waits for that fold to commit before the read: until then the
/// read's snapshot holds the deltas of the claims that fold is folding away
/// but not the arrivals it counts, and intents a claim took before any fold
/// saw them counted as gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fold_refused_while_another_runs_waits_for_it_before_the_read() {
    use sqlx::Connection;
    let db = TestDb::new().await;
    assert!(db.store.fold_tallies().await.unwrap());
    for n in 0..3 {
        db.enqueue(
            &format!("raced:{n}"),
            "webhook",
            json!({"url": "http://127.0.0.1:9/hook", "body": n}),
        )
        .await;
    }
    // a claim takes them before any fold has seen them arrive
    assert_eq!(db.store.claim("r", 10, 60_000, &[]).await.unwrap().len(), 3);
    // another session's fold, not committed yet
    let mut other = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::raw_sql("BEGIN; SELECT outbox.fold_tallies();")
        .execute(&mut other)
        .await
        .unwrap();
    let store = db.store.clone();
    let read = tokio::spawn(async move {
        let folded = store.fold_tallies().await.unwrap();
        (folded, store.tallied_backlogs().await.unwrap())
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !read.is_finished(),
        "the refused fold did not wait for the running one"
    );
    sqlx::query("COMMIT").execute(&mut other).await.unwrap();
    let (folded, backlogs) = read.await.unwrap();
    assert!(!folded, "the other session was folding");
    let backlogs: BTreeMap<Option<String>, i64> = backlogs.into_iter().collect();
    assert_eq!(backlogs, counted_backlogs(&db).await);
    assert_eq!(
        backlogs.get(&Some("http://127.0.0.1:9".to_string())),
        Some(&3)
    );
}

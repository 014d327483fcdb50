//! The log in segments (schemas 0042 and 0043): rotation moves the new
//! intents into a new segment while the claims read both; a segment closes
//! only once every intent in it is claimed and out of its batch, and takes
//! no insert after; retirement puts its intents delivered at the first
//! attempt into the ledger and drops it whole, while the intents with rows
//! live on.

use std::time::Duration;

use crate::common::{config, run_once_within, Receiver, Reply, TestDb};
use outbox_relay::store::operator::Known;
use outbox_relay::store::segments::SegmentPass;
use outbox_relay::store::Store;
use serde_json::json;

/// One step of a segment function, and what it answered.
async fn step(db: &TestDb, function: &str, ms: i64) -> String {
    sqlx::query_scalar(&format!(
        "SELECT outbox.{function}($1 * interval '1 millisecond')"
    ))
    .bind(ms)
    .fetch_one(db.pool())
    .await
    .unwrap_or_else(|e| panic!("{function}: {e}"))
}

/// The segments `outbox.intent_log_open` reads, besides the tail, which it
/// always reads.
async fn open_segments(db: &TestDb) -> Vec<String> {
    let mut read: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT t.relname::text FROM pg_depend d
           JOIN pg_rewrite r ON r.oid = d.objid
           JOIN pg_class t ON t.oid = d.refobjid
          WHERE r.ev_class = 'outbox.intent_log_open'::regclass AND t.oid <> r.ev_class
          ORDER BY 1",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    let tail = read.iter().position(|t| t == "intent_log_tail");
    read.remove(tail.expect("the open log reads the tail"));
    read
}

async fn enqueue_later(db: &TestDb, key: &str, url: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT id FROM outbox.enqueue($1, 'webhook', $2, p_run_after => now() + interval '1 hour')",
    )
    .bind(key)
    .bind(json!({"url": url, "body": {}}))
    .fetch_one(db.pool())
    .await
    .unwrap()
}

/// Rotate until the next segment is open and the sequence is in it.
async fn rotate(db: &TestDb) {
    assert_eq!(step(db, "rotate_log", 0).await, "made");
    assert_eq!(step(db, "rotate_log", 0).await, "opened");
    assert_eq!(step(db, "rotate_log", 0).await, "moved");
}

/// Retention passes (a new segment and retirement at once) until one drops
/// a segment, for at most 20 s, their counts summed: a step that cannot
/// take its lock at once (autovacuum on a new segment, say) answers busy,
/// and the next pass goes on.
pub(crate) async fn passes_until_a_drop(store: &Store) -> SegmentPass {
    let mut sum = SegmentPass::default();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while sum.dropped == 0 && std::time::Instant::now() < deadline {
        let pass = store
            .maintain_log_segments(Duration::ZERO, Some(Duration::ZERO))
            .await
            .expect("a retention pass");
        sum.closed += pass.closed;
        sum.copied += pass.copied;
        sum.dropped += pass.dropped;
        if sum.dropped == 0 {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    sum
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_segment_retires_whole_and_the_intents_with_rows_live_on() {
    let db = TestDb::new().await;
    let rx = Receiver::start(|r, _| match r.path.as_str() {
        "/bad" => Reply::status(400),
        _ => Reply::status(200),
    })
    .await;
    let cfg = config();
    for i in 0..20 {
        db.enqueue(
            &format!("a-{i}"),
            "webhook",
            json!({"url": rx.url("/ok"), "body": {"i": i}}),
        )
        .await;
    }
    let later = enqueue_later(&db, "later", &rx.url("/later")).await;
    let dropped = enqueue_later(&db, "dropped", &rx.url("/later")).await;
    db.enqueue("bad", "webhook", json!({"url": rx.url("/bad"), "body": {}}))
        .await;
    run_once_within(&db, &cfg, Duration::from_secs(30)).await;
    assert_eq!(db.count("state = 'delivered'").await, 20);
    assert_eq!(db.state("bad").await, "rejected");

    // the next segment joins the views before the sequence moves into it
    assert_eq!(open_segments(&db).await, ["intent_log_0"]);
    assert_eq!(step(&db, "rotate_log", 0).await, "made");
    assert_eq!(step(&db, "rotate_log", 0).await, "opened");
    assert_eq!(open_segments(&db).await, ["intent_log_0", "intent_log_1"]);
    let before: i64 = db
        .enqueue(
            "b-before",
            "webhook",
            json!({"url": rx.url("/ok"), "body": {}}),
        )
        .await;
    assert!(before < 1 << 32, "{before}");
    assert_eq!(step(&db, "rotate_log", 0).await, "moved");
    // an empty newest segment is not rotated away
    assert_eq!(step(&db, "rotate_log", 0).await, "made");
    assert_eq!(step(&db, "rotate_log", 0).await, "idle");
    for i in 0..10 {
        let id = db
            .enqueue(
                &format!("b-{i}"),
                "webhook",
                json!({"url": rx.url("/ok"), "body": {}}),
            )
            .await;
        assert!(id >= 1 << 32, "{id}");
    }
    // the claims read both open segments
    run_once_within(&db, &cfg, Duration::from_secs(30)).await;
    assert_eq!(db.count("key LIKE 'b-%' AND state = 'delivered'").await, 11);

    // closed once the sequence left it a moment ago
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(step(&db, "close_log_segment", 1000).await, "closed");
    assert_eq!(open_segments(&db).await, ["intent_log_1"]);
    assert_eq!(step(&db, "close_log_segment", 1000).await, "idle");
    // an insert that took its id there before the sequence moved fails,
    // for the application to retry
    let late = sqlx::query(
        "INSERT INTO outbox.intent_log (id, key, kind, payload) VALUES (7, 'late', 'webhook', '{}')",
    )
    .execute(db.pool())
    .await
    .unwrap_err();
    assert_eq!(
        late.as_database_error().and_then(|e| e.code()).as_deref(),
        Some("40001"),
        "{late}"
    );

    // not yet old enough
    assert_eq!(step(&db, "retire_log_segment", 3_600_000).await, "idle");
    // an application's snapshot from before the copy into the ledger holds
    // the drop: until it ends it still sees the intents in the log
    let mut app = db.pool().begin().await.unwrap();
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut *app)
        .await
        .unwrap();
    sqlx::query("SELECT count(*) FROM outbox.subscriptions")
        .execute(&mut *app)
        .await
        .unwrap();
    assert_eq!(step(&db, "retire_log_segment", 0).await, "copied");
    assert_eq!(step(&db, "retire_log_segment", 0).await, "idle");
    let old: (i64, bool) =
        sqlx::query_as("SELECT id, duplicate FROM outbox.enqueue('a-5', 'webhook', $1)")
            .bind(json!({"url": rx.url("/ok"), "body": {"i": 5}}))
            .fetch_one(&mut *app)
            .await
            .unwrap();
    assert!(old.1, "a key retired after the snapshot was taken: {old:?}");
    app.commit().await.unwrap();
    // an intent given its row after the copy (as an operator's retry gives
    // it) lives on in the row, and the ledger forgets it at the drop
    sqlx::query("SELECT outbox.track(ARRAY(SELECT id FROM outbox.intents WHERE key = 'a-7'))")
        .execute(db.pool())
        .await
        .unwrap();
    let mut answers = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while answers.last().map(String::as_str) != Some("dropped")
        && std::time::Instant::now() < deadline
    {
        // autovacuum may hold the log for a moment
        answers.push(step(&db, "retire_log_segment", 0).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        answers.last().map(String::as_str),
        Some("dropped"),
        "{answers:?}"
    );
    assert_eq!(step(&db, "retire_log_segment", 0).await, "idle");
    let gone: (Option<String>, Option<String>) = sqlx::query_as(
        "SELECT to_regclass('outbox.intent_log_0')::text, to_regclass('outbox.log_outcomes_0')::text",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(gone, (None, None));

    // the delivered intents answer from the ledger, as purged ones do
    assert_eq!(db.count("key LIKE 'a-%'").await, 1);
    assert_eq!(db.state("a-7").await, "delivered");
    let ledger: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox.ledger WHERE (key LIKE 'a-%' OR key = 'b-before') AND state = 'delivered'",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(ledger, 20);
    match db.store.lookup_key("a-3").await.unwrap() {
        Known::Ledger(e) => assert_eq!(e.state, "delivered"),
        other => panic!("a-3: {other:?}"),
    }
    let again: (i64, bool) =
        sqlx::query_as("SELECT id, duplicate FROM outbox.enqueue('a-3', 'webhook', $1)")
            .bind(json!({"url": rx.url("/ok"), "body": {"i": 3}}))
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert!(again.1, "a delivered key enqueued again is a duplicate");

    // the intents with rows live on: the rejected one with its attempt,
    // the scheduled one under its key, never taken over by a new enqueue
    assert_eq!(db.state("bad").await, "rejected");
    let attempts: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox.attempt_history h
           JOIN outbox.intents i ON i.id = h.intent_id WHERE i.key = 'bad'",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(attempts, 1);
    let dup: (i64, bool) =
        sqlx::query_as("SELECT id, duplicate FROM outbox.enqueue('later', 'webhook', $1)")
            .bind(json!({"url": rx.url("/later"), "body": {}}))
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(dup, (later, true));
    sqlx::query("UPDATE outbox.intents SET run_after = now() WHERE key = 'later'")
        .execute(db.pool())
        .await
        .unwrap();
    run_once_within(&db, &cfg, Duration::from_secs(30)).await;
    assert_eq!(db.state("later").await, "delivered");
    assert_eq!(rx.counts_by_id().values().filter(|n| **n > 1).count(), 0);
    assert_eq!(
        rx.requests().iter().filter(|r| r.path == "/later").count(),
        1
    );

    // an operator may delete one through the view, and its key is free
    sqlx::query("DELETE FROM outbox.intents WHERE key = 'dropped'")
        .execute(db.pool())
        .await
        .unwrap();
    assert_eq!(db.count("key = 'dropped'").await, 0);
    let anew = enqueue_later(&db, "dropped", &rx.url("/later")).await;
    assert_ne!(anew, dropped, "a deleted intent's key is a new intent");

    // and are purged row by row, their attempts with them
    sqlx::query("UPDATE outbox.intents SET updated_at = now() - interval '1 hour' WHERE key IN ('bad', 'later')")
        .execute(db.pool())
        .await
        .unwrap();
    let purged = db
        .store
        .purge_rows_paced(Duration::from_secs(60), false, 100, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(purged, 2);
    assert_eq!(db.count("key IN ('bad', 'later')").await, 0);
    let left: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox.attempts a
          WHERE NOT EXISTS (SELECT 1 FROM outbox.intent_rows t WHERE t.id = a.intent_id)",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(left, 0);
    match db.store.lookup_key("later").await.unwrap() {
        Known::Ledger(e) => assert_eq!(e.state, "delivered"),
        other => panic!("later: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_segment_stays_open_while_it_holds_an_intent_no_claim_has_taken() {
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    let cfg = config();
    for i in 0..5 {
        db.enqueue(
            &format!("k-{i}"),
            "webhook",
            json!({"url": rx.url("/ok"), "body": {}}),
        )
        .await;
    }
    rotate(&db).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // five intents after the claims' cursor
    assert_eq!(step(&db, "close_log_segment", 1000).await, "idle");
    assert_eq!(open_segments(&db).await, ["intent_log_0", "intent_log_1"]);
    run_once_within(&db, &cfg, Duration::from_secs(30)).await;
    assert_eq!(db.count("state = 'delivered'").await, 5);
    assert_eq!(step(&db, "close_log_segment", 1000).await, "closed");
    assert_eq!(open_segments(&db).await, ["intent_log_1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retention_pass_rotates_closes_and_retires() {
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    let cfg = config();
    for i in 0..5 {
        db.enqueue(
            &format!("k-{i}"),
            "webhook",
            json!({"url": rx.url("/ok"), "body": {}}),
        )
        .await;
    }
    run_once_within(&db, &cfg, Duration::from_secs(30)).await;
    let pass = db
        .store
        .maintain_log_segments(Duration::ZERO, Some(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!((pass.made, pass.opened, pass.closed), (2, 1, 0), "{pass:?}");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let pass = passes_until_a_drop(&db.store).await;
    let done = (pass.closed, pass.copied, pass.dropped);
    assert_eq!(done, (1, 1, 1), "closed, copied, dropped");
    assert_eq!(db.count("true").await, 0);
    let ledger: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox.ledger")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(ledger, 5);
    // a pass with nothing to do changes nothing
    let pass = db
        .store
        .maintain_log_segments(Duration::from_secs(3600), Some(Duration::ZERO))
        .await
        .unwrap();
    assert!(!pass.changed(), "{pass:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_past_the_segments_goes_to_the_tail_and_rotation_opens_above_it() {
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    let cfg = config();
    db.enqueue(
        "first",
        "webhook",
        json!({"url": rx.url("/ok"), "body": {}}),
    )
    .await;
    run_once_within(&db, &cfg, Duration::from_secs(30)).await;
    // the next segment is made but not attached
    assert_eq!(step(&db, "rotate_log", 3_600_000).await, "made");
    assert_eq!(step(&db, "rotate_log", 3_600_000).await, "idle");
    // an application moves the sequence past the segments: its intents go
    // to the tail, which the claims read
    sqlx::query("SELECT setval('outbox.intent_ids', (1::bigint << 32) + 5)")
        .execute(db.pool())
        .await
        .unwrap();
    let past = db
        .enqueue("past", "webhook", json!({"url": rx.url("/ok"), "body": {}}))
        .await;
    assert_eq!(past, (1 << 32) + 6);
    let in_tail: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox.intent_log_tail")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(in_tail, 1);
    // one run delivers it: the claim gives it its row and claims the row
    run_once_within(&db, &cfg, Duration::from_secs(30)).await;
    assert_eq!(db.state("past").await, "delivered");
    // the segment made before cannot take the tail's intent: it is made
    // again above it, and opened at once, the sequence being past half of
    // the newest segment
    assert_eq!(step(&db, "rotate_log", 3_600_000).await, "busy");
    assert_eq!(step(&db, "rotate_log", 3_600_000).await, "made");
    assert_eq!(step(&db, "rotate_log", 3_600_000).await, "opened");
    assert_eq!(step(&db, "rotate_log", 3_600_000).await, "moved");
    let next = db
        .enqueue("next", "webhook", json!({"url": rx.url("/ok"), "body": {}}))
        .await;
    assert_eq!(next, 2 << 32);
    run_once_within(&db, &cfg, Duration::from_secs(30)).await;
    assert_eq!(db.count("state = 'delivered'").await, 3);
    // the daemon's purge takes the tail's intents row by row, and leaves
    // the segments' to their retirement
    let purged = db
        .store
        .purge_rows_paced(Duration::ZERO, false, 100, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(purged, 1);
    assert_eq!(db.count("key = 'past'").await, 0);
    assert_eq!(db.count("key IN ('first', 'next')").await, 2);
    match db.store.lookup_key("past").await.unwrap() {
        Known::Ledger(e) => assert_eq!(e.state, "delivered"),
        other => panic!("past: {other:?}"),
    }
}

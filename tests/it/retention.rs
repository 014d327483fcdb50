//! Retention against work in flight: a purge that removes an intent whose
//! attempt is running, and a purged key enqueued again under snapshot
//! isolation.

use std::time::Duration;

use crate::common::{config, engine, run_once_within, wait_for, Receiver, Reply, TestDb};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_for_an_intent_purged_in_flight_is_dropped_and_counted() {
    let handle = outbox_relay::observe::metrics::recorder();
    let db = TestDb::new().await;
    let rx = Receiver::start(|r, _| match r.path.as_str() {
        "/slow" => Reply::status(200).after(Duration::from_millis(1500)),
        _ => Reply::status(200),
    })
    .await;
    db.enqueue(
        "purged",
        "webhook",
        json!({"url": rx.url("/slow"), "body": {}}),
    )
    .await;
    let cfg = config();
    let run = tokio::spawn(engine(db.store.clone(), &cfg).run_once());
    assert!(
        wait_for(Duration::from_secs(10), || async {
            !rx.requests().is_empty()
        })
        .await
    );
    // in flight: an operator cancels it and a purge removes it
    db.store.cancel("purged").await.unwrap();
    sqlx::query("UPDATE outbox.intents SET updated_at = now() - interval '1 hour'")
        .execute(db.pool())
        .await
        .unwrap();
    assert_eq!(
        db.store
            .purge(Duration::from_secs(1), false, false, 100)
            .await
            .unwrap(),
        1
    );
    // later work is still recorded: the completer is not wedged
    db.enqueue(
        "after",
        "webhook",
        json!({"url": rx.url("/ok"), "body": {}}),
    )
    .await;
    tokio::time::timeout(Duration::from_secs(20), run)
        .await
        .expect("run --once returned")
        .unwrap()
        .unwrap();
    run_once_within(&db, &cfg, Duration::from_secs(20)).await;
    assert_eq!(db.state("after").await, "delivered");
    let text = handle.render();
    assert!(
        text.lines()
            .any(|l| l.starts_with("outbox_completions_dropped_total{reason=\"intent_gone\"} 1")),
        "{}",
        text.lines()
            .filter(|l| l.contains("dropped"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Enqueue `key` inside `tx` and report what happened: Ok(duplicate) or the
/// SQLSTATE.
async fn enqueue_in(
    tx: &mut sqlx::PgConnection,
    key: &str,
    payload: serde_json::Value,
) -> Result<bool, String> {
    let r: Result<(i64, bool), sqlx::Error> =
        sqlx::query_as("SELECT id, duplicate FROM outbox.enqueue($1, 'webhook', $2)")
            .bind(key)
            .bind(payload)
            .fetch_one(&mut *tx)
            .await;
    r.map(|r| r.1)
        .map_err(|e| outbox_relay::store::sqlstate(&e).unwrap_or_else(|| e.to_string()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_snapshot_isolation_a_purged_key_is_never_a_new_intent() {
    let db = TestDb::new().await;
    let payload = json!({"url": "http://127.0.0.1:9/", "body": {"n": 1}});
    for level in ["REPEATABLE READ", "SERIALIZABLE"] {
        for (case, again) in [
            ("same", payload.clone()),
            ("other", json!({"url": "x", "body": 2})),
        ] {
            let key = format!("{level}-{case}");
            db.enqueue(&key, "webhook", payload.clone()).await;
            sqlx::query(
                "UPDATE outbox.intents SET state = 'delivered', delivered_at = now(),
                        updated_at = now() - interval '1 hour' WHERE key = $1",
            )
            .bind(&key)
            .execute(db.pool())
            .await
            .unwrap();
            // the application's snapshot is taken before the purge
            let mut app = db.pool().acquire().await.unwrap();
            sqlx::query(&format!("BEGIN ISOLATION LEVEL {level}"))
                .execute(&mut *app)
                .await
                .unwrap();
            sqlx::query("SELECT count(*) FROM outbox.intents")
                .execute(&mut *app)
                .await
                .unwrap();
            assert_eq!(
                db.store
                    .purge(Duration::from_secs(1), false, false, 100)
                    .await
                    .unwrap(),
                1
            );
            let got = enqueue_in(&mut app, &key, again.clone()).await;
            sqlx::query("ROLLBACK").execute(&mut *app).await.unwrap();
            match (case, &got) {
                (_, Err(code)) if code == "40001" => {}
                ("same", Ok(true)) => {}
                ("other", Err(code)) if code == "OB409" => {}
                _ => panic!("{level}, {case} payload: {got:?} (a new intent under a purged key)"),
            }
            // the application retries: now it sees the ledger
            let mut retry = db.pool().acquire().await.unwrap();
            sqlx::query(&format!("BEGIN ISOLATION LEVEL {level}"))
                .execute(&mut *retry)
                .await
                .unwrap();
            let again = enqueue_in(&mut retry, &key, again).await;
            sqlx::query("COMMIT").execute(&mut *retry).await.unwrap();
            match case {
                "same" => assert_eq!(again, Ok(true), "{level}"),
                _ => assert_eq!(again, Err("OB409".into()), "{level}"),
            }
        }
    }
    assert_eq!(db.count("true").await, 0, "no intent row was created");
    // a key never used is still a new intent at these levels, and leaves
    // nothing in the ledger
    let mut app = db.pool().acquire().await.unwrap();
    sqlx::query("BEGIN ISOLATION LEVEL SERIALIZABLE")
        .execute(&mut *app)
        .await
        .unwrap();
    assert_eq!(
        enqueue_in(&mut app, "fresh", payload.clone()).await,
        Ok(false)
    );
    sqlx::query("COMMIT").execute(&mut *app).await.unwrap();
    let probes: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox.ledger WHERE state = 'probe'")
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(probes, 0);
}

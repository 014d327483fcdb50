//! Every key in `outbox.intent_keys` (schemas 0037 to 0039): the keys of a
//! deployment's earlier intents are copied at the upgrade while it runs,
//! each key stays unique live or purged, a key whose intent is gone and
//! forgotten is free again, and a read of the view by key goes through
//! the table of keys.

use std::time::Duration;

use serde_json::json;

use crate::common::schema_at::{migrate_up_to, schema_up_to};
use crate::common::TestDb;

/// `outbox.enqueue(key, 'webhook', payload)` answered as (id, duplicate),
/// or the SQLSTATE of its error.
async fn enqueue(
    db: &TestDb,
    key: &str,
    payload: serde_json::Value,
) -> Result<(i64, bool), String> {
    sqlx::query_as("SELECT id, duplicate FROM outbox.enqueue($1, 'webhook', $2)")
        .bind(key)
        .bind(payload)
        .fetch_one(db.pool())
        .await
        .map_err(|e| outbox_relay::store::sqlstate(&e).unwrap_or_else(|| e.to_string()))
}

async fn scalar_i64(db: &TestDb, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(db.pool()).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_copies_every_earlier_key_and_each_stays_unique() {
    let (db, _) = schema_up_to(36).await;
    let payload = json!({"url": "http://127.0.0.1:9/", "body": {"n": 1}});
    // more keys than one copy takes, live in the log
    sqlx::query(
        "INSERT INTO outbox.intent_log (key, kind, payload)
         SELECT 'bulk:' || g, 'webhook', $1 FROM generate_series(1, 25000) g",
    )
    .bind(&payload)
    .execute(db.pool())
    .await
    .unwrap();
    let (live, _) = enqueue(&db, "live", payload.clone()).await.unwrap();
    // and some purged into the ledger
    for key in ["gone:1", "gone:2"] {
        enqueue(&db, key, payload.clone()).await.unwrap();
    }
    sqlx::query(
        "UPDATE outbox.intents SET state = 'delivered', delivered_at = now(),
                updated_at = now() - interval '1 hour' WHERE key LIKE 'gone:%'",
    )
    .execute(db.pool())
    .await
    .unwrap();
    assert_eq!(
        db.store
            .purge(Duration::from_secs(1), false, false, 100)
            .await
            .unwrap(),
        2
    );
    let gone: i64 = scalar_i64(
        &db,
        "SELECT intent_id FROM outbox.ledger WHERE key = 'gone:1'",
    )
    .await;

    let migrated = db.store.migrate().await.unwrap();
    let versions: Vec<i64> = migrated.applied.iter().map(|(v, _)| *v).collect();
    assert!(versions.starts_with(&[37, 38, 39]), "{versions:?}");

    // every key of the log and of the ledger, with its intent's id
    assert_eq!(
        scalar_i64(&db, "SELECT count(*) FROM outbox.intent_keys").await,
        25000 + 1 + 2
    );
    assert_eq!(
        scalar_i64(
            &db,
            "SELECT count(*) FROM outbox.intent_log l
              WHERE NOT EXISTS (SELECT 1 FROM outbox.intent_keys k
                                 WHERE k.key = l.key AND k.intent_id = l.id)"
        )
        .await,
        0
    );
    // the log keeps no index on the key, and the copy leaves nothing behind
    let on_key: i64 = scalar_i64(
        &db,
        "SELECT count(*) FROM pg_indexes
          WHERE schemaname = 'outbox' AND tablename = 'intent_log' AND indexdef LIKE '%(key)%'",
    )
    .await;
    assert_eq!(on_key, 0);
    let left: (Option<String>, Option<String>) = sqlx::query_as(
        "SELECT to_regclass('outbox.intent_keys_fill')::text,
                to_regprocedure('outbox.fill_intent_keys(integer)')::text",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(left, (None, None));

    // a live key, a purged one, another payload under a purged one, a new one
    assert_eq!(
        enqueue(&db, "live", payload.clone()).await,
        Ok((live, true))
    );
    assert_eq!(
        enqueue(&db, "bulk:7", payload.clone()).await.map(|r| r.1),
        Ok(true)
    );
    assert_eq!(
        enqueue(&db, "gone:1", payload.clone()).await,
        Ok((gone, true))
    );
    assert_eq!(
        enqueue(
            &db,
            "gone:2",
            json!({"url": "http://127.0.0.1:9/", "body": {"n": 2}})
        )
        .await,
        Err("OB409".to_string())
    );
    let (new, duplicate) = enqueue(&db, "new", payload.clone()).await.unwrap();
    assert!(!duplicate);
    assert_eq!(
        scalar_i64(
            &db,
            "SELECT intent_id FROM outbox.intent_keys WHERE key = 'new'"
        )
        .await,
        new
    );

    // the view finds an intent of the log by its key through the keys
    sqlx::query("ANALYZE outbox.intent_log, outbox.intent_keys")
        .execute(db.pool())
        .await
        .unwrap();
    let plan: Vec<String> =
        sqlx::query_scalar("EXPLAIN SELECT id, state FROM outbox.intents WHERE key = 'bulk:7'")
            .fetch_all(db.pool())
            .await
            .unwrap();
    let plan = plan.join("\n");
    assert!(plan.contains("intent_keys_pkey"), "{plan}");
    assert!(
        !crate::common::plans::beside_the_tail(&plan).contains("Seq Scan on intent_log"),
        "{plan}"
    );
    assert_eq!(db.state("bulk:7").await, "pending");
    // and a read that does not name the key reads no key row
    let plan: Vec<String> =
        sqlx::query_scalar("EXPLAIN SELECT count(*) FROM outbox.intents WHERE state = 'pending'")
            .fetch_all(db.pool())
            .await
            .unwrap();
    let plan = plan.join("\n");
    assert!(!plan.contains("intent_keys"), "{plan}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_whose_intent_is_gone_and_forgotten_is_free_again() {
    let db = TestDb::new().await;
    let payload = json!({"url": "http://127.0.0.1:9/", "body": {"n": 1}});

    // deleted from the log by hand: its key row is left, and taken over
    let (first, _) = enqueue(&db, "by-hand", payload.clone()).await.unwrap();
    sqlx::query("DELETE FROM outbox.intent_log WHERE key = 'by-hand'")
        .execute(db.pool())
        .await
        .unwrap();
    let (again, duplicate) = enqueue(&db, "by-hand", payload.clone()).await.unwrap();
    assert!(!duplicate);
    assert_ne!(again, first);
    assert_eq!(db.count("key = 'by-hand'").await, 1);

    // deleted through the view: the key goes with it
    enqueue(&db, "through-view", payload.clone()).await.unwrap();
    sqlx::query("DELETE FROM outbox.intents WHERE key = 'through-view'")
        .execute(db.pool())
        .await
        .unwrap();
    assert_eq!(
        scalar_i64(
            &db,
            "SELECT count(*) FROM outbox.intent_keys WHERE key = 'through-view'"
        )
        .await,
        0
    );

    // purged, then forgotten by the ledger's retention: a new operation
    let (purged, _) = enqueue(&db, "forgotten", payload.clone()).await.unwrap();
    sqlx::query(
        "UPDATE outbox.intents SET state = 'delivered', delivered_at = now(),
                updated_at = now() - interval '1 hour' WHERE key = 'forgotten'",
    )
    .execute(db.pool())
    .await
    .unwrap();
    db.store
        .purge(Duration::from_secs(1), false, false, 100)
        .await
        .unwrap();
    assert_eq!(
        enqueue(&db, "forgotten", payload.clone()).await,
        Ok((purged, true))
    );
    sqlx::query("UPDATE outbox.ledger SET purged_at = now() - interval '1 hour'")
        .execute(db.pool())
        .await
        .unwrap();
    assert_eq!(
        db.store
            .purge_ledger(Duration::from_secs(1), 100)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        scalar_i64(
            &db,
            "SELECT count(*) FROM outbox.intent_keys WHERE key = 'forgotten'"
        )
        .await,
        0
    );
    let (reborn, duplicate) = enqueue(&db, "forgotten", payload.clone()).await.unwrap();
    assert!(!duplicate);
    assert_ne!(reborn, purged);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_step_waits_for_the_statements_running_when_it_begins() {
    let db = TestDb::unmigrated().await;
    migrate_up_to(&db, 37).await;
    let mut copies = 0;
    while !sqlx::query_scalar::<_, bool>("SELECT outbox.fill_intent_keys(1000)")
        .fetch_one(db.pool())
        .await
        .unwrap()
    {
        copies += 1;
        assert!(copies < 10, "an empty log and ledger take two steps");
    }
    migrate_up_to(&db, 38).await;

    // a statement that began before: it could be a call of the enqueue's
    // earlier text, which names the log's index on the key (this one
    // takes no lock the last migration waits for)
    let mut older = db.pool().acquire().await.unwrap();
    let running = tokio::spawn(async move {
        sqlx::query("SELECT pg_sleep(3)")
            .execute(&mut *older)
            .await
            .unwrap();
    });
    tokio::time::sleep(Duration::from_millis(300)).await;

    let store = db.store.clone();
    let migrating = tokio::spawn(async move { store.migrate().await });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !migrating.is_finished(),
        "migrate waits for the older statement"
    );
    assert!(!db.store.migrations_current().await.unwrap());

    running.await.unwrap();
    let migrated = tokio::time::timeout(Duration::from_secs(10), migrating)
        .await
        .expect("migrate finished once the older statement ended")
        .unwrap()
        .unwrap();
    assert_eq!(migrated.applied.first().map(|a| a.0), Some(39));
    assert!(db.store.migrations_current().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_in_flight_when_the_copy_begins_keeps_its_key() {
    let (db, _) = schema_up_to(36).await;
    let payload = json!({"url": "http://127.0.0.1:9/", "body": {"n": 1}});
    // an application's transaction has enqueued and not committed when the
    // migration takes over the log's inserts
    let mut app = db.pool().acquire().await.unwrap();
    sqlx::query("BEGIN").execute(&mut *app).await.unwrap();
    let (id,): (i64,) = sqlx::query_as("SELECT id FROM outbox.enqueue('in-flight', 'webhook', $1)")
        .bind(&payload)
        .fetch_one(&mut *app)
        .await
        .unwrap();
    let store = db.store.clone();
    let migrating = tokio::spawn(async move { store.migrate().await });
    tokio::time::sleep(Duration::from_millis(1000)).await;
    // enqueues go on while the migration waits for the lock
    let (other, _) = tokio::time::timeout(
        Duration::from_secs(5),
        enqueue(&db, "meanwhile", payload.clone()),
    )
    .await
    .expect("an enqueue does not queue behind the waiting migration")
    .unwrap();
    sqlx::query("COMMIT").execute(&mut *app).await.unwrap();
    drop(app);
    tokio::time::timeout(Duration::from_secs(60), migrating)
        .await
        .expect("migrate finished")
        .unwrap()
        .unwrap();

    for (key, id) in [("in-flight", id), ("meanwhile", other)] {
        let kept: Option<i64> =
            sqlx::query_scalar("SELECT intent_id FROM outbox.intent_keys WHERE key = $1")
                .bind(key)
                .fetch_optional(db.pool())
                .await
                .unwrap();
        assert_eq!(kept, Some(id), "{key}");
        assert_eq!(
            enqueue(&db, key, payload.clone()).await,
            Ok((id, true)),
            "{key}"
        );
        assert_eq!(db.state(key).await, "pending", "{key}");
    }
}

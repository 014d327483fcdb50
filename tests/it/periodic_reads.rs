//! The relay's own periodic reads beside a backlog: when the first pending
//! intent comes due (asked whenever a claim finds nothing) and the summary
//! line's backlog. Each answers as the view `outbox.intents` does and reads
//! a bounded part of the log, however many intents wait in it.

use serde_json::json;

use outbox_relay::store::claims::NEXT_DUE;

use crate::common::TestDb;

/// When the first pending intent of a served kind comes due, from the view.
async fn view_next_due(db: &TestDb, unserved: &[String]) -> Option<f64> {
    sqlx::query_scalar(
        "SELECT extract(epoch FROM (min(run_after) - now()))::float8
           FROM outbox.intents WHERE state = 'pending' AND NOT waiting
            AND kind <> ALL($1::text[])",
    )
    .bind(unserved)
    .fetch_one(db.pool())
    .await
    .unwrap()
}

/// Log tuples fetched by `sql` ($1 bound to no kinds), in a session of its
/// own so that no earlier read is counted.
async fn log_tuples_read(db: &TestDb, sql: &str) -> i64 {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    sqlx::query(sql)
        .bind(Vec::<String>::new())
        .execute(&mut *tx)
        .await
        .unwrap();
    let fetched = crate::common::log_tuples_fetched(&mut tx).await;
    tx.rollback().await.unwrap();
    fetched
}

fn near(a: Option<f64>, b: Option<f64>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => (a - b).abs() < 5.0,
        (None, None) => true,
        _ => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_due_intent_is_read_from_the_first_of_each_table() {
    let db = TestDb::new().await;
    let none: Vec<String> = Vec::new();
    let webhooks = vec!["webhook".to_string()];
    assert_eq!(db.store.next_due_in(&none).await.unwrap(), None);

    // scheduled an hour ahead: its row says when
    sqlx::query(
        "INSERT INTO outbox.intents (key, kind, payload, run_after)
         VALUES ('later', 'webhook', $1, now() + interval '1 hour')",
    )
    .bind(json!({"url": "https://later.invalid/h"}))
    .execute(db.pool())
    .await
    .unwrap();
    let later = db.store.next_due_in(&none).await.unwrap();
    assert!(
        later.is_some_and(|s| (3500.0..=3600.0).contains(&s)),
        "{later:?}"
    );
    assert!(near(later, view_next_due(&db, &none).await));
    // a kind the relay does not serve is left out
    assert_eq!(db.store.next_due_in(&webhooks).await.unwrap(), None);

    // in the log, due at its enqueue
    db.enqueue("now", "webhook", json!({"url": "https://now.invalid/h"}))
        .await;
    let now = db.store.next_due_in(&none).await.unwrap();
    assert!(now.is_some_and(|s| s <= 0.0), "{now:?}");
    assert!(near(now, view_next_due(&db, &none).await));
    assert_eq!(db.store.next_due_in(&webhooks).await.unwrap(), None);

    // once a claim has taken it, the scheduled row is the first again
    let claimed = db.store.claim("t", 10, 60_000, &[]).await.unwrap();
    assert_eq!(claimed.len(), 1, "only the log intent is due");
    let after = db.store.next_due_in(&none).await.unwrap();
    assert!(
        after.is_some_and(|s| (3500.0..=3600.0).contains(&s)),
        "{after:?}"
    );
    assert!(near(after, view_next_due(&db, &none).await));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_periodic_reads_do_not_read_the_backlog() {
    let db = TestDb::new().await;
    sqlx::query(
        "SELECT count(*) FROM outbox.enqueue_many(
             ARRAY(SELECT 'bulk:' || g FROM generate_series(1, 20000) g),
             array_fill('webhook'::text, ARRAY[20000]),
             ARRAY(SELECT jsonb_build_object('url', 'https://r' || (g % 7) || '.invalid/h')
                     FROM generate_series(1, 20000) g))",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let none: Vec<String> = Vec::new();
    assert!(near(
        db.store.next_due_in(&none).await.unwrap(),
        view_next_due(&db, &none).await
    ));

    // the view's answer reads the whole backlog; the relay's, the first
    // intent after the cursor
    let view = log_tuples_read(
        &db,
        "SELECT min(run_after) FROM outbox.intents
          WHERE state = 'pending' AND NOT waiting AND kind <> ALL($1::text[])",
    )
    .await;
    assert!(view >= 20_000, "the view read {view} log tuples");
    let ours = log_tuples_read(&db, NEXT_DUE).await;
    assert!(
        ours <= 10,
        "the next due intent read {ours} log tuples beside 20,000 pending"
    );

    // the summary's backlog: the tallies, as the view counts it
    let pending: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox.intents WHERE state = 'pending'")
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(pending, 20_000);
    assert_eq!(db.store.pending_count().await.unwrap(), pending);
    // and after a claim, without the intents it took
    let claimed = db.store.claim("t", 100, 60_000, &[]).await.unwrap();
    assert_eq!(claimed.len(), 100);
    assert_eq!(db.store.pending_count().await.unwrap(), 19_900);
}

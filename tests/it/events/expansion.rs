//! The expansion: once per (event, subscription) pair, whatever happens to
//! the relay doing it, and only to the subscriptions that exist then.

use std::time::Duration;

use serde_json::json;

use super::*;
use crate::common::{config_file, engine, run_until, spawn_relay, wait_for, Receiver};

async fn expand(db: &TestDb, event: i64) -> (i32, i32) {
    sqlx::query_as("SELECT matched, created FROM outbox.expand_event($1)")
        .bind(event)
        .fetch_one(db.pool())
        .await
        .unwrap()
}

#[tokio::test]
async fn expanding_again_or_at_once_from_two_sessions_makes_one_delivery_per_pair() {
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    for n in 0..3 {
        subscribe(&db, &["--url", &rx.url(&format!("/{n}"))]).await;
    }
    let (event, _) = publish(&db, "e-1", "a.b", json!(1), None).await.unwrap();
    // two transactions expanding the same event at once: the second waits
    // for the first's keys and adds nothing
    let mut first = db.pool().begin().await.unwrap();
    let one: (i32, i32) = sqlx::query_as("SELECT matched, created FROM outbox.expand_event($1)")
        .bind(event)
        .fetch_one(&mut *first)
        .await
        .unwrap();
    assert_eq!(one, (3, 3));
    let pool = db.pool().clone();
    let second = tokio::spawn(async move {
        sqlx::query_as::<_, (i32, i32)>("SELECT matched, created FROM outbox.expand_event($1)")
            .bind(event)
            .fetch_one(&pool)
            .await
            .unwrap()
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !second.is_finished(),
        "the second expansion waits for the first"
    );
    first.commit().await.unwrap();
    assert_eq!(second.await.unwrap(), (3, 0));
    // and again, later
    assert_eq!(expand(&db, event).await, (3, 0));
    assert_eq!(db.count("kind = 'webhook'").await, 3);

    // the relay's own expansion then finds them made: a replay, no effect
    let cfg = events_config();
    run_until(engine(db.store.clone(), &cfg), LIMIT, || async {
        deliveries_in(&db, "delivered").await == 3
    })
    .await;
    let (reference, replayed): (String, Option<bool>) = sqlx::query_as(
        "SELECT i.provider_ref, h.replayed FROM outbox.intents i
           JOIN outbox.attempt_history h ON h.intent_id = i.id WHERE i.id = $1",
    )
    .bind(event)
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(reference, "0 of 3 matching subscriptions");
    assert_eq!(replayed, Some(true));
    assert_eq!(rx.requests().len(), 3);
    assert!(rx.counts_by_id().values().all(|n| *n == 1));
}

#[tokio::test]
async fn the_subscriptions_that_count_are_those_enabled_at_the_expansion() {
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    let (early, _) = subscribe(&db, &["--url", &rx.url("/early")]).await;
    let (off, _) = subscribe(&db, &["--url", &rx.url("/off")]).await;
    let out = relay_cli(
        &db,
        &["subscriptions", "disable", &off, "--reason", "maintenance"],
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (event, _) = publish(&db, "e-2", "a.b", json!({}), None).await.unwrap();
    // made after the publish, before the expansion: it counts
    let (late, _) = subscribe(&db, &["--url", &rx.url("/late")]).await;
    assert_eq!(expand(&db, event).await, (2, 2));
    let targets: Vec<String> = sqlx::query_scalar(
        "SELECT subscription_id FROM outbox.event_deliveries WHERE event_id = $1 ORDER BY 1",
    )
    .bind(event)
    .fetch_all(db.pool())
    .await
    .unwrap();
    let mut want = vec![early.clone(), late.clone()];
    want.sort();
    assert_eq!(targets, want);

    // a delivery whose subscription is removed before its turn is refused
    // with the reason, never sent
    let out = relay_cli(&db, &["subscriptions", "remove", &late]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cfg = events_config();
    run_until(engine(db.store.clone(), &cfg), LIMIT, || async {
        deliveries_in(&db, "delivered").await == 1 && deliveries_in(&db, "rejected").await == 1
    })
    .await;
    let paths: Vec<String> = rx.requests().iter().map(|r| r.path.clone()).collect();
    assert_eq!(paths, ["/early"]);
    let error: String = sqlx::query_scalar(
        "SELECT last_error FROM outbox.intents WHERE state = 'rejected' AND kind = 'webhook'",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert!(
        error.contains(&format!("subscription {late} was removed")),
        "{error}"
    );
}

/// A relay SIGKILLed while its expansion's transaction is open: nothing of
/// it stays, and the next relay's expansion makes each delivery once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_killed_mid_expansion_leaves_one_delivery_per_pair() {
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    for n in 0..5 {
        subscribe(&db, &["--url", &rx.url(&format!("/{n}"))]).await;
    }
    // the expansion's last statement sleeps, so the kill lands inside it;
    // the server notices the lost client within 100ms, not at the sleep's end
    sqlx::raw_sql(&format!(
        "ALTER DATABASE {} SET client_connection_check_interval = '100ms'",
        db.name
    ))
    .execute(db.pool())
    .await
    .unwrap();
    sqlx::raw_sql(
        "CREATE FUNCTION public.slow_link() RETURNS trigger LANGUAGE plpgsql AS
             $$ BEGIN PERFORM pg_sleep(30); RETURN NULL; END $$;
         CREATE TRIGGER slow_link AFTER INSERT ON outbox.event_deliveries
             FOR EACH STATEMENT EXECUTE FUNCTION public.slow_link();",
    )
    .execute(db.pool())
    .await
    .unwrap();
    publish(&db, "e-3", "a.b", json!({"x": 1}), None)
        .await
        .unwrap();
    let file = config_file(&format!(
        "[relay]\nlease = \"60s\"\npoll_interval = \"50ms\"\nsweep_interval = \"200ms\"\n\
         [webhook]\nallowed_networks = [\"127.0.0.0/8\"]\ntimeout = \"2s\"\n\
         [event]\ntimeout = \"40s\"\n[subscriptions]\nsecret_key = \"{KEY}\"\n"
    ));
    let mut relay = spawn_relay(&db, &file, "killed");
    let mid = wait_for(LIMIT, || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_stat_activity
              WHERE query LIKE '%expand_event%' AND wait_event = 'PgSleep'
                AND datname = current_database()",
        )
        .fetch_one(db.pool())
        .await
        .unwrap()
            > 0
    })
    .await;
    assert!(mid, "the relay reached the expansion");
    relay.start_kill().unwrap();
    relay.wait().await.unwrap();
    // its transaction ends with its connection
    assert!(
        wait_for(LIMIT, || async {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%expand_event%'
                   AND state <> 'idle' AND pid <> pg_backend_pid()
                   AND datname = current_database()",
            )
            .fetch_one(db.pool())
            .await
            .unwrap()
                == 0
        })
        .await
    );
    assert_eq!(
        db.count("kind = 'webhook'").await,
        0,
        "nothing of the killed expansion stays"
    );
    sqlx::raw_sql("DROP TRIGGER slow_link ON outbox.event_deliveries")
        .execute(db.pool())
        .await
        .unwrap();

    // the event's claim expires (its lease, shortened here) and another
    // relay expands it
    sqlx::query("UPDATE outbox.log_batches SET lease_expires_at = now() - interval '1 second'")
        .execute(db.pool())
        .await
        .unwrap();
    let cfg = events_config();
    run_until(engine(db.store.clone(), &cfg), LIMIT, || async {
        deliveries_in(&db, "delivered").await == 5
    })
    .await;
    assert_eq!(db.count("kind = 'webhook'").await, 5);
    assert_eq!(rx.requests().len(), 5);
    assert!(rx.counts_by_id().values().all(|n| *n == 1));
    assert_eq!(db.state("e-3").await, "delivered");
}

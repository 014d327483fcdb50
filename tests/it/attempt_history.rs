//! Where attempts are kept: a delivery at the first attempt on its intent
//! row, every other attempt in outbox.attempts, and all of them read
//! through outbox.attempt_history, `show` and the store, whatever happens
//! to the intent afterwards.

use std::time::Duration;

use crate::common::{self, config, engine, Receiver, Reply, TestDb};
use chrono::Utc;
use outbox_relay::store::operator::RetryOptions;
use outbox_relay::store::{AttemptOutcome, Completion, IntentState};
use serde_json::json;

async fn rows_in_attempts(db: &TestDb, id: i64) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM outbox.attempts WHERE intent_id = $1")
        .bind(id)
        .fetch_one(db.pool())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_time_delivery_is_kept_on_its_intent_and_read_as_its_attempt() {
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    let id = db
        .enqueue(
            "first-time",
            "webhook",
            json!({"url": rx.url("/"), "body": {}}),
        )
        .await;
    let relay = engine(db.store.clone(), &config());
    let owner = relay.owner().to_string();
    relay.run_once().await.unwrap();

    let intent = db.store.find("first-time").await.unwrap();
    assert_eq!(intent.state.as_sql(), "delivered");
    assert_eq!(rows_in_attempts(&db, id).await, 0, "no row of its own");
    let attempts = db.store.attempts(id).await.unwrap();
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    let a = &attempts[0];
    assert_eq!(
        (a.attempt, a.fence, a.outcome.as_str(), a.status, a.accepted),
        (1, 1, "delivered", Some(200), true)
    );
    assert_eq!(a.owner, owner);
    assert_eq!(a.provider_ref, intent.provider_ref);
    assert!(!a.replayed && a.error.is_none());
    assert!(a.finished_at.is_some_and(|f| f >= a.started_at));
    assert_eq!(intent.effect_at, a.finished_at, "when the effect happened");
    let history: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox.attempt_history
          WHERE intent_id = $1 AND attempt = 1 AND outcome = 'delivered' AND accepted",
    )
    .bind(id)
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(history, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_after_a_failure_keeps_both_attempts_in_their_own_rows() {
    let db = TestDb::new().await;
    let rx = Receiver::start(|_, nth| {
        if nth == 1 {
            Reply::status(503).header("retry-after", "1")
        } else {
            Reply::status(200)
        }
    })
    .await;
    let id = db
        .enqueue(
            "second-time",
            "webhook",
            json!({"url": rx.url("/"), "body": {}}),
        )
        .await;
    common::run_until_state(
        engine(db.store.clone(), &config()),
        &db.store,
        "second-time",
        "delivered",
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(rows_in_attempts(&db, id).await, 2);
    let outcomes: Vec<(i32, String)> = db
        .store
        .attempts(id)
        .await
        .unwrap()
        .into_iter()
        .map(|a| (a.attempt, a.outcome))
        .collect();
    assert_eq!(
        outcomes,
        [(1, "transient".to_string()), (2, "delivered".to_string())]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_moves_the_first_attempt_into_its_own_row_before_the_intent_changes() {
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    let id = db
        .enqueue("resent", "webhook", json!({"url": rx.url("/"), "body": {}}))
        .await;
    engine(db.store.clone(), &config())
        .run_once()
        .await
        .unwrap();
    let first = db.store.attempts(id).await.unwrap();
    assert_eq!(rows_in_attempts(&db, id).await, 0);

    db.store
        .retry(
            "resent",
            RetryOptions {
                new_effect: false,
                force: true,
            },
        )
        .await
        .unwrap();
    // the retry changed the intent's state: the attempt it described now
    // has its own row, the same as it read before
    assert_eq!(rows_in_attempts(&db, id).await, 1);
    let moved = db.store.attempts(id).await.unwrap();
    assert_eq!(format!("{moved:?}"), format!("{first:?}"));
    let on_row: Option<chrono::DateTime<Utc>> =
        sqlx::query_scalar("SELECT first_attempt_started_at FROM outbox.intents WHERE id = $1")
            .bind(id)
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert!(on_row.is_none());

    engine(db.store.clone(), &config())
        .run_once()
        .await
        .unwrap();
    let all = db.store.attempts(id).await.unwrap();
    assert_eq!(
        all.iter()
            .map(|a| (a.attempt, a.outcome.as_str()))
            .collect::<Vec<_>>(),
        [(1, "delivered"), (2, "delivered")]
    );
    assert!(all[0].fence == 1 && all[1].fence > 1, "{all:?}");
    assert_eq!(rx.requests().len(), 2);
}

/// The completer writes a batch again when it cannot tell whether its
/// commit went through: the second write changes nothing, adds no attempt,
/// and the first is found as already recorded.
#[tokio::test]
async fn a_completion_written_twice_keeps_one_first_attempt() {
    let db = TestDb::new().await;
    let id = db
        .enqueue(
            "twice",
            "webhook",
            json!({"url": "http://127.0.0.1:9/", "body": {}}),
        )
        .await;
    let claimed = db.store.claim("writer", 10, 60_000, &[]).await.unwrap();
    assert_eq!(claimed.len(), 1);
    let c = &claimed[0];
    let completion = Completion {
        id: c.id,
        kind: c.kind.clone(),
        delivered_before: false,
        operator_replay: false,
        fence: c.fence,
        attempt: c.attempt,
        key_generation: c.key_generation,
        started_at: Utc::now(),
        finished_at: Utc::now(),
        outcome: AttemptOutcome::Delivered,
        status: Some(200),
        provider_ref: Some("msg_twice".into()),
        error: None,
        replayed: false,
        uncounted: false,
        state: IntentState::Delivered,
        run_after: None,
        response: None,
        log_batch: c.log_batch,
    };
    let batch = [completion];
    let once = db.store.complete("writer", &batch).await.unwrap();
    assert_eq!(once.accepted.len(), 1);
    let again = db.store.complete("writer", &batch).await.unwrap();
    assert!(again.accepted.is_empty() && again.gone.is_empty());
    assert_eq!(rows_in_attempts(&db, id).await, 0);
    assert_eq!(db.store.attempts(id).await.unwrap().len(), 1);
    let found = db.store.already_completed(&batch).await.unwrap();
    assert_eq!(found.iter().map(|a| a.id).collect::<Vec<_>>(), [id]);
}

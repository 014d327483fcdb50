//! The Rust client (`outbox-client`) against real Postgres and the real
//! engine: an intent committed with its business row is delivered, a
//! rollback leaves neither, duplicates and conflicts are told apart, a
//! batch answers in input order, and a current OpenTelemetry span's trace
//! reaches the receiver.

use opentelemetry::context::FutureExt as _;
use opentelemetry::trace::{Span as _, TraceContextExt as _, Tracer as _, TracerProvider as _};
use outbox_client::{
    enqueue, enqueue_many, Amqp, Charge, Email, EnqueueError, Nats, NewIntent, Webhook,
};
use serde_json::json;

use crate::common::{config, engine, Receiver, TestDb};

async fn orders(db: &TestDb) {
    sqlx::query("CREATE TABLE orders (id bigint PRIMARY KEY)")
        .execute(db.pool())
        .await
        .unwrap();
}

async fn order_count(db: &TestDb, id: i64) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM orders WHERE id = $1")
        .bind(id)
        .fetch_one(db.pool())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_intent_commits_and_rolls_back_with_its_business_row() {
    let db = TestDb::new().await;
    orders(&db).await;
    let rx = Receiver::ok().await;
    for (id, commit) in [(1, true), (2, false)] {
        let mut tx = db.pool().begin().await.unwrap();
        sqlx::query("INSERT INTO orders (id) VALUES ($1)")
            .bind(id)
            .execute(&mut *tx)
            .await
            .unwrap();
        let hook = Webhook::new(rx.url("/orders"), json!({"order": id})).header("X-Tenant", "t1");
        let r = enqueue(
            &mut *tx,
            &NewIntent::of(format!("order:{id}"), hook).source("shop"),
        )
        .await
        .unwrap();
        assert!(!r.duplicate);
        if commit {
            tx.commit().await.unwrap();
        } else {
            tx.rollback().await.unwrap();
        }
    }
    assert_eq!(
        (order_count(&db, 1).await, order_count(&db, 2).await),
        (1, 0)
    );
    assert_eq!(db.count("key = 'order:2'").await, 0, "rolled back together");
    engine(db.store.clone(), &config())
        .run_once()
        .await
        .unwrap();
    assert_eq!(db.state("order:1").await, "delivered");
    let got = rx.requests();
    assert_eq!(got.len(), 1);
    assert!(got[0].webhook_id().starts_with("msg_"));
    assert_eq!(got[0].header("x-tenant").as_deref(), Some("t1"));
    assert_eq!(&got[0].body[..], br#"{"order": 1}"#);
}

#[tokio::test]
async fn a_duplicate_is_told_and_a_conflict_names_its_key() {
    let db = TestDb::new().await;
    orders(&db).await;
    let intent = NewIntent::of("order:7", Nats::new("orders.created", json!({"id": 7})));
    let first = enqueue(db.pool(), &intent).await.unwrap();
    let again = enqueue(db.pool(), &intent).await.unwrap();
    assert_eq!((again.id, again.duplicate), (first.id, true));

    let mut tx = db.pool().begin().await.unwrap();
    sqlx::query("INSERT INTO orders (id) VALUES (7)")
        .execute(&mut *tx)
        .await
        .unwrap();
    let other = NewIntent::of("order:7", Nats::new("orders.created", json!({"id": 8})));
    let err = enqueue(&mut *tx, &other).await.unwrap_err();
    match &err {
        EnqueueError::Conflict { key, message, .. } => {
            assert_eq!(key, "order:7");
            assert!(message.contains("already used"), "{message}");
        }
        e => panic!("not a conflict: {e:?}"),
    }
    assert_eq!(err.sqlstate().as_deref(), Some("OB409"));
    // the conflict aborted the caller's transaction: nothing more runs in it
    // and its business row cannot commit
    let after = sqlx::query("SELECT 1").execute(&mut *tx).await.unwrap_err();
    assert_eq!(
        after.as_database_error().and_then(|e| e.code()).as_deref(),
        Some("25P02"),
        "{after}"
    );
    drop(tx);
    assert_eq!(
        order_count(&db, 7).await,
        0,
        "the business row is not committed"
    );

    let err = enqueue(db.pool(), &NewIntent::of("", Nats::new("a", json!(1))))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, EnqueueError::Invalid { sqlstate, message } if sqlstate == "22023" && message.contains("key must not be empty")),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_batch_answers_in_input_order_and_names_a_conflicts_key() {
    let db = TestDb::new().await;
    let mut conn = db.pool().acquire().await.unwrap();
    let old = enqueue(
        &mut *conn,
        &NewIntent::of("b", Charge::new(100, "usd", "pm_card_visa")),
    )
    .await
    .unwrap();
    let batch = [
        NewIntent::of("a", Email::new(["a@x.example"], "Hi").text("hello")),
        NewIntent::of("b", Charge::new(100, "usd", "pm_card_visa")),
        NewIntent::of(
            "c",
            Amqp::new("orders", "created", json!({"id": 3})).header("v", 2),
        ),
        NewIntent::of("d", Webhook::to_endpoint("partner", json!({"id": 4}))),
    ];
    let answers = enqueue_many(&mut conn, &batch).await.unwrap();
    assert_eq!(
        answers.iter().map(|a| a.duplicate).collect::<Vec<_>>(),
        [false, true, false, false]
    );
    assert_eq!(answers[1].id, old.id);
    let ids: Vec<(i64, String)> =
        sqlx::query_as("SELECT id, key FROM outbox.intents WHERE key IN ('a', 'c', 'd')")
            .fetch_all(&mut *conn)
            .await
            .unwrap();
    for (i, key) in [(0, "a"), (2, "c"), (3, "d")] {
        assert!(ids.contains(&(answers[i].id, key.to_string())), "{ids:?}");
    }
    let destination: Option<String> =
        sqlx::query_scalar("SELECT destination FROM outbox.intents WHERE key = 'd'")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
    assert_eq!(destination.as_deref(), Some("partner"));
    let clash = [
        NewIntent::of("e", Nats::new("x", json!(1))),
        NewIntent::of("c", Amqp::new("orders", "created", json!({"id": 99}))),
    ];
    match enqueue_many(&mut conn, &clash).await {
        Err(EnqueueError::Conflict { key, .. }) => assert_eq!(key, "c"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        db.count("key = 'e'").await,
        0,
        "one statement: nothing of it written"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_current_spans_trace_reaches_the_receiver() {
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
    let span = provider.tracer("checkout").start("POST /orders");
    let trace_id = span.span_context().trace_id().to_string();
    let cx = opentelemetry::Context::current_with_span(span);
    let hook = Webhook::new(rx.url("/traced"), json!(1));
    enqueue(db.pool(), &NewIntent::of("traced", hook))
        .with_context(cx)
        .await
        .unwrap();
    let batch = [NewIntent::of(
        "untraced",
        Webhook::new(rx.url("/untraced"), json!(2)),
    )];
    enqueue_many(&mut db.pool().acquire().await.unwrap(), &batch)
        .await
        .unwrap();
    engine(db.store.clone(), &config())
        .run_once()
        .await
        .unwrap();
    let header = |path: &str| {
        rx.requests()
            .into_iter()
            .find(|r| r.path == path)
            .and_then(|r| r.header("traceparent"))
    };
    let sent = header("/traced").expect("a traceparent");
    assert_eq!(&sent[3..35], trace_id, "{sent}");
    assert_eq!(header("/untraced"), None, "no span was current");
}

/// A connection the server ends while an enqueue runs (`pg_terminate_backend`,
/// SQLSTATE 57P01) is no refusal: it comes back as sqlx's own error
/// (`EnqueueError::Database`), for `enqueue` and `enqueue_many` alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_the_server_ends_is_sqlxs_own_error() {
    let db = TestDb::new().await;
    for many in [false, true] {
        let key = format!("lost:{many}");
        let intent = NewIntent::of(&key, Nats::new("orders.lost", json!(1)));
        // another transaction holds the key uncommitted: the enqueue waits
        let mut holder = db.pool().begin().await.unwrap();
        enqueue(&mut *holder, &intent).await.unwrap();
        let mut tx = db.pool().begin().await.unwrap();
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        let admin = db.pool().clone();
        let terminate = tokio::spawn(async move {
            for _ in 0..1000 {
                let waits: Option<String> = sqlx::query_scalar(
                    "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1",
                )
                .bind(pid)
                .fetch_optional(&admin)
                .await
                .unwrap()
                .flatten();
                if waits.as_deref() == Some("Lock") {
                    return sqlx::query_scalar::<_, bool>("SELECT pg_terminate_backend($1)")
                        .bind(pid)
                        .fetch_one(&admin)
                        .await
                        .unwrap();
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            false
        });
        let err = if many {
            enqueue_many(&mut tx, std::slice::from_ref(&intent))
                .await
                .unwrap_err()
        } else {
            enqueue(&mut *tx, &intent).await.unwrap_err()
        };
        assert!(terminate.await.unwrap(), "backend {pid} never waited");
        match &err {
            EnqueueError::Database(e) => {
                let code = e.as_database_error().and_then(|d| d.code());
                assert!(
                    code.as_deref() == Some("57P01") || matches!(e, sqlx::Error::Io(_)),
                    "{e:?}"
                );
            }
            other => panic!("a lost connection became a refusal: {other:?}"),
        }
        drop(tx);
        holder.rollback().await.unwrap();
    }
}

/// Strict mode, `outbox_client::require_transaction`: an intent that would
/// commit on its own (on the pool, on a connection outside `BEGIN`, after a
/// `BEGIN` that wrote nothing) is refused with OB428 and not written; after
/// the business row in its transaction it is written as by `enqueue`.
#[tokio::test]
async fn strict_mode_refuses_an_intent_that_would_commit_on_its_own() {
    use outbox_client::require_transaction;
    let db = TestDb::new().await;
    orders(&db).await;
    let intent = |key: &str| NewIntent::of(key, Nats::new("orders.strict", json!({"key": key})));
    let ob428 = |err: EnqueueError| {
        assert_eq!(err.sqlstate().as_deref(), Some("OB428"), "{err:?}");
        assert!(matches!(err, EnqueueError::Database(_)), "{err:?}");
    };
    ob428(
        require_transaction::enqueue(db.pool(), &intent("pool"))
            .await
            .unwrap_err(),
    );
    let mut conn = db.pool().acquire().await.unwrap();
    ob428(
        require_transaction::enqueue_many(&mut conn, &[intent("many")])
            .await
            .unwrap_err(),
    );
    let mut tx = db.pool().begin().await.unwrap();
    ob428(
        require_transaction::enqueue(&mut *tx, &intent("first"))
            .await
            .unwrap_err(),
    );
    drop(tx);
    assert_eq!(db.count("key IN ('pool', 'many', 'first')").await, 0);

    let mut tx = db.pool().begin().await.unwrap();
    sqlx::query("INSERT INTO orders (id) VALUES (1)")
        .execute(&mut *tx)
        .await
        .unwrap();
    let one = require_transaction::enqueue(&mut *tx, &intent("one"))
        .await
        .unwrap();
    let many = require_transaction::enqueue_many(&mut tx, &[intent("one"), intent("two")])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(many[0].id, one.id);
    assert!(many[0].duplicate && !many[1].duplicate);
    assert_eq!(db.count("key IN ('one', 'two')").await, 2);
    // the crate's own enqueue is unchanged: on the pool, written
    enqueue(db.pool(), &intent("loose")).await.unwrap();
    assert_eq!(db.count("key = 'loose'").await, 1);
}

//! `publish` and `publish_many` against real Postgres: an event is one
//! intent of kind `event`, `{"type", "tenant", "data"}`, written in the
//! caller's transaction through `outbox.enqueue` (its duplicates and
//! conflicts), and valid by `schema/kinds/event.json`.

use outbox_client::{publish, publish_many, require_transaction, EnqueueError, NewEvent};
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::common::TestDb;

async fn orders(pool: &PgPool) {
    sqlx::query("CREATE TABLE orders (id bigint PRIMARY KEY)")
        .execute(pool)
        .await
        .unwrap();
}

async fn order_count(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The stored intent of `key`: its id, kind and payload.
async fn stored(pool: &PgPool, key: &str) -> Option<(i64, String, Value)> {
    sqlx::query_as("SELECT id, kind, payload FROM outbox.intents WHERE key = $1")
        .bind(key)
        .fetch_optional(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn an_event_commits_and_rolls_back_with_its_business_row() {
    let db = TestDb::new().await;
    let pool = db.pool().clone();
    orders(&pool).await;
    for (id, commit) in [(1_i64, true), (2, false)] {
        let mut tx = pool.begin().await.unwrap();
        sqlx::query("INSERT INTO orders (id) VALUES ($1)")
            .bind(id)
            .execute(&mut *tx)
            .await
            .unwrap();
        let event = NewEvent::new(
            format!("order:{id}:paid"),
            "order.paid",
            json!({"order": id, "amount": 1999}),
        );
        let r = publish(&mut *tx, &event).await.unwrap();
        assert!(!r.duplicate);
        if commit {
            tx.commit().await.unwrap();
            assert_eq!(
                stored(&pool, "order:1:paid").await,
                Some((
                    r.id,
                    "event".to_string(),
                    json!({"type": "order.paid", "tenant": null, "data": {"order": 1, "amount": 1999}})
                ))
            );
        } else {
            tx.rollback().await.unwrap();
        }
    }
    assert_eq!(order_count(&pool).await, 1);
    assert_eq!(
        stored(&pool, "order:2:paid").await,
        None,
        "rolled back together"
    );
}

#[tokio::test]
async fn the_same_event_is_a_duplicate_and_another_under_its_key_a_conflict() {
    let db = TestDb::new().await;
    let pool = db.pool().clone();
    orders(&pool).await;
    let event = NewEvent::new(
        "invoice:7",
        "invoice.created",
        json!({"invoice": 7, "lines": [1, 2]}),
    );
    let first = publish(&pool, &event).await.unwrap();
    let again = publish(&pool, &event).await.unwrap();
    assert_eq!((again.id, again.duplicate), (first.id, true));

    let mut tx = pool.begin().await.unwrap();
    sqlx::query("INSERT INTO orders (id) VALUES (7)")
        .execute(&mut *tx)
        .await
        .unwrap();
    let other = NewEvent::new("invoice:7", "invoice.created", json!({"invoice": 8}));
    let err = publish(&mut *tx, &other).await.unwrap_err();
    match &err {
        EnqueueError::Conflict { key, message, .. } => {
            assert_eq!(key, "invoice:7");
            assert!(message.contains("already used"), "{message}");
        }
        e => panic!("not a conflict: {e:?}"),
    }
    assert_eq!(err.sqlstate().as_deref(), Some("OB409"));
    drop(tx);
    assert_eq!(
        order_count(&pool).await,
        0,
        "the business row is not committed"
    );

    // another type, or another tenant, is another event too
    for other in [
        NewEvent::new("invoice:7", "invoice.paid", event.data.clone()),
        NewEvent::new("invoice:7", "invoice.created", event.data.clone()).tenant("acme"),
    ] {
        let err = publish(&pool, &other).await.unwrap_err();
        assert!(matches!(err, EnqueueError::Conflict { .. }), "{err:?}");
    }
}

#[tokio::test]
async fn a_bad_event_type_or_tenant_is_refused_and_nothing_is_written() {
    let db = TestDb::new().await;
    let pool = db.pool().clone();
    orders(&pool).await;
    let long = "x".repeat(201);
    for event_type in ["order paid", "order..paid", ".order", "", long.as_str()] {
        let mut tx = pool.begin().await.unwrap();
        sqlx::query("INSERT INTO orders (id) VALUES (1)")
            .execute(&mut *tx)
            .await
            .unwrap();
        let err = publish(&mut *tx, &NewEvent::new("bad", event_type, json!(1)))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, EnqueueError::Invalid { sqlstate, message }
                if sqlstate == "22023" && message.contains("is not a dotted name")),
            "{event_type:?}: {err:?}"
        );
    }
    for tenant in ["", &"t".repeat(201)] {
        let err = publish(
            &pool,
            &NewEvent::new("bad", "order.paid", json!(1)).tenant(tenant),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(&err, EnqueueError::Invalid { sqlstate, message }
                if sqlstate == "22023" && message.contains("tenant must be 1 to 200 characters")),
            "{err:?}"
        );
    }
    let err = publish_many(
        &pool,
        &[
            NewEvent::new("fine", "order.paid", json!(1)),
            NewEvent::new("bad", "order paid", json!(2)),
        ],
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&err, EnqueueError::Invalid { message, .. } if message.contains("event 2 (key 'bad')")),
        "{err:?}"
    );
    let written: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox.intents")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!((written, order_count(&pool).await), (0, 0));
}

#[tokio::test]
async fn publish_many_answers_in_input_order_new_and_duplicate_mixed() {
    let db = TestDb::new().await;
    let pool = db.pool().clone();
    let earlier = publish(
        &pool,
        &NewEvent::new("b", "order.shipped", json!({"n": 2})).tenant("acme"),
    )
    .await
    .unwrap();
    let mut tx = pool.begin().await.unwrap();
    let answers = publish_many(
        &mut *tx,
        &[
            NewEvent::new("a", "order.created", json!({"n": 1})),
            NewEvent::new("b", "order.shipped", json!({"n": 2})).tenant("acme"),
            NewEvent::new("c", "order.paid", json!(null)).tenant("acme"),
            NewEvent::new("a", "order.created", json!({"n": 1})),
        ],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        answers.iter().map(|a| a.duplicate).collect::<Vec<_>>(),
        [false, true, false, true]
    );
    assert_eq!(answers[1].id, earlier.id);
    assert_eq!(answers[3].id, answers[0].id);
    assert!(answers[0].id < answers[2].id, "new ids in input order");
    let expected = [
        (
            "a",
            0,
            json!({"type": "order.created", "tenant": null, "data": {"n": 1}}),
        ),
        (
            "b",
            1,
            json!({"type": "order.shipped", "tenant": "acme", "data": {"n": 2}}),
        ),
        (
            "c",
            2,
            json!({"type": "order.paid", "tenant": "acme", "data": null}),
        ),
    ];
    for (key, i, payload) in expected {
        assert_eq!(
            stored(&pool, key).await,
            Some((answers[i].id, "event".to_string(), payload)),
            "{key}"
        );
    }
    assert!(publish_many(&pool, &[]).await.unwrap().is_empty());

    let clash = [
        NewEvent::new("d", "order.paid", json!(1)),
        NewEvent::new("b", "order.shipped", json!({"n": 3})).tenant("acme"),
    ];
    match publish_many(&pool, &clash).await {
        Err(EnqueueError::Conflict { key, .. }) => assert_eq!(key, "b"),
        other => panic!("{other:?}"),
    }
    assert_eq!(stored(&pool, "d").await, None, "one statement: none of it");
}

#[tokio::test]
async fn a_tenant_or_none_is_the_events_own() {
    let db = TestDb::new().await;
    let pool = db.pool().clone();
    let none = publish(
        &pool,
        &NewEvent::new("none", "user.created", json!({"user": 1})),
    )
    .await
    .unwrap();
    let acme = publish(
        &pool,
        &NewEvent::new("acme", "user.created", json!({"user": 1})).tenant("acme"),
    )
    .await
    .unwrap();
    assert_ne!(none.id, acme.id);
    for (key, tenant) in [("none", Value::Null), ("acme", json!("acme"))] {
        let (_, _, payload) = stored(&pool, key).await.unwrap();
        assert_eq!(
            payload,
            json!({"type": "user.created", "tenant": tenant, "data": {"user": 1}})
        );
    }
}

#[tokio::test]
async fn strict_mode_refuses_an_event_that_would_commit_on_its_own() {
    let db = TestDb::new().await;
    let pool = db.pool().clone();
    orders(&pool).await;
    let event = |key: &str| NewEvent::new(key, "order.paid", json!({"key": key}));
    let ob428 = |err: EnqueueError, function: &str| {
        assert_eq!(err.sqlstate().as_deref(), Some("OB428"), "{err:?}");
        assert!(
            err.to_string()
                .contains(&format!("{function}: nothing has been written")),
            "{err}"
        );
    };
    ob428(
        require_transaction::publish(&pool, &event("one"))
            .await
            .unwrap_err(),
        "outbox.publish",
    );
    ob428(
        require_transaction::publish_many(&pool, &[event("many")])
            .await
            .unwrap_err(),
        "outbox.publish_many",
    );
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("INSERT INTO orders (id) VALUES (1)")
        .execute(&mut *tx)
        .await
        .unwrap();
    require_transaction::publish(&mut *tx, &event("after"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(stored(&pool, "one").await, None);
    assert_eq!(stored(&pool, "many").await, None);
    assert!(stored(&pool, "after").await.is_some());
}

#[tokio::test]
async fn an_explicit_traceparent_is_stored() {
    let db = TestDb::new().await;
    let pool = db.pool().clone();
    let explicit = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    publish(
        &pool,
        &NewEvent::new("one", "order.paid", json!(1)).traceparent(explicit),
    )
    .await
    .unwrap();
    publish_many(
        &pool,
        &[
            NewEvent::new("many", "order.paid", json!(2)).traceparent(explicit),
            NewEvent::new("none", "order.paid", json!(3)),
        ],
    )
    .await
    .unwrap();
    for (key, expected) in [
        ("one", Some(explicit)),
        ("many", Some(explicit)),
        ("none", None),
    ] {
        let traceparent: Option<String> =
            sqlx::query_scalar("SELECT traceparent FROM outbox.intents WHERE key = $1")
                .bind(key)
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(traceparent.as_deref(), expected, "{key}");
    }
}

/// With the feature `opentelemetry`: an event published while a span is
/// current, without a traceparent of its own, takes the span's.
#[tokio::test]
async fn a_current_spans_traceparent_goes_with_the_event() {
    let db = TestDb::new().await;
    let pool = db.pool().clone();
    use opentelemetry::context::FutureExt as _;
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState,
    };
    let sc = SpanContext::new(
        TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap(),
        SpanId::from_hex("00f067aa0ba902b7").unwrap(),
        TraceFlags::SAMPLED,
        true,
        TraceState::default(),
    );
    let cx = opentelemetry::Context::new().with_remote_span_context(sc);
    let explicit = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    async {
        publish(&pool, &NewEvent::new("span", "order.paid", json!(1)))
            .await
            .unwrap();
        publish_many(
            &pool,
            &[
                NewEvent::new("many-span", "order.paid", json!(2)),
                NewEvent::new("many-explicit", "order.paid", json!(3)).traceparent(explicit),
            ],
        )
        .await
        .unwrap();
    }
    .with_context(cx)
    .await;
    let from_span = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    for (key, expected) in [
        ("span", from_span),
        ("many-span", from_span),
        ("many-explicit", explicit),
    ] {
        let traceparent: Option<String> =
            sqlx::query_scalar("SELECT traceparent FROM outbox.intents WHERE key = $1")
                .bind(key)
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(traceparent.as_deref(), Some(expected), "{key}");
    }
}

/// The JSON Schema of the `event` kind.
fn event_schema() -> jsonschema::Validator {
    let path = format!("{}/schema/kinds/event.json", env!("CARGO_MANIFEST_DIR"));
    let schema: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    jsonschema::validator_for(&schema).unwrap()
}

#[tokio::test]
async fn the_events_publish_writes_are_valid_by_the_event_schema() {
    let db = TestDb::new().await;
    let pool = db.pool().clone();
    let validator = event_schema();
    let data = [
        json!({"order": 42, "amount": 1999}),
        json!(null),
        json!([1, "two"]),
        json!("text"),
    ];
    let mut tx = pool.begin().await.unwrap();
    publish(
        &mut *tx,
        &NewEvent::new("e0", "order.paid", data[0].clone()).tenant("acme"),
    )
    .await
    .unwrap();
    publish(
        &mut *tx,
        &NewEvent::new("e1", "invoice.created", data[1].clone()),
    )
    .await
    .unwrap();
    publish_many(
        &mut *tx,
        &[
            NewEvent::new("e2", "a_b-c.D9", data[2].clone()).tenant("t".repeat(200)),
            NewEvent::new("e3", "x", data[3].clone()),
        ],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    for (i, expected) in data.iter().enumerate() {
        let (kind, payload): (String, Value) =
            sqlx::query_as("SELECT kind, payload FROM outbox.intents WHERE key = $1")
                .bind(format!("e{i}"))
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(kind, "event");
        assert_eq!(&payload["data"], expected);
        let errors: Vec<String> = validator
            .iter_errors(&payload)
            .map(|e| e.to_string())
            .collect();
        assert!(errors.is_empty(), "event {payload}: {errors:?}");
    }
}

//! The `amqp` kind against a real RabbitMQ: confirms, the message's
//! properties, unroutable and missing exchanges, bad payloads, a confirm
//! lost after the publish (redelivered under the same `message_id`, or
//! parked), and a broker that restarts.

use std::time::Duration;

use outbox_providers::amqp::request::message_id;
use outbox_providers::AmbiguityPolicy;
use serde_json::json;

use crate::common::amqp::{
    declare_durable, drain, message_ids, take_one, HoldingProxy, Rabbit, RabbitNode,
};
use crate::common::{config, engine, run_until, run_until_state, TestDb};
use outbox_providers::Secret;
use outbox_relay::config::{Config, Dur};
use outbox_relay::store::operator::RetryOptions;

fn amqp_config(rabbit: &Rabbit) -> Config {
    let mut c = config();
    c.amqp.url = Some(rabbit.url());
    c.amqp.password = Some(Secret::new(rabbit.password.clone()));
    c.amqp.timeout = Dur(Duration::from_secs(2));
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_is_published_with_confirms_and_a_stable_message_id() {
    let db = TestDb::new().await;
    let rabbit = Rabbit::shared();
    let (_conn, ch, exchange, queue) = rabbit.topology("created").await;
    sqlx::query("SELECT outbox.enqueue('order:1:created', 'amqp', $1::text::jsonb)")
        .bind(format!(
            r#"{{"exchange": "{exchange}", "routing_key": "created",
                 "body": {{"id": 123456789012345678901234567890, "total": 1999}},
                 "headers": {{"trace-id": "t-1", "version": 2, "test": true}}}}"#
        ))
        .execute(db.pool())
        .await
        .unwrap();
    let cfg = amqp_config(&rabbit);
    engine(db.store.clone(), &cfg).run_once().await.unwrap();
    let i = db.store.find("order:1:created").await.unwrap();
    assert_eq!(i.state, "delivered", "{i:?}");
    let id = message_id("order:1:created", 0);
    assert_eq!(
        i.provider_ref.as_deref(),
        Some(format!("exchange {exchange:?} routing key \"created\" message_id {id}").as_str())
    );
    let stored: String = sqlx::query_scalar(
        "SELECT (payload->'body')::text FROM outbox.intents WHERE key = 'order:1:created'",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    let msgs = drain(&ch, &queue).await;
    assert_eq!(msgs.len(), 1);
    let m = &msgs[0].delivery;
    assert_eq!(
        String::from_utf8_lossy(&m.data),
        stored,
        "the stored text, digits and all"
    );
    let p = &m.properties;
    assert_eq!(
        p.message_id().as_ref().map(|s| s.to_string()),
        Some(id.clone())
    );
    assert_eq!(
        p.content_type().as_ref().map(|s| s.to_string()).as_deref(),
        Some("application/json")
    );
    assert_eq!(*p.delivery_mode(), Some(2), "persistent");
    assert_eq!(
        p.app_id().as_ref().map(|s| s.to_string()).as_deref(),
        Some("outbox-relay")
    );
    assert!(p.timestamp().is_some_and(|t| t > 1_700_000_000));
    let headers = p.headers().as_ref().expect("headers");
    let h = |name: &str| headers.inner().get(name).cloned();
    assert_eq!(
        h("trace-id"),
        Some(lapin::types::AMQPValue::LongString("t-1".into()))
    );
    assert_eq!(h("version"), Some(lapin::types::AMQPValue::LongLongInt(2)));
    assert_eq!(h("test"), Some(lapin::types::AMQPValue::Boolean(true)));

    // an operator retry publishes again under the same message_id (RabbitMQ
    // keeps both: consumers dedupe on it); a new effect is a new id
    for new_effect in [false, true] {
        db.store
            .retry(
                "order:1:created",
                RetryOptions {
                    new_effect,
                    force: true,
                },
            )
            .await
            .unwrap();
        engine(db.store.clone(), &cfg).run_once().await.unwrap();
    }
    assert_eq!(
        message_ids(&drain(&ch, &queue).await),
        [id, message_id("order:1:created", 1)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unroutable_is_rejected_a_missing_exchange_retried_and_neither_touches_the_others() {
    let db = TestDb::new().await;
    let rabbit = Rabbit::shared();
    let (_conn, ch, exchange, queue) = rabbit.topology("created").await;
    let missing = format!("{exchange}-missing");
    db.enqueue(
        "unroutable",
        "amqp",
        json!({"exchange": exchange, "routing_key": "nobody.listens", "body": 1}),
    )
    .await;
    db.enqueue(
        "nowhere",
        "amqp",
        json!({"exchange": missing, "routing_key": "created", "body": 1}),
    )
    .await;
    for n in 0..10 {
        db.enqueue(
            &format!("good:{n}"),
            "amqp",
            json!({"exchange": exchange, "routing_key": "created", "body": n}),
        )
        .await;
    }
    let mut cfg = amqp_config(&rabbit);
    cfg.retry.max_attempts = 2;
    // retried at once, so that one run --once sees both attempts
    cfg.retry.schedule = vec![Dur(Duration::ZERO)];
    engine(db.store.clone(), &cfg).run_once().await.unwrap();

    let i = db.store.find("unroutable").await.unwrap();
    assert_eq!((i.state.as_str(), i.attempts), ("rejected", 1), "{i:?}");
    let reason = i.last_error.unwrap();
    assert!(
        reason.contains("312 NO_ROUTE") && reason.contains("nobody.listens"),
        "{reason}"
    );

    let i = db.store.find("nowhere").await.unwrap();
    assert_eq!((i.state.as_str(), i.attempts), ("dead", 2), "{i:?}");
    let reason = i.last_error.unwrap();
    assert!(
        reason.contains("404") && reason.contains(&missing),
        "{reason}"
    );

    // each publish has its channel: the 404 that closed one touched no other
    assert_eq!(
        db.count("key LIKE 'good:%' AND state = 'delivered'").await,
        10
    );
    assert_eq!(drain(&ch, &queue).await.len(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_payloads_are_rejected_and_nothing_is_published() {
    let db = TestDb::new().await;
    let rabbit = Rabbit::shared();
    let (_conn, ch, exchange, queue) = rabbit.topology("created").await;
    let cases = [
        (
            "spaced",
            json!({"exchange": "a b", "routing_key": "created", "body": 1}),
            "exchange name is",
        ),
        (
            "no-key",
            json!({"exchange": exchange, "body": 1}),
            "no \"routing_key\"",
        ),
        (
            "header",
            json!({"exchange": exchange, "routing_key": "created", "body": 1, "headers": {"x": [1]}}),
            "whole number",
        ),
        (
            "field",
            json!({"exchange": exchange, "routing_key": "created", "body": 1, "subject": "x"}),
            "unknown field",
        ),
        (
            "long",
            json!({"exchange": exchange, "routing_key": "k".repeat(300), "body": 1}),
            "limit is 255",
        ),
    ];
    for (key, payload, _) in &cases {
        db.enqueue(key, "amqp", payload.clone()).await;
    }
    sqlx::query("SELECT outbox.enqueue('named', 'amqp', '{\"exchange\": \"\", \"routing_key\": \"q\", \"body\": 1}', 'partner')")
        .execute(db.pool())
        .await
        .unwrap();
    engine(db.store.clone(), &amqp_config(&rabbit))
        .run_once()
        .await
        .unwrap();
    for (key, _, says) in cases
        .iter()
        .chain([&("named", json!(null), "take no destination")])
    {
        let i = db.store.find(key).await.unwrap();
        assert_eq!(i.state, "rejected", "{key}");
        assert!(
            i.last_error.as_deref().unwrap_or_default().contains(says),
            "{key}: {i:?}"
        );
    }
    assert!(drain(&ch, &queue).await.is_empty());
}

/// The publish reaches the broker, its confirm never comes back.
async fn confirm_lost(policy: AmbiguityPolicy) -> (TestDb, Vec<String>) {
    let db = TestDb::new().await;
    let rabbit = Rabbit::shared();
    let (_conn, ch, exchange, queue) = rabbit.topology("created").await;
    let proxy = HoldingProxy::start(&rabbit).await;
    db.enqueue(
        "held",
        "amqp",
        json!({"exchange": exchange, "routing_key": "created", "body": {"n": 1}}),
    )
    .await;
    let mut cfg = amqp_config(&rabbit.via(proxy.port));
    cfg.amqp.timeout = Dur(Duration::from_secs(1));
    cfg.amqp.on_ambiguous = policy;
    cfg.retry.schedule = vec![Dur(Duration::from_secs(1))];
    proxy.arm();
    engine(db.store.clone(), &cfg).run_once().await.unwrap();
    assert!(proxy.holding(), "the publish went through the proxy");
    proxy.release();
    let a = db
        .store
        .attempts(db.store.find("held").await.unwrap().id)
        .await
        .unwrap();
    assert_eq!(a.len(), 1);
    assert_eq!(a[0].outcome, "ambiguous", "{a:?}");
    let error = a[0].error.clone().unwrap_or_default();
    assert!(error.contains("no publisher confirm"), "{error}");
    if policy == AmbiguityPolicy::Redeliver {
        run_until_state(
            engine(db.store.clone(), &cfg),
            &db.store,
            "held",
            "delivered",
            Duration::from_secs(20),
        )
        .await;
    }
    let ids = message_ids(&drain(&ch, &queue).await);
    (db, ids)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_confirm_is_redelivered_under_the_same_message_id() {
    let (db, ids) = confirm_lost(AmbiguityPolicy::Redeliver).await;
    let i = db.store.find("held").await.unwrap();
    assert_eq!((i.state.as_str(), i.attempts), ("delivered", 2), "{i:?}");
    // the broker took it both times; the consumer sees one id twice
    assert_eq!(ids, [message_id("held", 0), message_id("held", 0)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_confirm_is_parked_when_configured_and_not_republished() {
    let (db, ids) = confirm_lost(AmbiguityPolicy::Park).await;
    let i = db.store.find("held").await.unwrap();
    assert_eq!(i.state, "ambiguous", "{i:?}");
    assert_eq!(ids, [message_id("held", 0)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_that_goes_away_is_transient_and_the_relay_reconnects_when_it_is_back() {
    // the relay's log, shown when this test fails: a rare failure here is
    // otherwise hard to explain
    let _ = tracing_subscriber::fmt()
        .with_env_filter("info,outbox_providers=debug")
        .with_test_writer()
        .try_init();
    let db = TestDb::new().await;
    let node = RabbitNode::start().await;
    let rabbit = node.rabbit();
    let cfg = {
        let mut c = amqp_config(&rabbit);
        c.retry.schedule = vec![Dur(Duration::from_millis(300))];
        c.retry.max_attempts = 1000;
        // the broker's absence opens the amqp breaker: probe every second
        c.breaker.cooldown = Dur(Duration::from_secs(1));
        c.breaker.max_cooldown = Dur(Duration::from_secs(2));
        c
    };
    // a durable topology, so that it outlives the restart
    {
        let conn = rabbit.connect().await;
        let ch = conn.create_channel().await.unwrap();
        declare_durable(&ch, "events", "events-q").await;
        let _ = conn.close(200, "done".into()).await;
    }
    db.enqueue(
        "before",
        "amqp",
        json!({"exchange": "events", "routing_key": "e", "body": 1}),
    )
    .await;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let relay = tokio::spawn(engine(db.store.clone(), &cfg).run(async {
        let _ = rx.await;
    }));
    assert!(
        crate::common::wait_for(Duration::from_secs(20), || async {
            db.state("before").await == "delivered"
        })
        .await
    );
    node.kill().await;
    db.enqueue(
        "during",
        "amqp",
        json!({"exchange": "events", "routing_key": "e", "body": 2}),
    )
    .await;
    assert!(
        crate::common::wait_for(Duration::from_secs(20), || async {
            db.count("key = 'during' AND attempts >= 2").await == 1
        })
        .await,
        "the publish is retried while the broker is down"
    );
    let state = db.state("during").await;
    assert!(matches!(state.as_str(), "pending" | "claimed"), "{state}");
    node.up().await;
    let back = crate::common::wait_for(Duration::from_secs(40), || async {
        db.state("during").await == "delivered"
    })
    .await;
    if !back {
        let id = db.store.find("during").await.unwrap().id;
        let attempts = db.store.attempts(id).await.unwrap();
        let last: Vec<_> = attempts
            .iter()
            .rev()
            .take(5)
            .map(|a| (&a.outcome, &a.error, a.finished_at))
            .collect();
        panic!("delivered once the broker is back; the last attempts, newest first: {last:?}");
    }
    let _ = tx.send(());
    relay.await.unwrap().unwrap();
    let conn = rabbit.connect().await;
    let ch = conn.create_channel().await.unwrap();
    let ids = message_ids(&drain(&ch, "events-q").await);
    assert_eq!(ids, [message_id("before", 0), message_id("during", 0)]);
    let a = db
        .store
        .attempts(db.store.find("during").await.unwrap().id)
        .await
        .unwrap();
    let reasons: Vec<_> = a.iter().filter_map(|a| a.error.clone()).collect();
    assert!(
        reasons
            .iter()
            .all(|r| r.contains("AMQP") && !r.contains("guest:")),
        "transient reasons name the broker, never the password: {reasons:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_key_ordering_holds_for_amqp_publishes() {
    let db = TestDb::new().await;
    let rabbit = Rabbit::shared();
    let (_conn, ch, exchange, queue) = rabbit.topology("e").await;
    // two keys interleaved; with 16 in flight only ordering keeps each in turn
    for n in 0..30 {
        let key = ["order:a", "order:b"][n % 2];
        sqlx::query("SELECT outbox.enqueue($1, 'amqp', $2, NULL, now(), $3)")
            .bind(format!("ev:{n}"))
            .bind(json!({"exchange": exchange, "routing_key": "e", "body": {"key": key, "n": n}}))
            .bind(key)
            .execute(db.pool())
            .await
            .unwrap();
    }
    let cfg = amqp_config(&rabbit);
    run_until(
        engine(db.store.clone(), &cfg),
        Duration::from_secs(30),
        || async { db.count("state = 'delivered'").await == 30 },
    )
    .await;
    let mut seen: std::collections::HashMap<String, Vec<u64>> = Default::default();
    for m in drain(&ch, &queue).await {
        let body: serde_json::Value = serde_json::from_slice(&m.delivery.data).unwrap();
        seen.entry(body["key"].as_str().unwrap().to_string())
            .or_default()
            .push(body["n"].as_u64().unwrap());
    }
    assert_eq!(seen["order:a"], (0..30).step_by(2).collect::<Vec<u64>>());
    assert_eq!(seen["order:b"], (1..30).step_by(2).collect::<Vec<u64>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_lost_between_publish_and_confirm_is_ambiguous_and_redelivered() {
    let db = TestDb::new().await;
    let rabbit = Rabbit::shared();
    let (_conn, ch, exchange, queue) = rabbit.topology("created").await;
    let proxy = HoldingProxy::start(&rabbit).await;
    db.enqueue(
        "cut",
        "amqp",
        json!({"exchange": exchange, "routing_key": "created", "body": 1}),
    )
    .await;
    let mut cfg = amqp_config(&rabbit.via(proxy.port));
    cfg.retry.schedule = vec![Dur(Duration::from_millis(200))];
    proxy.arm_cut();
    engine(db.store.clone(), &cfg).run_once().await.unwrap();
    assert!(proxy.holding(), "the publish went through the proxy");
    proxy.release();
    let id = db.store.find("cut").await.unwrap().id;
    let a = db.store.attempts(id).await.unwrap();
    assert_eq!(a[0].outcome, "ambiguous", "{a:?}");
    let error = a[0].error.clone().unwrap_or_default();
    assert!(
        error.contains("lost after the publish") && error.contains("before its confirm"),
        "{error}"
    );
    run_until_state(
        engine(db.store.clone(), &cfg),
        &db.store,
        "cut",
        "delivered",
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(
        message_ids(&drain(&ch, &queue).await),
        [message_id("cut", 0), message_id("cut", 0)],
        "the broker took both; the consumer dedupes on the one id"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nack_is_transient_and_retried_under_the_same_message_id() {
    use lapin::types::{AMQPValue, FieldTable};
    let db = TestDb::new().await;
    let rabbit = Rabbit::shared();
    // a full queue that refuses more: the broker nacks the publish
    let mut args = FieldTable::default();
    args.insert("x-max-length".into(), AMQPValue::LongInt(1));
    args.insert(
        "x-overflow".into(),
        AMQPValue::LongString("reject-publish".into()),
    );
    let (_conn, ch, exchange, queue) = rabbit.topology_with("e", args).await;
    for key in ["first", "second"] {
        sqlx::query("SELECT outbox.enqueue($1, 'amqp', $2, NULL, now(), 'one-at-a-time')")
            .bind(key)
            .bind(json!({"exchange": exchange, "routing_key": "e", "body": key}))
            .execute(db.pool())
            .await
            .unwrap();
    }
    let mut cfg = amqp_config(&rabbit);
    cfg.retry.schedule = vec![Dur(Duration::from_millis(100))];
    cfg.retry.max_attempts = 1000;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let relay = tokio::spawn(engine(db.store.clone(), &cfg).run(async {
        let _ = rx.await;
    }));
    assert!(
        crate::common::wait_for(Duration::from_secs(20), || async {
            db.count("key = 'second' AND attempts >= 2").await == 1
        })
        .await,
        "the second publish is nacked and retried"
    );
    let i = db.store.find("second").await.unwrap();
    assert!(matches!(i.state.as_str(), "pending" | "claimed"), "{i:?}");
    assert!(
        i.last_error
            .as_deref()
            .unwrap_or_default()
            .contains("nacked"),
        "{i:?}"
    );
    // room again: the first message taken off (one get: a retry may land
    // as soon as there is room), and the retry goes through, under the
    // same id
    let first = take_one(&ch, &queue)
        .await
        .expect("the first message waits in the queue");
    assert_eq!(
        message_ids(std::slice::from_ref(&first)),
        [message_id("first", 0)]
    );
    assert!(
        crate::common::wait_for(Duration::from_secs(20), || async {
            db.state("second").await == "delivered"
        })
        .await
    );
    let _ = tx.send(());
    relay.await.unwrap().unwrap();
    assert_eq!(
        message_ids(&drain(&ch, &queue).await),
        [message_id("second", 0)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_exchange_or_a_full_queue_does_not_hold_back_the_other_publishes() {
    use lapin::types::{AMQPValue, FieldTable};
    let db = TestDb::new().await;
    let rabbit = Rabbit::shared();
    let (_conn, ch, exchange, queue) = rabbit.topology("created").await;
    // a queue full to its limit of one that refuses more (the broker nacks)
    let mut args = FieldTable::default();
    args.insert("x-max-length".into(), AMQPValue::LongInt(1));
    args.insert(
        "x-overflow".into(),
        AMQPValue::LongString("reject-publish".into()),
    );
    let (_full_conn, _full_ch, full, _) = rabbit.topology_with("e", args).await;
    let missing = format!("{exchange}-missing");
    for n in 0..6 {
        db.enqueue(
            &format!("nowhere:{n}"),
            "amqp",
            json!({"exchange": missing, "routing_key": "created", "body": n}),
        )
        .await;
        db.enqueue(
            &format!("full:{n}"),
            "amqp",
            json!({"exchange": full, "routing_key": "e", "body": n}),
        )
        .await;
    }
    let mut cfg = amqp_config(&rabbit);
    // a breaker that opens at the third failure and would hold the broker
    // for a minute
    cfg.breaker.failures = 3;
    cfg.breaker.cooldown = Dur(Duration::from_secs(60));
    cfg.retry.schedule = vec![Dur(Duration::from_millis(200))];
    cfg.retry.max_attempts = 1000;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let relay = tokio::spawn(engine(db.store.clone(), &cfg).run(async {
        let _ = rx.await;
    }));
    let refused = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM outbox.attempt_history a JOIN outbox.intents i ON i.id = a.intent_id
              WHERE a.outcome = 'transient' AND (i.key LIKE 'nowhere:%' OR i.key LIKE 'full:%')",
        )
        .fetch_one(db.pool())
        .await
        .unwrap()
    };
    assert!(
        crate::common::wait_for(Duration::from_secs(20), || async { refused().await >= 8 }).await,
        "the missing exchange and the full queue refused publishes: {}",
        refused().await
    );
    // the refusals' health records are written beside their completions
    tokio::time::sleep(Duration::from_millis(300)).await;
    for n in 0..10 {
        db.enqueue(
            &format!("good:{n}"),
            "amqp",
            json!({"exchange": exchange, "routing_key": "created", "body": n}),
        )
        .await;
    }
    let delivered = crate::common::wait_for(Duration::from_secs(10), || async {
        db.count("key LIKE 'good:%' AND state = 'delivered'").await == 10
    })
    .await;
    let amqp: Option<(String, i32)> =
        sqlx::query_as("SELECT state, failures FROM outbox.destinations WHERE name = 'amqp'")
            .fetch_optional(db.pool())
            .await
            .unwrap();
    let _ = tx.send(());
    relay.await.unwrap().unwrap();
    assert!(
        delivered,
        "publishes to a healthy exchange went on: {} of 10 delivered; the amqp destination: {amqp:?}",
        db.count("key LIKE 'good:%' AND state = 'delivered'").await
    );
    assert!(
        amqp.as_ref().is_none_or(|(state, _)| state == "closed"),
        "answers about one exchange or queue do not open the broker's breaker: {amqp:?}"
    );
    assert_eq!(drain(&ch, &queue).await.len(), 10);
    assert_eq!(
        db.count("key LIKE 'nowhere:%' AND state = 'pending' AND last_error LIKE '%404%'")
            .await,
        6,
        "the missing exchange's intents wait on their own schedule"
    );
}

/// Without an export the intent's own trace context rides along as
/// message headers, so consumers join the application's trace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_carries_the_applications_trace_context() {
    let db = TestDb::new().await;
    let rabbit = Rabbit::shared();
    let (_conn, ch, exchange, queue) = rabbit.topology("traced").await;
    let (traceparent, _, _) = crate::traces::app_span();
    sqlx::query("SELECT outbox.enqueue('traced:1', 'amqp', $1, p_traceparent => $2, p_tracestate => 'vendor=abc')")
        .bind(json!({"exchange": exchange, "routing_key": "traced", "body": 1}))
        .bind(&traceparent)
        .execute(db.pool())
        .await
        .unwrap();
    engine(db.store.clone(), &amqp_config(&rabbit))
        .run_once()
        .await
        .unwrap();
    assert_eq!(db.state("traced:1").await, "delivered");
    let msgs = drain(&ch, &queue).await;
    assert_eq!(msgs.len(), 1);
    let headers = msgs[0]
        .delivery
        .properties
        .headers()
        .clone()
        .unwrap_or_default();
    let text = |name: &str| match headers.inner().get(name) {
        Some(lapin::types::AMQPValue::LongString(s)) => Some(s.to_string()),
        _ => None,
    };
    assert_eq!(text("traceparent"), Some(traceparent));
    assert_eq!(text("tracestate").as_deref(), Some("vendor=abc"));
}

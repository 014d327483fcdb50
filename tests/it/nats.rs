//! The `nats` kind against a real `nats-server -js`: PubAck, JetStream's
//! dedupe on the derived `Nats-Msg-Id`, no stream, bad subjects, and
//! reconcile inside and past the duplicate window.

use std::time::Duration;

use async_nats::jetstream::stream::Config as StreamConfig;
use outbox_providers::nats::request::message_id;
use serde_json::json;

use crate::common::nats::NatsServer;
use crate::common::{config, engine, TestDb};
use outbox_relay::config::{Config, Dur};
use outbox_relay::store::operator::RetryOptions;

fn nats_config(server: &NatsServer) -> Config {
    let mut c = config();
    c.nats.url = Some(server.url());
    c.nats.timeout = Dur(Duration::from_secs(2));
    c
}

async fn stream(server: &NatsServer, name: &str, subjects: &str, window: Duration) {
    server
        .jetstream()
        .await
        .create_stream(StreamConfig {
            name: name.into(),
            subjects: vec![subjects.into()],
            duplicate_window: window,
            ..Default::default()
        })
        .await
        .unwrap();
}

async fn messages(server: &NatsServer, name: &str) -> Vec<(String, String, String)> {
    server.messages(name).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_is_published_once_and_a_retry_is_a_jetstream_replay() {
    let db = TestDb::new().await;
    let server = NatsServer::start().await;
    stream(&server, "ORDERS", "orders.>", Duration::from_secs(120)).await;
    sqlx::query("SELECT outbox.enqueue('order:1:created', 'nats', $1::text::jsonb)")
        .bind(
            r#"{"subject": "orders.created", "body": {"id": 123456789012345678901234567890, "total": 1999},
                "headers": {"trace-id": "t-1"}}"#,
        )
        .execute(db.pool())
        .await
        .unwrap();
    let cfg = nats_config(&server);
    engine(db.store.clone(), &cfg).run_once().await.unwrap();
    let i = db.store.find("order:1:created").await.unwrap();
    assert_eq!(i.state, "delivered");
    assert_eq!(i.provider_ref.as_deref(), Some("ORDERS:1"));
    let stored: String = sqlx::query_scalar(
        "SELECT (payload->'body')::text FROM outbox.intents WHERE key = 'order:1:created'",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    let msgs = messages(&server, "ORDERS").await;
    assert_eq!(
        msgs,
        [(
            "orders.created".to_string(),
            message_id("order:1:created", 0),
            stored
        )]
    );

    // an operator retry publishes under the same id: JetStream dedupes it
    db.store
        .retry(
            "order:1:created",
            RetryOptions {
                new_effect: false,
                force: true,
            },
        )
        .await
        .unwrap();
    engine(db.store.clone(), &cfg).run_once().await.unwrap();
    let attempts = db.store.attempts(i.id).await.unwrap();
    assert_eq!(
        attempts.iter().map(|a| a.replayed).collect::<Vec<_>>(),
        [false, true]
    );
    assert_eq!(
        messages(&server, "ORDERS").await.len(),
        1,
        "no second message"
    );
    // a new effect is a new id and a new message
    db.store
        .retry(
            "order:1:created",
            RetryOptions {
                new_effect: true,
                force: true,
            },
        )
        .await
        .unwrap();
    engine(db.store.clone(), &cfg).run_once().await.unwrap();
    let msgs = messages(&server, "ORDERS").await;
    assert_eq!(msgs.len(), 2);
    assert_eq!(msgs[1].1, message_id("order:1:created", 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_stream_for_the_subject_is_transient_until_the_budget_is_spent() {
    let db = TestDb::new().await;
    let server = NatsServer::start().await;
    db.enqueue(
        "lost",
        "nats",
        json!({"subject": "nowhere.here", "body": 1}),
    )
    .await;
    let mut cfg = nats_config(&server);
    cfg.retry.max_attempts = 2;
    // retried at once, so that one run --once sees both attempts
    cfg.retry.schedule = vec![Dur(Duration::ZERO)];
    engine(db.store.clone(), &cfg).run_once().await.unwrap();
    let i = db.store.find("lost").await.unwrap();
    assert_eq!((i.state.as_str(), i.attempts), ("dead", 2), "{i:?}");
    let reason = i.last_error.unwrap();
    assert!(
        reason.contains("\"nowhere.here\"") && reason.contains("no responders"),
        "{reason}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_subject_or_header_is_rejected_and_nothing_is_published() {
    let db = TestDb::new().await;
    let server = NatsServer::start().await;
    stream(&server, "ALL", "orders.>", Duration::from_secs(120)).await;
    db.enqueue("wild", "nats", json!({"subject": "orders.*", "body": 1}))
        .await;
    db.enqueue(
        "spaced",
        "nats",
        json!({"subject": "orders created", "body": 1}),
    )
    .await;
    db.enqueue(
        "reserved",
        "nats",
        json!({"subject": "orders.x", "body": 1, "headers": {"Nats-Expected-Stream": "X"}}),
    )
    .await;
    engine(db.store.clone(), &nats_config(&server))
        .run_once()
        .await
        .unwrap();
    for (key, says) in [
        ("wild", "wildcard"),
        ("spaced", "whitespace"),
        ("reserved", "reserved"),
    ] {
        let i = db.store.find(key).await.unwrap();
        assert_eq!(i.state, "rejected", "{key}");
        assert!(
            i.last_error.as_deref().unwrap_or_default().contains(says),
            "{key}: {i:?}"
        );
    }
    assert!(messages(&server, "ALL").await.is_empty());
}

/// A relay published, then died before recording it; another relay takes
/// the expired lease over.
async fn published_then_died(db: &TestDb, server: &NatsServer, key: &str, subject: &str) {
    let claims = db.store.claim("dead-relay", 10, 100, &[]).await.unwrap();
    assert_eq!(claims.len(), 1);
    let js = server.jetstream().await;
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(
        async_nats::header::NATS_MESSAGE_ID,
        message_id(key, 0).as_str(),
    );
    js.publish_with_headers(subject.to_string(), headers, "1".into())
        .await
        .unwrap()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_lost_lease_the_message_is_found_or_republished_inside_the_window() {
    let db = TestDb::new().await;
    let server = NatsServer::start().await;
    stream(&server, "EV", "ev.>", Duration::from_secs(120)).await;
    let cfg = nats_config(&server);

    // found: the last message on the subject carries the intent's id
    db.enqueue("found", "nats", json!({"subject": "ev.found", "body": 1}))
        .await;
    published_then_died(&db, &server, "found", "ev.found").await;
    engine(db.store.clone(), &cfg).run_once().await.unwrap();
    let i = db.store.find("found").await.unwrap();
    assert_eq!(
        (i.state.as_str(), i.provider_ref.as_deref()),
        ("delivered", Some("EV:1"))
    );
    assert_eq!(
        messages(&server, "EV").await.len(),
        1,
        "found, not republished"
    );

    // not the last on its subject any more: inside the window the relay
    // republishes under the same id and JetStream dedupes it
    db.enqueue("deduped", "nats", json!({"subject": "ev.busy", "body": 1}))
        .await;
    published_then_died(&db, &server, "deduped", "ev.busy").await;
    let js = server.jetstream().await;
    js.publish("ev.busy", "someone else".into())
        .await
        .unwrap()
        .await
        .unwrap();
    engine(db.store.clone(), &cfg).run_once().await.unwrap();
    let i = db.store.find("deduped").await.unwrap();
    assert_eq!(i.state, "delivered", "{i:?}");
    let attempts = db.store.attempts(i.id).await.unwrap();
    assert!(attempts.last().unwrap().replayed, "{attempts:?}");
    let all = messages(&server, "EV").await;
    let ours: Vec<_> = all
        .iter()
        .filter(|m| m.1 == message_id("deduped", 0))
        .collect();
    assert_eq!(ours.len(), 1, "exactly one message for the intent: {all:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_duplicate_window_an_unconfirmed_publish_is_parked_not_republished() {
    let db = TestDb::new().await;
    let server = NatsServer::start().await;
    // a window shorter than the time a republish needs to be safe
    stream(&server, "SHORT", "short.>", Duration::from_secs(1)).await;
    db.enqueue("late", "nats", json!({"subject": "short.x", "body": 1}))
        .await;
    // the dead relay may or may not have published: here it did not
    db.store.claim("dead-relay", 10, 100, &[]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    engine(db.store.clone(), &nats_config(&server))
        .run_once()
        .await
        .unwrap();
    let i = db.store.find("late").await.unwrap();
    assert_eq!(i.state, "ambiguous", "{i:?}");
    assert!(
        messages(&server, "SHORT").await.is_empty(),
        "never republished blind"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subject_without_a_stream_does_not_hold_back_the_other_publishes() {
    let db = TestDb::new().await;
    let server = NatsServer::start().await;
    stream(&server, "ORDERS", "orders.>", Duration::from_secs(120)).await;
    for n in 0..6 {
        db.enqueue(
            &format!("lost:{n}"),
            "nats",
            json!({"subject": "nowhere.here", "body": n}),
        )
        .await;
    }
    let mut cfg = nats_config(&server);
    // a breaker that opens at the third failure and would hold the server
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
              WHERE a.outcome = 'transient' AND i.key LIKE 'lost:%'",
        )
        .fetch_one(db.pool())
        .await
        .unwrap()
    };
    assert!(
        crate::common::wait_for(Duration::from_secs(20), || async { refused().await >= 6 }).await,
        "the subject without a stream was refused: {}",
        refused().await
    );
    // the refusals' health records are written beside their completions
    tokio::time::sleep(Duration::from_millis(300)).await;
    for n in 0..10 {
        db.enqueue(
            &format!("order:{n}"),
            "nats",
            json!({"subject": format!("orders.{n}"), "body": n}),
        )
        .await;
    }
    let delivered = crate::common::wait_for(Duration::from_secs(10), || async {
        db.count("key LIKE 'order:%' AND state = 'delivered'").await == 10
    })
    .await;
    let nats: Option<(String, i32)> =
        sqlx::query_as("SELECT state, failures FROM outbox.destinations WHERE name = 'nats'")
            .fetch_optional(db.pool())
            .await
            .unwrap();
    let _ = tx.send(());
    relay.await.unwrap().unwrap();
    assert!(
        delivered,
        "publishes to a subject with a stream went on: {} of 10; the nats destination: {nats:?}",
        db.count("key LIKE 'order:%' AND state = 'delivered'").await
    );
    assert!(
        nats.as_ref().is_none_or(|(state, _)| state == "closed"),
        "a subject without a stream does not open the server's breaker: {nats:?}"
    );
    assert_eq!(messages(&server, "ORDERS").await.len(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_jetstream_opens_the_nats_breaker() {
    let db = TestDb::new().await;
    let server = NatsServer::start_without_jetstream().await;
    for n in 0..4 {
        db.enqueue(
            &format!("order:{n}"),
            "nats",
            json!({"subject": format!("orders.{n}"), "body": n}),
        )
        .await;
    }
    let mut cfg = nats_config(&server);
    cfg.breaker.failures = 3;
    cfg.breaker.cooldown = Dur(Duration::from_secs(60));
    cfg.retry.schedule = vec![Dur(Duration::from_millis(100))];
    cfg.retry.max_attempts = 1000;
    let open = || async {
        sqlx::query_scalar::<_, String>("SELECT state FROM outbox.destinations WHERE name = 'nats'")
            .fetch_optional(db.pool())
            .await
            .unwrap()
            .is_some_and(|state| state == "open")
    };
    crate::common::run_until(
        engine(db.store.clone(), &cfg),
        Duration::from_secs(20),
        open,
    )
    .await;
    let reasons: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT last_error FROM outbox.intents WHERE key LIKE 'order:%' AND attempts > 0",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    assert!(
        reasons.iter().any(|r| r.contains("no JetStream")),
        "the reason names the server's want, not a subject's: {reasons:?}"
    );
    assert_eq!(db.count("state = 'delivered'").await, 0);
}

/// A message carries the trace context of its attempt's `publish` span,
/// which the receiver of the traces sees as the application's child.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_carries_its_publish_spans_traceparent() {
    use crate::common::otlp::Collector;
    use crate::traces::{app_span, export, traced_engine_with};
    use outbox_relay::observe::trace::{Protocol, Tracer};
    let db = TestDb::new().await;
    let server = NatsServer::start().await;
    stream(&server, "TRACED", "traced.>", Duration::from_secs(120)).await;
    let collector = Collector::start().await;
    let (traceparent, trace, app) = app_span();
    sqlx::query("SELECT outbox.enqueue('traced:1', 'nats', $1, p_traceparent => $2)")
        .bind(json!({"subject": "traced.created", "body": 1, "headers": {"traceparent": "stale"}}))
        .bind(&traceparent)
        .execute(db.pool())
        .await
        .unwrap();
    let tracer = Tracer::start(&export(&collector, Protocol::HttpProtobuf, 64)).unwrap();
    traced_engine_with(&db, &nats_config(&server), &tracer)
        .run_once()
        .await
        .unwrap();
    tracer.shutdown().await;
    assert_eq!(db.state("traced:1").await, "delivered");
    let spans = collector
        .wait_for(Duration::from_secs(10), |s| !s.is_empty())
        .await;
    let publish = &spans[0];
    assert_eq!(
        (publish.name.as_str(), publish.kind),
        ("publish traced.created", 4)
    );
    assert_eq!(
        (publish.trace_id.as_str(), publish.parent_span_id.as_str()),
        (trace.as_str(), app.as_str())
    );
    assert_eq!(publish.attr("messaging.system"), Some("nats"));
    assert_eq!(
        publish.attr("messaging.destination.name"),
        Some("traced.created")
    );
    let id = message_id("traced:1", 0);
    assert_eq!(publish.attr("messaging.message.id"), Some(id.as_str()));
    let js = server.jetstream().await;
    let stored = js
        .get_stream("TRACED")
        .await
        .unwrap()
        .get_raw_message(1)
        .await
        .unwrap();
    let header = |name: &str| stored.headers.get(name).map(|v| v.as_str().to_string());
    assert_eq!(
        header("traceparent"),
        Some(format!("00-{trace}-{}-01", publish.span_id))
    );
    let msg_id = stored.headers.get(async_nats::header::NATS_MESSAGE_ID);
    assert_eq!(msg_id.map(|v| v.as_str()), Some(id.as_str()));
}

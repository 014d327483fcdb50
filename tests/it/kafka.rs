//! The `kafka` kind against a real Kafka-API broker (Tansu) read back by a
//! real consumer (librdkafka): the record, its key, partition and headers,
//! per-key order, operator retries and new effects, refusals, and the
//! delivery report lost on the way back, or the record never written,
//! behind a proxy that reads the protocol.

use std::time::Duration;

use outbox_providers::kafka::{partition, request::effect_key};
use outbox_providers::AmbiguityPolicy;
use outbox_relay::config::{Config, Dur};
use outbox_relay::store::operator::RetryOptions;
use serde_json::json;

use crate::common::kafka::{Broker, Mode, Proxy, Record};
use crate::common::{config, engine, free_port, run_until, TestDb};

const EFFECT_HEADER: &str = "outbox-effect-key";

fn kafka_config(brokers: String) -> Config {
    let mut c = config();
    c.kafka.brokers = Some(brokers);
    c.kafka.timeout = Dur(Duration::from_secs(3));
    c.kafka.linger = Dur(Duration::from_millis(1));
    c
}

async fn enqueue(db: &TestDb, key: &str, payload: serde_json::Value, ordering_key: Option<&str>) {
    sqlx::query("SELECT outbox.enqueue($1, 'kafka', $2::text::jsonb, p_ordering_key => $3)")
        .bind(key)
        .bind(payload.to_string())
        .bind(ordering_key)
        .execute(db.pool())
        .await
        .unwrap();
}

fn header<'a>(r: &'a Record, name: &str) -> Option<&'a str> {
    r.headers.get(name).map(String::as_str)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_carries_its_body_key_and_effect_key_and_the_reference_names_it() {
    let db = TestDb::new().await;
    let broker = Broker::start().await;
    broker.create_topic("orders", 3).await;
    let big = "123456789012345678901234567890.10";
    sqlx::query(
        "SELECT outbox.enqueue('order:1', 'kafka', $1::text::jsonb, p_ordering_key => 'acct-9')",
    )
    .bind(format!(
        r#"{{"topic": "orders", "key": "acct-1", "body": {{"total": {big}}}, "headers": {{"source": "shop"}}}}"#
    ))
    .execute(db.pool())
    .await
    .unwrap();
    enqueue(
        &db,
        "order:2",
        json!({"topic": "orders", "body": [2]}),
        Some("acct-2"),
    )
    .await;
    enqueue(
        &db,
        "order:3",
        json!({"topic": "orders", "body": null, "partition": 1}),
        None,
    )
    .await;
    let cfg = kafka_config(broker.brokers());
    engine(db.store.clone(), &cfg).run_once().await.unwrap();

    let records = broker.records("orders", 3).await;
    assert_eq!(records.len(), 3, "{records:?}");
    for (key, record_key, body) in [
        ("order:1", Some("acct-1"), format!(r#"{{"total": {big}}}"#)),
        ("order:2", Some("acct-2"), "[2]".to_string()),
        ("order:3", None, "null".to_string()),
    ] {
        let i = db.store.find(key).await.unwrap();
        assert_eq!(i.state, "delivered", "{key}: {:?}", i.last_error);
        let ours = effect_key(key, 0);
        let r = records
            .iter()
            .find(|r| header(r, EFFECT_HEADER) == Some(ours.as_str()))
            .unwrap_or_else(|| panic!("{key}: no record with its effect key"));
        assert_eq!(r.key.as_deref(), record_key, "{key}");
        assert_eq!(r.value, body, "{key}: the stored text, digits intact");
        assert_eq!(
            i.provider_ref.as_deref(),
            Some(format!("orders:{}:{}", r.partition, r.offset).as_str()),
            "{key}"
        );
        if let Some(k) = record_key {
            // Kafka's default partitioner, as reconcile computes it
            assert_eq!(r.partition, partition::for_key(k.as_bytes(), 3), "{key}");
        }
    }
    let first = records
        .iter()
        .find(|r| r.key.as_deref() == Some("acct-1"))
        .unwrap();
    assert_eq!(header(first, "source"), Some("shop"));
    let third = records.iter().find(|r| r.key.is_none()).unwrap();
    assert_eq!(third.partition, 1, "the payload's partition");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_keys_intents_stay_in_order_in_one_partition() {
    let db = TestDb::new().await;
    let broker = Broker::start().await;
    broker.create_topic("ledger", 4).await;
    for seq in 0..8 {
        for k in 0..4 {
            let key = format!("acct-{k}");
            enqueue(
                &db,
                &format!("ledger:{k}:{seq}"),
                json!({"topic": "ledger", "body": {"k": k, "seq": seq}}),
                Some(&key),
            )
            .await;
        }
    }
    let cfg = kafka_config(broker.brokers());
    run_until(
        engine(db.store.clone(), &cfg),
        Duration::from_secs(60),
        || async { db.count("state = 'delivered'").await == 32 },
    )
    .await;
    let records = broker.records("ledger", 4).await;
    assert_eq!(records.len(), 32);
    for k in 0..4 {
        let key = format!("acct-{k}");
        let mine: Vec<&Record> = records
            .iter()
            .filter(|r| r.key.as_deref() == Some(&key))
            .collect();
        let partitions: std::collections::BTreeSet<i32> =
            mine.iter().map(|r| r.partition).collect();
        assert_eq!(partitions.len(), 1, "{key}: one partition");
        let seqs: Vec<i64> = mine
            .iter()
            .map(|r| {
                serde_json::from_str::<serde_json::Value>(&r.value).unwrap()["seq"]
                    .as_i64()
                    .unwrap()
            })
            .collect();
        assert_eq!(seqs, (0..8).collect::<Vec<_>>(), "{key}: in offset order");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_retry_finds_the_record_and_a_new_effect_is_a_new_record() {
    let db = TestDb::new().await;
    let broker = Broker::start().await;
    broker.create_topic("events", 2).await;
    enqueue(
        &db,
        "evt:1",
        json!({"topic": "events", "body": {"n": 1}}),
        None,
    )
    .await;
    let cfg = kafka_config(broker.brokers());
    engine(db.store.clone(), &cfg).run_once().await.unwrap();
    let i = db.store.find("evt:1").await.unwrap();
    assert_eq!(i.state, "delivered");
    let reference = i.provider_ref.clone();

    // the same effect: the record is found, none is added
    db.store
        .retry(
            "evt:1",
            RetryOptions {
                new_effect: false,
                force: true,
            },
        )
        .await
        .unwrap();
    engine(db.store.clone(), &cfg).run_once().await.unwrap();
    let again = db.store.find("evt:1").await.unwrap();
    assert_eq!(again.state, "delivered");
    assert_eq!(again.provider_ref, reference, "the record it found");
    let attempts = db.store.attempts(i.id).await.unwrap();
    assert_eq!(
        attempts.iter().map(|a| a.replayed).collect::<Vec<_>>(),
        [false, true]
    );
    assert_eq!(
        broker.records("events", 2).await.len(),
        1,
        "no second record"
    );

    // a new effect: a new header, a new record
    db.store
        .retry(
            "evt:1",
            RetryOptions {
                new_effect: true,
                force: true,
            },
        )
        .await
        .unwrap();
    engine(db.store.clone(), &cfg).run_once().await.unwrap();
    let records = broker.records("events", 2).await;
    let keys: Vec<&str> = records
        .iter()
        .filter_map(|r| header(r, EFFECT_HEADER))
        .collect();
    assert_eq!(records.len(), 2);
    assert!(keys.contains(&effect_key("evt:1", 0).as_str()));
    assert!(keys.contains(&effect_key("evt:1", 1).as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_too_large_is_rejected_with_its_reason() {
    let db = TestDb::new().await;
    let broker = Broker::start().await;
    broker.create_topic("big", 1).await;
    // under the outbox's 1 MiB payload limit, over the producer's
    // kafka.max_message_bytes (1,000,000 by default)
    for (key, size) in [("big:1", 1_000_100), ("big:2", 1_040_000)] {
        enqueue(
            &db,
            key,
            json!({"topic": "big", "body": "x".repeat(size)}),
            None,
        )
        .await;
    }
    let cfg = kafka_config(broker.brokers());
    engine(db.store.clone(), &cfg).run_once().await.unwrap();
    for key in ["big:1", "big:2"] {
        let i = db.store.find(key).await.unwrap();
        assert_eq!(i.state, "rejected", "{key}");
        let reason = i.last_error.unwrap_or_default();
        assert!(
            reason.contains("kafka.max_message_bytes (1000000)"),
            "{key}: the relay's own limit, not the broker's: {reason}"
        );
        assert!(!reason.contains("broker"), "{key}: {reason}");
    }
    assert!(broker.records("big", 1).await.is_empty());

    // a producer allowed larger records sends them
    let mut cfg = cfg;
    cfg.kafka.max_message_bytes = 2_000_000;
    db.store
        .retry(
            "big:2",
            RetryOptions {
                new_effect: false,
                force: false,
            },
        )
        .await
        .unwrap();
    engine(db.store.clone(), &cfg).run_once().await.unwrap();
    let i = db.store.find("big:2").await.unwrap();
    assert_eq!(i.state, "delivered", "{:?}", i.last_error);
    let records = broker.records("big", 1).await;
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].value.len(), 1_040_002, "the body's JSON text");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_that_cannot_be_reached_is_transient_and_nothing_is_sent() {
    let db = TestDb::new().await;
    enqueue(&db, "down:1", json!({"topic": "t", "body": 1}), None).await;
    let cfg = kafka_config(format!("127.0.0.1:{}", free_port()));
    engine(db.store.clone(), &cfg).run_once().await.unwrap();
    let i = db.store.find("down:1").await.unwrap();
    assert_eq!(i.state, "pending", "{:?}", i.last_error);
    let reason = i.last_error.unwrap_or_default();
    assert!(reason.contains("was not written"), "{reason}");
}

/// A broker behind a protocol proxy: clients learn the proxy's address.
async fn proxied() -> (Broker, Proxy) {
    let (port, proxy_port) = (free_port(), free_port());
    let broker = Broker::start_advertising(port, proxy_port).await;
    let proxy = Proxy::start(proxy_port, port).await;
    (broker, proxy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_delivery_report_is_reconciled_as_delivered_without_a_second_record() {
    let db = TestDb::new().await;
    let (broker, proxy) = proxied().await;
    broker.create_topic("swallow", 2).await;
    enqueue(
        &db,
        "lost:1",
        json!({"topic": "swallow", "key": "k", "body": {"n": 1}}),
        None,
    )
    .await;
    let cfg = kafka_config(broker.brokers());
    let engine = engine(db.store.clone(), &cfg);
    proxy.set(Mode::SwallowProduceResponses);
    engine.run_once().await.unwrap();
    proxy.set(Mode::Pass);
    let i = db.store.find("lost:1").await.unwrap();
    let records = broker.records("swallow", 2).await;
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(i.state, "delivered", "{:?}", i.last_error);
    assert_eq!(
        i.provider_ref.as_deref(),
        Some(format!("swallow:{}:{}", records[0].partition, records[0].offset).as_str())
    );
    let attempts = db.store.attempts(i.id).await.unwrap();
    assert_eq!(attempts.len(), 1, "settled within its one attempt");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_never_written_is_redelivered_once_or_parked() {
    for policy in [AmbiguityPolicy::Redeliver, AmbiguityPolicy::Park] {
        let db = TestDb::new().await;
        let (broker, proxy) = proxied().await;
        broker.create_topic("dropped", 1).await;
        enqueue(&db, "never:1", json!({"topic": "dropped", "body": 1}), None).await;
        let mut cfg = kafka_config(broker.brokers());
        cfg.kafka.on_ambiguous = policy;
        proxy.set(Mode::DropProduceRequests);
        engine(db.store.clone(), &cfg).run_once().await.unwrap();
        proxy.set(Mode::Pass);
        let i = db.store.find("never:1").await.unwrap();
        let reason = i.last_error.clone().unwrap_or_default();
        assert!(reason.contains("unknown"), "{policy:?}: {reason}");
        match policy {
            AmbiguityPolicy::Park => {
                assert_eq!(i.state, "ambiguous", "{policy:?}");
                assert!(broker.records("dropped", 1).await.is_empty());
            }
            AmbiguityPolicy::Redeliver => {
                assert_eq!(i.state, "pending", "{policy:?}");
                sqlx::query("UPDATE outbox.intents SET run_after = now()")
                    .execute(db.pool())
                    .await
                    .unwrap();
                engine(db.store.clone(), &cfg).run_once().await.unwrap();
                let i = db.store.find("never:1").await.unwrap();
                assert_eq!(i.state, "delivered", "{:?}", i.last_error);
                let records = broker.records("dropped", 1).await;
                assert_eq!(records.len(), 1, "exactly one record: {records:?}");
                assert_eq!(
                    header(&records[0], EFFECT_HEADER),
                    Some(effect_key("never:1", 0).as_str()),
                    "under the same header"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_the_cluster_does_not_have_is_classified() {
    let db = TestDb::new().await;
    let broker = Broker::start().await;
    broker.create_topic("one", 1).await;
    enqueue(
        &db,
        "nowhere:1",
        json!({"topic": "no-such-topic", "body": 1}),
        None,
    )
    .await;
    enqueue(
        &db,
        "nowhere:2",
        json!({"topic": "one", "body": 1, "partition": 5}),
        None,
    )
    .await;
    let cfg = kafka_config(broker.brokers());
    engine(db.store.clone(), &cfg).run_once().await.unwrap();
    // Tansu creates no topic on first use: a refusal that would repeat
    for (key, why) in [
        ("nowhere:1", "the topic does not exist"),
        ("nowhere:2", "no such partition"),
    ] {
        let i = db.store.find(key).await.unwrap();
        assert_eq!(i.state, "rejected", "{key}");
        let reason = i.last_error.unwrap_or_default();
        assert!(reason.contains(why), "{key}: {reason}");
    }
    assert!(broker.records("one", 1).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_applications_trace_context_rides_along_in_place_of_the_payloads() {
    let db = TestDb::new().await;
    let broker = Broker::start().await;
    broker.create_topic("traced", 1).await;
    let parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    sqlx::query(
        "SELECT outbox.enqueue('traced:1', 'kafka', $1::jsonb, p_traceparent => $2, p_tracestate => 'vendor=1')",
    )
    .bind(json!({"topic": "traced", "body": 1, "headers": {"traceparent": "forged", "source": "shop"}}))
    .bind(parent)
    .execute(db.pool())
    .await
    .unwrap();
    let cfg = kafka_config(broker.brokers());
    engine(db.store.clone(), &cfg).run_once().await.unwrap();
    let records = broker.records("traced", 1).await;
    assert_eq!(records.len(), 1);
    // no export configured: the intent's own context, unchanged
    assert_eq!(header(&records[0], "traceparent"), Some(parent));
    assert_eq!(header(&records[0], "tracestate"), Some("vendor=1"));
    assert_eq!(header(&records[0], "source"), Some("shop"));
}

/// Keys whose partition in a topic of `before` partitions is another than
/// in one of `after`.
fn keys_that_move(before: i32, after: i32, n: usize) -> Vec<String> {
    (0..)
        .map(|i| format!("acct-{i}"))
        .filter(|k| {
            partition::for_key(k.as_bytes(), before) != partition::for_key(k.as_bytes(), after)
        })
        .take(n)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_that_gains_partitions_keeps_one_record_per_effect() {
    let db = TestDb::new().await;
    let (broker, proxy) = proxied().await;
    broker.create_topic("grows", 6).await;
    let keys = keys_that_move(3, 6, 3);
    for (i, key) in keys.iter().enumerate() {
        enqueue(
            &db,
            &format!("grow:{i}"),
            json!({"topic": "grows", "key": key, "body": i}),
            None,
        )
        .await;
    }
    let mut cfg = kafka_config(broker.brokers());
    // one attempt per run: a retry waits for the test to make it due
    cfg.retry.schedule = vec![Dur(Duration::from_secs(3600))];
    // the producer sees 3 partitions; once its records are on their way the
    // topic has 6, and the delivery reports are lost
    proxy.show_partitions_until_produce(3);
    proxy.set(Mode::SwallowProduceResponses);
    engine(db.store.clone(), &cfg).run_once().await.unwrap();
    proxy.set(Mode::Pass);
    // whatever the first attempts concluded, later ones settle the rest
    for _ in 0..3 {
        sqlx::query("UPDATE outbox.intents SET run_after = now() WHERE state = 'pending'")
            .execute(db.pool())
            .await
            .unwrap();
        engine(db.store.clone(), &cfg).run_once().await.unwrap();
    }
    let records = broker.records("grows", 6).await;
    for (i, key) in keys.iter().enumerate() {
        let intent = format!("grow:{i}");
        let ours = effect_key(&intent, 0);
        let mine: Vec<&Record> = records
            .iter()
            .filter(|r| header(r, EFFECT_HEADER) == Some(ours.as_str()))
            .collect();
        assert_eq!(
            mine.len(),
            1,
            "{intent}: one record per effect key: {mine:?}"
        );
        let i = db.store.find(&intent).await.unwrap();
        assert_eq!(i.state, "delivered", "{intent}: {:?}", i.last_error);
        assert_eq!(
            mine[0].partition,
            partition::for_key(key.as_bytes(), 3),
            "{intent}: where the producer's 3 partitions put it"
        );
        assert_eq!(
            i.provider_ref.as_deref(),
            Some(format!("grows:{}:{}", mine[0].partition, mine[0].offset).as_str()),
            "{intent}"
        );
    }
}

/// Attempt 1 finds no topic; an operator retries once the topic exists.
async fn refused_then_retried(db: &TestDb, key: &str, topic: &str, cfg: &Config) {
    enqueue(
        db,
        key,
        json!({"topic": topic, "key": "acct-1", "body": {"n": 1}}),
        None,
    )
    .await;
    engine(db.store.clone(), cfg).run_once().await.unwrap();
    let i = db.store.find(key).await.unwrap();
    assert_eq!(i.state, "rejected", "{:?}", i.last_error);
    db.store
        .retry(
            key,
            RetryOptions {
                new_effect: false,
                force: false,
            },
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retrys_search_ends_on_a_partition_another_producer_keeps_busy() {
    let db = TestDb::new().await;
    let broker = Broker::start().await;
    let cfg = kafka_config(broker.brokers());
    refused_then_retried(&db, "busy:1", "busy", &cfg).await;
    broker.create_topic("busy", 1).await;
    let chatter = broker.chatter("busy", "acct-1", Duration::from_millis(100));
    tokio::time::sleep(Duration::from_secs(1)).await;
    // a relay that did not make attempt 1 (a new process) searches first
    engine(db.store.clone(), &cfg).run_once().await.unwrap();
    let sent = chatter.stop();
    assert!(sent >= 10, "the other producer kept writing: {sent}");
    let i = db.store.find("busy:1").await.unwrap();
    assert_eq!(i.state, "delivered", "{:?}", i.last_error);
    let attempts = db.store.attempts(i.id).await.unwrap();
    assert_eq!(attempts.len(), 2, "one retry: {attempts:?}");
    assert!(!attempts[1].replayed, "searched, not found, produced");
    let records = broker.records("busy", 1).await;
    let ours = effect_key("busy:1", 0);
    let mine: Vec<&Record> = records
        .iter()
        .filter(|r| header(r, EFFECT_HEADER) == Some(ours.as_str()))
        .collect();
    assert_eq!(mine.len(), 1, "{mine:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_an_attempt_that_sent_nothing_does_not_search() {
    let db = TestDb::new().await;
    let (broker, proxy) = proxied().await;
    let cfg = kafka_config(broker.brokers());
    // one relay, both attempts: it knows attempt 1 sent nothing
    let providers =
        outbox_relay::engine::providers(&cfg, &crate::common::context(&db.store, &cfg)).unwrap();
    let relay = || {
        outbox_relay::Engine::new(
            db.store.clone(),
            providers.clone(),
            outbox_relay::EngineConfig::from_config(&cfg),
        )
    };
    enqueue(
        &db,
        "unsent:1",
        json!({"topic": "later", "key": "acct-1", "body": 1}),
        None,
    )
    .await;
    relay().run_once().await.unwrap();
    let i = db.store.find("unsent:1").await.unwrap();
    assert_eq!(i.state, "rejected", "{:?}", i.last_error);
    broker.create_topic("later", 1).await;
    db.store
        .retry(
            "unsent:1",
            RetryOptions {
                new_effect: false,
                force: false,
            },
        )
        .await
        .unwrap();
    // a search could not read the topic now; a produce gets through, to
    // the topic the same relay found missing a moment ago
    proxy.set(Mode::DropReads);
    relay().run_once().await.unwrap();
    proxy.set(Mode::Pass);
    let i = db.store.find("unsent:1").await.unwrap();
    assert_eq!(i.state, "delivered", "{:?}", i.last_error);
    let attempts = db.store.attempts(i.id).await.unwrap();
    assert_eq!(attempts.len(), 2, "{attempts:?}");
    assert_eq!(broker.records("later", 1).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_lookalikes_and_control_characters_are_refused_at_enqueue() {
    let db = TestDb::new().await;
    for (headers, needle) in [
        (json!({" outbox-effect-key": "x"}), "header name"),
        (json!({"outbox-effect-key\u{200b}": "x"}), "header name"),
        (json!({"source ": "shop"}), "header name"),
        (json!({"sourcé": "shop"}), "header name"),
        (json!({"Outbox-Effect-Key": "x"}), "set by the relay"),
        (
            json!({"source": "shop\r\nx-forged: 1"}),
            "control character",
        ),
        (json!({"source": "shop\nx"}), "control character"),
        (json!({"source": "a\u{1}b"}), "control character"),
        (json!({"source": "a\tb"}), "control character"),
        (json!({"source": "a\u{85}b"}), "control character"),
        (json!({"source": 1}), "must be a string"),
        (json!(["source"]), "must be an object"),
    ] {
        let payload = json!({"topic": "t", "body": 1, "headers": headers});
        for statement in [
            "SELECT outbox.enqueue('h:1', 'kafka', $1::jsonb)",
            "SELECT outbox.enqueue_many(ARRAY['h:1'], ARRAY['kafka'], ARRAY[$1::jsonb])",
            "INSERT INTO outbox.outbox (key, kind, payload) VALUES ('h:1', 'kafka', $1::jsonb)",
        ] {
            let err = sqlx::query(statement)
                .bind(&payload)
                .execute(db.pool())
                .await
                .expect_err(&format!("{statement}: {headers}"));
            let db_err = err.as_database_error().unwrap();
            assert_eq!(db_err.code().as_deref(), Some("22023"), "{headers}: {err}");
            assert!(db_err.message().contains(needle), "{headers}: {err}");
        }
    }
    // a name with a space inside, and any value without control
    // characters, are fine
    sqlx::query("SELECT outbox.enqueue('h:3', 'kafka', $1::jsonb)")
        .bind(json!({"topic": "t", "body": 1, "headers": {"x trace id": "é ok", "b": ""}}))
        .execute(db.pool())
        .await
        .unwrap();
}

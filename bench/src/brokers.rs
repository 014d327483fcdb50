//! `--brokers nats,amqp,kafka`: the broker kinds drained by the engine
//! against real brokers: N publishes per kind, the rate from the commit of
//! the last intent until the last completion, and the broker's own count
//! checked afterwards (a stream holding N messages, a queue holding N, a
//! topic whose records, read back, are N), so a drain that reports done
//! without publishing everything fails the bench.
//!
//! The bench makes its own stream (`OUTBOX_BENCH_<pid>`, subjects
//! `outbox-bench-<pid>.>`), its own exchange and exclusive queue, and its
//! own topic (`outbox-bench-<pid>`, 4 partitions), and removes them
//! afterwards.

use std::time::{Duration, Instant};

use outbox_relay::config::{Config, Dur};
use outbox_relay::store::{enqueue_many, NewIntent, Store};
use outbox_relay::{Engine, EngineConfig};
use serde::Serialize;
use serde_json::json;

use crate::sql::{run_sql, wait_delivered, EMPTY_LOG};

/// Where the brokers are.
#[derive(Debug, Clone)]
pub struct Brokers {
    pub kinds: Vec<String>,
    pub nats_url: String,
    /// `amqp://user@host:port/vhost`, no password.
    pub amqp_url: String,
    pub amqp_password: String,
    /// Kafka bootstrap brokers, `host:port`.
    pub kafka_brokers: String,
    pub intents: usize,
}

/// One broker kind's drain.
#[derive(Debug, Clone, Serialize)]
pub struct BrokerDrain {
    pub kind: String,
    pub intents: usize,
    pub in_flight: usize,
    pub drain_per_s: f64,
    /// What the broker holds afterwards (must equal `intents`).
    pub stored: u64,
}

pub async fn drains(
    store: &Store,
    config: &Config,
    brokers: &Brokers,
    in_flight: usize,
) -> anyhow::Result<Vec<BrokerDrain>> {
    let mut out = Vec::new();
    for kind in &brokers.kinds {
        out.push(match kind.as_str() {
            "nats" => nats(store, config, brokers, in_flight).await?,
            "amqp" => amqp(store, config, brokers, in_flight).await?,
            "kafka" => kafka(store, config, brokers, in_flight).await?,
            other => anyhow::bail!("--brokers: unknown broker kind {other:?} (nats, amqp, kafka)"),
        });
    }
    Ok(out)
}

/// Enqueue `n` intents of `kind` (keys `<prefix>N`), 1,000 per statement.
async fn enqueue(
    store: &Store,
    kind: &str,
    prefix: &str,
    n: usize,
    payload: impl Fn(usize) -> serde_json::Value,
) -> anyhow::Result<()> {
    let mut conn = store.pool().acquire().await?;
    for start in (0..n).step_by(1000) {
        let batch: Vec<NewIntent> = (start..(start + 1000).min(n))
            .map(|i| NewIntent::new(format!("{prefix}{i}"), kind, payload(i)))
            .collect();
        enqueue_many(&mut conn, &batch).await?;
    }
    Ok(())
}

/// Run the engine until every `<prefix>` intent is delivered; intents/s.
async fn drain(store: &Store, cfg: &Config, prefix: &str, n: usize) -> anyhow::Result<f64> {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let engine = Engine::new(
        store.clone(),
        outbox_relay::engine::providers(
            cfg,
            &outbox_relay::services::subscriptions::context(store, cfg)?,
        )?,
        EngineConfig::from_config(cfg),
    );
    let t = Instant::now();
    let running = tokio::spawn(engine.run(async {
        let _ = stopped.await;
    }));
    let waited = wait_delivered(store, prefix, n as i64).await;
    let rate = n as f64 / t.elapsed().as_secs_f64();
    let _ = stop.send(());
    running.await??;
    waited?;
    Ok(rate)
}

fn engine_config(config: &Config, in_flight: usize) -> Config {
    let mut cfg = config.clone();
    cfg.relay.concurrency = in_flight as u32;
    cfg.relay.metrics_addr = None;
    cfg
}

fn body(i: usize) -> serde_json::Value {
    json!({"event": "order.created", "order_id": i, "customer": "cus_0123456789",
           "amount": 1999, "currency": "usd", "items": [{"sku": "SKU-42", "qty": 1}],
           "note": "bench payload padded to about three hundred bytes"})
}

async fn nats(
    store: &Store,
    config: &Config,
    brokers: &Brokers,
    in_flight: usize,
) -> anyhow::Result<BrokerDrain> {
    let n = brokers.intents;
    let client = async_nats::connect(&brokers.nats_url).await.map_err(|e| {
        anyhow::anyhow!(
            "--brokers nats: cannot connect to {} ({e}); start `nats-server -js` or pass --nats-url",
            brokers.nats_url
        )
    })?;
    let js = async_nats::jetstream::new(client);
    let name = format!("OUTBOX_BENCH_{}", std::process::id());
    let subject = format!("outbox-bench-{}", std::process::id());
    let _ = js.delete_stream(&name).await;
    js.create_stream(async_nats::jetstream::stream::Config {
        name: name.clone(),
        subjects: vec![format!("{subject}.>")],
        ..Default::default()
    })
    .await
    .map_err(|e| {
        anyhow::anyhow!("--brokers nats: cannot create stream {name} ({e}); is JetStream on (-js)?")
    })?;
    run_sql(store, EMPTY_LOG).await?;
    eprintln!("bench: drain {n} nats publishes to JetStream, {in_flight} in flight");
    enqueue(
        store,
        "nats",
        "nats-",
        n,
        |i| json!({"subject": format!("{subject}.orders.created"), "body": body(i)}),
    )
    .await?;
    run_sql(
        store,
        "VACUUM ANALYZE outbox.intent_log, outbox.intent_rows",
    )
    .await?;
    let mut cfg = engine_config(config, in_flight);
    cfg.nats.url = Some(brokers.nats_url.clone());
    let rate = drain(store, &cfg, "nats-", n).await;
    let stored = match js.get_stream(&name).await {
        Ok(mut s) => s.info().await.map(|i| i.state.messages).unwrap_or(0),
        Err(_) => 0,
    };
    let _ = js.delete_stream(&name).await;
    let rate = rate?;
    anyhow::ensure!(
        stored == n as u64,
        "nats: the stream holds {stored} messages for {n} delivered intents"
    );
    Ok(BrokerDrain {
        kind: "nats".into(),
        intents: n,
        in_flight,
        drain_per_s: rate,
        stored,
    })
}

async fn amqp(
    store: &Store,
    config: &Config,
    brokers: &Brokers,
    in_flight: usize,
) -> anyhow::Result<BrokerDrain> {
    use lapin::options::{
        ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
    };
    use lapin::types::FieldTable;
    let n = brokers.intents;
    let mut login =
        url::Url::parse(&brokers.amqp_url).map_err(|e| anyhow::anyhow!("--amqp-url: {e}"))?;
    login
        .set_password(Some(&brokers.amqp_password))
        .map_err(|_| anyhow::anyhow!("--amqp-url: cannot carry a password"))?;
    let conn = lapin::Connection::connect(login.as_str(), lapin::ConnectionProperties::default())
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "--brokers amqp: cannot connect to {} ({e}); start rabbitmq-server or pass --amqp-url",
                brokers.amqp_url
            )
        })?;
    let ch = conn.create_channel().await?;
    let exchange = format!("outbox-bench-{}", std::process::id());
    ch.exchange_declare(
        exchange.as_str().into(),
        lapin::ExchangeKind::Direct,
        ExchangeDeclareOptions {
            auto_delete: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await?;
    let queue = format!("{exchange}-q");
    ch.queue_declare(
        queue.as_str().into(),
        QueueDeclareOptions {
            exclusive: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await?;
    ch.queue_bind(
        queue.as_str().into(),
        exchange.as_str().into(),
        "created".into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await?;
    run_sql(store, EMPTY_LOG).await?;
    eprintln!("bench: drain {n} amqp publishes with publisher confirms, {in_flight} in flight");
    enqueue(
        store,
        "amqp",
        "amqp-",
        n,
        |i| json!({"exchange": exchange, "routing_key": "created", "body": body(i)}),
    )
    .await?;
    run_sql(
        store,
        "VACUUM ANALYZE outbox.intent_log, outbox.intent_rows",
    )
    .await?;
    let mut cfg = engine_config(config, in_flight);
    cfg.amqp.url = Some(brokers.amqp_url.clone());
    cfg.amqp.password = Some(outbox_providers::Secret::new(brokers.amqp_password.clone()));
    cfg.amqp.timeout = Dur(Duration::from_secs(10));
    let rate = drain(store, &cfg, "amqp-", n).await;
    let stored = ch
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .map(|q| u64::from(q.message_count()))
        .unwrap_or(0);
    let _ = ch
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await;
    let _ = conn.close(200, "bench done".into()).await;
    let rate = rate?;
    anyhow::ensure!(
        stored == n as u64,
        "amqp: the queue holds {stored} messages for {n} delivered intents"
    );
    Ok(BrokerDrain {
        kind: "amqp".into(),
        intents: n,
        in_flight,
        drain_per_s: rate,
        stored,
    })
}

async fn kafka(
    store: &Store,
    config: &Config,
    brokers: &Brokers,
    in_flight: usize,
) -> anyhow::Result<BrokerDrain> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::config::ClientConfig;
    let n = brokers.intents;
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &brokers.kafka_brokers)
        .create()?;
    let topic = format!("outbox-bench-{}", std::process::id());
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let created = admin
        .create_topics(
            &[NewTopic::new(&topic, 4, TopicReplication::Fixed(1))],
            &options,
        )
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "--brokers kafka: cannot reach {} ({e}); start a broker or pass --kafka-brokers",
                brokers.kafka_brokers
            )
        })?;
    if let Some(Err((_, code))) = created.first() {
        anyhow::bail!("--brokers kafka: cannot create topic {topic}: {code}");
    }
    run_sql(store, EMPTY_LOG).await?;
    eprintln!(
        "bench: drain {n} kafka records (idempotent producer, acks=all), {in_flight} in flight"
    );
    enqueue(
        store,
        "kafka",
        "kafka-",
        n,
        |i| json!({"topic": topic, "body": body(i)}),
    )
    .await?;
    run_sql(
        store,
        "VACUUM ANALYZE outbox.intent_log, outbox.intent_rows",
    )
    .await?;
    let mut cfg = engine_config(config, in_flight);
    cfg.kafka.brokers = Some(brokers.kafka_brokers.clone());
    cfg.kafka.timeout = Dur(Duration::from_secs(10));
    let rate = drain(store, &cfg, "kafka-", n).await;
    let (servers, name) = (brokers.kafka_brokers.clone(), topic.clone());
    let stored = tokio::task::spawn_blocking(move || count_records(&servers, &name, 4)).await??;
    let _ = admin.delete_topics(&[&topic], &options).await;
    let rate = rate?;
    anyhow::ensure!(
        stored == n as u64,
        "kafka: the topic holds {stored} records for {n} delivered intents"
    );
    Ok(BrokerDrain {
        kind: "kafka".into(),
        intents: n,
        in_flight,
        drain_per_s: rate,
        stored,
    })
}

/// The records of `topic`, read from the start until none arrives for two
/// seconds (a count that does not trust the broker's high watermark).
fn count_records(brokers: &str, topic: &str, partitions: i32) -> anyhow::Result<u64> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
    let consumer: BaseConsumer = rdkafka::config::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "outbox-bench")
        .set("enable.auto.commit", "false")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    let (mut count, mut last) = (0u64, Instant::now());
    while last.elapsed() < Duration::from_secs(2) {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(_)) => {
                count += 1;
                last = Instant::now();
            }
            Some(Err(e)) => anyhow::bail!("kafka: reading {topic} back: {e}"),
            None => {}
        }
    }
    Ok(count)
}

//! Chaos drill: three relay processes deliver a mixed workload (webhook,
//! email, charge, nats, amqp, kafka) against real peers while a driver SIGKILLs a
//! random relay every few seconds and restarts it, the webhook receiver
//! answers 500 to ~20% of requests and stalls past the timeout on ~2%, the
//! SMTP server drops ~1% of connections after DATA, one charge in six takes
//! 1.5 s at Stripe, and Postgres itself (a private cluster), the NATS server
//! and the RabbitMQ node are each SIGKILLed and restarted once mid-run;
//! circuit breakers are on (5 failures open one).
//!
//! At the end: the intent count is unchanged; every intent is terminal (or
//! ambiguous with its reason); no transient failure ended terminal; every
//! delivered intent took effect at its peer, under one key across all its
//! attempts; no payment was created twice; and the effects that happened
//! more than once are counted and bounded by what the faults explain. The
//! JetStream stream holds exactly one message per nats intent (kills during
//! a publish included: the redelivery is deduped by `Nats-Msg-Id`); the
//! RabbitMQ queue holds every delivered amqp intent's message (a confirm
//! means it was stored), repeated only where a confirm was lost; the Kafka
//! topic (Tansu) holds exactly one record per kafka intent (a kill
//! mid-publish is reconciled by reading the partition).
//!
//! Size: CHAOS_INTENTS (default 900), CHAOS_KILL_EVERY_MS (default 2000).
//! The full drill: `CHAOS_INTENTS=3000 tests/run.sh chaos:: --no-capture`.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common;
use crate::common::amqp::{declare_durable, drain, RabbitNode};
use crate::common::cluster::Cluster;
use crate::common::kafka::Broker;
use crate::common::nats::NatsServer;
use crate::common::smtp::SmtpPeer;
use crate::common::stripe::{FakeStripe, API_KEY};
use crate::common::{Receiver, Reply};
use outbox_relay::store::Store;
use serde_json::{json, Value};

const RELAYS: usize = 3;
const CONCURRENCY: usize = 16;
const WEBHOOK_TIMEOUT_MS: u64 = 1000;
const STALL_MS: u64 = 1500;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// What the webhook receiver decided for one request.
#[derive(Debug, Clone)]
struct Answer {
    intent: String,
    webhook_id: String,
    status: u16,
    stalled: bool,
}

fn spawn_relay(
    db_url: &str,
    config: &std::path::Path,
    stripe_base: &str,
    name: &str,
) -> tokio::process::Child {
    common::relay_command(db_url)
        .env("OUTBOX_RELAY__AMQP__PASSWORD", "guest")
        .arg("run")
        .env("OUTBOX_RELAY_CONFIG", config)
        .env("OUTBOX_RELAY__RELAY__NAME", format!("\"{name}\""))
        .env("OUTBOX_RELAY__CHARGE__API_BASE", stripe_base)
        .env("STRIPE_API_KEY", API_KEY)
        .env("RUST_LOG", "error")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn relay")
}

fn intent_of(i: usize) -> (String, &'static str) {
    let kind = ["webhook", "email", "charge", "nats", "amqp", "kafka"][i % 6];
    (format!("chaos-{kind}-{i}"), kind)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_drill() {
    let n: usize = env_or("CHAOS_INTENTS", 900);
    let kill_every = Duration::from_millis(env_or("CHAOS_KILL_EVERY_MS", 2000));
    // enqueue over a stretch of time, so the faults land on a live workload
    let enqueue_for = Duration::from_secs((n as u64 / 60).max(10));
    let started = Instant::now();

    let cluster = Cluster::start("chaos");
    Store::connect(&cluster.url, 2)
        .await
        .unwrap()
        .migrate()
        .await
        .unwrap();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(5))
        .connect(&cluster.url)
        .await
        .unwrap();

    // peers
    let answers: Arc<Mutex<Vec<Answer>>> = Arc::default();
    let log = answers.clone();
    let rx = Receiver::start(move |req, _| {
        let intent = req.body_str("k");
        let roll = fastrand::f64();
        let (reply, status, stalled) = if roll < 0.02 {
            (
                Reply::status(200).after(Duration::from_millis(STALL_MS)),
                200,
                true,
            )
        } else if roll < 0.22 {
            (Reply::status(500), 500, false)
        } else {
            // a real endpoint takes a moment: kills land mid-request
            (
                Reply::status(200).after(Duration::from_millis(fastrand::u64(10..60))),
                200,
                false,
            )
        };
        log.lock().unwrap().push(Answer {
            intent,
            webhook_id: req.webhook_id(),
            status,
            stalled,
        });
        reply
    })
    .await;
    let smtp = SmtpPeer::start_with(&["--drop-rate", "0.01"]).await;
    let stripe = FakeStripe::start().await;
    let mut nats = NatsServer::start().await;
    nats.jetstream()
        .await
        .create_stream(async_nats::jetstream::stream::Config {
            name: "CHAOS".into(),
            subjects: vec!["chaos.>".into()],
            // the default window (2 minutes) spans the drill
            ..Default::default()
        })
        .await
        .unwrap();
    let kafka = Broker::start().await;
    kafka.create_topic("chaos", 3).await;
    let rabbit_node = RabbitNode::start().await;
    let rabbit = rabbit_node.rabbit();
    {
        let conn = rabbit.connect().await;
        let ch = conn.create_channel().await.unwrap();
        declare_durable(&ch, "chaos", "chaos-q").await;
        let _ = conn.close(200, "declared".into()).await;
    }

    let config = common::config_file(&format!(
        r#"
[relay]
concurrency = {CONCURRENCY}
batch_size = {CONCURRENCY}
lease = "4s"
poll_interval = "200ms"
sweep_interval = "250ms"
shutdown_timeout = "3s"

[retry]
max_attempts = 1000
schedule = ["50ms", "100ms", "200ms"]
jitter = 0.2

[webhook]
timeout = "{WEBHOOK_TIMEOUT_MS}ms"
connect_timeout = "500ms"
allowed_networks = ["127.0.0.0/8"]
on_ambiguous = "redeliver"

[email]
smtp_url = "{smtp_url}"
from = "Shop <shop@example.com>"
timeout = "2s"
connect_timeout = "500ms"
on_ambiguous = "redeliver"

[charge]
timeout = "2s"
connect_timeout = "500ms"
on_ambiguous = "park"

# breakers on, quick to open and to probe: the 500s, stalls and broker
# restarts trip them now and then, and nothing may be lost for it
[breaker]
failures = 5
cooldown = "500ms"
max_cooldown = "2s"

[nats]
url = "{nats_url}"
timeout = "2s"
on_ambiguous = "redeliver"

[amqp]
url = "{amqp_url}"
timeout = "2s"

[kafka]
brokers = "{kafka_brokers}"
timeout = "2s"
"#,
        smtp_url = smtp.url(),
        nats_url = nats.url(),
        amqp_url = rabbit.url(),
        kafka_brokers = kafka.brokers(),
    ));

    // three relays
    let relays: Arc<tokio::sync::Mutex<Vec<tokio::process::Child>>> =
        Arc::new(tokio::sync::Mutex::new(
            (0..RELAYS)
                .map(|r| spawn_relay(&cluster.url, &config, &stripe.base, &format!("relay-{r}-0")))
                .collect(),
        ));

    // the enqueuer: n intents over `enqueue_for`, in small transactions,
    // each retried (same keys) until it commits
    let enqueue_errors = Arc::new(AtomicUsize::new(0));
    let enqueuer = {
        let pool = pool.clone();
        let errors = enqueue_errors.clone();
        let hook = rx.url("/hook");
        tokio::spawn(async move {
            let ticks = (enqueue_for.as_millis() / 100) as usize;
            let per_tick = n.div_ceil(ticks);
            let mut i = 0;
            while i < n {
                let batch: Vec<Value> = (i..(i + per_tick).min(n))
                    .map(|j| {
                        let (key, kind) = intent_of(j);
                        let payload = match kind {
                            "webhook" => json!({"url": hook, "body": {"k": key}}),
                            "email" => json!({"to": [format!("user{j}@example.com")],
                                              "subject": key, "text": "chaos"}),
                            "nats" => json!({"subject": "chaos.events", "body": {"k": key}}),
                            "amqp" => json!({"exchange": "chaos", "routing_key": "e",
                                             "body": {"k": key}}),
                            "kafka" => json!({"topic": "chaos", "body": {"k": key}}),
                            _ => json!({"amount": 100 + j, "currency": "usd",
                                        // one charge in six takes 1.5 s at Stripe, so
                                        // kills catch some mid-request and reconcile
                                        // must find out what happened
                                        "payment_method": if j % 30 == 2 { "pm_slow" } else { "pm_card_visa" },
                                        "description": key}),
                        };
                        json!({"k": key, "kind": kind, "payload": payload})
                    })
                    .collect();
                loop {
                    let r = sqlx::query(
                        "SELECT outbox.enqueue(x.k, x.kind, x.payload)
                           FROM jsonb_to_recordset($1) AS x(k text, kind text, payload jsonb)",
                    )
                    .bind(Value::Array(batch.clone()))
                    .execute(&pool)
                    .await;
                    match r {
                        Ok(_) => break,
                        Err(_) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                    }
                }
                i += batch.len();
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };

    // the killer: SIGKILL a random relay every `kill_every` and restart it,
    // until the enqueuer is done and a little after
    let kills = Arc::new(AtomicUsize::new(0));
    let kill_until = Instant::now() + enqueue_for + Duration::from_secs(5);
    let killer = {
        let relays = relays.clone();
        let kills = kills.clone();
        let url = cluster.url.clone();
        let config = config.clone();
        let stripe_base = stripe.base.clone();
        tokio::spawn(async move {
            let mut generation = 0;
            while Instant::now() < kill_until {
                tokio::time::sleep(kill_every.mul_f64(0.75 + fastrand::f64() * 0.5)).await;
                generation += 1;
                let victim = fastrand::usize(..RELAYS);
                let mut relays = relays.lock().await;
                let _ = relays[victim].start_kill();
                let _ = relays[victim].wait().await;
                kills.fetch_add(1, Ordering::Relaxed);
                relays[victim] = spawn_relay(
                    &url,
                    &config,
                    &stripe_base,
                    &format!("relay-{victim}-{generation}"),
                );
            }
        })
    };

    // the brokers and Postgres are each killed and restarted once while
    // the enqueueing goes on: NATS at a quarter, Postgres half way, RabbitMQ
    // at three quarters (its node takes seconds to start: amqp intents wait)
    tokio::time::sleep(enqueue_for / 4).await;
    let nats_restart_took = nats.restart().await;
    eprintln!("chaos: nats-server restarted in {nats_restart_took:?}");
    tokio::time::sleep(enqueue_for / 4).await;
    let restart_took = tokio::task::block_in_place(|| cluster.restart());
    eprintln!("chaos: Postgres restarted in {restart_took:?}");
    tokio::time::sleep(enqueue_for / 4).await;
    let rabbit_began = Instant::now();
    rabbit_node.kill().await;
    rabbit_node.up().await;
    let rabbit_restart_took = rabbit_began.elapsed();
    eprintln!("chaos: RabbitMQ restarted in {rabbit_restart_took:?}");

    enqueuer.await.unwrap();
    killer.await.unwrap();
    eprintln!(
        "chaos: {n} intents enqueued, {} kills; waiting for every intent to settle",
        kills.load(Ordering::Relaxed)
    );

    // settle: nothing pending or claimed
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut open = i64::MAX;
    while Instant::now() < deadline {
        open = sqlx::query_scalar(
            "SELECT count(*) FROM outbox.intents WHERE state IN ('pending', 'claimed')",
        )
        .fetch_one(&pool)
        .await
        .unwrap_or(i64::MAX);
        if open == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    for relay in relays.lock().await.iter_mut() {
        common::terminate(relay).await;
    }
    let elapsed = started.elapsed();

    // ---- the figures --------------------------------------------------
    let states: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT kind, state, count(*) FROM outbox.intents GROUP BY 1, 2 ORDER BY 1, 2",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let intents: Vec<(String, String, String, Option<String>)> =
        sqlx::query_as("SELECT key, kind, state, last_error FROM outbox.intents")
            .fetch_all(&pool)
            .await
            .unwrap();
    // per kind: the leases lost to kills and the attempts that ended
    // ambiguous (a confirm that never came)
    let explained: HashMap<String, (i64, i64)> = sqlx::query_as::<_, (String, i64, i64)>(
        "SELECT i.kind, count(*) FILTER (WHERE a.outcome = 'lost'),
                count(*) FILTER (WHERE a.outcome = 'ambiguous')
           FROM outbox.attempt_history a JOIN outbox.intents i ON i.id = a.intent_id
          GROUP BY 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap()
    .into_iter()
    .map(|(k, l, a)| (k, (l, a)))
    .collect();
    let (attempts, stale, lost, replayed): (i64, i64, i64, i64) = sqlx::query_as(
        "SELECT count(*),
                count(*) FILTER (WHERE NOT accepted),
                count(*) FILTER (WHERE outcome = 'lost'),
                count(*) FILTER (WHERE replayed)
           FROM outbox.attempt_history",
    )
    .fetch_one(&pool)
    .await
    .unwrap();

    let answers = answers.lock().unwrap().clone();
    let webhook_500 = answers.iter().filter(|a| a.status == 500).count();
    let stalls = answers.iter().filter(|a| a.stalled).count();
    let mut webhook_effects: HashMap<&str, usize> = HashMap::new();
    let mut webhook_ids: HashMap<&str, HashSet<&str>> = HashMap::new();
    for a in &answers {
        if a.status == 200 {
            *webhook_effects.entry(&a.intent).or_default() += 1;
        }
        webhook_ids
            .entry(&a.intent)
            .or_default()
            .insert(&a.webhook_id);
    }
    let webhook_dups: usize = webhook_effects.values().map(|c| c - 1).sum();

    let messages = smtp.messages();
    let header = |data: &str, name: &str| {
        data.lines()
            .find(|l| {
                l.len() > name.len()
                    && l[..name.len()].eq_ignore_ascii_case(name)
                    && l.as_bytes()[name.len()] == b':'
            })
            .map(|l| l[name.len() + 1..].trim().to_string())
            .unwrap_or_default()
    };
    let mut email_effects: HashMap<String, usize> = HashMap::new();
    let mut email_ids: HashMap<String, HashSet<String>> = HashMap::new();
    let mut smtp_drops = 0;
    for m in &messages {
        let data = m["data"].as_str().unwrap_or_default();
        let subject = header(data, "Subject");
        // every message reached the server whole: a dropped one may have
        // been delivered too, as far as the relay can tell
        *email_effects.entry(subject.clone()).or_default() += 1;
        if m["dropped"].as_bool() == Some(true) {
            smtp_drops += 1;
        }
        email_ids
            .entry(subject)
            .or_default()
            .insert(header(data, "Message-ID"));
    }
    let email_dups: usize = email_effects.values().map(|c| c - 1).sum();

    let payments = stripe.fake.payments();
    let mut payments_per_intent: HashMap<String, usize> = HashMap::new();
    for p in &payments {
        let key = p["metadata"]["outbox_intent_key"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        *payments_per_intent.entry(key).or_default() += 1;
    }
    let stripe_requests = stripe.fake.requests();
    let stripe_replays = stripe_requests.iter().filter(|r| r.1).count();
    let stripe_keys: HashSet<&str> = stripe_requests.iter().map(|r| r.0.as_str()).collect();

    // the brokers: what the stream and the queue hold, by intent key
    let key_of = |body: &[u8]| {
        serde_json::from_slice::<Value>(body)
            .ok()
            .and_then(|b| b["k"].as_str().map(str::to_string))
            .unwrap_or_default()
    };
    let stream = nats.messages("CHAOS").await;
    let mut nats_effects: HashMap<String, usize> = HashMap::new();
    for (_, id, body) in &stream {
        let key = key_of(body.as_bytes());
        assert_eq!(
            id,
            &outbox_providers::nats::request::message_id(&key, 0),
            "{key}: the message carries its intent's id"
        );
        *nats_effects.entry(key).or_default() += 1;
    }
    let amqp_messages = {
        let conn = rabbit.connect().await;
        let ch = conn.create_channel().await.unwrap();
        drain(&ch, "chaos-q").await
    };
    let mut amqp_effects: HashMap<String, usize> = HashMap::new();
    for m in &amqp_messages {
        let key = key_of(&m.delivery.data);
        let id = m
            .delivery
            .properties
            .message_id()
            .as_ref()
            .map(|s| s.to_string());
        assert_eq!(
            id,
            Some(outbox_providers::amqp::request::message_id(&key, 0)),
            "{key}: the message carries its intent's message_id"
        );
        *amqp_effects.entry(key).or_default() += 1;
    }
    let amqp_dups: usize = amqp_effects.values().map(|c| c - 1).sum();
    let mut kafka_effects: HashMap<String, usize> = HashMap::new();
    for r in kafka.records("chaos", 3).await {
        let key = key_of(r.value.as_bytes());
        assert_eq!(
            r.headers.get("outbox-effect-key"),
            Some(&outbox_providers::kafka::request::effect_key(&key, 0)),
            "{key}: the record carries its intent's effect key"
        );
        *kafka_effects.entry(key).or_default() += 1;
    }
    let (amqp_lost, amqp_ambiguous) = explained.get("amqp").copied().unwrap_or_default();

    let breaker_events: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT destination, event, count(*) FROM outbox.destination_events GROUP BY 1, 2 ORDER BY 1, 2",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let kills = kills.load(Ordering::Relaxed);
    eprintln!("\n=== chaos drill: {n} intents, {RELAYS} relays, {elapsed:.1?} ===");
    eprintln!(
        "faults: {kills} relay kills (SIGKILL), 1 Postgres restart ({restart_took:?}), \
         nats-server restart ({nats_restart_took:?}), RabbitMQ restart ({rabbit_restart_took:?}), \
         {webhook_500} webhook 500s, {stalls} webhook stalls past the timeout, \
         {smtp_drops} SMTP connections dropped after DATA, {} enqueue retries",
        enqueue_errors.load(Ordering::Relaxed)
    );
    eprintln!("intents by kind and state:");
    for (kind, state, count) in &states {
        eprintln!("  {kind:<8} {state:<10} {count}");
    }
    eprintln!(
        "attempts: {attempts} recorded, {stale} completions refused by the fence, \
         {lost} leases lost to kills and reconciled, {replayed} provider replays"
    );
    eprintln!(
        "webhook: {} requests, {} intents took effect, {webhook_dups} effects repeated",
        answers.len(),
        webhook_effects.len()
    );
    eprintln!(
        "email:   {} messages, {} intents took effect, {email_dups} messages repeated",
        messages.len(),
        email_effects.len()
    );
    eprintln!(
        "charge:  {} requests ({stripe_replays} answered from Stripe's idempotency store), \
         {} payments for {} intents",
        stripe_requests.len(),
        payments.len(),
        payments_per_intent.len()
    );
    eprintln!("breaker events: {breaker_events:?}");
    eprintln!(
        "nats:    {} messages in the stream for {} intents",
        stream.len(),
        nats_effects.len()
    );
    eprintln!(
        "kafka:   {} records in the topic for {} intents",
        kafka_effects.values().sum::<usize>(),
        kafka_effects.len()
    );
    eprintln!(
        "amqp:    {} messages in the queue for {} intents, {amqp_dups} repeated \
         ({amqp_lost} lost leases, {amqp_ambiguous} lost confirms)",
        amqp_messages.len(),
        amqp_effects.len()
    );
    eprintln!(
        "repeated effects explained by the faults: at most {lost} lost leases + {stalls} stalls \
         + {smtp_drops} drops = {}",
        lost as usize + stalls + smtp_drops
    );

    // ---- the verdict --------------------------------------------------
    assert_eq!(open, 0, "intents still open after the settle deadline");
    assert_eq!(intents.len(), n, "the intent count is unchanged");
    for (key, _, state, error) in &intents {
        match state.as_str() {
            "delivered" => {}
            "ambiguous" => assert!(
                error.as_deref().is_some_and(|e| !e.is_empty()),
                "{key} is ambiguous without a reason"
            ),
            // no input was bad and the retry budget is large: any other end
            // is a transient failure that ended terminal
            other => panic!("{key} ended {other}: {error:?}"),
        }
    }
    for (key, kind, state, _) in &intents {
        if state != "delivered" {
            continue;
        }
        match kind.as_str() {
            "webhook" => {
                assert!(
                    webhook_effects.contains_key(key.as_str()),
                    "{key} never took effect"
                );
                assert_eq!(webhook_ids[key.as_str()].len(), 1, "{key}: one webhook-id");
            }
            "email" => {
                assert!(email_effects.contains_key(key), "{key} never took effect");
                assert_eq!(email_ids[key].len(), 1, "{key}: one Message-ID");
            }
            "nats" => assert!(nats_effects.contains_key(key), "{key} is not in the stream"),
            // a confirm means the broker stored it, across its restart
            "amqp" => assert!(amqp_effects.contains_key(key), "{key} is not in the queue"),
            "kafka" => assert!(kafka_effects.contains_key(key), "{key} is not in the topic"),
            _ => assert_eq!(
                payments_per_intent.get(key),
                Some(&1),
                "{key}: exactly one payment"
            ),
        }
    }
    assert!(
        payments_per_intent.values().all(|&c| c == 1),
        "no payment was created twice"
    );
    // JetStream deduped every redelivery (kills mid-publish, the server's
    // restart): one message per intent, none for an intent that is not one
    assert!(
        nats_effects.values().all(|&c| c == 1),
        "a nats intent was published twice: {:?}",
        nats_effects
            .iter()
            .filter(|(_, &c)| c > 1)
            .collect::<Vec<_>>()
    );
    // a kill mid-publish is reconciled by reading the partition: one record
    // per intent, none republished
    assert!(
        kafka_effects.values().all(|&c| c == 1),
        "a kafka intent was written twice: {:?}",
        kafka_effects
            .iter()
            .filter(|(_, &c)| c > 1)
            .collect::<Vec<_>>()
    );
    let nats_keys: HashSet<&str> = intents
        .iter()
        .filter(|i| i.1 == "nats")
        .map(|i| i.0.as_str())
        .collect();
    assert!(nats_effects.keys().all(|k| nats_keys.contains(k.as_str())));
    // RabbitMQ does not dedupe: a repeat needs a lease lost to a kill or a
    // confirm lost with the broker
    assert!(
        amqp_dups <= (amqp_lost + amqp_ambiguous) as usize,
        "more repeated amqp messages ({amqp_dups}) than lost leases and confirms explain"
    );
    // each charge reached Stripe under one idempotency key: every key sent
    // is the one its intent's payment carries, one payment per intent
    let payment_keys: HashSet<&str> = payments
        .iter()
        .filter_map(|p| p["metadata"]["outbox_idempotency_key"].as_str())
        .collect();
    let charge_intents = intents.iter().filter(|i| i.1 == "charge").count();
    assert_eq!(
        payment_keys.len(),
        charge_intents,
        "one key per charge intent"
    );
    assert_eq!(
        stripe_keys, payment_keys,
        "every request to Stripe used its intent's one key"
    );
    // A repeated effect needs a cause: a relay killed after the effect but
    // before its completion was written (its lease is then reconciled as
    // `lost` and, for a receiver that dedupes, redelivered under the same
    // key), a request that outlived its timeout, or a mail dropped after DATA.
    assert!(
        webhook_dups + email_dups <= lost as usize + stalls + smtp_drops,
        "more repeated effects ({webhook_dups} webhook, {email_dups} email) than the faults explain"
    );
    assert!(kills > 0, "the drill killed relays");
    std::fs::remove_file(config).ok();
}

//! Rolling upgrade under load: three relays of the previous version (a
//! pinned commit of this repository, built once per machine by
//! deploy/lib/previous-relay.sh) deliver webhooks and NATS events while the
//! application enqueues; the upgrade follows the procedure in
//! docs/operating/production.md step by step (the test reads it there and
//! fails when the page says anything else), with this build as the new
//! version; kafka, a kind the old relays do not know, is enqueued during
//! the roll.
//!
//! Asserted: nothing lost, nothing rejected (the kafka intents least of
//! all), everything delivered; each webhook under one `webhook-id`, each
//! NATS event stored once per `Nats-Msg-Id`, each Kafka record once per
//! `outbox-effect-key`; every claim an old relay made was completed by it
//! (none left claimed, none of its completions refused); the old relays
//! stopped cleanly.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;

use crate::common::kafka::Broker;
use crate::common::nats::NatsServer;
use crate::common::{self, Receiver, TestDb};

/// The upgrade procedure, as docs/operating/production.md lists it under
/// "Upgrades"; the test performs these steps in this order.
const PROCEDURE: [&str; 4] = [
    "Run `outbox-relay migrate` with the new binary, while the old relays run.",
    "Re-run `deploy/sql/roles.sql` as the database owner.",
    "Replace the relays one at a time: stop one with SIGTERM (it finishes the deliveries in flight and hands back the claims it has not started), start the new binary in its place, and wait until its `/readyz` answers 200 before the next.",
    "Enqueue a kind the new version adds once a new relay runs: until one does, an old relay rejects it as unknown.",
];

/// The numbered steps under "## Upgrades" in the production page.
fn documented_procedure() -> Vec<String> {
    let page = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/operating/production.md"
    ))
    .unwrap();
    let section = page
        .split("\n## Upgrades\n")
        .nth(1)
        .expect("production.md has an Upgrades section");
    let section = section.split("\n## ").next().unwrap_or_default();
    let mut steps: Vec<String> = Vec::new();
    for line in section.lines() {
        let numbered = line
            .split_once(". ")
            .filter(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
        match numbered {
            Some((_, text)) => steps.push(text.trim().to_string()),
            None if line.starts_with("   ") && !steps.is_empty() => {
                let last = steps.last_mut().unwrap();
                last.push(' ');
                last.push_str(line.trim());
            }
            None => {}
        }
    }
    steps
}

/// The previous relay: $OUTBOX_TEST_PREVIOUS_RELAY, which tests/run.sh sets
/// (deploy/lib/previous-relay.sh builds it once per machine).
fn previous_relay() -> PathBuf {
    match std::env::var("OUTBOX_TEST_PREVIOUS_RELAY") {
        Ok(v) if v.starts_with("unavailable:") => panic!(
            "the previous relay is unavailable: {}",
            &v["unavailable:".len()..]
        ),
        Ok(v) => PathBuf::from(v),
        Err(_) => panic!(
            "OUTBOX_TEST_PREVIOUS_RELAY is not set: run the suite with tests/run.sh, which \
             builds the previous relay once per machine (deploy/lib/previous-relay.sh)"
        ),
    }
}

fn spawn(
    bin: &std::path::Path,
    db: &TestDb,
    config: &std::path::Path,
    name: &str,
    port: u16,
) -> tokio::process::Child {
    common::relay_command_of(bin, &db.url)
        .arg("run")
        .env("OUTBOX_RELAY_CONFIG", config)
        .env("OUTBOX_RELAY__RELAY__NAME", format!("\"{name}\""))
        .env(
            "OUTBOX_RELAY__RELAY__METRICS_ADDR",
            format!("\"127.0.0.1:{port}\""),
        )
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .expect("spawn relay")
}

async fn ready(http: &reqwest::Client, port: u16) -> bool {
    common::wait_for(Duration::from_secs(20), || async {
        http.get(format!("http://127.0.0.1:{port}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status() == 200)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_upgrade_under_load_loses_nothing_and_keys_every_effect_once() {
    assert_eq!(
        documented_procedure(),
        PROCEDURE,
        "docs/operating/production.md's upgrade procedure is not the one this test performs"
    );
    let old = previous_relay();
    let new = common::relay_bin();
    let db = TestDb::unmigrated().await;
    let out = tokio::process::Command::new(&old)
        .arg("migrate")
        .env("DATABASE_URL", &db.url)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "the previous relay's migrate: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let seen: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let log = seen.clone();
    let rx = Receiver::start(move |req, _| {
        let key = req.body_str("k");
        log.lock().unwrap().push((key, req.webhook_id()));
        common::Reply::status(200).after(Duration::from_millis(fastrand::u64(5..30)))
    })
    .await;
    let nats = NatsServer::start().await;
    nats.jetstream()
        .await
        .create_stream(async_nats::jetstream::stream::Config {
            name: "UP".into(),
            subjects: vec!["up.>".into()],
            ..Default::default()
        })
        .await
        .unwrap();
    let kafka = Broker::start().await;
    kafka.create_topic("up", 2).await;

    let base = format!(
        r#"
[relay]
concurrency = 16
batch_size = 16
lease = "10s"
poll_interval = "100ms"
sweep_interval = "250ms"
shutdown_timeout = "5s"

[retry]
schedule = ["100ms"]

[webhook]
timeout = "3s"

[nats]
url = "{}"
timeout = "3s"
"#,
        nats.url()
    );
    let old_config = common::config_file(&base);
    let new_config = common::config_file(&format!(
        "{base}\n[kafka]\nbrokers = \"{}\"\ntimeout = \"5s\"\n",
        kafka.brokers()
    ));
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    let ports: Vec<u16> = (0..3).map(|_| common::free_port()).collect();
    let mut relays: Vec<tokio::process::Child> = (0..3)
        .map(|r| spawn(&old, &db, &old_config, &format!("old-{r}"), ports[r]))
        .collect();
    for port in &ports {
        assert!(
            ready(&http, *port).await,
            "an old relay did not become ready"
        );
    }

    // the application: webhooks and NATS events throughout, kafka events
    // once it is allowed to
    let enqueueing = Arc::new(AtomicBool::new(true));
    let kafka_allowed = Arc::new(AtomicBool::new(false));
    let app = {
        let pool = db.pool().clone();
        let hook = rx.url("/hook");
        let (enqueueing, kafka_allowed) = (enqueueing.clone(), kafka_allowed.clone());
        tokio::spawn(async move {
            let mut kinds: HashMap<&'static str, usize> = HashMap::new();
            let mut i = 0usize;
            while enqueueing.load(Ordering::SeqCst) {
                let kind = match i % 3 {
                    2 if kafka_allowed.load(Ordering::SeqCst) => "kafka",
                    1 => "nats",
                    _ => "webhook",
                };
                let key = format!("up-{kind}-{i}");
                let payload = match kind {
                    "webhook" => json!({"url": hook, "body": {"k": key}}),
                    "nats" => json!({"subject": "up.events", "body": {"k": key}}),
                    _ => json!({"topic": "up", "key": key, "body": {"k": key}}),
                };
                sqlx::query("SELECT outbox.enqueue($1, $2, $3)")
                    .bind(&key)
                    .bind(kind)
                    .bind(payload)
                    .execute(&pool)
                    .await
                    .unwrap();
                *kinds.entry(kind).or_default() += 1;
                i += 1;
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
            kinds
        })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;

    // 1. migrate with the new binary while the old relays run
    eprintln!("upgrade: {}", PROCEDURE[0]);
    let out = common::relay_command(&db.url)
        .arg("migrate")
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "migrate: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // 2. roles.sql
    eprintln!("upgrade: {}", PROCEDURE[1]);
    let roles =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/sql/roles.sql"))
            .unwrap();
    sqlx::raw_sql(&roles)
        .execute(db.pool())
        .await
        .expect("roles.sql applies");
    tokio::time::sleep(Duration::from_secs(2)).await;
    // 3. one relay at a time; 4. the new kind once a new relay runs
    eprintln!("upgrade: {}", PROCEDURE[2]);
    for r in 0..3 {
        let status = common::terminate(&mut relays[r]).await;
        assert!(
            status.success(),
            "old relay {r} did not stop cleanly: {status}"
        );
        relays[r] = spawn(&new, &db, &new_config, &format!("new-{r}"), ports[r]);
        assert!(
            ready(&http, ports[r]).await,
            "new relay {r} did not become ready"
        );
        if r == 0 {
            eprintln!("upgrade: {}", PROCEDURE[3]);
            kafka_allowed.store(true, Ordering::SeqCst);
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    enqueueing.store(false, Ordering::SeqCst);
    let enqueued = app.await.unwrap();
    let total: usize = enqueued.values().sum();
    assert!(
        enqueued.get("kafka").copied().unwrap_or(0) > 0,
        "no kafka intent was enqueued during the roll"
    );

    let drained = common::wait_for(Duration::from_secs(60), || async {
        db.count("state = 'delivered'").await == total as i64
    })
    .await;
    let states: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT kind, state::text, count(*) FROM outbox.intents GROUP BY 1, 2 ORDER BY 1, 2",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    assert!(
        drained,
        "not everything was delivered after the upgrade: {states:?} of {enqueued:?}"
    );
    assert_eq!(db.count("true").await, total as i64, "intents were lost");

    // each effect under one key
    let seen = seen.lock().unwrap().clone();
    let mut ids: HashMap<&str, HashSet<&str>> = HashMap::new();
    for (key, id) in &seen {
        ids.entry(key).or_default().insert(id);
    }
    assert_eq!(
        ids.len(),
        enqueued["webhook"],
        "webhooks missing at the receiver"
    );
    assert!(
        ids.values().all(|s| s.len() == 1),
        "a webhook went out under two webhook-ids"
    );
    let events = nats.messages("UP").await;
    let msg_ids: HashSet<&str> = events.iter().map(|e| e.1.as_str()).collect();
    assert_eq!(
        (events.len(), msg_ids.len()),
        (enqueued["nats"], enqueued["nats"]),
        "NATS events are not exactly one per intent"
    );
    let records = kafka.records("up", 2).await;
    let effect_keys: HashSet<&str> = records
        .iter()
        .filter_map(|r| r.headers.get("outbox-effect-key").map(String::as_str))
        .collect();
    assert_eq!(
        (records.len(), effect_keys.len()),
        (enqueued["kafka"], enqueued["kafka"]),
        "Kafka records are not exactly one per intent"
    );

    // the old relays' claims: completed by them, none refused, none left
    let (old_attempts, old_refused, new_attempts, kafka_by_old): (i64, i64, i64, i64) =
        sqlx::query_as(
            "SELECT count(*) FILTER (WHERE a.owner LIKE 'old-%'),
                count(*) FILTER (WHERE a.owner LIKE 'old-%' AND NOT a.accepted),
                count(*) FILTER (WHERE a.owner LIKE 'new-%'),
                count(*) FILTER (WHERE a.owner LIKE 'old-%' AND i.kind = 'kafka')
           FROM outbox.attempt_history a JOIN outbox.intents i ON i.id = a.intent_id",
        )
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert!(old_attempts > 0 && new_attempts > 0);
    assert_eq!(old_refused, 0, "an old relay's completion was refused");
    assert_eq!(
        kafka_by_old, 0,
        "an old relay attempted a kind it does not know"
    );
    for relay in relays.iter_mut() {
        common::terminate(relay).await;
    }
    eprintln!(
        "upgrade drill: {total} intents ({enqueued:?}), all delivered; {old_attempts} attempts by \
         the old relays, {new_attempts} by the new; {} webhook requests for {} webhooks",
        seen.len(),
        ids.len()
    );
}

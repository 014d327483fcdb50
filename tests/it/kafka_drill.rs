//! The kafka kind under faults: 2,000 intents over four partitions through
//! two relay processes, one SIGKILLed mid-publish and restarted, and the
//! network to the broker cut for longer than a delivery report may take (a
//! proxy between the relays and Tansu, which advertises the proxy). Every
//! intent ends delivered, the topic holds exactly one record per
//! `outbox-effect-key`, and each intent's reference names its record.

use std::collections::HashMap;
use std::time::Duration;

use outbox_providers::kafka::request::effect_key;

use crate::common::kafka::{Broker, Mode, Proxy};
use crate::common::{config_file, free_port, spawn_relay, terminate, wait_for, TestDb};

const INTENTS: usize = 2000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_intent_is_one_record_despite_a_sigkilled_relay_and_a_cut_network() {
    let db = TestDb::new().await;
    let (port, proxy_port) = (free_port(), free_port());
    let broker = Broker::start_advertising(port, proxy_port).await;
    let proxy = Proxy::start(proxy_port, port).await;
    broker.create_topic("drill", 4).await;
    // a third keyed by account (one partition per key, in order), the rest
    // keyless (any partition)
    let mut tx = db.pool().begin().await.unwrap();
    for n in 0..INTENTS {
        let ordering = (n % 3 == 0).then(|| format!("acct-{}", n % 40));
        sqlx::query("SELECT outbox.enqueue($1, 'kafka', $2::text::jsonb, p_ordering_key => $3)")
            .bind(format!("drill:{n}"))
            .bind(format!(r#"{{"topic": "drill", "body": {{"n": {n}}}}}"#))
            .bind(ordering)
            .execute(&mut *tx)
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    // the cut opens the cluster's breaker (many failures in a row): a short
    // cooldown keeps the drill short
    let cfg =
        config_file(&format!(
        "{}\n[kafka]\nbrokers = \"127.0.0.1:{proxy_port}\"\ntimeout = \"3s\"\nlinger = \"2ms\"\n\
         [breaker]\ncooldown = \"2s\"\nmax_cooldown = \"4s\"\n",
        // room in the lease for a whole attempt after a slow claim
        // and a retry budget the faults cannot spend
        crate::common::SUBPROCESS_CONFIG
            .replace("lease = \"4s\"", "lease = \"6s\"")
            // a retry's first delay as a deployment would have it (5 s by
            // default): time for a record still in flight when an attempt
            // gave up to land before the retry searches for it
            .replace("schedule = [\"50ms\"]", "max_attempts = 1000\nschedule = [\"1s\"]")
    ));
    let mut relays = vec![
        spawn_relay(&db, &cfg, "kafka-0"),
        spawn_relay(&db, &cfg, "kafka-1"),
    ];
    let delivered = || db.count("state = 'delivered'");

    // a relay killed mid-publish, restarted
    assert!(
        wait_for(Duration::from_secs(60), || async {
            delivered().await >= 300
        })
        .await,
        "300 delivered before the kill"
    );
    relays[0].start_kill().unwrap();
    relays[0].wait().await.unwrap();
    relays[0] = spawn_relay(&db, &cfg, "kafka-0b");

    // the network cut for three times a delivery report's wait
    let before_cut = delivered().await;
    assert!(
        wait_for(Duration::from_secs(60), || async {
            delivered().await >= before_cut + 300
        })
        .await,
        "300 more delivered before the cut"
    );
    proxy.set(Mode::Cut);
    tokio::time::sleep(Duration::from_secs(3)).await;
    proxy.set(Mode::Pass);

    let done = wait_for(Duration::from_secs(150), || async {
        delivered().await == INTENTS as i64
    })
    .await;
    for r in &mut relays {
        terminate(r).await;
    }
    let states: Vec<(String, i64)> =
        sqlx::query_as("SELECT state, count(*) FROM outbox.intents GROUP BY state")
            .fetch_all(db.pool())
            .await
            .unwrap();
    assert!(done, "every intent delivered: {states:?}");

    let records = broker.records("drill", 4).await;
    let mut by_effect: HashMap<String, Vec<String>> = HashMap::new();
    for r in &records {
        let key = r
            .headers
            .get("outbox-effect-key")
            .cloned()
            .unwrap_or_default();
        by_effect
            .entry(key)
            .or_default()
            .push(format!("drill:{}:{}", r.partition, r.offset));
    }
    let refs: Vec<(String, Option<String>)> =
        sqlx::query_as("SELECT key, provider_ref FROM outbox.intents")
            .fetch_all(db.pool())
            .await
            .unwrap();
    let mut wrong = Vec::new();
    for (key, reference) in &refs {
        match by_effect.get(&effect_key(key, 0)) {
            Some(found) if found.len() == 1 && reference.as_ref() == Some(&found[0]) => {}
            other => wrong.push(format!("{key}: reference {reference:?}, records {other:?}")),
        }
    }
    assert!(
        wrong.is_empty() && records.len() == INTENTS,
        "{} records for {INTENTS} intents; {} wrong, e.g. {:?}",
        records.len(),
        wrong.len(),
        &wrong[..wrong.len().min(5)]
    );
    std::fs::remove_file(cfg).ok();
}

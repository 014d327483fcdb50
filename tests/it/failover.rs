//! Failover drill: a primary and an asynchronous streaming standby
//! (pg_basebackup -R) behind HAProxy, whose health check sends connections
//! to whichever node is primary, with `pg_receivewal --synchronous`
//! archiving the primary's WAL beside the standby (a walsender that streams
//! and flushes at once, but no server a failover can promote). Three relay processes drain webhooks to a
//! receiver that records each `webhook-id` while the application keeps
//! enqueueing; mid-drain the standby stops streaming (its
//! `primary_conninfo` cleared and reloaded), two seconds later the primary
//! is SIGKILLed with all its processes, the standby promoted and HAProxy
//! switches to it: the primary's last commits are lost, as an asynchronous
//! failover loses them.
//!
//! Asserted: the relays reconnect by themselves (none restarted), `/readyz`
//! answers 503 while no database does and 200 after; every intent on the
//! new primary ends delivered; every intent acknowledged after the
//! failover is there; an intent delivered twice was delivered under one
//! `webhook-id`, and every repeat is accounted for by a completion the
//! failover lost. With `relay.wait_for_standbys = 1` no webhook is sent for
//! an intent the new primary does not have (deliveries wait while the
//! standby lags, and resume once a standby rebuilt from the new primary
//! catches up); with 0, some are, and the drill counts them.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde_json::json;
use sqlx::Connection;

use crate::common;
use crate::common::cluster::Cluster;
use crate::common::failover::Haproxy;
use crate::common::{Receiver, Reply};
use outbox_relay::store::Store;

const RELAYS: usize = 3;

/// What one run of the drill saw.
#[derive(Debug)]
struct Figures {
    /// Intents whose enqueue the application saw commit.
    acknowledged: usize,
    /// Of those, committed on the old primary and lost with it.
    lost_intents: usize,
    /// Intents on the new primary (all ended delivered).
    on_new_primary: usize,
    /// Intents the receiver saw before the kill and again after it: their
    /// completion was lost with the old primary's last commits.
    lost_completions: usize,
    /// Intents the receiver saw more than once.
    repeats: usize,
    /// Webhooks sent for intents the new primary does not have.
    effects_without_intent: usize,
    /// From the kill to the first delivery the new primary recorded.
    kill_to_first_delivery: Duration,
    /// How long deliveries were held up by `relay.wait_for_standbys`, as
    /// `stats` reported it just before the kill (0 when not waiting).
    held_up_before_kill: f64,
}

impl Figures {
    /// The figures as the drill prints them.
    fn report(&self, wait_for_standbys: u32) -> String {
        format!(
            "failover drill (relay.wait_for_standbys = {wait_for_standbys}): {} intents acknowledged, \
             {} lost with the old primary, {} on the new primary (all delivered); {} completions \
             lost, {} intents repeated at the receiver (each under one webhook-id); {} webhooks \
             sent for intents the failover lost; deliveries held up {:.1}s before the kill; \
             first delivery on the new primary {:.1}s after the kill",
            self.acknowledged,
            self.lost_intents,
            self.on_new_primary,
            self.lost_completions,
            self.repeats,
            self.effects_without_intent,
            self.held_up_before_kill,
            self.kill_to_first_delivery.as_secs_f64(),
        )
    }
}

fn spawn_relay(
    url: &str,
    config: &std::path::Path,
    name: &str,
    port: u16,
    log: &PathBuf,
) -> tokio::process::Child {
    let log = std::fs::File::create(log).unwrap();
    common::relay_command(url)
        .arg("run")
        .env("OUTBOX_RELAY_CONFIG", config)
        .env("OUTBOX_RELAY__RELAY__NAME", format!("\"{name}\""))
        .env(
            "OUTBOX_RELAY__RELAY__METRICS_ADDR",
            format!("\"127.0.0.1:{port}\""),
        )
        .env("RUST_LOG", "warn,outbox_relay::engine::standbys=debug")
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn relay")
}

/// Each relay's `/readyz` status (0 when it does not answer).
async fn readiness(http: &reqwest::Client, ports: &[u16]) -> Vec<u16> {
    let mut out = Vec::new();
    for port in ports {
        let status = http
            .get(format!("http://127.0.0.1:{port}/readyz"))
            .send()
            .await
            .map_or(0, |r| r.status().as_u16());
        out.push(status);
    }
    out
}

async fn drill(wait_for_standbys: u32) -> Figures {
    let primary = Cluster::start("failover-primary");
    let standby = tokio::task::block_in_place(|| primary.replica("failover-standby"));
    let archiver = tokio::task::block_in_place(|| primary.archive_wal(None));
    let proxy = Haproxy::start(&[
        (&primary.url, primary.port()),
        (&standby.url, standby.port()),
    ])
    .await;
    let store = Store::connect(&proxy.url, 2).await.unwrap();
    store.migrate().await.unwrap();

    // the receiver: every request, with its key and webhook-id
    let seen: Arc<Mutex<Vec<(String, String, Instant)>>> = Arc::default();
    let log = seen.clone();
    let rx = Receiver::start(move |req, _| {
        let key = req.body_str("k");
        log.lock()
            .unwrap()
            .push((key, req.webhook_id(), Instant::now()));
        Reply::status(200).after(Duration::from_millis(fastrand::u64(5..20)))
    })
    .await;

    let config = common::config_file(&format!(
        r#"
[relay]
concurrency = 16
batch_size = 16
lease = "4s"
poll_interval = "100ms"
sweep_interval = "250ms"
shutdown_timeout = "2s"
wait_for_standbys = {wait_for_standbys}

[retry]
max_attempts = 1000
schedule = ["100ms", "200ms"]

[webhook]
timeout = "2s"
connect_timeout = "500ms"
allowed_networks = ["127.0.0.0/8"]
"#
    ));
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "failover-{}-{wait_for_standbys}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let ports: Vec<u16> = (0..RELAYS).map(|_| common::free_port()).collect();
    let logs: Vec<PathBuf> = (0..RELAYS)
        .map(|r| dir.join(format!("relay-{r}.log")))
        .collect();
    let mut relays: Vec<tokio::process::Child> = (0..RELAYS)
        .map(|r| {
            spawn_relay(
                &proxy.url,
                &config,
                &format!("relay-{r}"),
                ports[r],
                &logs[r],
            )
        })
        .collect();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()
        .unwrap();

    // the application: one intent per transaction, each retried under its
    // key until it commits; the acknowledged ones are noted
    let acked: Arc<Mutex<Vec<(String, Instant)>>> = Arc::default();
    let enqueueing = Arc::new(AtomicBool::new(true));
    let app = {
        let url = proxy.url.clone();
        let hook = rx.url("/hook");
        let acked = acked.clone();
        let enqueueing = enqueueing.clone();
        tokio::spawn(async move {
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(2)
                .acquire_timeout(Duration::from_secs(1))
                .connect_lazy(&url)
                .unwrap();
            let mut i = 0;
            while enqueueing.load(Ordering::SeqCst) {
                let key = format!("failover-{i}");
                let done = sqlx::query("SELECT outbox.enqueue($1, 'webhook', $2)")
                    .bind(&key)
                    .bind(json!({"url": hook, "body": {"k": key}}))
                    .execute(&pool)
                    .await;
                match done {
                    Ok(_) => {
                        acked.lock().unwrap().push((key, Instant::now()));
                        i += 1;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        })
    };

    // steady state, then the standby stops streaming; the archiver goes on
    tokio::time::sleep(Duration::from_secs(4)).await;
    let walsenders = |primary_url: String| async move {
        let mut c = sqlx::PgConnection::connect(&primary_url).await.unwrap();
        let names: Vec<String> = sqlx::query_scalar(
            "SELECT application_name FROM pg_stat_replication WHERE state = 'streaming'
              ORDER BY application_name",
        )
        .fetch_all(&mut c)
        .await
        .unwrap();
        names
    };
    let before = walsenders(primary.url.clone()).await;
    assert!(
        before.len() == 2 && before.iter().any(|n| n == "pg_receivewal"),
        "the standby and the archiver are not both streaming: {before:?}"
    );
    let mut on_standby = sqlx::PgConnection::connect(&standby.url).await.unwrap();
    for sql in [
        "ALTER SYSTEM SET primary_conninfo = ''",
        "SELECT pg_reload_conf()",
    ] {
        sqlx::raw_sql(sql).execute(&mut on_standby).await.unwrap();
    }
    on_standby.close().await.ok();
    let stopped = common::wait_for(Duration::from_secs(10), || async {
        walsenders(primary.url.clone()).await == ["pg_receivewal"]
    })
    .await;
    assert!(
        stopped,
        "the standby kept streaming after its primary_conninfo was cleared, or the archiver \
         stopped"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let held_up_before_kill = store
        .stats()
        .await
        .unwrap()
        .standby_waits
        .iter()
        .map(|w| w.behind_seconds)
        .fold(0.0, f64::max);
    if wait_for_standbys > 0 {
        assert!(
            held_up_before_kill > 0.0,
            "with the standby stopped, stats shows no relay waiting for it"
        );
        let metrics = http
            .get(format!("http://127.0.0.1:{}/metrics", ports[0]))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            metrics
                .lines()
                .any(|l| l.starts_with("outbox_standbys_held_up 1")),
            "the held-up gauge is not 1 while the standby lags:\n{metrics}"
        );
    }

    // the primary dies with its last commits; the relays lose the database
    let kill_wall: DateTime<Utc> = Utc::now();
    let killed = Instant::now();
    tokio::task::block_in_place(|| primary.kill());
    let unready = common::wait_for(Duration::from_secs(10), || async {
        readiness(&http, &ports).await.contains(&503)
    })
    .await;
    assert!(
        unready,
        "no relay's /readyz said 503 while no database answered"
    );
    tokio::task::block_in_place(|| standby.promote());
    let promoted = killed.elapsed();

    // the application goes on against the new primary for a while
    tokio::time::sleep(Duration::from_secs(3)).await;
    enqueueing.store(false, Ordering::SeqCst);
    app.await.unwrap();
    // the new primary needs a standby of its own before deliveries that
    // wait for one go on: the old primary's node is rebuilt from it
    let rebuilt = (wait_for_standbys > 0)
        .then(|| tokio::task::block_in_place(|| standby.replica("failover-rebuilt")));

    // every intent on the new primary ends delivered, by the same relays
    let new_primary = Store::connect(&standby.url, 2).await.unwrap();
    let drained = common::wait_for(Duration::from_secs(60), || async {
        let left: i64 =
            sqlx::query_scalar("SELECT count(*) FROM outbox.intents WHERE state <> 'delivered'")
                .fetch_one(new_primary.pool())
                .await
                .unwrap_or(1);
        left == 0
    })
    .await;
    if !drained {
        for log in &logs {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(15).collect();
            eprintln!(
                "--- {}:\n{}",
                log.display(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        let states: Vec<(String, i64)> =
            sqlx::query_as("SELECT state::text, count(*) FROM outbox.intents GROUP BY 1")
                .fetch_all(new_primary.pool())
                .await
                .unwrap();
        panic!("intents on the new primary were not all delivered within 60 s: {states:?}");
    }
    for relay in relays.iter_mut() {
        assert!(
            relay.try_wait().unwrap().is_none(),
            "a relay exited during the failover instead of reconnecting"
        );
    }
    let ready = common::wait_for(Duration::from_secs(10), || async {
        readiness(&http, &ports).await.iter().all(|s| *s == 200)
    })
    .await;
    assert!(
        ready,
        "/readyz is not 200 on every relay after the failover"
    );

    // what the new primary holds, and what the receiver saw
    let rows: Vec<(String, DateTime<Utc>)> =
        sqlx::query_as("SELECT key, delivered_at FROM outbox.intents")
            .fetch_all(new_primary.pool())
            .await
            .unwrap();
    let present: HashSet<String> = rows.iter().map(|r| r.0.clone()).collect();
    let first_after = rows
        .iter()
        .filter(|r| r.1 > kill_wall)
        .map(|r| r.1)
        .min()
        .expect("something was delivered after the failover");
    let acked = acked.lock().unwrap().clone();
    for (key, at) in &acked {
        if *at > killed + promoted {
            assert!(
                present.contains(key),
                "{key} was acknowledged after the failover and is gone"
            );
        }
    }
    let seen = seen.lock().unwrap().clone();
    let mut by_key: HashMap<&str, Vec<(&str, Instant)>> = HashMap::new();
    for (key, id, at) in &seen {
        by_key.entry(key).or_default().push((id, *at));
    }
    let mut lost_completions = 0;
    let mut repeats = 0;
    let mut effects_without_intent = 0;
    for (key, requests) in &by_key {
        let ids: HashSet<&str> = requests.iter().map(|r| r.0).collect();
        assert_eq!(
            ids.len(),
            1,
            "{key} reached the receiver under several webhook-ids: {ids:?}"
        );
        if !present.contains(*key) {
            effects_without_intent += 1;
            continue;
        }
        let before = requests.iter().any(|r| r.1 < killed);
        let after = requests.iter().any(|r| r.1 > killed);
        if before && after {
            lost_completions += 1;
        }
        if requests.len() > 1 {
            repeats += 1;
            assert!(
                before && after,
                "{key} was delivered {} times, not across the failover: no lost completion explains it",
                requests.len()
            );
        }
    }
    for key in &present {
        assert!(
            by_key.contains_key(key.as_str()),
            "{key} is delivered on the new primary but never reached the receiver"
        );
    }
    if wait_for_standbys > 0 {
        let said = logs.iter().any(|l| {
            std::fs::read_to_string(l)
                .unwrap_or_default()
                .contains("deliveries wait: fewer than relay.wait_for_standbys standbys")
        });
        assert!(
            said,
            "no relay logged that its deliveries wait for standbys"
        );
    }
    for relay in relays.iter_mut() {
        common::terminate(relay).await;
    }
    drop(rebuilt);
    drop(archiver);
    Figures {
        acknowledged: acked.len(),
        lost_intents: acked.iter().filter(|(k, _)| !present.contains(k)).count(),
        on_new_primary: present.len(),
        lost_completions,
        repeats,
        effects_without_intent,
        kill_to_first_delivery: (first_after - kill_wall).to_std().unwrap_or_default(),
        held_up_before_kill,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_with_wait_for_standbys_sends_no_webhook_for_an_intent_the_new_primary_lacks() {
    let f = drill(1).await;
    eprintln!("{}", f.report(1));
    assert!(
        f.lost_intents > 0,
        "the failover lost no commit: the standby did not fall behind"
    );
    assert_eq!(
        f.effects_without_intent, 0,
        "webhooks were sent for intents the failover lost"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_without_waiting_sends_webhooks_for_intents_the_failover_loses() {
    let f = drill(0).await;
    eprintln!("{}", f.report(0));
    assert!(
        f.lost_intents > 0,
        "the failover lost no commit: the standby did not fall behind"
    );
    // what the guard prevents: effects whose intents are gone
    assert!(
        f.effects_without_intent > 0,
        "no webhook was sent for a lost intent: the drill did not show the hazard"
    );
}

//! Schedules, retention with the ledger, "did it happen?" lookups, per-key ordering.

use std::collections::HashMap;
use std::time::Duration;

use crate::common;
use crate::common::logged::LoggedRelay;
use crate::common::{
    config, engine, relay_bin, run_until, spawn_relay, terminate, wait_for, Receiver, Reply, TestDb,
};
use outbox_relay::store::{enqueue, EnqueueError, NewIntent};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_relays_running_an_every_second_schedule_make_one_intent_per_tick() {
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    let cfg = common::config_file(&format!(
        "{}\n[[schedule]]\nname = \"heartbeat\"\ncron = \"* * * * * *\"\nkind = \"webhook\"\npayload = {{ url = \"{}\", body = {{ ping = true }} }}\n",
        common::SUBPROCESS_CONFIG,
        rx.url("/tick")
    ));
    let mut a = spawn_relay(&db, &cfg, "sched-a");
    let mut b = spawn_relay(&db, &cfg, "sched-b");
    assert!(
        wait_for(Duration::from_secs(30), || async {
            db.count("key LIKE 'schedule:heartbeat:%'").await >= 5
        })
        .await
    );
    assert!(terminate(&mut a).await.success());
    assert!(terminate(&mut b).await.success());

    let keys: Vec<String> = sqlx::query_scalar(
        "SELECT key FROM outbox.intents WHERE key LIKE 'schedule:%' ORDER BY key",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    let ticks: Vec<chrono::DateTime<chrono::Utc>> = keys
        .iter()
        .map(|k| k.trim_start_matches("schedule:heartbeat:").parse().unwrap())
        .collect();
    for pair in ticks.windows(2) {
        assert_eq!(
            (pair[1] - pair[0]).num_seconds(),
            1,
            "one intent per tick, none missing: {keys:?}"
        );
    }
    let duplicates: i64 = sqlx::query_scalar(
        "SELECT coalesce(sum(duplicates), 0)::bigint + (SELECT count(*) FROM outbox.enqueue_duplicates)
           FROM outbox.intents",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(
        duplicates, 0,
        "the relays took turns: no tick was even enqueued twice"
    );
    let delivered = rx.counts_by_id();
    assert!(
        delivered.values().all(|n| *n == 1),
        "each tick delivered once"
    );

    let out = common::cli(
        &db,
        &[
            "--config",
            cfg.to_str().unwrap(),
            "schedules",
            "--next",
            "2",
            "--json",
        ],
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed[0]["name"], "heartbeat");
    assert_eq!(listed[0]["next"].as_array().unwrap().len(), 2);
    assert!(listed[0]["last_tick"].is_string());
    std::fs::remove_file(cfg).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purged_key_is_still_known_to_enqueue_show_and_the_lookup_endpoint() {
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    let payload = json!({"url": rx.url("/"), "body": {"order": 9}});
    let id = db.enqueue("order:9", "webhook", payload.clone()).await;
    engine(db.store.clone(), &config())
        .run_once()
        .await
        .unwrap();
    let purged = db
        .store
        .purge(Duration::ZERO, false, false, 1000)
        .await
        .unwrap();
    assert_eq!(purged, 1);
    assert_eq!(db.count("true").await, 0);

    // the same operation again: a duplicate of the purged intent, nothing new
    let again = enqueue(
        db.pool(),
        &NewIntent::new("order:9", "webhook", payload.clone()),
    )
    .await
    .unwrap();
    assert_eq!((again.id, again.duplicate), (id, true));
    assert_eq!(db.count("true").await, 0, "no new intent, no second effect");
    // another operation under the same key: still a conflict
    let e = enqueue(
        db.pool(),
        &NewIntent::new(
            "order:9",
            "webhook",
            json!({"url": rx.url("/"), "body": {"order": 10}}),
        ),
    )
    .await
    .unwrap_err();
    assert!(matches!(e, EnqueueError::Conflict { .. }), "{e:?}");
    assert_eq!(rx.requests().len(), 1);

    let out = common::cli(&db, &["show", "order:9", "--json"]).await;
    assert!(out.status.success());
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (shown["source"].as_str(), shown["state"].as_str()),
        (Some("ledger"), Some("delivered"))
    );
    assert!(shown["provider_ref"].as_str().unwrap().starts_with("msg_"));

    // the daemon answers "did it happen?" over HTTP, live or purged
    db.enqueue("order:live", "webhook", payload.clone()).await;
    let port = common::free_port();
    let cfg = common::config_file(&common::SUBPROCESS_CONFIG.replace(
        "[relay]",
        &format!("[relay]\nmetrics_addr = \"127.0.0.1:{port}\""),
    ));
    let mut relay = tokio::process::Command::new(relay_bin())
        .args(["--config", cfg.to_str().unwrap(), "run"])
        .env("DATABASE_URL", &db.url)
        .env("RUST_LOG", "warn")
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let get = |key: &'static str| async move {
        let r = reqwest::get(format!("http://127.0.0.1:{port}/v1/intents/{key}"))
            .await
            .ok()?;
        Some((
            r.status().as_u16(),
            r.json::<serde_json::Value>().await.ok()?,
        ))
    };
    assert!(
        wait_for(Duration::from_secs(20), || async {
            get("order:live")
                .await
                .is_some_and(|(_, b)| b["state"] == "delivered")
        })
        .await
    );
    let (status, body) = get("order:9").await.unwrap();
    assert_eq!(
        (status, body["source"].as_str(), body["state"].as_str()),
        (200, Some("ledger"), Some("delivered"))
    );
    let (status, body) = get("order:live").await.unwrap();
    assert_eq!((status, body["source"].as_str()), (200, Some("live")));
    let (status, _) = get("never-enqueued").await.unwrap();
    assert_eq!(status, 404);
    terminate(&mut relay).await;
    std::fs::remove_file(cfg).ok();

    // past the ledger's retention the key is a stranger: that is the retry deadline
    assert_eq!(db.store.purge_ledger(Duration::ZERO, 100).await.unwrap(), 1);
    let fresh = enqueue(db.pool(), &NewIntent::new("order:9", "webhook", payload))
        .await
        .unwrap();
    assert!(!fresh.duplicate);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purging_100k_delivered_rows_in_batches_while_deliveries_continue() {
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    sqlx::query(
        "INSERT INTO outbox.intents (key, kind, payload, state, delivered_at, updated_at)
         SELECT 'history-' || g, 'webhook', '{\"body\": 1}'::jsonb, 'delivered', now() - interval '2 days',
                now() - interval '2 days'
           FROM generate_series(1, 100000) g",
    )
    .execute(db.pool())
    .await
    .unwrap();
    for n in 0..500 {
        db.enqueue(
            &format!("live-{n}"),
            "webhook",
            json!({"url": rx.url("/"), "body": n}),
        )
        .await;
    }
    let store = db.store.clone();
    let purge = tokio::spawn(async move {
        store
            .purge(Duration::from_secs(86_400), false, false, 1000)
            .await
            .unwrap()
    });
    let s = db.store.clone();
    run_until(
        engine(db.another_store().await, &config()),
        Duration::from_secs(60),
        || {
            let s = s.clone();
            async move {
                let delivered: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM outbox.intents WHERE key LIKE 'live-%' AND state = 'delivered'",
                )
                .fetch_one(s.pool())
                .await
                .unwrap();
                delivered == 500
            }
        },
    )
    .await;
    assert_eq!(purge.await.unwrap(), 100_000);
    assert_eq!(db.count("key LIKE 'history-%'").await, 0);
    assert_eq!(
        db.count("state = 'delivered'").await,
        500,
        "the live intents were delivered meanwhile, and kept"
    );
    let ledger: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox.ledger")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(ledger, 100_000);
}

/// An undelivered intent: key, state, ordering key, waiting, attempts,
/// last error, seconds until due.
type StallRow = (
    String,
    String,
    Option<String>,
    bool,
    i32,
    Option<String>,
    String,
);

/// What a stalled ordering drill left: the states, every undelivered
/// intent with its key, flags and last error, the pending rechecks, the
/// destinations' health and whether each relay still runs.
async fn stall_report(db: &TestDb, relays: &mut [tokio::process::Child]) -> String {
    let mut out = format!("{:?}\n", db.store.stats().await.unwrap().by_state);
    let rows: Vec<StallRow> = sqlx::query_as(
        "SELECT key, state, ordering_key, waiting, attempts, last_error, \
                    to_char(run_after - now(), 'FMSS.MS') \
               FROM outbox.intents WHERE state <> 'delivered' ORDER BY ordering_key, id LIMIT 40",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    for r in rows {
        out.push_str(&format!("  {r:?}\n"));
    }
    let rechecks: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox.ordering_rechecks")
        .fetch_one(db.pool())
        .await
        .unwrap();
    out.push_str(&format!("ordering rechecks noted: {rechecks}\n"));
    let health: Vec<(String, String)> =
        sqlx::query_as("SELECT name, row_to_json(d)::text FROM outbox.destinations d")
            .fetch_all(db.pool())
            .await
            .unwrap_or_default();
    for h in health {
        out.push_str(&format!("  destination {h:?}\n"));
    }
    for (i, r) in relays.iter_mut().enumerate() {
        out.push_str(&format!("relay {i}: {:?}\n", r.try_wait()));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_relays_deliver_50_keys_x_20_intents_in_order_despite_transient_failures() {
    const KEYS: usize = 50;
    const PER_KEY: usize = 20;
    let db = TestDb::new().await;
    // every 5th request fails with a 503
    let counter = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let c = counter.clone();
    let rx = Receiver::start(move |_, _| {
        if c.fetch_add(1, std::sync::atomic::Ordering::SeqCst) % 5 == 4 {
            Reply::status(503)
        } else {
            Reply::status(200)
        }
    })
    .await;
    let mut tx = db.pool().begin().await.unwrap();
    for seq in 0..PER_KEY {
        for k in 0..KEYS {
            let intent = NewIntent {
                ordering_key: Some(format!("account-{k}")),
                ..NewIntent::new(
                    format!("acct-{k}-{seq}"),
                    "webhook",
                    json!({"url": rx.url("/"), "body": {"k": k, "seq": seq}}),
                )
            };
            enqueue(&mut *tx, &intent).await.unwrap();
        }
    }
    tx.commit().await.unwrap();
    let cfg = common::config_file(common::SUBPROCESS_CONFIG);
    let mut relays: Vec<_> = (0..4)
        .map(|i| spawn_relay(&db, &cfg, &format!("ordered-{i}")))
        .collect();
    // well inside nextest's limit, so that a stall reports what it left
    let done = wait_for(Duration::from_secs(75), || async {
        db.count("state = 'delivered'").await == (KEYS * PER_KEY) as i64
    })
    .await;
    let stall = if done {
        String::new()
    } else {
        stall_report(&db, &mut relays).await
    };
    for r in &mut relays {
        terminate(r).await;
    }
    assert!(done, "not all delivered within 75 s:\n{stall}");

    // per key: every request for seq n came after the 200 for seq n-1
    let mut by_key: HashMap<i64, Vec<(i64, std::time::Instant)>> = HashMap::new();
    for r in rx.requests() {
        let b: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        by_key
            .entry(b["k"].as_i64().unwrap())
            .or_default()
            .push((b["seq"].as_i64().unwrap(), r.at));
    }
    assert_eq!(by_key.len(), KEYS);
    for (k, reqs) in &by_key {
        let seqs: Vec<i64> = reqs.iter().map(|r| r.0).collect();
        let mut sorted = seqs.clone();
        sorted.sort();
        assert_eq!(seqs, sorted, "key {k}: requests out of order: {seqs:?}");
    }
    let failures = rx.requests().len() - KEYS * PER_KEY;
    assert!(
        failures > 100,
        "the receiver did fail some requests ({failures})"
    );
    std::fs::remove_file(cfg).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_head_blocks_only_its_key_until_an_operator_releases_it() {
    let db = TestDb::new().await;
    let rx = Receiver::start(|r, _| {
        if r.path == "/down" {
            Reply::status(500)
        } else {
            Reply::status(200)
        }
    })
    .await;
    let mut cfg = config();
    cfg.retry.max_attempts = 1;
    let intent = |key: &str, okey: &str, path: &str| NewIntent {
        ordering_key: Some(okey.to_string()),
        ..NewIntent::new(key, "webhook", json!({"url": rx.url(path), "body": key}))
    };
    for i in [
        intent("a1", "A", "/down"),
        intent("a2", "A", "/ok"),
        intent("b1", "B", "/ok"),
        intent("b2", "B", "/ok"),
    ] {
        enqueue(db.pool(), &i).await.unwrap();
    }
    let s = db.store.clone();
    run_until(
        engine(db.store.clone(), &cfg),
        Duration::from_secs(20),
        || {
            let s = s.clone();
            async move {
                s.find("b2").await.unwrap().state == "delivered"
                    && s.find("a1").await.unwrap().state == "dead"
            }
        },
    )
    .await;
    assert_eq!(
        db.state("a2").await,
        "pending",
        "blocked behind its dead head"
    );
    assert_eq!(db.store.stats().await.unwrap().blocked_ordering_keys, 1);
    db.store.cancel("a1").await.unwrap();
    engine(db.store.clone(), &cfg).run_once().await.unwrap();
    assert_eq!(
        db.state("a2").await,
        "delivered",
        "cancelling the head released the key"
    );
    assert_eq!(db.store.stats().await.unwrap().blocked_ordering_keys, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_completer_makes_the_relay_unready_and_exit_non_zero() {
    let db = TestDb::new().await;
    let rx = Receiver::start(|_, _| Reply::status(200).after(Duration::from_millis(800))).await;
    db.enqueue(
        "held",
        "webhook",
        json!({"url": rx.url("/held"), "body": {}}),
    )
    .await;
    let port = common::free_port();
    let relay = LoggedRelay::spawn(
        common::relay_command(&db.url)
            .arg("run")
            .env(
                "OUTBOX_RELAY__RELAY__METRICS_ADDR",
                format!("\"127.0.0.1:{port}\""),
            )
            .env("OUTBOX_RELAY__RELAY__LEASE", "3s")
            .env("OUTBOX_RELAY__RELAY__SHUTDOWN_TIMEOUT", "2s")
            .env("OUTBOX_RELAY__RELAY__POLL_INTERVAL", "50ms")
            .env("OUTBOX_RELAY__WEBHOOK__TIMEOUT", "1s")
            .env("RUST_LOG", "warn"),
    );
    assert!(
        wait_for(Duration::from_secs(10), || async {
            !rx.requests().is_empty()
        })
        .await
    );
    // another transaction holds the table the completion writes the
    // delivery into: the completion statement waits behind it
    let mut app = db.pool().begin().await.unwrap();
    sqlx::query("LOCK TABLE outbox.log_outcomes IN SHARE MODE")
        .execute(&mut *app)
        .await
        .unwrap();
    let ready = format!("http://127.0.0.1:{port}/readyz");
    let said = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let saw_broken = wait_for(Duration::from_secs(15), || {
        let ready = ready.clone();
        let said = said.clone();
        async move {
            match reqwest::get(&ready).await {
                Ok(r) if r.status() == 503 => {
                    let text = r.text().await.unwrap_or_default();
                    let broken = text.contains("completer");
                    *said.lock().unwrap() = text;
                    broken
                }
                _ => false,
            }
        }
    })
    .await;
    let said = said.lock().unwrap().clone();
    assert!(saw_broken, "readyz said {said:?}");
    assert!(said.contains("broken: task completer is stuck"), "{said}");
    let (status, stderr) = relay.exited(Duration::from_secs(20)).await;
    assert!(!status.success(), "exit status {status}");
    app.rollback().await.unwrap();
    assert!(stderr.contains("task completer is stuck"), "{stderr}");
    // the fleet registry says it stopped
    let stopped: bool = sqlx::query_scalar("SELECT stopped_at IS NOT NULL FROM outbox.relays")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert!(stopped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_logs_a_summary_line_at_the_default_level() {
    let db = TestDb::new().await;
    let rx = Receiver::start(|r, _| match r.path.as_str() {
        "/gone" => Reply::status(410),
        _ => Reply::status(200),
    })
    .await;
    for i in 0..3 {
        db.enqueue(
            &format!("s{i}"),
            "webhook",
            json!({"url": rx.url("/ok"), "body": i}),
        )
        .await;
    }
    db.enqueue(
        "gone",
        "webhook",
        json!({"url": rx.url("/gone"), "body": 0}),
    )
    .await;
    let relay = LoggedRelay::spawn(
        common::relay_command(&db.url)
            .arg("run")
            .env("OUTBOX_RELAY__RELAY__SUMMARY_INTERVAL", "\"500ms\"")
            .env("OUTBOX_RELAY__RELAY__POLL_INTERVAL", "\"50ms\"")
            .env_remove("RUST_LOG"),
    );
    assert!(
        wait_for(Duration::from_secs(10), || async {
            db.count("state IN ('delivered', 'rejected')").await == 4
        })
        .await
    );
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let (status, stderr) = relay.stop().await;
    assert!(status.success());
    let line = stderr
        .lines()
        .find(|l| l.contains("summary of the last"))
        .unwrap_or_else(|| panic!("no summary line in:\n{stderr}"));
    assert!(
        line.contains("delivered=3") && line.contains("failed=1") && line.contains("backlog=0"),
        "{line}"
    );
    assert!(
        stderr.contains("SIGTERM received") && stderr.contains("stopped"),
        "{stderr}"
    );
}

/// A SIGTERM that arrives while the relay starts (its first connection is
/// up: migrating, registering, its claim loop starting) stops it cleanly,
/// exit 0. The handlers used to be installed only when the engine first
/// waited for a signal, after its claim loop and services had started; a
/// signal before that took the default action and killed the process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigterm_while_the_relay_starts_is_a_clean_stop() {
    let db = TestDb::new().await;
    // watched from a connection of no name: the test's own pool carries the
    // relay's
    let watcher = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&db.url)
        .await
        .unwrap();
    for round in 0..3 {
        // connections opened from here on (not the last round's relay's)
        let since: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
            .fetch_one(&watcher)
            .await
            .unwrap();
        let relay_connections = || async {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE application_name = 'outbox-relay' AND datname = current_database()
                    AND backend_start >= $1",
            )
            .bind(since)
            .fetch_one(&watcher)
            .await
            .unwrap()
        };
        let mut relay = common::relay_command(&db.url)
            .arg("run")
            .env("RUST_LOG", "warn")
            .spawn()
            .unwrap();
        // as soon as a connection of the relay's shows up
        let connected = wait_for(Duration::from_secs(15), || async {
            relay_connections().await >= 1
        })
        .await;
        assert!(connected, "round {round}: the relay connected");
        let status = common::terminate(&mut relay).await;
        assert!(
            status.success(),
            "round {round}: SIGTERM while starting ends the relay cleanly: {status:?}"
        );
    }
}

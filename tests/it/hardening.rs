//! The faults adversarial testing found, one test each, against
//! real Postgres, real receivers on loopback and the SMTP peer.

use std::time::Duration;

use crate::common;
use crate::common::smtp::SmtpPeer;
use crate::common::stripe::{FakeStripe, API_KEY};
use crate::common::{config, engine, wait_for, Receiver, Reply, TestDb};
use outbox_providers::Secret;
use serde_json::json;

/// The test configuration with charges against the Stripe fake.
fn charge_config(stripe: &crate::common::stripe::Running) -> outbox_relay::config::Config {
    let mut cfg = config();
    cfg.charge.api_key = Some(Secret::new(API_KEY));
    cfg.charge.api_base = stripe.base.clone();
    cfg
}

/// `run --once` must return: a wedged completer never lets it.
async fn run_once_within(db: &TestDb, cfg: &outbox_relay::config::Config, limit: Duration) {
    tokio::time::timeout(limit, engine(db.store.clone(), cfg).run_once())
        .await
        .expect("run --once returned (the completer is not wedged)")
        .expect("run --once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nul_in_a_refusal_body_is_stored_escaped_and_wedges_nothing() {
    let db = TestDb::new().await;
    let rx = Receiver::start(|r, _| match r.path.as_str() {
        "/nul" => Reply::status(422).body("bad\u{0}byte \u{1} here"),
        _ => Reply::status(200),
    })
    .await;
    db.enqueue("nul", "webhook", json!({"url": rx.url("/nul"), "body": {}}))
        .await;
    for i in 0..5 {
        db.enqueue(
            &format!("ok-{i}"),
            "webhook",
            json!({"url": rx.url("/ok"), "body": {"i": i}}),
        )
        .await;
    }
    run_once_within(&db, &config(), Duration::from_secs(20)).await;
    let nul = db.store.find("nul").await.unwrap();
    assert_eq!(nul.state, "rejected");
    let body = nul.response.unwrap()["body"].as_str().unwrap().to_string();
    assert_eq!(body, "bad\\u0000byte \\u0001 here");
    assert_eq!(db.count("state = 'delivered'").await, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nul_in_a_charge_decline_is_stored_escaped() {
    let db = TestDb::new().await;
    let stripe = FakeStripe::start().await;
    let cfg = charge_config(&stripe);
    db.enqueue(
        "declined-nul",
        "charge",
        json!({"amount": 100, "currency": "usd", "payment_method": "pm_decline_nul"}),
    )
    .await;
    run_once_within(&db, &cfg, Duration::from_secs(20)).await;
    let i = db.store.find("declined-nul").await.unwrap();
    assert_eq!(i.state, "rejected");
    let reason = i.last_error.unwrap();
    assert!(
        reason.contains("declined.\\u0000\\u0000 (after a NUL)"),
        "{reason}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_absurd_charge_retry_after_is_capped_and_run_once_returns() {
    let db = TestDb::new().await;
    let stripe = FakeStripe::start().await;
    let cfg = charge_config(&stripe);
    db.enqueue(
        "limited",
        "charge",
        json!({"amount": 100, "currency": "usd", "payment_method": "pm_rate_limited_absurdly"}),
    )
    .await;
    run_once_within(&db, &cfg, Duration::from_secs(20)).await;
    let i = db.store.find("limited").await.unwrap();
    assert_eq!((i.state.as_str(), i.attempts), ("pending", 1));
    let wait = i.run_after - chrono::Utc::now();
    assert!(
        wait > chrono::Duration::minutes(59) && wait < chrono::Duration::minutes(75),
        "Retry-After capped at an hour (plus jitter): {wait}"
    );
    assert_eq!(
        stripe.fake.requests().len(),
        1,
        "asked once, not once a lease"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_for_an_intent_purged_in_flight_is_dropped_and_counted() {
    let handle = outbox_relay::observe::metrics::recorder();
    let db = TestDb::new().await;
    let rx = Receiver::start(|r, _| match r.path.as_str() {
        "/slow" => Reply::status(200).after(Duration::from_millis(1500)),
        _ => Reply::status(200),
    })
    .await;
    db.enqueue(
        "purged",
        "webhook",
        json!({"url": rx.url("/slow"), "body": {}}),
    )
    .await;
    let cfg = config();
    let run = tokio::spawn(engine(db.store.clone(), &cfg).run_once());
    assert!(
        wait_for(Duration::from_secs(10), || async {
            !rx.requests().is_empty()
        })
        .await
    );
    // in flight: an operator cancels it and a purge removes it
    db.store.cancel("purged").await.unwrap();
    sqlx::query("UPDATE outbox.intents SET updated_at = now() - interval '1 hour'")
        .execute(db.pool())
        .await
        .unwrap();
    assert_eq!(
        db.store
            .purge(Duration::from_secs(1), false, false, 100)
            .await
            .unwrap(),
        1
    );
    // later work is still recorded: the completer is not wedged
    db.enqueue(
        "after",
        "webhook",
        json!({"url": rx.url("/ok"), "body": {}}),
    )
    .await;
    tokio::time::timeout(Duration::from_secs(20), run)
        .await
        .expect("run --once returned")
        .unwrap()
        .unwrap();
    run_once_within(&db, &cfg, Duration::from_secs(20)).await;
    assert_eq!(db.state("after").await, "delivered");
    let text = handle.render();
    assert!(
        text.lines()
            .any(|l| l.starts_with("outbox_completions_dropped_total{reason=\"intent_gone\"} 1")),
        "{}",
        text.lines()
            .filter(|l| l.contains("dropped"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_smtp_550_is_a_rejection_not_an_invariant_violation() {
    let handle = outbox_relay::observe::metrics::recorder();
    let db = TestDb::new().await;
    let peer = SmtpPeer::start().await;
    let mut cfg = config();
    cfg.email.smtp_url = Some(Secret::new(peer.url()));
    cfg.email.from = Some("shop@example.com".into());
    db.enqueue(
        "nobody",
        "email",
        json!({"to": ["unknown@example.com"], "subject": "hi", "text": "x"}),
    )
    .await;
    run_once_within(&db, &cfg, Duration::from_secs(20)).await;
    let i = db.store.find("nobody").await.unwrap();
    assert_eq!(i.state, "rejected");
    let attempts = db.store.attempts(i.id).await.unwrap();
    assert_eq!(attempts[0].status, Some(550));
    let text = handle.render();
    assert!(
        text.contains("outbox_invariant_violations_total{kind=\"email\"} 0"),
        "{}",
        text.lines()
            .filter(|l| l.contains("invariant"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Enqueue `key` inside `tx` and report what happened: Ok(duplicate) or the
/// SQLSTATE.
async fn enqueue_in(
    tx: &mut sqlx::PgConnection,
    key: &str,
    payload: serde_json::Value,
) -> Result<bool, String> {
    let r: Result<(i64, bool), sqlx::Error> =
        sqlx::query_as("SELECT id, duplicate FROM outbox.enqueue($1, 'webhook', $2)")
            .bind(key)
            .bind(payload)
            .fetch_one(&mut *tx)
            .await;
    r.map(|r| r.1)
        .map_err(|e| outbox_relay::store::sqlstate(&e).unwrap_or_else(|| e.to_string()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_snapshot_isolation_a_purged_key_is_never_a_new_intent() {
    let db = TestDb::new().await;
    let payload = json!({"url": "http://127.0.0.1:9/", "body": {"n": 1}});
    for level in ["REPEATABLE READ", "SERIALIZABLE"] {
        for (case, again) in [
            ("same", payload.clone()),
            ("other", json!({"url": "x", "body": 2})),
        ] {
            let key = format!("{level}-{case}");
            db.enqueue(&key, "webhook", payload.clone()).await;
            sqlx::query(
                "UPDATE outbox.intents SET state = 'delivered', delivered_at = now(),
                        updated_at = now() - interval '1 hour' WHERE key = $1",
            )
            .bind(&key)
            .execute(db.pool())
            .await
            .unwrap();
            // the application's snapshot is taken before the purge
            let mut app = db.pool().acquire().await.unwrap();
            sqlx::query(&format!("BEGIN ISOLATION LEVEL {level}"))
                .execute(&mut *app)
                .await
                .unwrap();
            sqlx::query("SELECT count(*) FROM outbox.intents")
                .execute(&mut *app)
                .await
                .unwrap();
            assert_eq!(
                db.store
                    .purge(Duration::from_secs(1), false, false, 100)
                    .await
                    .unwrap(),
                1
            );
            let got = enqueue_in(&mut app, &key, again.clone()).await;
            sqlx::query("ROLLBACK").execute(&mut *app).await.unwrap();
            match (case, &got) {
                (_, Err(code)) if code == "40001" => {}
                ("same", Ok(true)) => {}
                ("other", Err(code)) if code == "OB409" => {}
                _ => panic!("{level}, {case} payload: {got:?} (a new intent under a purged key)"),
            }
            // the application retries: now it sees the ledger
            let mut retry = db.pool().acquire().await.unwrap();
            sqlx::query(&format!("BEGIN ISOLATION LEVEL {level}"))
                .execute(&mut *retry)
                .await
                .unwrap();
            let again = enqueue_in(&mut retry, &key, again).await;
            sqlx::query("COMMIT").execute(&mut *retry).await.unwrap();
            match case {
                "same" => assert_eq!(again, Ok(true), "{level}"),
                _ => assert_eq!(again, Err("OB409".into()), "{level}"),
            }
        }
    }
    assert_eq!(db.count("true").await, 0, "no intent row was created");
    // a key never used is still a new intent at these levels, and leaves
    // nothing in the ledger
    let mut app = db.pool().acquire().await.unwrap();
    sqlx::query("BEGIN ISOLATION LEVEL SERIALIZABLE")
        .execute(&mut *app)
        .await
        .unwrap();
    assert_eq!(
        enqueue_in(&mut app, "fresh", payload.clone()).await,
        Ok(false)
    );
    sqlx::query("COMMIT").execute(&mut *app).await.unwrap();
    let probes: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox.ledger WHERE state = 'probe'")
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(probes, 0);
}

async fn enqueue_ordered(db: &TestDb, key: &str, ordering_key: &str) -> i64 {
    sqlx::query_scalar("SELECT id FROM outbox.enqueue($1, 'webhook', $2, NULL, now(), $3)")
        .bind(key)
        .bind(json!({"url": "http://127.0.0.1:9/", "body": {"k": key}}))
        .bind(ordering_key)
        .fetch_one(db.pool())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_retry_of_an_older_intent_waits_while_a_later_one_is_claimed() {
    let db = TestDb::new().await;
    enqueue_ordered(&db, "o1", "order-1").await;
    enqueue_ordered(&db, "o2", "order-1").await;
    let first = db.store.claim("r1", 10, 60_000, &[]).await.unwrap();
    assert_eq!(
        first.iter().map(|c| c.key.as_str()).collect::<Vec<_>>(),
        ["o1"]
    );
    sqlx::query("UPDATE outbox.intents SET state = 'delivered', owner = NULL, lease_expires_at = NULL WHERE key = 'o1'")
        .execute(db.pool())
        .await
        .unwrap();
    let second = db.store.claim("r1", 10, 60_000, &[]).await.unwrap();
    assert_eq!(
        second.iter().map(|c| c.key.as_str()).collect::<Vec<_>>(),
        ["o2"]
    );
    // o2 is in flight; an operator retries the delivered o1
    db.store
        .retry(
            "o1",
            outbox_relay::store::operator::RetryOptions {
                new_effect: false,
                force: true,
            },
        )
        .await
        .unwrap();
    let third = db.store.claim("r2", 10, 60_000, &[]).await.unwrap();
    assert!(third.is_empty(), "two of one key in flight: {third:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_intent_committed_late_waits_while_a_younger_one_is_claimed() {
    let db = TestDb::new().await;
    let mut slow = db.pool().begin().await.unwrap();
    let older: i64 = sqlx::query_scalar(
        "SELECT id FROM outbox.enqueue('x1', 'webhook', $1, NULL, now(), 'cart-9')",
    )
    .bind(json!({"url": "http://127.0.0.1:9/", "body": 1}))
    .fetch_one(&mut *slow)
    .await
    .unwrap();
    let younger = enqueue_ordered(&db, "x2", "cart-9").await;
    assert!(older < younger);
    let claimed = db.store.claim("r1", 10, 60_000, &[]).await.unwrap();
    assert_eq!(claimed.iter().map(|c| c.id).collect::<Vec<_>>(), [younger]);
    slow.commit().await.unwrap();
    let again = db.store.claim("r2", 10, 60_000, &[]).await.unwrap();
    assert!(again.is_empty(), "two of one key in flight: {again:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_claiming_at_once_take_one_intent_per_key() {
    let db = TestDb::new().await;
    // 50 keys, 4 intents each, the first committed last by another session
    for k in 0..50 {
        for n in 0..4 {
            enqueue_ordered(&db, &format!("k{k}-{n}"), &format!("key-{k}")).await;
        }
    }
    let stores = [
        db.another_store().await,
        db.another_store().await,
        db.another_store().await,
    ];
    let claims =
        futures_util::future::join_all(stores.iter().enumerate().map(|(i, s)| async move {
            s.claim(&format!("r{i}"), 200, 60_000, &[]).await.unwrap()
        }))
        .await;
    let mut per_key = std::collections::HashMap::<String, usize>::new();
    for c in claims.iter().flatten() {
        *per_key
            .entry(c.key.split('-').next().unwrap().to_string())
            .or_default() += 1;
    }
    assert_eq!(per_key.len(), 50, "every key's head claimed");
    assert!(per_key.values().all(|n| *n == 1), "{per_key:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_key_keeps_its_backlog_out_of_the_claim() {
    let db = TestDb::new().await;
    enqueue_ordered(&db, "head", "stuck").await;
    sqlx::query("UPDATE outbox.intents SET state = 'dead' WHERE key = 'head'")
        .execute(db.pool())
        .await
        .unwrap();
    sqlx::query(
        "SELECT outbox.enqueue('behind-' || g, 'webhook', jsonb_build_object('url', 'http://127.0.0.1:9/', 'body', g),
                               NULL, now(), 'stuck')
           FROM generate_series(1, 20000) g",
    )
    .execute(db.pool())
    .await
    .unwrap();
    db.enqueue(
        "free",
        "webhook",
        json!({"url": "http://127.0.0.1:9/", "body": 0}),
    )
    .await;
    sqlx::query("ANALYZE outbox.intents")
        .execute(db.pool())
        .await
        .unwrap();
    assert_eq!(db.count("waiting").await, 20000);
    let plan = db.store.explain_claim(100).await.unwrap().join("\n");
    let buffers: u64 = plan
        .lines()
        .find_map(|l| l.trim().strip_prefix("Buffers: shared hit="))
        .and_then(|v| v.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|v| v.parse().ok())
        .expect("the plan reports buffers");
    assert!(
        buffers < 200,
        "a claim of one intent read {buffers} buffers:\n{plan}"
    );
    let stats = db.store.stats().await.unwrap();
    assert_eq!(stats.blocked_ordering_keys, 1);
    // the head is cancelled: the next one is promoted into the claim index
    db.store.cancel("head").await.unwrap();
    let next = db.store.claim("r", 100, 60_000, &[]).await.unwrap();
    let mut keys: Vec<_> = next.iter().map(|c| c.key.as_str()).collect();
    keys.sort();
    assert_eq!(keys, ["behind-1", "free"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_left_waiting_by_a_race_is_promoted_by_the_sweeper() {
    let db = TestDb::new().await;
    enqueue_ordered(&db, "lonely", "k").await;
    // what a racing enqueue leaves: waiting, with nothing ahead of it
    sqlx::query("UPDATE outbox.intents SET waiting = true")
        .execute(db.pool())
        .await
        .unwrap();
    assert!(db
        .store
        .claim("r", 10, 60_000, &[])
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        db.store
            .promote_stranded_heads(1000)
            .await
            .unwrap()
            .promoted,
        1
    );
    assert_eq!(db.store.claim("r", 10, 60_000, &[]).await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_body_arrives_as_the_stored_json_text_digit_for_digit() {
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    let payload = format!(
        r#"{{"url": "{}", "body": {{"id": 123456789012345678901234567890, "price": 0.1000000000000000055511151231257827, "neg": -9007199254740993, "tiny": 1e-300, "s": "é\u0001"}}}}"#,
        rx.url("/precise")
    );
    sqlx::query("SELECT outbox.enqueue('precise', 'webhook', $1::text::jsonb)")
        .bind(&payload)
        .execute(db.pool())
        .await
        .unwrap();
    run_once_within(&db, &config(), Duration::from_secs(20)).await;
    assert_eq!(db.state("precise").await, "delivered");
    let stored: String = sqlx::query_scalar(
        "SELECT (payload->'body')::text FROM outbox.intents WHERE key = 'precise'",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    let sent = rx.requests()[0].body.clone();
    assert_eq!(std::str::from_utf8(&sent).unwrap(), stored);
    assert!(
        stored.contains("123456789012345678901234567890"),
        "{stored}"
    );
    assert!(
        stored.contains("0.1000000000000000055511151231257827"),
        "{stored}"
    );
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
    let mut relay = common::relay_command(&db.url)
        .arg("run")
        .env(
            "OUTBOX_RELAY__RELAY__METRICS_ADDR",
            format!("\"127.0.0.1:{port}\""),
        )
        .env("OUTBOX_RELAY__RELAY__LEASE", "3s")
        .env("OUTBOX_RELAY__RELAY__SHUTDOWN_TIMEOUT", "2s")
        .env("OUTBOX_RELAY__RELAY__POLL_INTERVAL", "50ms")
        .env("OUTBOX_RELAY__WEBHOOK__TIMEOUT", "1s")
        .env("RUST_LOG", "warn")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    assert!(
        wait_for(Duration::from_secs(10), || async {
            !rx.requests().is_empty()
        })
        .await
    );
    // an application transaction holds the intent's row in the log: the
    // completion statement waits behind it
    let mut app = db.pool().begin().await.unwrap();
    sqlx::query("SELECT 1 FROM outbox.intent_log WHERE key = 'held' FOR UPDATE")
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
    let status = tokio::time::timeout(Duration::from_secs(20), relay.wait())
        .await
        .expect("the broken relay exits")
        .unwrap();
    assert!(!status.success(), "exit status {status}");
    app.rollback().await.unwrap();
    let mut stderr = String::new();
    use tokio::io::AsyncReadExt;
    relay
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .await
        .unwrap();
    assert!(stderr.contains("task completer is stuck"), "{stderr}");
    // the fleet registry says it stopped
    let stopped: bool = sqlx::query_scalar("SELECT stopped_at IS NOT NULL FROM outbox.relays")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert!(stopped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kind_this_relay_does_not_know_waits_while_a_live_relay_knows_it() {
    let db = TestDb::new().await;
    // a newer relay of the fleet knows "sms" (and is not configured for it)
    db.store
        .register_relay(
            "newer:1",
            "9.9.9",
            &["webhook"],
            &["webhook", "email", "charge", "sms"],
        )
        .await
        .unwrap();
    db.enqueue("text-1", "sms", json!({"to": "+15550100"}))
        .await;
    run_once_within(&db, &config(), Duration::from_secs(20)).await;
    assert_eq!(
        db.state("text-1").await,
        "pending",
        "left for the relay that knows it"
    );
    let waiting = db.store.unserved_kinds().await.unwrap();
    assert_eq!(waiting.len(), 1);
    assert_eq!((waiting[0].kind.as_str(), waiting[0].pending), ("sms", 1));
    assert_eq!(waiting[0].known_by, ["newer:1"]);
    // once no live relay knows it, it is rejected as unknown
    db.store.deregister_relay("newer:1").await.unwrap();
    run_once_within(&db, &config(), Duration::from_secs(20)).await;
    let i = db.store.find("text-1").await.unwrap();
    assert_eq!(i.state, "rejected");
    assert!(i.last_error.unwrap().contains("no live relay knows it"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_lists_the_fleet_and_stats_says_why_a_kind_waits() {
    let db = TestDb::new().await;
    db.store
        .register_relay(
            "a:1",
            "0.1.0",
            &["webhook", "email"],
            &["webhook", "email", "charge"],
        )
        .await
        .unwrap();
    db.store
        .register_relay(
            "b:2",
            "0.0.9",
            &["webhook"],
            &["webhook", "email", "charge"],
        )
        .await
        .unwrap();
    db.store.deregister_relay("b:2").await.unwrap();
    db.enqueue(
        "c1",
        "charge",
        json!({"amount": 1, "currency": "usd", "payment_method": "pm"}),
    )
    .await;
    let out = common::cli(&db, &["relays", "--json"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let fleet: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(fleet[0]["owner"], "a:1");
    assert_eq!(fleet[0]["live"], true);
    assert_eq!(fleet[0]["kinds"], json!(["webhook", "email"]));
    assert_eq!(fleet[1]["owner"], "b:2");
    assert_eq!(fleet[1]["live"], false);
    let table = common::cli(&db, &["relays"]).await;
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.contains("OWNER") && text.contains("a:1") && text.contains("live"),
        "{text}"
    );
    assert!(text.contains("stopped"), "{text}");
    let stats = common::cli(&db, &["stats"]).await;
    let text = String::from_utf8_lossy(&stats.stdout);
    assert!(
        text.contains("waiting: 1 pending charge intent(s): known to a:1 but no live relay is configured for it"),
        "{text}"
    );
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
    let mut relay = common::relay_command(&db.url)
        .arg("run")
        .env("OUTBOX_RELAY__RELAY__SUMMARY_INTERVAL", "\"500ms\"")
        .env("OUTBOX_RELAY__RELAY__POLL_INTERVAL", "\"50ms\"")
        .env_remove("RUST_LOG")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    assert!(
        wait_for(Duration::from_secs(10), || async {
            db.count("state IN ('delivered', 'rejected')").await == 4
        })
        .await
    );
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let status = common::terminate(&mut relay).await;
    assert!(status.success());
    let mut stderr = String::new();
    use tokio::io::AsyncReadExt;
    relay
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .await
        .unwrap();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_searches_run_within_the_attempt_budget_the_lease_covers() {
    let db = TestDb::new().await;
    let stripe = FakeStripe::start().await;
    let cfg = charge_config(&stripe);
    // the budget: charge.timeout (3 s in the test config)
    let budget = cfg.charge.timeout.0;
    stripe.fake.slow_search(Duration::from_millis(2000));
    // claimed by a relay that died: the next attempt reconciles first (2 s),
    // then POSTs (answered 500 without a payment: ambiguous), then would
    // reconcile again (2 s more): past the budget
    db.enqueue(
        "slow-reconcile",
        "charge",
        json!({"amount": 100, "currency": "usd", "payment_method": "pm_500_before_create"}),
    )
    .await;
    db.store.claim("crashed", 10, 100, &[]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    run_once_within(&db, &cfg, Duration::from_secs(30)).await;
    let i = db.store.find("slow-reconcile").await.unwrap();
    let attempts = db.store.attempts(i.id).await.unwrap();
    let last = attempts.last().unwrap();
    let took = (last.finished_at.unwrap() - last.started_at)
        .to_std()
        .unwrap();
    assert!(
        took < budget + Duration::from_millis(600),
        "the attempt took {took:?}, beyond its {budget:?} budget: {attempts:?}"
    );
    assert_ne!(i.state, "delivered", "{i:?}");
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

//! Destination health against real receivers, with several relay
//! processes: an outage that opens a breaker and drains by itself, a rate
//! limit held across three relays, a 429 storm absorbed, a manual pause,
//! and the operator alerts each raises once.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{self, cli, config, engine, Receiver, Reply, TestDb};
use outbox_providers::AmbiguityPolicy;
use outbox_relay::config::Dur;

/// A subprocess relay configuration with destination health settings.
/// (The lease leaves 2.4 s past what an attempt needs: three debug-built
/// relays on a loaded two-core machine may take a second to start a
/// claimed attempt, and a claim without room for its attempt is handed
/// back.)
fn relay_config(extra: &str) -> std::path::PathBuf {
    common::config_file(&format!(
        r#"
[relay]
concurrency = 16
lease = "6s"
poll_interval = "50ms"
sweep_interval = "100ms"
shutdown_timeout = "5s"

[webhook]
timeout = "2s"
allowed_networks = ["127.0.0.0/8"]
{extra}
"#
    ))
}

/// The alerts the receiver got: (type, subject), in order.
fn alerts(rx: &Receiver) -> Vec<(String, String)> {
    rx.requests()
        .iter()
        .filter_map(|r| serde_json::from_slice::<Value>(&r.body).ok())
        .map(|b| {
            (
                b["type"].as_str().unwrap_or_default().to_string(),
                b["subject"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// How many attempts the retry schedule alone makes of one intent in
/// `span` (the last step repeating).
fn scheduled_attempts(steps: &[f64], span: f64) -> usize {
    let (mut t, mut n) = (0.0, 0);
    while t < span {
        n += 1;
        t += steps[(n - 1).min(steps.len() - 1)];
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_opens_the_breaker_spares_the_healthy_endpoint_and_drains_by_itself() {
    let db = TestDb::new().await;
    const OUTAGE: Duration = Duration::from_secs(10);
    let outage_ends: Arc<Mutex<Option<Instant>>> = Arc::default();
    let ends = outage_ends.clone();
    let failing = Receiver::start(move |_, _| match *ends.lock().unwrap() {
        Some(end) if Instant::now() < end => Reply::status(503),
        _ => Reply::status(200),
    })
    .await;
    let healthy = Receiver::start(|_, _| Reply::status(200).after(Duration::from_millis(5))).await;
    let alert_rx = Receiver::ok().await;
    let steps = [0.2, 0.5, 1.0];
    let cfg = relay_config(&format!(
        r#"
[retry]
schedule = ["200ms", "500ms", "1s"]
max_attempts = 50
jitter = 0.1

[breaker]
failures = 10
cooldown = "1s"
max_cooldown = "2s"

[alerts]
url = "{}"
"#,
        alert_rx.url("/alerts")
    ));
    let began = Instant::now();
    *outage_ends.lock().unwrap() = Some(began + OUTAGE);
    for n in 0..300 {
        db.enqueue(
            &format!("failing:{n}"),
            "webhook",
            json!({"url": failing.url("/hook"), "body": {"n": n}}),
        )
        .await;
        db.enqueue(
            &format!("healthy:{n}"),
            "webhook",
            json!({"url": healthy.url("/hook"), "body": {"n": n}}),
        )
        .await;
    }
    let mut relays: Vec<_> = (0..3)
        .map(|r| common::spawn_relay(&db, &cfg, &format!("health-{r}")))
        .collect();

    // the healthy endpoint's intents go as if nothing happened
    assert!(
        common::wait_for(OUTAGE, || async {
            db.count("key LIKE 'healthy:%' AND state = 'delivered'")
                .await
                == 300
        })
        .await,
        "the healthy endpoint's intents were delivered during the outage"
    );
    let healthy_done = began.elapsed();
    assert_eq!(
        db.count("key LIKE 'healthy:%' AND attempts <> 1").await,
        0,
        "one attempt each"
    );

    // while it is open: the CLI shows it, waiting intents say why
    let failing_origin = format!("http://{}", failing.addr);
    let out = cli(&db, &["destinations", "--json"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let row = list
        .iter()
        .find(|d| d["name"] == failing_origin.as_str())
        .unwrap_or_else(|| panic!("{failing_origin} in {list:?}"));
    if began.elapsed() < OUTAGE {
        assert!(
            matches!(row["state"].as_str(), Some("open" | "half_open")),
            "{row}"
        );
        assert!(row["pending"].as_i64().unwrap() > 0, "{row}");
        let waiting: i64 = db
            .count("key LIKE 'failing:%' AND state = 'pending' AND last_error LIKE 'the circuit breaker for%is open%'")
            .await;
        assert!(waiting > 0, "pending intents name the open breaker");
    }

    // recovery: every intent delivered within seconds, no operator action
    assert!(
        common::wait_for(OUTAGE + Duration::from_secs(10), || async {
            db.count("key LIKE 'failing:%' AND state = 'delivered'")
                .await
                == 300
        })
        .await,
        "the failing endpoint's backlog drained after it recovered: {} delivered",
        db.count("key LIKE 'failing:%' AND state = 'delivered'")
            .await
    );
    let drained_after = began.elapsed().saturating_sub(OUTAGE);
    assert_eq!(db.count("state = 'dead'").await, 0, "nothing ended dead");
    let end = began + OUTAGE;
    let during = failing.requests().iter().filter(|r| r.at < end).count();
    let by_schedule = 300 * scheduled_attempts(&steps, OUTAGE.as_secs_f64());
    eprintln!(
        "outage: healthy endpoint done after {healthy_done:?}; {during} requests to the failing \
         endpoint during its {OUTAGE:?} outage (the retry schedule alone: about {by_schedule}); \
         its backlog drained {drained_after:?} after it recovered"
    );
    assert!(
        during * 10 < by_schedule,
        "the breaker bounded the attempts: {during} vs {by_schedule}"
    );
    assert!(
        drained_after < Duration::from_secs(8),
        "drained within seconds of recovery: {drained_after:?}"
    );

    // one alert per event, with three relays
    assert!(
        common::wait_for(Duration::from_secs(10), || async {
            alerts(&alert_rx).iter().any(|a| a.0 == "breaker.closed")
        })
        .await,
        "the close alert arrived: {:?}",
        alerts(&alert_rx)
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let got = alerts(&alert_rx);
    let count = |t: &str| {
        got.iter()
            .filter(|a| a.0 == t && a.1 == failing_origin)
            .count()
    };
    assert_eq!(count("breaker.opened"), 1, "{got:?}");
    assert_eq!(count("breaker.closed"), 1, "{got:?}");
    assert!(
        alert_rx
            .requests()
            .iter()
            .all(|r| r.header("webhook-signature").is_some() || r.header("webhook-id").is_some()),
        "alerts are webhooks with their headers"
    );
    let events: Vec<String> = sqlx::query_scalar(
        "SELECT event FROM outbox.destination_events WHERE destination = $1 ORDER BY id",
    )
    .bind(&failing_origin)
    .fetch_all(db.pool())
    .await
    .unwrap();
    assert_eq!(
        events.first().map(String::as_str),
        Some("opened"),
        "{events:?}"
    );
    assert_eq!(
        events.last().map(String::as_str),
        Some("closed"),
        "{events:?}"
    );
    for r in &mut relays {
        common::terminate(r).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_holds_in_every_five_second_window_across_three_relays() {
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    let origin = format!("http://{}", rx.addr);
    let other = Receiver::ok().await;
    let cfg = relay_config(&format!(
        r#"
[retry]
schedule = ["50ms"]
jitter = 0.0

[limits]
"{origin}" = "50/s"
"#
    ));
    const N: usize = 500;
    for n in 0..N {
        db.enqueue(
            &format!("limited:{n}"),
            "webhook",
            json!({"url": rx.url("/hook"), "body": {"n": n}}),
        )
        .await;
    }
    for n in 0..100 {
        db.enqueue(
            &format!("other:{n}"),
            "webhook",
            json!({"url": other.url("/hook"), "body": {"n": n}}),
        )
        .await;
    }
    let began = Instant::now();
    let mut relays: Vec<_> = (0..3)
        .map(|r| common::spawn_relay(&db, &cfg, &format!("limit-{r}")))
        .collect();
    // another destination is not slowed by the limited one
    assert!(
        common::wait_for(Duration::from_secs(5), || async {
            db.count("key LIKE 'other:%' AND state = 'delivered'").await == 100
        })
        .await,
        "the unlimited destination went at once"
    );
    assert!(
        common::wait_for(Duration::from_secs(40), || async {
            db.count("key LIKE 'limited:%' AND state = 'delivered'")
                .await
                == N as i64
        })
        .await,
        "the limited destination drained: {}",
        db.count("key LIKE 'limited:%' AND state = 'delivered'")
            .await
    );
    let took = began.elapsed();
    for r in &mut relays {
        common::terminate(r).await;
    }
    let mut at: Vec<Instant> = rx.requests().iter().map(|r| r.at).collect();
    at.sort();
    assert_eq!(at.len(), N, "one request per intent");
    let first = at[0];
    let mut per_second = vec![0usize; 1 + (at[N - 1] - first).as_secs() as usize];
    for t in &at {
        per_second[(*t - first).as_secs() as usize] += 1;
    }
    eprintln!("requests per second: {per_second:?}");
    // the most requests in any 5 s window
    let window = Duration::from_secs(5);
    let busiest = (0..at.len())
        .map(|i| at[i..].iter().take_while(|t| **t < at[i] + window).count())
        .max()
        .unwrap();
    let attempts = db.count("key LIKE 'limited:%' AND attempts <> 1").await;
    eprintln!(
        "rate limit 50/s, 3 relays: {N} requests in {took:?}, at most {busiest} in any 5 s window \
         (limit 250, +10% = 275); {attempts} intents took more than one attempt"
    );
    assert!(busiest <= 275, "{busiest} requests in one 5 s window");
    // and it is not starved either: the whole drain ran near the rate
    let span = (at[N - 1] - at[0]).as_secs_f64();
    assert!(
        (N as f64 / span) > 40.0,
        "the drain ran at {:.1}/s",
        N as f64 / span
    );
    assert_eq!(attempts, 0, "a held-back intent spends no attempt");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_storm_slows_the_whole_destination_and_no_intent_dies() {
    let db = TestDb::new().await;
    let storm_ends = Instant::now() + Duration::from_secs(3);
    let rx = Receiver::start(move |_, _| {
        if Instant::now() < storm_ends {
            Reply::status(429).header("retry-after", "1")
        } else {
            Reply::status(200)
        }
    })
    .await;
    for n in 0..200 {
        db.enqueue(
            &format!("storm:{n}"),
            "webhook",
            json!({"url": rx.url("/hook"), "body": {"n": n}}),
        )
        .await;
    }
    let mut cfg = config();
    cfg.retry.max_attempts = 5;
    cfg.retry.schedule = vec![Dur(Duration::from_millis(50))];
    common::run_until(
        engine(db.store.clone(), &cfg),
        Duration::from_secs(30),
        || async { db.count("state IN ('delivered', 'dead')").await == 200 },
    )
    .await;
    assert_eq!(db.count("state = 'dead'").await, 0, "no intent went dead");
    let storm: usize = rx.requests().iter().filter(|r| r.at < storm_ends).count();
    eprintln!("429 storm of 3 s: {storm} requests answered 429 for 200 intents");
    // one 429 slows every intent of the destination: a few waves, not
    // every intent on its own schedule (about 3 each, 600 in all)
    assert!(storm < 150, "{storm} requests during the storm");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_pauses_and_resumes_a_destination_and_both_are_recorded() {
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    let alert_rx = Receiver::ok().await;
    let origin = format!("http://{}", rx.addr);
    let file = relay_config(&format!(
        "[alerts]\nurl = \"{}\"\n",
        alert_rx.url("/alerts")
    ));
    let run = |args: Vec<String>| {
        let file = file.clone();
        let url = db.url.clone();
        async move {
            tokio::process::Command::new(common::relay_bin())
                .args(&args)
                .env("DATABASE_URL", url)
                .env("OUTBOX_RELAY_CONFIG", &file)
                .output()
                .await
                .unwrap()
        }
    };
    let out = run(vec![
        "destinations".into(),
        "pause".into(),
        format!("{origin}/ignored/path"),
        "--reason".into(),
        "partner maintenance".into(),
    ])
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("paused {origin}")));
    for n in 0..5 {
        db.enqueue(
            &format!("held:{n}"),
            "webhook",
            json!({"url": rx.url("/hook"), "body": {"n": n}}),
        )
        .await;
    }
    let mut cfg = config();
    cfg.alerts.url = Some(alert_rx.url("/alerts"));
    // the relays' health loop raises the pause's alert, once whichever runs
    let settings = cfg.health().unwrap();
    for _ in 0..3 {
        outbox_relay::services::health::raise_pause_alerts(&db.store, &settings).await;
    }
    engine(db.store.clone(), &cfg).run_once().await.unwrap();
    assert!(
        rx.requests().is_empty(),
        "nothing is sent to a paused destination"
    );
    let i = db.store.find("held:0").await.unwrap();
    assert_eq!((i.state.as_str(), i.attempts), ("pending", 0), "{i:?}");
    assert!(
        i.last_error
            .as_deref()
            .unwrap_or_default()
            .contains("is paused by"),
        "{i:?}"
    );
    let out = run(vec!["destinations".into(), "--json".into()]).await;
    let list: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let row = list.iter().find(|d| d["name"] == origin.as_str()).unwrap();
    assert_eq!(row["state"], "paused");
    assert_eq!(row["pending"], 5);
    assert!(row["paused_by"].as_str().is_some_and(|a| !a.is_empty()));
    let table = run(vec!["destinations".into()]).await;
    assert!(String::from_utf8_lossy(&table.stdout).contains("paused by"));

    let out = run(vec!["destinations".into(), "resume".into(), origin.clone()]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // the deferral's wait is about a second
    common::run_until(
        engine(db.store.clone(), &cfg),
        Duration::from_secs(10),
        || async { db.count("key LIKE 'held:%' AND state = 'delivered'").await == 5 },
    )
    .await;
    let events: Vec<(String, String, Option<Value>)> = sqlx::query_as(
        "SELECT event, actor, detail FROM outbox.destination_events WHERE destination = $1 ORDER BY id",
    )
    .bind(&origin)
    .fetch_all(db.pool())
    .await
    .unwrap();
    let names: Vec<&str> = events.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(names, ["paused", "resumed"]);
    assert_eq!(
        events[0].2.as_ref().unwrap()["reason"],
        "partner maintenance"
    );
    assert!(events.iter().all(|e| !e.1.is_empty()), "each has its actor");
    let got = alerts(&alert_rx);
    assert_eq!(
        got.iter().filter(|a| a.0 == "destination.paused").count(),
        1,
        "{got:?}"
    );
    // an unknown name is refused with the forms it takes
    let out = run(vec![
        "destinations".into(),
        "pause".into(),
        "partner".into(),
    ])
    .await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a destination"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dead_count_alert_is_raised_once_per_crossing_by_any_number_of_relays() {
    let db = TestDb::new().await;
    let rx = Receiver::start(|_, _| Reply::status(503)).await;
    let alert_rx = Receiver::ok().await;
    for n in 0..3 {
        db.enqueue(
            &format!("doomed:{n}"),
            "webhook",
            json!({"url": rx.url("/hook"), "body": {"n": n}}),
        )
        .await;
    }
    let mut cfg = config();
    cfg.retry.max_attempts = 1;
    cfg.alerts.url = Some(alert_rx.url("/alerts"));
    cfg.alerts.dead_threshold = Some(3);
    engine(db.store.clone(), &cfg).run_once().await.unwrap();
    assert_eq!(db.count("state = 'dead'").await, 3);
    let settings = cfg.health().unwrap();
    // three relays' health loops at the same moment, twice
    for _ in 0..2 {
        let checks = (0..3).map(|_| {
            let store = db.store.clone();
            let settings = settings.clone();
            tokio::spawn(async move {
                outbox_relay::services::health::check_dead_alert(&store, &settings).await
            })
        });
        for c in checks.collect::<Vec<_>>() {
            c.await.unwrap();
        }
    }
    engine(db.store.clone(), &cfg).run_once().await.unwrap();
    let got = alerts(&alert_rx);
    assert_eq!(got, [("dead.threshold".to_string(), "dead".to_string())]);
    let body: Value = serde_json::from_slice(&alert_rx.requests()[0].body).unwrap();
    assert_eq!(body["detail"]["dead"], 3);
    // below the threshold the latch drops; the next crossing alerts again
    sqlx::query("UPDATE outbox.intents SET state = 'cancelled' WHERE key = 'doomed:0'")
        .execute(db.pool())
        .await
        .unwrap();
    outbox_relay::services::health::check_dead_alert(&db.store, &settings).await;
    sqlx::query("UPDATE outbox.intents SET state = 'dead' WHERE key = 'doomed:0'")
        .execute(db.pool())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    outbox_relay::services::health::check_dead_alert(&db.store, &settings).await;
    engine(db.store.clone(), &cfg).run_once().await.unwrap();
    assert_eq!(alerts(&alert_rx).len(), 2, "{:?}", alerts(&alert_rx));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_breaker_with_nothing_left_to_send_is_closed_by_itself() {
    let db = TestDb::new().await;
    let alert_rx = Receiver::ok().await;
    let gone = "https://gone.example";
    let busy = "https://busy.example";
    for name in [gone, busy] {
        for _ in 0..3 {
            sqlx::query(
                "SELECT outbox.destination_failed($1, 'refused', false, 'test', 3,
                        interval '1 second', interval '2 seconds', NULL, NULL)",
            )
            .bind(name)
            .execute(db.pool())
            .await
            .unwrap();
        }
    }
    // both open, their probes due two minutes ago; only busy has a backlog
    sqlx::query("UPDATE outbox.destinations SET next_probe_at = now() - interval '2 minutes'")
        .execute(db.pool())
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO outbox.intents (key, kind, payload, run_after)
         VALUES ('waiting', 'webhook', $1, now() + interval '1 hour')",
    )
    .bind(json!({"url": format!("{busy}/hook"), "body": 1}))
    .execute(db.pool())
    .await
    .unwrap();
    let mut cfg = config();
    cfg.alerts.url = Some(alert_rx.url("/alerts"));
    let settings = cfg.health().unwrap();
    let mut seen = std::collections::HashSet::new();
    outbox_relay::services::health::refresh_backlog_gauges(
        &db.store, &settings, "relay-1", &mut seen,
    )
    .await
    .unwrap();
    let states: Vec<(String, String)> =
        sqlx::query_as("SELECT name, state FROM outbox.destinations ORDER BY name")
            .fetch_all(db.pool())
            .await
            .unwrap();
    assert_eq!(
        states,
        [
            (busy.to_string(), "open".to_string()),
            (gone.to_string(), "closed".to_string())
        ]
    );
    let events: Vec<(String, Value)> = sqlx::query_as(
        "SELECT event, detail FROM outbox.destination_events WHERE destination = $1 ORDER BY id",
    )
    .bind(gone)
    .fetch_all(db.pool())
    .await
    .unwrap();
    assert_eq!(events.last().unwrap().0, "closed");
    assert_eq!(events.last().unwrap().1["idle"], true);
    // its close alert is an intent like any other
    let alert: i64 = db
        .count("payload->'body'->>'type' = 'breaker.closed'")
        .await;
    assert_eq!(alert, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_holds_for_every_spelling_of_an_ipv4_origin() {
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    let port = rx.addr.port();
    let cfg = config();
    let settings = cfg.health().unwrap();
    let paused = outbox_relay::services::health::pause(
        &db.store,
        &settings,
        &format!("http://127.0.0.1:{port}"),
        Some("maintenance"),
    )
    .await
    .unwrap();
    assert_eq!(paused, format!("http://127.0.0.1:{port}"));
    let spellings = [
        format!("http://[::ffff:127.0.0.1]:{port}/hook"),
        format!("http://[::FFFF:7f00:1]:{port}/hook"),
        format!("http://0x7f.1:{port}/hook"),
        format!("http://127.0.0.1.:{port}/hook"),
    ];
    for (n, url) in spellings.iter().enumerate() {
        db.enqueue(
            &format!("spelled:{n}"),
            "webhook",
            json!({"url": url, "body": n}),
        )
        .await;
    }
    engine(db.store.clone(), &cfg).run_once().await.unwrap();
    assert!(
        rx.requests().is_empty(),
        "a paused origin receives nothing, however it is written: {:?}",
        rx.requests()
            .iter()
            .map(|r| r.path.clone())
            .collect::<Vec<_>>()
    );
    assert_eq!(
        db.count(
            "key LIKE 'spelled:%' AND state = 'pending' AND attempts = 0
             AND last_error LIKE '%is paused by%'"
        )
        .await,
        spellings.len() as i64
    );
    // the same URLs reach the receiver once it is resumed
    outbox_relay::services::health::resume(&db.store, &settings, &paused)
        .await
        .unwrap();
    common::run_until(
        engine(db.store.clone(), &cfg),
        Duration::from_secs(15),
        || async {
            db.count("key LIKE 'spelled:%' AND state = 'delivered'")
                .await
                == 4
        },
    )
    .await;
    assert_eq!(rx.requests().len(), spellings.len());
}

/// Run `engine` until `done` holds or `limit` passes; whether it held.
async fn run_for<F, Fut>(engine: outbox_relay::engine::Engine, limit: Duration, done: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let handle = tokio::spawn(engine.run(async {
        let _ = rx.await;
    }));
    let ok = common::wait_for(limit, done).await;
    let _ = tx.send(());
    handle.await.unwrap().unwrap();
    ok
}

/// `SELECT count(*) FROM <from_where>`.
async fn rows(db: &TestDb, from_where: &str) -> i64 {
    sqlx::query_scalar(&format!("SELECT count(*) FROM {from_where}"))
        .fetch_one(db.pool())
        .await
        .unwrap()
}

/// `n` webhook origins on loopback that refuse every connection, and the
/// sockets that hold their ports: bound but never listening, so a
/// connection is refused and no other test can take the port meanwhile.
fn refused_origins(n: usize) -> (Vec<String>, Vec<tokio::net::TcpSocket>) {
    (0..n)
        .map(|_| {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
            let port = socket.local_addr().unwrap().port();
            (format!("http://127.0.0.1:{port}"), socket)
        })
        .unzip()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_that_stopped_are_pruned_and_the_gate_reads_only_recent_ones() {
    let db = TestDb::new().await;
    let (origins, _held) = refused_origins(50);
    for (n, o) in origins.iter().enumerate() {
        db.enqueue(
            &format!("refused:{n}"),
            "webhook",
            json!({"url": format!("{o}/hook"), "body": n}),
        )
        .await;
    }
    // each intent gives up below the breaker's threshold: every origin is
    // left closed with failures that no success will ever reset
    let cfg = relay_config(
        r#"
[retry]
schedule = ["50ms"]
max_attempts = 2
jitter = 0.0

[breaker]
failures = 3
cooldown = "200ms"
max_cooldown = "1s"
"#,
    );
    let mut relay = common::spawn_relay(&db, &cfg, "pruner");
    assert!(
        common::wait_for(Duration::from_secs(20), || async {
            db.count("key LIKE 'refused:%' AND state = 'dead'").await == origins.len() as i64
        })
        .await,
        "every refused intent gave up"
    );
    let failing: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox.destinations WHERE state = 'closed' AND failures = 2",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(failing, origins.len() as i64);
    // within the failure window (max_cooldown) the gate keeps them in view;
    // past it, it reads none of them, and the paused one first
    let mut settings = config().health().unwrap();
    let breaker = settings.breaker.as_mut().unwrap();
    breaker.max_cooldown = Duration::from_secs(1);
    settings.probe_settings = settings.breaker;
    let window = settings.failure_window();
    assert_eq!(window, Duration::from_secs(1));
    let paused = format!("http://127.0.0.1:{}", common::free_port());
    outbox_relay::services::health::pause(&db.store, &settings, &paused, None)
        .await
        .unwrap();
    let names = |rows: Vec<outbox_relay::store::destinations::DestinationRow>| {
        rows.into_iter().map(|r| r.name).collect::<Vec<_>>()
    };
    let viewed = names(
        db.store
            .read_unhealthy(Duration::from_secs(3600), 5)
            .await
            .unwrap(),
    );
    assert_eq!(viewed.len(), 5, "the view is bounded: {viewed:?}");
    assert_eq!(
        viewed[0], paused,
        "the paused destination first: {viewed:?}"
    );
    tokio::time::sleep(window).await;
    let viewed = names(db.store.read_unhealthy(window, 10_000).await.unwrap());
    assert_eq!(
        viewed,
        std::slice::from_ref(&paused),
        "failures past the window are not read"
    );
    // the relay prunes them (about every minute, the first time about ten
    // seconds after it starts)
    assert!(
        common::wait_for(Duration::from_secs(30), || async {
            rows(&db, "outbox.destinations WHERE failures > 0").await == 0
        })
        .await,
        "the stale failures were pruned: {} left",
        rows(&db, "outbox.destinations WHERE failures > 0").await
    );
    assert_eq!(
        rows(&db, "outbox.destinations").await,
        1,
        "only the paused destination is left"
    );
    common::terminate(&mut relay).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incident_across_many_origins_is_a_handful_of_alerts() {
    let db = TestDb::new().await;
    let alert_rx = Receiver::ok().await;
    let (origins, _held) = refused_origins(50);
    for (n, o) in origins.iter().enumerate() {
        db.enqueue(
            &format!("refused:{n}"),
            "webhook",
            json!({"url": format!("{o}/hook"), "body": n}),
        )
        .await;
    }
    let mut cfg = config();
    cfg.retry.max_attempts = 1;
    cfg.breaker.failures = 1;
    cfg.alerts.url = Some(alert_rx.url("/alerts"));
    let settings = cfg.health().unwrap();
    engine(db.store.clone(), &cfg).run_once().await.unwrap();
    let opened: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox.destination_events WHERE event = 'opened'")
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(
        opened,
        origins.len() as i64,
        "every origin's breaker opened"
    );
    engine(db.store.clone(), &cfg).run_once().await.unwrap();
    let got = alerts(&alert_rx);
    assert_eq!(
        got.iter().filter(|a| a.0 == "breaker.opened").count(),
        3,
        "the first three are raised one by one: {got:?}"
    );
    // the window is over (five minutes later): one summary, whichever of
    // three relays' health loops raises it
    sqlx::query("UPDATE outbox.alert_windows SET started_at = started_at - interval '5 minutes'")
        .execute(db.pool())
        .await
        .unwrap();
    for _ in 0..3 {
        outbox_relay::services::health::raise_alert_summaries(&db.store, &settings).await;
    }
    engine(db.store.clone(), &cfg).run_once().await.unwrap();
    let summaries: Vec<Value> = alert_rx
        .requests()
        .iter()
        .filter_map(|r| serde_json::from_slice::<Value>(&r.body).ok())
        .filter(|b| b["type"] == "alerts.suppressed")
        .collect();
    assert_eq!(summaries.len(), 1, "{summaries:?}");
    let detail = &summaries[0]["detail"];
    assert_eq!(summaries[0]["subject"], "breaker.opened");
    assert_eq!(detail["suppressed"], origins.len() - 3, "{detail}");
    assert_eq!(detail["raised"], 3);
    assert_eq!(detail["subjects"].as_array().unwrap().len(), 20, "{detail}");
    assert_eq!(
        alert_rx.requests().len(),
        4,
        "an incident of {} origins is 4 messages",
        origins.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_holds_for_a_claim_recovered_after_a_crash() {
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    let parked_rx = Receiver::ok().await;
    db.enqueue("crashed", "webhook", json!({"url": rx.url("/"), "body": 1}))
        .await;
    db.enqueue(
        "crashed-parked",
        "webhook",
        json!({"url": parked_rx.url("/"), "body": 2}),
    )
    .await;
    // a relay claims both with a 100ms lease and dies mid-delivery
    let claims = db.store.claim("dead-relay", 10, 100, &[]).await.unwrap();
    assert_eq!(claims.len(), 2);
    let redeliver = config();
    let mut park = config();
    park.webhook.on_ambiguous = AmbiguityPolicy::Park;
    let settings = redeliver.health().unwrap();
    for r in [&rx, &parked_rx] {
        outbox_relay::services::health::pause(
            &db.store,
            &settings,
            &format!("http://{}", r.addr),
            None,
        )
        .await
        .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(150)).await;

    // the sweeper recovers both; the gate holds them like any other claim
    engine(db.store.clone(), &redeliver)
        .run_once()
        .await
        .unwrap();
    assert!(
        rx.requests().is_empty() && parked_rx.requests().is_empty(),
        "a paused destination receives nothing, recovered claims included"
    );
    for key in ["crashed", "crashed-parked"] {
        let i = db.store.find(key).await.unwrap();
        assert_eq!((i.state.as_str(), i.attempts), ("pending", 1), "{i:?}");
        assert!(
            i.last_error
                .as_deref()
                .unwrap_or_default()
                .contains("is paused by"),
            "{i:?}"
        );
        let outcomes: Vec<String> = db
            .store
            .attempts(i.id)
            .await
            .unwrap()
            .into_iter()
            .map(|a| a.outcome)
            .collect();
        assert_eq!(outcomes, ["lost"], "no attempt spent while paused");
    }

    // resumed: the recovery goes on where it stopped. Redelivered under the
    // same key, or, with the park policy, parked: the lost attempt is still
    // asked about, not forgotten by the deferral
    outbox_relay::services::health::resume(
        &db.store,
        &settings,
        &format!("http://{}", parked_rx.addr),
    )
    .await
    .unwrap();
    let parked = run_for(
        engine(db.store.clone(), &park),
        Duration::from_secs(15),
        || async { db.state("crashed-parked").await == "ambiguous" },
    )
    .await;
    assert!(
        parked,
        "the recovery was parked: {:?}",
        db.store.find("crashed-parked").await.unwrap()
    );
    assert!(parked_rx.requests().is_empty(), "parking never re-executes");
    let reason = db
        .store
        .find("crashed-parked")
        .await
        .unwrap()
        .last_error
        .unwrap();
    assert!(reason.contains("dead-relay"), "{reason}");
    outbox_relay::services::health::resume(&db.store, &settings, &format!("http://{}", rx.addr))
        .await
        .unwrap();
    common::run_until(
        engine(db.store.clone(), &redeliver),
        Duration::from_secs(15),
        || async { db.state("crashed").await == "delivered" },
    )
    .await;
    assert_eq!(rx.requests().len(), 1);
    let i = db.store.find("crashed").await.unwrap();
    let outcomes: Vec<String> = db
        .store
        .attempts(i.id)
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.outcome)
        .collect();
    assert_eq!(outcomes, ["lost", "delivered"]);
    assert_eq!(
        rows(&db, "outbox.intents WHERE recover_owner IS NOT NULL").await,
        0
    );
}

/// One table of spellings, and the name each comes to: the gate's
/// (`config::destinations::origin`, which pauses and breakers go by) and
/// the SQL's (`outbox.destination_of`, which `destinations`, the console's
/// host filter and a bulk change's dry run count by) give the same one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_spelling_of_an_origin_has_one_name_in_the_gate_and_in_the_sql() {
    use outbox_relay::config::destinations::origin;
    let db = TestDb::new().await;
    let local = Some("http://127.0.0.1:8080");
    let table: &[(&str, Option<&str>)] = &[
        ("http://127.0.0.1:8080/x", local),
        ("http://127.1:8080/", local),
        ("http://0x7f.1:8080", local),
        ("http://0x7F.0.0.1:8080", local),
        ("http://2130706433:8080/a", local),
        ("http://0177.0.0.1:8080", local),
        ("http://127.0.0.1.:8080", local),
        ("http://[::ffff:127.0.0.1]:8080", local),
        ("http://[::FFFF:7f00:1]:8080/x?y", local),
        ("http://%31%32%37.0.0.1:8080", local),
        ("http://127.0.0.1:08080", local),
        ("http://user:pw@127.0.0.1:8080/", local),
        ("  http://127.0.0.1:8080/  ", local),
        ("http:\\\\127.0.0.1:8080\\x", local),
        ("http:127.0.0.1:8080/x", local),
        ("http://localhost.:8080", Some("http://localhost:8080")),
        ("http://LocalHost.:8080/x", Some("http://localhost:8080")),
        ("HTTP://LOCALHOST:8080", Some("http://localhost:8080")),
        ("http://%6Cocalhost:8080", Some("http://localhost:8080")),
        ("http://example.com../", Some("http://example.com")),
        ("HTTPS://API.Example:443/a?b", Some("https://api.example")),
        ("https://api.example:0443/", Some("https://api.example")),
        ("http://api.example:80/", Some("http://api.example")),
        ("http://api.example:443/", Some("http://api.example:443")),
        ("http://h:/", Some("http://h")),
        ("http://h:0/", Some("http://h:0")),
        (
            "https://api-2.example:65535",
            Some("https://api-2.example:65535"),
        ),
        ("http://[::1]:8080", Some("http://[::1]:8080")),
        ("http://[0:0:0:0:0:0:0:1]/", Some("http://[::1]")),
        ("http://[::7f00:1]/", Some("http://[::7f00:1]")),
        (
            "http://[2001:DB8:0:0:1:0:0:1]/",
            Some("http://[2001:db8::1:0:0:1]"),
        ),
        (
            "http://Bücher.example./",
            Some("http://xn--bcher-kva.example"),
        ),
        (
            "http://b%C3%BCcher.example/",
            Some("http://xn--bcher-kva.example"),
        ),
        ("http://münchen.de", Some("http://xn--mnchen-3ya.de")),
        ("http://1.2.3.4.5/", None),
        ("http://256.0.0.1/", None),
        ("http://0x100000000/", None),
        ("http://h:65536/", None),
        ("http://a b/", None),
        ("http://[::1/", None),
        ("ftp://h/", None),
        ("not a url", None),
    ];
    let mut wrong = Vec::new();
    for (spelling, want) in table {
        let gate = origin(spelling);
        let sql: Option<String> = sqlx::query_scalar(
            "SELECT outbox.destination_of('webhook', NULL, jsonb_build_object('url', $1::text))",
        )
        .bind(spelling)
        .fetch_one(db.pool())
        .await
        .unwrap();
        if gate.as_deref() != *want || sql.as_deref() != *want {
            wrong.push(format!(
                "{spelling:?}: gate {gate:?}, SQL {sql:?}, want {want:?}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));

    // the backlog the operator views count is the one the pause holds
    for (n, (spelling, _)) in table.iter().enumerate().filter(|(_, (_, w))| *w == local) {
        db.enqueue(
            &format!("spelled:{n}"),
            "webhook",
            json!({"url": spelling, "body": n}),
        )
        .await;
    }
    let backlogs = db.store.destination_backlogs().await.unwrap();
    let spelled = table.iter().filter(|(_, w)| *w == local).count() as i64;
    assert_eq!(backlogs, [(local.map(str::to_string), spelled)]);
}

/// A pause of `http://localhost:P` holds `http://localhost.:P` and
/// `http://LocalHost.:P`: a name is matched without its trailing dot and
/// whatever its case.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_holds_a_dns_name_with_a_trailing_dot_in_any_case() {
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    let port = rx.addr.port();
    let cfg = config();
    let settings = cfg.health().unwrap();
    let paused = outbox_relay::services::health::pause(
        &db.store,
        &settings,
        &format!("http://localhost:{port}"),
        None,
    )
    .await
    .unwrap();
    for (n, host) in ["localhost.", "LocalHost.", "LOCALHOST"].iter().enumerate() {
        db.enqueue(
            &format!("dotted:{n}"),
            "webhook",
            json!({"url": format!("http://{host}:{port}/hook"), "body": n}),
        )
        .await;
    }
    engine(db.store.clone(), &cfg).run_once().await.unwrap();
    assert!(rx.requests().is_empty(), "{:?}", rx.requests().len());
    assert_eq!(
        db.count("key LIKE 'dotted:%' AND state = 'pending' AND attempts = 0 AND last_error LIKE '%is paused by%'")
            .await,
        3
    );
    let counted = db.store.destination_backlogs().await.unwrap();
    assert_eq!(counted, [(Some(paused), 3)]);
}

/// A probe whose relay died leaves its breaker half-open with nobody to
/// settle it. Once its time is up the breaker is open again (its probe
/// due, for the next intent), and with nothing pending it is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_open_breaker_whose_prober_died_is_open_again_or_closed() {
    let db = TestDb::new().await;
    let stranded = "https://stranded.example";
    let waiting = "https://waiting.example";
    for name in [stranded, waiting] {
        sqlx::query(
            "INSERT INTO outbox.destinations
                    (name, state, failures, opened_at, cooldown, next_probe_at, probe_owner, probe_until)
             VALUES ($1, 'half_open', 5, now() - interval '10 minutes', interval '1 minute',
                     now() - interval '3 minutes', 'killed-relay', now() - interval '2 minutes')",
        )
        .bind(name)
        .execute(db.pool())
        .await
        .unwrap();
    }
    sqlx::query(
        "INSERT INTO outbox.intents (key, kind, payload, run_after)
         VALUES ('waiting', 'webhook', $1, now() + interval '1 hour')",
    )
    .bind(json!({"url": format!("{waiting}/hook"), "body": 1}))
    .execute(db.pool())
    .await
    .unwrap();
    let settings = config().health().unwrap();
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let health = tokio::spawn(outbox_relay::services::health::run(
        db.store.clone(),
        settings,
        "relay-restarted".into(),
        Duration::from_millis(20),
        stop,
    ));
    let state = |name: &'static str| {
        let pool = db.pool().clone();
        async move {
            sqlx::query_scalar::<_, String>("SELECT state FROM outbox.destinations WHERE name = $1")
                .bind(name)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    let settled = common::wait_for(Duration::from_secs(10), || async {
        state(stranded).await == "closed" && state(waiting).await == "open"
    })
    .await;
    stop_tx.send(true).unwrap();
    health.await.unwrap();
    assert!(
        settled,
        "stranded {}, waiting {}",
        state(stranded).await,
        state(waiting).await
    );
    let events: Vec<String> = sqlx::query_scalar(
        "SELECT event FROM outbox.destination_events WHERE destination = $1 ORDER BY id",
    )
    .bind(stranded)
    .fetch_all(db.pool())
    .await
    .unwrap();
    assert_eq!(events, ["probe_expired", "closed"]);
    // the open one's probe is due: the next intent takes it
    let taken: bool =
        sqlx::query_scalar("SELECT outbox.take_probe($1, 'relay-restarted', interval '5 seconds')")
            .bind(waiting)
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert!(taken);
}

/// A rate limit's bucket in use is touched at every take, so that the
/// pruning of idle destinations never drops it (and its tokens).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_in_use_is_touched_by_every_take_and_never_pruned() {
    let db = TestDb::new().await;
    let name = "https://limited.example";
    db.store.take_tokens(name, 1.0, 5.0, 5).await.unwrap();
    sqlx::query("UPDATE outbox.destinations SET updated_at = now() - interval '40 days'")
        .execute(db.pool())
        .await
        .unwrap();
    assert_eq!(db.store.take_tokens(name, 1.0, 5.0, 5).await.unwrap(), 0);
    let age: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM now() - updated_at)::float8 FROM outbox.destinations WHERE name = $1",
    )
    .bind(name)
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert!(age < 60.0, "updated {age}s ago");
    db.store
        .prune_destinations(Duration::from_secs(30 * 24 * 3600))
        .await
        .unwrap();
    assert_eq!(
        rows(&db, "outbox.destinations WHERE tokens IS NOT NULL").await,
        1,
        "the bucket in use is kept, its tokens spent"
    );
}

/// Deliveries held back for the standbys are plain to see: `stats` counts
/// the intents held back (a held-up relay claims nothing, so they are due
/// and unclaimed) and `/readyz`, still 200, says which relay holds them
/// and for how long.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_hold_is_counted_by_stats_and_told_by_readyz() {
    let db = TestDb::new().await;
    sqlx::query(
        "INSERT INTO outbox.relays (owner, version, kinds, known_kinds, standbys_needed,
                                    standbys_streaming, standby_waits, standbys_behind_since)
         VALUES ('held-relay', 'test', '{webhook}', '{webhook}', 1, 0, 0,
                 now() - interval '75 seconds')",
    )
    .execute(db.pool())
    .await
    .unwrap();
    for n in 0..5 {
        db.enqueue(
            &format!("held:{n}"),
            "webhook",
            json!({"url": "http://127.0.0.1:9/", "body": n}),
        )
        .await;
    }
    let out = cli(&db, &["stats"]).await;
    let stats = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{stats}");
    assert!(
        stats.contains(
            "held back: 5 intent(s) wait for the standbys (relay.wait_for_standbys): \
             5 due and not claimed, 0 claimed; held up for 7"
        ),
        "{stats}"
    );

    let health = std::sync::Arc::new(outbox_relay::observe::readiness::Health::default());
    health
        .registered
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let access = outbox_relay::services::lookup::Access {
        enabled: false,
        token: None,
    };
    let (addr, server) = outbox_relay::services::endpoint::serve(
        "127.0.0.1:0".parse().unwrap(),
        db.store.clone(),
        health,
        access,
    )
    .await
    .unwrap();
    let server = tokio::spawn(server);
    let ready = reqwest::get(format!("http://{addr}/readyz")).await.unwrap();
    assert_eq!(ready.status(), 200);
    let body = ready.text().await.unwrap();
    assert!(body.starts_with("ready\n"), "{body}");
    assert!(
        body.contains("held up: relay held-relay has held deliveries back for 7")
            && body.contains("must reach 1 standby(s), 0 streaming (relay.wait_for_standbys)"),
        "{body}"
    );
    // once the standbys catch up, readyz says only that it is ready
    sqlx::query("UPDATE outbox.relays SET standbys_behind_since = NULL")
        .execute(db.pool())
        .await
        .unwrap();
    let body = reqwest::get(format!("http://{addr}/readyz"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(body, "ready\n");
    server.abort();
}

/// The backlog read counts each pending or claimed row where
/// `outbox.destination_of` puts it, whatever names its destination: the
/// kind, the `destination` column, or a webhook's URL however spelled (or
/// not a string, as a row written past `outbox.enqueue` may hold).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backlog_read_counts_each_row_where_destination_of_puts_it() {
    let db = TestDb::new().await;
    let rows = [
        (
            "webhook",
            None,
            json!({"url": "https://a.example/x", "body": 1}),
        ),
        (
            "webhook",
            None,
            json!({"url": "https://a.example:443/y?z=1", "body": 2}),
        ),
        (
            "webhook",
            None,
            json!({"url": "HTTPS://A.example./y", "body": 3}),
        ),
        (
            "webhook",
            Some("partner"),
            json!({"url": "https://b.example/x", "body": 4}),
        ),
        ("webhook", None, json!({"url": 42, "body": 5})),
        (
            "webhook",
            None,
            json!({"url": {"host": "c.example"}, "body": 6}),
        ),
        ("webhook", None, json!({"body": 7})),
        ("email", Some("ignored"), json!({"to": "a@example.com"})),
        ("nats", None, json!({"subject": "s"})),
        ("kafka", Some("ignored"), json!({"topic": "t"})),
    ];
    for (n, (kind, destination, payload)) in rows.iter().enumerate() {
        sqlx::query(
            "INSERT INTO outbox.intents (key, kind, destination, payload) VALUES ($1, $2, $3, $4)",
        )
        .bind(format!("row:{n}"))
        .bind(kind)
        .bind(destination)
        .bind(payload)
        .execute(db.pool())
        .await
        .unwrap();
    }
    // one claimed (counted), one delivered (not)
    sqlx::query(
        "UPDATE outbox.intents SET state = 'claimed', owner = 'r', lease_expires_at = now() + interval '1 minute'
          WHERE key = 'row:0'",
    )
    .execute(db.pool())
    .await
    .unwrap();
    sqlx::query(
        "UPDATE outbox.intents SET state = 'delivered', delivered_at = now() WHERE key = 'row:1'",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let mut per_row: Vec<(Option<String>, i64)> = sqlx::query_as(
        "SELECT outbox.destination_of(kind, destination, payload), count(*)
           FROM outbox.intents WHERE state IN ('pending', 'claimed') GROUP BY 1",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    let mut grouped = db.store.destination_backlogs().await.unwrap();
    per_row.sort();
    grouped.sort();
    assert_eq!(grouped, per_row);
    assert_eq!(grouped.iter().map(|r| r.1).sum::<i64>(), 9);
    assert!(
        grouped.contains(&(Some("https://a.example".into()), 2)),
        "{grouped:?}"
    );
}

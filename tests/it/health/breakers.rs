//! Circuit breakers: an outage opens one and the destination drains by
//! itself, a breaker closes with nothing left to send or when its prober
//! died, and the failures it counts are only recent ones.

use super::*;

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

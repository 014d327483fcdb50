//! /metrics, /healthz and /readyz of a running relay, scraped over HTTP.

use std::collections::HashMap;
use std::time::Duration;

use crate::common;
use crate::common::proxy::Proxy;
use crate::common::{relay_bin, wait_for, Receiver, Reply, TestDb};
use serde_json::json;

/// Prometheus text → "name{labels}" → value.
async fn scrape(port: u16) -> HashMap<String, f64> {
    let text = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            l.rsplit_once(' ')
                .map(|(k, v)| (k.to_string(), v.parse().unwrap_or(f64::NAN)))
        })
        .collect()
}

/// The sum of every series of `name` whose labels include all of `labels`.
fn sum(m: &HashMap<String, f64>, name: &str, labels: &[&str]) -> f64 {
    m.iter()
        .filter(|(k, _)| k.split('{').next() == Some(name) && labels.iter().all(|l| k.contains(l)))
        .map(|(_, v)| v)
        .sum()
}

fn spawn(db_url: &str, port: u16, extra: &[(&str, &str)]) -> tokio::process::Child {
    let mut cmd = common::relay_command(db_url);
    cmd.arg("run")
        .env(
            "OUTBOX_RELAY__RELAY__METRICS_ADDR",
            format!("\"127.0.0.1:{port}\""),
        )
        .env("OUTBOX_RELAY__RELAY__POLL_INTERVAL", "50ms")
        .env("OUTBOX_RELAY__RELAY__SWEEP_INTERVAL", "100ms")
        .env("OUTBOX_RELAY__RELAY__LEASE", "5s")
        .env("OUTBOX_RELAY__WEBHOOK__TIMEOUT", "2s")
        .env("OUTBOX_RELAY__RETRY__SCHEDULE", "[\"50ms\"]")
        .env("RUST_LOG", "warn");
    for (k, v) in extra {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_are_counted_by_source_and_each_effect_once() {
    let db = TestDb::new().await;
    let rx = Receiver::start(|r, _| {
        if r.path == "/replayed" {
            Reply::status(200).header("idempotent-replayed", "true")
        } else {
            Reply::status(200)
        }
    })
    .await;
    let hook = |path: &str| json!({"url": rx.url(path), "body": {"p": path}});
    // a: plain; b: enqueued three times (2 duplicates); c: the receiver reports a replay;
    // d: claimed by a relay that died (lease expires, redelivered)
    db.enqueue("m:a", "webhook", hook("/a")).await;
    for _ in 0..3 {
        db.enqueue("m:b", "webhook", hook("/b")).await;
    }
    db.enqueue("m:c", "webhook", hook("/replayed")).await;
    db.enqueue("m:d", "webhook", hook("/d")).await;
    let dead = db.store.claim("dead-relay", 1, 100, &[]).await.unwrap();
    assert_eq!(dead[0].key, "m:a", "the dead relay took m:a");
    tokio::time::sleep(Duration::from_millis(150)).await;

    let port = common::free_port();
    let mut relay = spawn(&db.url, port, &[]);
    assert!(
        wait_for(Duration::from_secs(20), || async {
            db.count("state = 'delivered'").await == 4
        })
        .await
    );
    // a duplicate enqueue of an intent already delivered still counts, per client
    sqlx::query("SELECT * FROM outbox.enqueue('m:b', 'webhook', $1, p_source => 'checkout')")
        .bind(hook("/b"))
        .execute(db.pool())
        .await
        .unwrap();
    // an operator retry re-sends a delivered intent under the same key
    let out = common::cli(&db, &["retry", "m:d", "--force"]).await;
    assert!(out.status.success());
    assert!(
        wait_for(Duration::from_secs(20), || async {
            let m = scrape(port).await;
            sum(&m, "outbox_replays_total", &["source=\"operator\""]) == 1.0
                && sum(&m, "outbox_replays_total", &["source=\"enqueue\""]) == 3.0
        })
        .await
    );
    let m = scrape(port).await;
    let replays = |source: &str| {
        sum(
            &m,
            "outbox_replays_total",
            &[&format!("source=\"{source}\"")],
        )
    };
    assert_eq!(replays("enqueue"), 3.0, "three duplicate enqueues");
    assert_eq!(replays("provider"), 1.0, "one provider-reported replay");
    assert_eq!(
        replays("redelivery"),
        1.0,
        "one redelivery after a lease expiry"
    );
    assert_eq!(replays("operator"), 1.0, "one operator retry");
    assert_eq!(
        sum(
            &m,
            "outbox_duplicate_enqueues_total",
            &["client=\"checkout\""]
        ),
        1.0
    );
    assert_eq!(
        sum(
            &m,
            "outbox_duplicate_enqueues_total",
            &["client=\"unknown\""]
        ),
        2.0
    );
    assert_eq!(
        sum(&m, "outbox_delivered_total", &["kind=\"webhook\""]),
        4.0,
        "each effect once"
    );
    assert_eq!(
        sum(&m, "outbox_attempts_total", &["outcome=\"delivered\""]),
        5.0
    );
    assert_eq!(sum(&m, "outbox_leases_expired_total", &[]), 1.0);
    assert_eq!(sum(&m, "outbox_fencing_rejections_total", &[]), 0.0);
    assert_eq!(sum(&m, "outbox_invariant_violations_total", &[]), 0.0);
    assert!(
        m.contains_key("outbox_spans_dropped_total"),
        "exported at 0 from the start"
    );
    assert!(m
        .keys()
        .any(|k| k.starts_with("outbox_delivery_latency_seconds_bucket")));
    assert!(m
        .keys()
        .any(|k| k.starts_with("outbox_attempt_duration_seconds_bucket")));
    // intents per claim and per completion statement, in buckets of counts
    let (claims, claimed) = (
        sum(&m, "outbox_claim_batch_size_count", &[]),
        sum(&m, "outbox_claim_batch_size_sum", &[]),
    );
    assert!(
        claims >= 1.0 && claimed >= claims,
        "{claims} claims of {claimed} intents"
    );
    let (writes, written) = (
        sum(&m, "outbox_completion_batch_size_count", &[]),
        sum(&m, "outbox_completion_batch_size_sum", &[]),
    );
    assert!(
        writes >= 1.0 && written >= 5.0,
        "{writes} writes of {written} completions"
    );
    assert!(
        m.contains_key("outbox_claim_batch_size_bucket{le=\"1\"}"),
        "{m:?}"
    );
    assert!(
        m.contains_key("outbox_completion_batch_size_bucket{le=\"1024\"}"),
        "{m:?}"
    );
    assert!(
        wait_for(Duration::from_secs(10), || async {
            let m = scrape(port).await;
            m.get("outbox_intents{kind=\"webhook\",state=\"pending\"}") == Some(&0.0)
                && m.contains_key("outbox_oldest_due_seconds{kind=\"webhook\"}")
        })
        .await,
        "queue gauges are refreshed"
    );
    common::terminate(&mut relay).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_follows_the_database_and_healthz_the_process() {
    let db = TestDb::new().await;
    let mut proxy = Proxy::to_postgres().await;
    let via_proxy = proxy.url_for(&db);

    let port = common::free_port();
    let mut relay = spawn(via_proxy.as_str(), port, &[]);
    let status = |path: &'static str| async move {
        match reqwest::get(format!("http://127.0.0.1:{port}{path}")).await {
            Ok(r) => r.status().as_u16(),
            Err(_) => 0,
        }
    };
    assert!(
        wait_for(Duration::from_secs(20), || async {
            status("/readyz").await == 200
        })
        .await,
        "ready"
    );
    // the container health check agrees, with no database URL of its own
    // (0.0.0.0, as in a container's config, means this host)
    let health = |args: Vec<String>| async move {
        tokio::process::Command::new(relay_bin())
            .arg("health")
            .args(args)
            .env_remove("DATABASE_URL")
            .output()
            .await
            .unwrap()
    };
    let out = health(vec!["--addr".into(), format!("0.0.0.0:{port}")]).await;
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("/readyz: ready"),
        "{out:?}"
    );

    proxy.down();
    assert!(
        wait_for(Duration::from_secs(20), || async {
            status("/readyz").await == 503
        })
        .await,
        "not ready without the database"
    );
    assert_eq!(status("/healthz").await, 200, "but alive");
    let out = health(vec!["--addr".into(), format!("127.0.0.1:{port}")]).await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("503"),
        "{out:?}"
    );
    let out = health(vec![
        "--live".into(),
        "--addr".into(),
        format!("127.0.0.1:{port}"),
    ])
    .await;
    assert!(out.status.success(), "{out:?}");
    proxy.up().await;
    assert!(
        wait_for(Duration::from_secs(30), || async {
            status("/readyz").await == 200
        })
        .await,
        "ready again"
    );
    // and it still delivers
    let rx = Receiver::ok().await;
    db.enqueue(
        "after-outage",
        "webhook",
        json!({"url": rx.url("/"), "body": 1}),
    )
    .await;
    assert!(
        wait_for(Duration::from_secs(20), || async {
            db.state("after-outage").await == "delivered"
        })
        .await
    );
    let status_code = common::terminate(&mut relay).await;
    assert!(status_code.success());
    // a mistyped flag is a failed check too (Docker reserves exit code 2)
    let out = health(vec!["--bogus".into()]).await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    // nobody listening: a clear failure, not a hang
    let out = health(vec!["--addr".into(), format!("127.0.0.1:{port}")]).await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("/readyz"),
        "{out:?}"
    );
    proxy.down();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destination_health_is_exported_with_bounded_labels() {
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    let origin = format!("http://{}", rx.addr);
    // a paused destination with a backlog, and 12 more with backlogs of
    // their own: the 10 largest by name, the rest as `other`
    sqlx::query("SELECT outbox.pause_destination($1, 'test')")
        .bind(&origin)
        .execute(db.pool())
        .await
        .unwrap();
    for n in 0..3 {
        db.enqueue(
            &format!("paused:{n}"),
            "webhook",
            json!({"url": rx.url("/hook"), "body": n}),
        )
        .await;
    }
    for host in 1..=12 {
        for n in 0..(20 + host) {
            sqlx::query(
                "INSERT INTO outbox.intents (key, kind, payload, run_after)
                 VALUES ($1, 'webhook', $2, now() + interval '1 hour')",
            )
            .bind(format!("later:{host}:{n}"))
            .bind(json!({"url": format!("https://h{host}.example/x"), "body": 1}))
            .execute(db.pool())
            .await
            .unwrap();
        }
    }
    let port = common::free_port();
    let limit = format!("{{\"{origin}\" = \"5/s\"}}");
    let mut relay = spawn(&db.url, port, &[("OUTBOX_RELAY__LIMITS", &limit)]);
    // a claim may set the paused destination's intents aside for its
    // limit before any is dispatched and deferred as paused: the gauges
    // are ready once one was
    let ready = |m: &HashMap<String, f64>| {
        sum(
            m,
            "outbox_destination_state",
            &[&format!("destination=\"{origin}\"")],
        ) == 3.0
            && sum(m, "outbox_destination_pending", &["destination=\"other\""]) > 0.0
            && sum(
                m,
                "outbox_destination_deferrals_total",
                &["reason=\"paused\""],
            ) >= 1.0
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut m = HashMap::new();
    while !ready(&m) {
        assert!(
            std::time::Instant::now() < deadline,
            "the gauges appear, and a paused intent held back: {m:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        if reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
            .await
            .is_ok()
        {
            m = scrape(port).await;
        }
    }
    let pending = |d: &str| {
        sum(
            &m,
            "outbox_destination_pending",
            &[&format!("destination=\"{d}\"")],
        )
    };
    assert_eq!(pending(&origin), 3.0, "the configured destination by name");
    // the 10 largest others by name (h3..h12), h1 and h2 as other
    assert_eq!(pending("https://h12.example"), 32.0);
    assert_eq!(pending("https://h3.example"), 23.0);
    assert_eq!(pending("https://h2.example"), 0.0);
    assert_eq!(pending("other"), 21.0 + 22.0);
    let names = m
        .keys()
        .filter(|k| k.starts_with("outbox_destination_pending{"))
        .count();
    assert_eq!(names, 12, "configured + 10 + other");
    common::terminate(&mut relay).await;
}

/// A condition on a scrape.
type Check = dyn Fn(&HashMap<String, f64>) -> bool;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destination_that_recovers_leaves_the_state_gauge() {
    let db = TestDb::new().await;
    let port = common::free_port();
    let mut relay = spawn(&db.url, port, &[]);
    let state_series = |m: &HashMap<String, f64>| {
        let mut names: Vec<String> = m
            .keys()
            .filter(|k| k.starts_with("outbox_destination_state{"))
            .cloned()
            .collect();
        names.sort();
        names
    };
    // (scrape until `ok`, for at most 20 s: the gauges refresh every 5 s)
    let scrape_until = |what: &'static str, ok: Box<Check>| async move {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(r) = reqwest::get(format!("http://127.0.0.1:{port}/metrics")).await {
                if r.status().is_success() {
                    let m = scrape(port).await;
                    if ok(&m) {
                        return m;
                    }
                    assert!(
                        std::time::Instant::now() < deadline,
                        "{what}: {:?}",
                        m.iter()
                            .filter(|(k, _)| k.starts_with("outbox_destination_state"))
                            .collect::<Vec<_>>()
                    );
                }
            }
            assert!(std::time::Instant::now() < deadline, "{what}: no /metrics");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    for cycle in 0..2 {
        let origins: Vec<String> = (0..5)
            .map(|n| format!("https://c{cycle}-{n}.example"))
            .collect();
        for o in &origins {
            sqlx::query("SELECT outbox.pause_destination($1, 'test')")
                .bind(o)
                .execute(db.pool())
                .await
                .unwrap();
        }
        let shown = origins.clone();
        scrape_until(
            "the paused destinations are shown",
            Box::new(move |m| {
                shown.iter().all(|o| {
                    m.get(&format!("outbox_destination_state{{destination=\"{o}\"}}")) == Some(&3.0)
                })
            }),
        )
        .await;
        for o in &origins {
            sqlx::query("SELECT outbox.resume_destination($1)")
                .bind(o)
                .execute(db.pool())
                .await
                .unwrap();
        }
        let m = scrape_until(
            "the resumed destinations leave the gauge",
            Box::new(move |m| {
                !origins.iter().any(|o| {
                    m.contains_key(&format!("outbox_destination_state{{destination=\"{o}\"}}"))
                })
            }),
        )
        .await;
        assert_eq!(
            state_series(&m),
            ["outbox_destination_state{destination=\"other\"}"],
            "nothing configured, nothing unhealthy: only `other` is left"
        );
    }
    common::terminate(&mut relay).await;
}

/// A transaction that holds a snapshot holds back the xmin horizon: the
/// gauges say for how long and how many transaction ids back, and fall
/// back once it ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_transaction_shows_in_the_xmin_horizon_gauges() {
    use sqlx::Connection;
    let db = TestDb::new().await;
    let port = common::free_port();
    let mut relay = spawn(&db.url, port, &[]);
    let gauges = || async move {
        let m = scrape(port).await;
        let get =
            |name: &str, holder: &str| m.get(&format!("{name}{{holder=\"{holder}\"}}")).copied();
        (
            get("outbox_oldest_xmin_age_seconds", "transaction"),
            get("outbox_oldest_xmin_age_transactions", "transaction"),
            m,
        )
    };
    assert!(
        wait_for(Duration::from_secs(20), || async {
            reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
                .await
                .is_ok()
                && gauges().await.1.is_some()
        })
        .await,
        "the xmin gauges are exported"
    );
    let (_, _, m) = gauges().await;
    for holder in ["prepared", "replication_slot", "standby"] {
        assert!(
            m.contains_key(&format!(
                "outbox_oldest_xmin_age_transactions{{holder=\"{holder}\"}}"
            )),
            "{holder}: {m:?}"
        );
    }
    assert!(m.contains_key("outbox_oldest_xmin_age_seconds{holder=\"prepared\"}"));

    // a report in REPEATABLE READ: its snapshot is taken by its first read
    let mut report = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let began = std::time::Instant::now();
    sqlx::query("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut report)
        .await
        .unwrap();
    sqlx::query("SELECT count(*) FROM outbox.intents")
        .execute(&mut report)
        .await
        .unwrap();
    // twenty transactions that write after it: each takes a transaction id
    for _ in 0..20 {
        sqlx::query("SELECT txid_current()")
            .execute(db.pool())
            .await
            .unwrap();
    }
    let hold = Duration::from_secs(6);
    tokio::time::sleep(hold.saturating_sub(began.elapsed())).await;
    let seen = std::cell::Cell::new((None, None));
    assert!(
        wait_for(Duration::from_secs(15), || async {
            let (secs, xids, _) = gauges().await;
            seen.set((secs, xids));
            secs >= Some(hold.as_secs_f64()) && xids >= Some(20.0)
        })
        .await,
        "held for {hold:?} and 20 transactions: {:?}",
        seen.get()
    );
    assert!(
        seen.get().0 <= Some(began.elapsed().as_secs_f64()),
        "no older than the transaction: {:?}",
        seen.get()
    );

    sqlx::query("ROLLBACK").execute(&mut report).await.unwrap();
    assert!(
        wait_for(Duration::from_secs(15), || async {
            let (secs, xids, _) = gauges().await;
            seen.set((secs, xids));
            secs.is_some_and(|s| s < 1.0) && xids.is_some_and(|x| x < 20.0)
        })
        .await,
        "falls back once the transaction ends: {:?}",
        seen.get()
    );
    common::terminate(&mut relay).await;
}

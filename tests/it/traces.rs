//! Tracing: an attempt is a span in the application's trace, exported over
//! OTLP to a real receiver (the official protobuf definitions), and the
//! webhook names that span in its `traceparent`.

use std::time::Duration;

use outbox_relay::config::Config;
use outbox_relay::engine::{Engine, EngineConfig};
use outbox_relay::observe::trace::{Export, Protocol, Tracer};
use serde_json::{json, Value};

use crate::common::otlp::{Collector, SpanSeen};
use crate::common::{self, config, run_until, Receiver, Reply, TestDb};

/// A W3C `traceparent` of a new application span: (header, trace id, span id).
pub(crate) fn app_span() -> (String, String, String) {
    let trace = format!("{:016x}{:016x}", fastrand::u64(1..), fastrand::u64(..));
    let span = format!("{:016x}", fastrand::u64(1..));
    (format!("00-{trace}-{span}-01"), trace, span)
}

pub(crate) fn export(collector: &Collector, protocol: Protocol, queue: usize) -> Export {
    Export {
        endpoint: Some(match protocol {
            Protocol::HttpProtobuf => format!("{}/v1/traces", collector.http_endpoint()),
            Protocol::Grpc => collector.grpc_endpoint(),
        }),
        protocol,
        sample_ratio: None,
        default_service_name: true,
        queue,
    }
}

fn traced_engine(db: &TestDb, tracer: &Tracer) -> Engine {
    traced_engine_with(db, &config(), tracer)
}

/// An engine of `config` whose attempts are spans of `tracer`.
pub(crate) fn traced_engine_with(db: &TestDb, config: &Config, tracer: &Tracer) -> Engine {
    let cfg = EngineConfig::from_config(config).with_tracer(tracer.clone());
    Engine::new(
        db.store.clone(),
        outbox_relay::engine::providers(config, &crate::common::context(&db.store, config))
            .unwrap(),
        cfg,
    )
}

/// Enqueue webhooks in one transaction that `SET LOCAL outbox.traceparent`
/// once (`None`: no context at all).
async fn enqueue_traced(db: &TestDb, traceparent: Option<&str>, intents: &[(&str, Value)]) {
    let mut tx = db.pool().begin().await.unwrap();
    if let Some(t) = traceparent {
        // SET takes no parameters; the value is the test's own
        sqlx::raw_sql(&format!("SET LOCAL outbox.traceparent = '{t}'"))
            .execute(&mut *tx)
            .await
            .unwrap();
    }
    for (key, payload) in intents {
        sqlx::query("SELECT outbox.enqueue($1, 'webhook', $2)")
            .bind(key)
            .bind(payload)
            .execute(&mut *tx)
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
}

/// Run an engine exporting to `collector` until `intents` are settled,
/// flush, and wait for `spans` spans (at most 10 s more): the spans then.
async fn deliver_traced(
    db: &TestDb,
    collector: &Collector,
    protocol: Protocol,
    intents: i64,
    spans: usize,
) -> Vec<SpanSeen> {
    let tracer = Tracer::start(&export(collector, protocol, 64)).unwrap();
    run_until(traced_engine(db, &tracer), Duration::from_secs(20), || {
        delivered_all(db, intents)
    })
    .await;
    tracer.shutdown().await;
    collector
        .wait_for(Duration::from_secs(10), |s| s.len() >= spans)
        .await
}

async fn delivered_all(db: &TestDb, n: i64) -> bool {
    db.count("state IN ('delivered', 'rejected')").await == n
}

fn by_key<'a>(spans: &'a [SpanSeen], key: &str) -> Vec<&'a SpanSeen> {
    spans
        .iter()
        .filter(|s| s.attr("outbox.intent.key") == Some(key))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_is_a_child_of_the_enqueuing_span_and_the_webhook_names_it() {
    let db = TestDb::new().await;
    let collector = Collector::start().await;
    let rx = Receiver::start(|r, _| {
        if r.path.starts_with("/gone") {
            Reply::status(410)
        } else {
            Reply::status(200)
        }
    })
    .await;
    let (traceparent, trace, app) = app_span();
    enqueue_traced(
        &db,
        Some(&traceparent),
        &[
            (
                "order:1:hook",
                json!({"url": rx.url("/in/s3cret-path?token=s3cret"), "body": 1}),
            ),
            ("order:1:gone", json!({"url": rx.url("/gone"), "body": 2})),
        ],
    )
    .await;
    let spans = deliver_traced(&db, &collector, Protocol::HttpProtobuf, 2, 2).await;

    let hook = by_key(&spans, "order:1:hook");
    assert_eq!(hook.len(), 1, "{spans:#?}");
    let hook = hook[0];
    assert_eq!(
        (hook.trace_id.as_str(), hook.parent_span_id.as_str()),
        (trace.as_str(), app.as_str())
    );
    assert_eq!(
        (hook.name.as_str(), hook.kind, hook.via),
        ("POST", 3, "http")
    );
    assert_eq!(hook.service, "outbox-relay");
    for (name, want) in [
        ("http.request.method", "POST"),
        ("server.address", "127.0.0.1"),
        ("http.response.status_code", "200"),
        ("outbox.intent.kind", "webhook"),
        ("outbox.attempt", "1"),
        ("outbox.outcome", "delivered"),
        ("outbox.replayed", "false"),
    ] {
        assert_eq!(hook.attr(name), Some(want), "{name}: {hook:#?}");
    }
    assert_eq!(
        hook.attr("url.full"),
        Some(format!("{}?token=REDACTED", rx.url("/in/REDACTED")).as_str()),
        "neither the path's nor the query's secret reaches the collector"
    );
    assert!(hook
        .attr("outbox.fence")
        .is_some_and(|f| f.parse::<i64>().is_ok()));
    assert_eq!(hook.status_code, 0, "a delivery is no error");

    // the receiver was told the attempt's span: its own spans join the trace
    let got = rx.requests();
    let sent = got.iter().find(|r| r.path.starts_with("/in")).unwrap();
    assert_eq!(
        sent.header("traceparent"),
        Some(format!("00-{trace}-{}-01", hook.span_id))
    );

    let gone = by_key(&spans, "order:1:gone")[0];
    assert_eq!(gone.trace_id, trace);
    assert_eq!(gone.attr("http.response.status_code"), Some("410"));
    assert_eq!(gone.attr("outbox.outcome"), Some("rejected"));
    assert_eq!(
        (gone.status_code, gone.attr("error.type")),
        (2, Some("rejected"))
    );
    assert!(gone.status_message.contains("410"), "{gone:#?}");
}

/// Without an endpoint nothing is exported, and the intent's own context
/// goes out unchanged; an intent without one (or with a malformed one,
/// which the enqueue ignored) sends none, and a payload's own header
/// passes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_export_the_applications_context_is_forwarded_unchanged() {
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    let (traceparent, _, _) = app_span();
    enqueue_traced(
        &db,
        Some(&traceparent),
        &[(
            "ctx",
            json!({"url": rx.url("/ctx"), "body": 1, "headers": {"traceparent": "00-stale"}}),
        )],
    )
    .await;
    enqueue_traced(
        &db,
        Some("00-not-a-trace-01"),
        &[("bad", json!({"url": rx.url("/bad"), "body": 2}))],
    )
    .await;
    enqueue_traced(
        &db,
        None,
        &[(
            "own",
            json!({"url": rx.url("/own"), "body": 3, "headers": {"traceparent": "00-app-set-it"}}),
        )],
    )
    .await;
    assert_eq!(
        db.count("traceparent IS NULL").await,
        2,
        "the malformed one is not stored"
    );
    run_until(
        common::engine(db.store.clone(), &config()),
        Duration::from_secs(20),
        || delivered_all(&db, 3),
    )
    .await;
    let header = |path: &str| {
        rx.requests()
            .into_iter()
            .find(|r| r.path == path)
            .and_then(|r| r.header("traceparent"))
    };
    assert_eq!(header("/ctx"), Some(traceparent));
    assert_eq!(header("/bad"), None);
    assert_eq!(header("/own").as_deref(), Some("00-app-set-it"));
}

/// An intent with no context (or a malformed one) is a new root; every
/// attempt of it lands in the one trace derived from its key, which the
/// console names too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_intent_without_context_has_its_own_trace_across_attempts() {
    let db = TestDb::new().await;
    let collector = Collector::start().await;
    let rx = Receiver::start(|_, nth| Reply::status(if nth == 1 { 503 } else { 200 })).await;
    enqueue_traced(
        &db,
        Some("garbage"),
        &[("lonely", json!({"url": rx.url("/l"), "body": 1}))],
    )
    .await;
    let spans = deliver_traced(&db, &collector, Protocol::Grpc, 1, 2).await;
    let intent = db.store.find("lonely").await.unwrap();
    let attempts = by_key(&spans, "lonely");
    assert_eq!(attempts.len(), 2, "{spans:#?}");
    for (n, span) in attempts.iter().enumerate() {
        assert_eq!(span.via, "grpc");
        assert_eq!(span.trace_id, intent.trace_id(), "attempt {n}");
        assert_eq!(span.parent_span_id, "", "a root");
    }
    assert_eq!(attempts[0].attr("outbox.outcome"), Some("transient"));
    assert_eq!(attempts[1].attr("outbox.outcome"), Some("delivered"));
    let sent: Vec<String> = rx
        .requests()
        .iter()
        .filter_map(|r| r.header("traceparent"))
        .collect();
    assert_eq!(
        sent,
        attempts
            .iter()
            .map(|s| format!("00-{}-{}-01", s.trace_id, s.span_id))
            .collect::<Vec<_>>()
    );
}

/// The binary, configured by the standard variables alone (gRPC), killed
/// mid-attempt: the survivor's reconcile and redelivery are spans in the
/// same trace as the first relay's attempt, and the JSON log lines of an
/// attempt name its trace and span.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivery_after_a_sigkilled_relay_stays_in_the_applications_trace() {
    let db = TestDb::new().await;
    let collector = Collector::start().await;
    let rx = Receiver::start(|_, nth| match nth {
        1 => Reply::status(503),
        2 => Reply::status(200).after(Duration::from_secs(30)),
        _ => Reply::status(200),
    })
    .await;
    let (traceparent, trace, app) = app_span();
    enqueue_traced(
        &db,
        Some(&traceparent),
        &[("crash", json!({"url": rx.url("/c"), "body": 1}))],
    )
    .await;
    let cfg_file = common::config_file(common::SUBPROCESS_CONFIG);
    let logs = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("traces");
    std::fs::create_dir_all(&logs).unwrap();
    let relay = |name: &str| {
        let log = std::fs::File::create(logs.join(format!("{}-{name}.log", db.name))).unwrap();
        common::relay_command(&db.url)
            .args(["--log-format", "json", "run"])
            .env("OUTBOX_RELAY_CONFIG", &cfg_file)
            .env("OUTBOX_RELAY__RELAY__NAME", format!("\"{name}\""))
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", collector.grpc_endpoint())
            .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
            .env("RUST_LOG", "info")
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn relay")
    };
    let mut doomed = relay("doomed");
    // the first attempt failed (503) and its span was exported; the second
    // is in flight
    let first = collector
        .wait_for(Duration::from_secs(20), |s| !by_key(s, "crash").is_empty())
        .await;
    assert!(
        common::wait_for(Duration::from_secs(20), || async {
            rx.requests().len() == 2
        })
        .await
    );
    doomed.kill().await.unwrap(); // SIGKILL
    let mut survivor = relay("survivor");
    assert!(
        common::wait_for(Duration::from_secs(30), || async {
            db.state("crash").await == "delivered"
        })
        .await
    );
    common::terminate(&mut survivor).await;
    let spans = collector
        .wait_for(Duration::from_secs(10), |s| by_key(s, "crash").len() >= 3)
        .await;
    let spans = by_key(&spans, "crash");
    assert!(spans
        .iter()
        .all(|s| s.trace_id == trace && s.parent_span_id == app && s.via == "grpc"));
    let outcome = |s: &&SpanSeen| (s.name.clone(), s.attr("outbox.attempt").map(str::to_string));
    let mut seen: Vec<_> = spans.iter().map(outcome).collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            ("POST".to_string(), Some("1".to_string())),
            ("POST".to_string(), Some("3".to_string())),
            ("outbox.reconcile".to_string(), Some("3".to_string())),
        ],
        "{spans:#?}"
    );
    for s in &spans {
        eprintln!(
            "span {} parent {} {:?} kind {} status {} {:?}",
            s.span_id, s.parent_span_id, s.name, s.kind, s.status_code, s.attributes
        );
    }
    let reconcile = spans.iter().find(|s| s.name == "outbox.reconcile").unwrap();
    assert_eq!(reconcile.attr("outbox.previous_owner"), Some("doomed"));
    assert_eq!(reconcile.attr("outbox.reconcile.result"), Some("redeliver"));
    let redelivery = spans
        .iter()
        .find(|s| s.name == "POST" && s.attr("outbox.attempt") == Some("3"))
        .unwrap();
    assert_eq!(redelivery.attr("outbox.outcome"), Some("delivered"));
    let requests = rx.requests();
    assert_eq!(requests.len(), 3);
    assert_eq!(requests[0].webhook_id(), requests[2].webhook_id());
    assert_eq!(
        requests[2].header("traceparent"),
        Some(format!("00-{trace}-{}-01", redelivery.span_id))
    );

    // the first relay's log line of its failed attempt names the span
    let attempt1 = by_key(&first, "crash")[0];
    let log = std::fs::read_to_string(logs.join(format!("{}-doomed.log", db.name))).unwrap();
    let line = log
        .lines()
        .find(|l| l.contains("transient failure"))
        .unwrap_or_else(|| panic!("no attempt logged:\n{log}"));
    let line: Value = serde_json::from_str(line).unwrap();
    assert_eq!(line["span"]["trace_id"], trace.as_str(), "{line}");
    assert_eq!(line["span"]["span_id"], attempt1.span_id.as_str(), "{line}");
    std::fs::remove_file(cfg_file).ok();
}

/// A collector that accepts connections and never answers: deliveries go
/// on at their pace, the bounded queue drops what does not fit and counts
/// it, and the relay warns once, not once per span.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_collector_changes_no_delivery() {
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_addr = silent.local_addr().unwrap();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            open.push(socket); // read nothing, answer nothing
        }
    });
    let cfg_file = common::config_file(common::SUBPROCESS_CONFIG);
    let port = common::free_port();
    let log_path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("traces-silent-{}.log", db.name));
    let mut relay = common::relay_command(&db.url)
        .arg("run")
        .env("OUTBOX_RELAY_CONFIG", &cfg_file)
        .env(
            "OUTBOX_RELAY__RELAY__METRICS_ADDR",
            format!("\"127.0.0.1:{port}\""),
        )
        .env(
            "OUTBOX_RELAY__TELEMETRY__OTLP_ENDPOINT",
            format!("\"http://{silent_addr}\""),
        )
        .env("OUTBOX_RELAY__TELEMETRY__QUEUE", "2")
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    let wave = |from: usize, n: usize| {
        (from..from + n)
            .map(|i| (format!("w{i}"), json!({"url": rx.url("/w"), "body": i})))
            .collect::<Vec<_>>()
    };
    let first = wave(0, 5);
    let first: Vec<(&str, Value)> = first.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    enqueue_traced(&db, None, &first).await;
    assert!(common::wait_for(Duration::from_secs(20), || delivered_all(&db, 5)).await);
    // the export task now waits on the collector; the queue holds 2
    tokio::time::sleep(Duration::from_secs(1)).await;
    let second = wave(5, 40);
    let second: Vec<(&str, Value)> = second
        .iter()
        .map(|(k, v)| (k.as_str(), v.clone()))
        .collect();
    let started = std::time::Instant::now();
    enqueue_traced(&db, None, &second).await;
    assert!(
        common::wait_for(Duration::from_secs(20), || delivered_all(&db, 45)).await,
        "every intent is delivered while the collector says nothing"
    );
    let took = started.elapsed();
    let metrics = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let dropped: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("outbox_spans_dropped_total "))
        .unwrap_or_else(|| panic!("no outbox_spans_dropped_total in\n{metrics}"))
        .trim()
        .parse()
        .unwrap();
    assert!(dropped >= 30.0, "{dropped} spans dropped of 40 (queue 2)");
    assert_eq!(rx.requests().len(), 45);
    common::terminate(&mut relay).await;
    held.abort();
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert_eq!(
        log.matches("trace spans dropped").count(),
        1,
        "one warning a minute at most:\n{log}"
    );
    eprintln!(
        "40 intents delivered in {took:?} with the collector silent; {dropped} spans dropped"
    );
    std::fs::remove_file(cfg_file).ok();
}

/// A Python application instrumented with the OpenTelemetry SDK (from
/// PyPI) opens a span, enqueues inside it with `SET LOCAL
/// outbox.traceparent`, and exports to the same receiver as the relay:
/// one trace, the relay's attempt a child of the application's span.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_applications_span_is_the_parent_of_the_relays_attempt() {
    let db = TestDb::new().await;
    let collector = Collector::start().await;
    let rx = Receiver::ok().await;
    let python = std::env::var("OUTBOX_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/peers/traced_app.py");
    let out = tokio::process::Command::new(&python)
        .arg(script)
        .arg(&db.url)
        .arg(format!("{}/v1/traces", collector.http_endpoint()))
        .arg(rx.url("/orders"))
        .output()
        .await
        .expect("run python3");
    assert!(
        out.status.success(),
        "the traced application failed with {python} (tests/run.sh installs \
         tests/peers/requirements.txt into target/test-venv and names its \
         interpreter in OUTBOX_TEST_PYTHON): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said: Value = serde_json::from_slice(&out.stdout).expect("one JSON line");
    let stored: Option<String> = sqlx::query_scalar(
        "SELECT traceparent FROM outbox.intents WHERE key = 'order:7:confirmation'",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(stored.as_deref(), said["traceparent"].as_str());

    let spans = deliver_traced(&db, &collector, Protocol::HttpProtobuf, 1, 2).await;
    let app = spans
        .iter()
        .find(|s| s.service == "checkout")
        .expect("the application's span");
    let attempt = spans
        .iter()
        .find(|s| s.service == "outbox-relay")
        .expect("the relay's span");
    assert_eq!((app.name.as_str(), app.kind), ("POST /orders", 2));
    assert_eq!(attempt.trace_id, app.trace_id);
    assert_eq!(attempt.parent_span_id, app.span_id);
    assert_eq!(
        rx.requests()[0].header("traceparent"),
        Some(format!("00-{}-{}-01", app.trace_id, attempt.span_id))
    );
}

/// The tracing guide's SQL example runs as copied and stores its context.
#[tokio::test]
async fn the_tracing_guides_example_runs_as_copied() {
    let page = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/guides/tracing.md"
    ));
    let start = page.find("```sql\n").expect("a SQL example") + "```sql\n".len();
    let example = &page[start..start + page[start..].find("```").unwrap()];
    let db = TestDb::new().await;
    sqlx::raw_sql(example)
        .execute(db.pool())
        .await
        .unwrap_or_else(|e| panic!("{e}:\n{example}"));
    let stored: Option<String> = sqlx::query_scalar(
        "SELECT traceparent FROM outbox.intents WHERE key = 'order:44:confirmation'",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(
        stored.as_deref(),
        Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
    );
}

/// A webhook that cannot be reached, with its secret in the path, in a bare
/// query and in a named query value: the secret is in no span (attributes
/// or status), no log line, no `last_error` and no `show`; each shows the
/// URL by the one rule (`…/services/REDACTED/…`, `?REDACTED`,
/// `?token=REDACTED`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_webhooks_secrets_reach_no_span_log_error_or_listing() {
    let db = TestDb::new().await;
    let collector = Collector::start().await;
    let closed = common::free_port(); // nothing listens: the connect is refused
    let base = format!("http://127.0.0.1:{closed}");
    let urls = [
        (
            "leak:path",
            format!("{base}/services/T0001/B0002/SECRETPATH"),
        ),
        ("leak:bare", format!("{base}/hook?SECRETBARE")),
        ("leak:named", format!("{base}/hook?token=SECRETVALUE")),
    ];
    let intents: Vec<(&str, Value)> = urls
        .iter()
        .map(|(k, u)| (*k, json!({"url": u, "body": 1})))
        .collect();
    enqueue_traced(&db, None, &intents).await;
    let out = common::relay_command(&db.url)
        .args(["run", "--once"])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", collector.http_endpoint())
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        .env("RUST_LOG", "debug")
        .output()
        .await
        .unwrap();
    let logs = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{logs}");
    assert!(logs.contains("could not connect"), "{logs}");
    let spans = collector
        .wait_for(Duration::from_secs(10), |s| s.len() >= 3)
        .await;
    let want = [
        ("leak:path", "/services/REDACTED/REDACTED/REDACTED"),
        ("leak:bare", "/hook?REDACTED"),
        ("leak:named", "/hook?token=REDACTED"),
    ];
    for (key, shown) in want {
        let span = by_key(&spans, key);
        assert_eq!(span.len(), 1, "{spans:#?}");
        let span = span[0];
        assert_eq!(span.status_code, 2, "{span:#?}");
        assert!(
            span.status_message
                .starts_with(&format!("POST {base}{shown}: could not connect")),
            "{span:#?}"
        );
        assert_eq!(
            span.attr("url.full"),
            Some(format!("{base}{shown}").as_str())
        );
        let intent = db.store.find(key).await.unwrap();
        let error = intent.last_error.unwrap_or_default();
        assert!(error.contains(&format!("{base}{shown}")), "{error}");
        let show = common::cli(&db, &["show", key]).await;
        let show = String::from_utf8_lossy(&show.stdout).into_owned();
        assert!(show.contains(&format!("{base}{shown}")), "{show}");
        let json = common::cli(&db, &["show", key, "--json"]).await;
        let json = String::from_utf8_lossy(&json.stdout).into_owned();
        assert!(json.contains(&format!("{base}{shown}")), "{json}");
        for text in [format!("{span:?}"), error, show, json] {
            assert!(!text.contains("SECRET"), "{text}");
        }
    }
    assert!(!logs.contains("SECRET"), "{logs}");
}

/// An error as a relay older than the redaction rule wrote it, with a
/// secret in the userinfo, the path, a bare query and a query value.
pub(crate) const RAW_ERROR: &str =
    "POST http://SECRETUSER:SECRETPW@127.0.0.1:9/services/T0001/B0002\
                                    /SECRETPATH?SECRETBARE&token=SECRETVALUE: could not connect";
/// [`RAW_ERROR`] as every shown URL is shown.
pub(crate) const SHOWN_ERROR: &str = "POST http://127.0.0.1:9/services/REDACTED/REDACTED/REDACTED\
                                      ?REDACTED&token=REDACTED: could not connect";

/// Rows written raw, as an older relay wrote them: the webhook intent
/// `raw:live` (due in an hour) whose URL and last error carry secrets, the
/// purged intent `raw:purged` in the ledger and the destination
/// `http://127.0.0.1:9`, each with [`RAW_ERROR`].
pub(crate) async fn rows_written_raw(db: &TestDb) {
    let url = "http://SECRETUSER:SECRETPW@127.0.0.1:9/services/T0001/B0002/SECRETPATH\
               ?SECRETBARE&token=SECRETVALUE";
    sqlx::query(
        "SELECT outbox.enqueue('raw:live', 'webhook', $1, p_run_after => now() + interval '1 hour')",
    )
    .bind(json!({"url": url, "body": 1}))
    .execute(db.pool())
    .await
    .unwrap();
    for sql in [
        "UPDATE outbox.intents SET last_error = $1 WHERE key = 'raw:live'",
        "INSERT INTO outbox.ledger (key, intent_id, kind, fingerprint, state, last_error, created_at, completed_at)
         VALUES ('raw:purged', 1000000, 'webhook', outbox.fingerprint('{}'), 'dead', $1, now(), now())",
        "INSERT INTO outbox.destinations (name, state, failures, last_error)
         VALUES ('http://127.0.0.1:9', 'closed', 2, $1)",
    ] {
        sqlx::query(sql)
            .bind(RAW_ERROR)
            .execute(db.pool())
            .await
            .unwrap();
    }
}

/// The CLI shows an error written before the redaction rule by the rule:
/// `list` and `list --json` (the webhook's URL too), `show` of a purged
/// intent and `destinations`, as text and as JSON.
#[tokio::test]
async fn a_raw_errors_secrets_reach_no_cli_listing() {
    let db = TestDb::new().await;
    rows_written_raw(&db).await;
    let run = |args: &'static [&'static str]| {
        let db = &db;
        async move {
            let out = common::cli(db, args).await;
            assert!(out.status.success(), "{args:?}: {out:?}");
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            assert!(!text.contains("SECRET"), "{args:?}: {text}");
            text
        }
    };
    // the table clips the middle of a long error
    let table = run(&["list"]).await;
    assert!(
        table.contains("POST http://127.0.0.1:9/services/REDACTE"),
        "{table}"
    );
    let listed: Value = serde_json::from_str(&run(&["list", "--json"]).await).unwrap();
    assert_eq!(listed[0]["last_error"], SHOWN_ERROR, "{listed}");
    assert_eq!(
        listed[0]["payload"]["url"],
        "http://127.0.0.1:9/services/REDACTED/REDACTED/REDACTED?REDACTED&token=REDACTED"
    );
    let show = run(&["show", "raw:purged"]).await;
    assert!(show.contains(SHOWN_ERROR), "{show}");
    let shown: Value = serde_json::from_str(&run(&["show", "raw:purged", "--json"]).await).unwrap();
    assert_eq!(
        (&shown["source"], &shown["last_error"]),
        (&json!("ledger"), &json!(SHOWN_ERROR)),
        "{shown}"
    );
    let destinations = run(&["destinations"]).await;
    assert!(
        destinations.contains("POST http://127.0.0.1:9/services/REDACTED/"),
        "{destinations}"
    );
    let destinations = run(&["destinations", "--json"]).await;
    assert!(destinations.contains(SHOWN_ERROR), "{destinations}");
}

/// A webhook provider that panics on every delivery.
struct Panics;

#[async_trait::async_trait]
impl outbox_providers::Provider for Panics {
    fn kind(&self) -> &'static str {
        "webhook"
    }
    async fn deliver(&self, d: &outbox_providers::Delivery<'_>) -> outbox_providers::Outcome {
        panic!("cannot handle {}", d.key)
    }
    fn on_ambiguous(&self) -> outbox_providers::AmbiguityPolicy {
        outbox_providers::AmbiguityPolicy::Redeliver
    }
}

/// A provider that panics leaves a span with an outcome all the same: an
/// error, `ambiguous` as the intent is parked, saying the provider panicked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_panic_ends_its_span_as_an_error_that_says_so() {
    let db = TestDb::new().await;
    let collector = Collector::start().await;
    enqueue_traced(
        &db,
        None,
        &[("boom", json!({"url": "http://127.0.0.1:9/", "body": 1}))],
    )
    .await;
    let tracer = Tracer::start(&export(&collector, Protocol::HttpProtobuf, 64)).unwrap();
    let cfg = EngineConfig::from_config(&config()).with_tracer(tracer.clone());
    let engine = Engine::new(
        db.store.clone(),
        outbox_providers::ProviderSet::new().with(std::sync::Arc::new(Panics)),
        cfg,
    );
    tokio::time::timeout(Duration::from_secs(30), engine.run_once())
        .await
        .expect("run_once ends although the provider panicked")
        .unwrap();
    tracer.shutdown().await;
    assert_eq!(db.state("boom").await, "ambiguous");
    let spans = collector
        .wait_for(Duration::from_secs(10), |s| !s.is_empty())
        .await;
    let span = by_key(&spans, "boom");
    assert_eq!(span.len(), 1, "{spans:#?}");
    let span = span[0];
    assert_eq!(
        (
            span.status_code,
            span.attr("outbox.outcome"),
            span.attr("error.type")
        ),
        (2, Some("ambiguous"), Some("panic")),
        "{span:#?}"
    );
    assert!(
        span.status_message
            .contains("the webhook provider panicked"),
        "{span:#?}"
    );
}

//! `GET /v1/intents/{key}` of a running relay: by key only, behind the
//! bearer token when one is set, off with `relay.lookup = false`.

use std::time::Duration;

use crate::common;
use crate::common::logged::LoggedRelay;
use crate::common::TestDb;
use serde_json::json;

const TOKEN: &str = "lookup-token-0123456789abcdef";

/// `outbox-relay run` with the listener on a free port, ready to answer.
async fn relay(db: &TestDb, env: &[(&str, &str)]) -> (LoggedRelay, u16) {
    let port = common::free_port();
    let mut cmd = common::relay_command(&db.url);
    cmd.arg("run")
        .env(
            "OUTBOX_RELAY__RELAY__METRICS_ADDR",
            format!("\"127.0.0.1:{port}\""),
        )
        .env("RUST_LOG", "debug")
        .stdout(std::process::Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut relay = LoggedRelay::spawn(&mut cmd);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(Some(status)) = relay.child.try_wait() {
            panic!("the relay exited ({status}): {}", relay.stop().await.1);
        }
        let healthz = reqwest::get(format!("http://127.0.0.1:{port}/healthz")).await;
        if healthz.is_ok_and(|r| r.status() == 200) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the relay's listener did not come up"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    (relay, port)
}

/// GET the path with an optional Authorization header: status and body.
async fn get(port: u16, path: &str, authorization: Option<&str>) -> (u16, serde_json::Value) {
    let mut req = reqwest::Client::new().get(format!("http://127.0.0.1:{port}{path}"));
    if let Some(a) = authorization {
        req = req.header("authorization", a);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(json!(text)))
}

async fn enqueue_future(db: &TestDb, key: &str) -> i64 {
    // due in an hour: the relay leaves it pending while the test asks
    sqlx::query_scalar(
        "SELECT id FROM outbox.enqueue($1, 'webhook', $2, p_run_after => now() + interval '1 hour')",
    )
    .bind(key)
    .bind(json!({"url": "http://127.0.0.1:9/", "body": key}))
    .fetch_one(db.pool())
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_intent_is_found_by_its_key_never_by_its_id() {
    let db = TestDb::new().await;
    let id = enqueue_future(&db, "lookup:a").await;
    let (child, port) = relay(&db, &[]).await;

    let (status, body) = get(port, "/v1/intents/lookup:a", None).await;
    assert_eq!((status, body["id"].as_i64()), (200, Some(id)), "{body}");
    assert_eq!(body["state"], "pending");
    // the id is no way in, whether or not any intent has it
    for path in [format!("/v1/intents/{id}"), "/v1/intents/2".into()] {
        let (status, body) = get(port, &path, None).await;
        assert_eq!(status, 404, "{path}: {body}");
    }
    // a key that looks like a number is a key like any other
    let other = enqueue_future(&db, &id.to_string()).await;
    let (status, body) = get(port, &format!("/v1/intents/{id}"), None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (body["id"].as_i64(), body["key"].as_str()),
        (Some(other), Some(id.to_string().as_str()))
    );
    // purged into the ledger: by key still, by id not
    sqlx::query("UPDATE outbox.intents SET state = 'cancelled' WHERE key = 'lookup:a'")
        .execute(db.pool())
        .await
        .unwrap();
    db.store
        .purge(Duration::ZERO, false, false, 100)
        .await
        .unwrap();
    let (status, body) = get(port, "/v1/intents/lookup:a", None).await;
    assert_eq!(
        (status, body["source"].as_str(), body["id"].as_i64()),
        (200, Some("ledger"), Some(id)),
        "{body}"
    );
    let (status, _) = get(port, &format!("/v1/intents/{other}"), None).await;
    assert_eq!(status, 404);
    child.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_token_only_the_right_bearer_is_answered() {
    let db = TestDb::new().await;
    let id = enqueue_future(&db, "lookup:t").await;
    let (child, port) = relay(&db, &[("OUTBOX_RELAY_LOOKUP_TOKEN", TOKEN)]).await;

    let right = format!("Bearer {TOKEN}");
    let wrong = format!("Bearer {}x", &TOKEN[..TOKEN.len() - 1]);
    for (authorization, want) in [
        (None, 401),
        (Some(wrong.as_str()), 401),
        (Some("Bearer"), 401),
        (Some(TOKEN), 401),
        (Some(right.as_str()), 200),
    ] {
        let (status, body) = get(port, "/v1/intents/lookup:t", authorization).await;
        assert_eq!(status, want, "{authorization:?}: {body}");
        if want == 200 {
            assert_eq!(body["id"].as_i64(), Some(id));
        } else {
            assert!(
                !body.to_string().contains("lookup:t") && !body.to_string().contains(TOKEN),
                "a refusal says nothing about the intent: {body}"
            );
        }
    }
    // an unknown key is 401 without the token, 404 with it
    assert_eq!(get(port, "/v1/intents/nope", None).await.0, 401);
    assert_eq!(get(port, "/v1/intents/nope", Some(&right)).await.0, 404);
    // the probes and the metrics need no token
    for path in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(get(port, path, None).await.0, 200, "{path}");
    }
    let logs = child.stop().await.1;
    assert!(
        logs.contains("GET /v1/intents/{key} is behind the bearer token"),
        "{logs}"
    );
    assert!(!logs.contains(TOKEN), "the token never reaches the logs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookup_false_turns_the_endpoint_off() {
    let db = TestDb::new().await;
    enqueue_future(&db, "lookup:off").await;
    let (child, port) = relay(
        &db,
        &[
            ("OUTBOX_RELAY__RELAY__LOOKUP", "false"),
            ("OUTBOX_RELAY_LOOKUP_TOKEN", TOKEN),
        ],
    )
    .await;
    let right = format!("Bearer {TOKEN}");
    for authorization in [None, Some(right.as_str())] {
        let (status, body) = get(port, "/v1/intents/lookup:off", authorization).await;
        assert_eq!(status, 404, "{body}");
    }
    assert_eq!(get(port, "/metrics", None).await.0, 200);
    let logs = child.stop().await.1;
    assert!(logs.contains("GET /v1/intents/{key} is off"), "{logs}");
}

/// Cancelled while its request was in flight, and the request then
/// succeeded: "did it happen?" says yes, here, in `show` and in the console.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_intent_cancelled_while_its_request_succeeded_is_said_to_have_happened() {
    use crate::common::{cli, config, engine, run_until, Receiver, Reply};
    use outbox_relay::services::lookup::{route, Access};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    let db = TestDb::new().await;
    let rx = Receiver::start(|_, _| Reply::status(200).after(Duration::from_millis(700))).await;
    db.enqueue("late:1", "webhook", json!({"url": rx.url("/"), "body": {}}))
        .await;
    let cancelled = Arc::new(AtomicBool::new(false));
    run_until(
        engine(db.store.clone(), &config()),
        Duration::from_secs(20),
        || {
            let (db, rx, cancelled) = (&db, &rx, cancelled.clone());
            async move {
                if !cancelled.load(Ordering::SeqCst) && !rx.requests().is_empty() {
                    // the request has left: cancel it while it is in flight
                    db.store.cancel("late:1").await.unwrap();
                    cancelled.store(true, Ordering::SeqCst);
                }
                let stale: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM outbox.attempt_history WHERE outcome = 'delivered' AND NOT accepted",
            )
            .fetch_one(db.pool())
            .await
            .unwrap();
                stale == 1
            }
        },
    )
    .await;
    assert_eq!(db.count("key = 'late:1' AND state = 'cancelled'").await, 1);

    // GET /v1/intents/{key}
    let app: axum::Router = axum::Router::new().route(
        "/v1/intents/{key}",
        route(
            db.store.clone(),
            Access {
                enabled: true,
                token: None,
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let (status, body) = get(port, "/v1/intents/late:1", None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["state"], "cancelled", "{body}");
    assert_eq!(body["effect_happened"], true, "{body}");
    assert!(body["effect_at"].is_string(), "{body}");
    server.abort();

    // `show`
    let out = cli(&db, &["show", "late:1"]).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("effect") && text.contains("happened at"),
        "{text}"
    );

    // the console's lookup and the intent's page
    let console = crate::common::console::ConsoleServer::start(&db, &[]).await;
    let mut s = crate::common::console::Session::new(&console);
    let page = s.get("/lookup?key=late:1").await;
    assert!(
        page.body.contains("Yes: the effect happened"),
        "{}",
        page.body
    );
    let api = s.get("/api/v1/lookup?key=late:1").await;
    assert!(
        api.body.contains("Yes: the effect happened"),
        "{}",
        api.body
    );
    let id = db.store.find("late:1").await.unwrap().id;
    let page = s.get(&format!("/intents/{id}")).await;
    assert!(page.body.contains("id=\"effect-anyway\""), "{}", page.body);
}

/// `GET /v1/intents/{key}` served in-process: its status and body.
async fn ask(db: &TestDb, key: &str) -> (u16, serde_json::Value) {
    use outbox_relay::services::lookup::{route, Access};
    let app: axum::Router = axum::Router::new().route(
        "/v1/intents/{key}",
        route(
            db.store.clone(),
            Access {
                enabled: true,
                token: None,
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let answer = get(port, &format!("/v1/intents/{key}"), None).await;
    server.abort();
    answer
}

/// What `show`, the console's lookup and its API say of `key`.
async fn said_of(db: &TestDb, key: &str) -> (String, String, String) {
    let out = common::cli(db, &["show", key]).await;
    let shown = String::from_utf8_lossy(&out.stdout).to_string();
    let console = crate::common::console::ConsoleServer::start(db, &[]).await;
    let mut s = crate::common::console::Session::new(&console);
    let page = s.get(&format!("/lookup?key={key}")).await.body;
    let api = s.get(&format!("/api/v1/lookup?key={key}")).await.body;
    (shown, page, api)
}

/// "Did it happen?" after purge: an effect that happened although its
/// intent ended cancelled is remembered by the ledger, whether it was
/// delivered and then retried by an operator, or its success came after
/// the intent was cancelled and purged (the completion finds no row).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_happened_effect_is_remembered_after_purge() {
    use crate::common::{config, engine, run_until, Receiver, Reply};
    use outbox_relay::store::operator::RetryOptions;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    let db = TestDb::new().await;
    // delivered, retried with --force, cancelled before it went again
    let ok = Receiver::ok().await;
    db.enqueue(
        "forced:1",
        "webhook",
        json!({"url": ok.url("/"), "body": {}}),
    )
    .await;
    run_until(
        engine(db.store.clone(), &config()),
        Duration::from_secs(20),
        || async { db.count("key = 'forced:1' AND state = 'delivered'").await == 1 },
    )
    .await;
    sqlx::query("UPDATE outbox.intents SET provider_ref = 'ref-forced-1' WHERE key = 'forced:1'")
        .execute(db.pool())
        .await
        .unwrap();
    let how = RetryOptions {
        force: true,
        new_effect: false,
    };
    db.store.retry("forced:1", how).await.unwrap();
    db.store.cancel("forced:1").await.unwrap();
    // live: the delivered attempt was accepted, and the words say so
    let (shown, page, _) = said_of(&db, "forced:1").await;
    assert!(
        shown.contains("happened at") && shown.contains("then an operator retried it"),
        "{shown}"
    );
    assert!(!shown.contains("not accepted"), "{shown}");
    assert!(
        page.contains("Yes: the effect happened") && page.contains("then an operator retried it"),
        "{page}"
    );

    // cancelled while its request was in flight, purged before the answer
    let rx = Receiver::start(|_, _| Reply::status(200).after(Duration::from_millis(1500))).await;
    db.enqueue(
        "purged:1",
        "webhook",
        json!({"url": rx.url("/"), "body": {}}),
    )
    .await;
    let purged = Arc::new(AtomicBool::new(false));
    run_until(
        engine(db.store.clone(), &config()),
        Duration::from_secs(20),
        || {
            let (db, rx, purged) = (&db, &rx, purged.clone());
            async move {
                if !purged.load(Ordering::SeqCst) && !rx.requests().is_empty() {
                    db.store.cancel("purged:1").await.unwrap();
                    db.store
                        .purge(Duration::ZERO, false, false, 100)
                        .await
                        .unwrap();
                    purged.store(true, Ordering::SeqCst);
                }
                let noted: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM outbox.ledger WHERE key = 'purged:1' AND effect_at IS NOT NULL",
                )
                .fetch_one(db.pool())
                .await
                .unwrap();
                noted == 1
            }
        },
    )
    .await;
    assert_eq!(db.count("true").await, 0, "both intents are purged");

    for key in ["forced:1", "purged:1"] {
        let (status, body) = ask(&db, key).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            (
                body["source"].as_str(),
                body["state"].as_str(),
                &body["effect_happened"]
            ),
            (Some("ledger"), Some("cancelled"), &json!(true)),
            "{key}: {body}"
        );
        assert!(body["effect_at"].is_string(), "{key}: {body}");
        let (shown, page, api) = said_of(&db, key).await;
        assert!(
            shown.contains("happened at") && shown.contains("ended cancelled"),
            "{key}: {shown}"
        );
        for text in [&page, &api] {
            assert!(
                text.contains("Yes: the effect happened") && !text.contains("No: an operator"),
                "{key}: {text}"
            );
        }
    }
    let (_, body) = ask(&db, "forced:1").await;
    assert_eq!(body["provider_ref"], "ref-forced-1", "{body}");
}

/// The endpoint shows a last error written before the redaction rule (as
/// an older relay wrote it) by the rule, live and from the ledger: no
/// secret of its URL's userinfo, path or query.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raw_last_errors_secrets_are_not_answered() {
    use crate::traces::{rows_written_raw, SHOWN_ERROR};
    let db = TestDb::new().await;
    rows_written_raw(&db).await;
    let (child, port) = relay(&db, &[]).await;
    for (key, source) in [("raw:live", "live"), ("raw:purged", "ledger")] {
        let (status, body) = get(port, &format!("/v1/intents/{key}"), None).await;
        assert_eq!(
            (status, body["source"].as_str()),
            (200, Some(source)),
            "{body}"
        );
        assert_eq!(body["last_error"], SHOWN_ERROR, "{body}");
        assert!(!body.to_string().contains("SECRET"), "{body}");
    }
    child.stop().await;
}

//! Webhook delivery end to end: SQL API in, a real HTTP receiver, state read back.

use std::time::Duration;

use crate::common;
use crate::common::{config, engine, run_once_within, run_until, Receiver, Reply, TestDb};
use outbox_providers::webhook::sign::SigningKey;
use outbox_providers::Secret;
use serde_json::json;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivers_with_stable_standard_webhooks_headers() {
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    let mut cfg = config();
    cfg.webhook.signing_secrets = vec![Secret::new(SECRET)];
    for n in 0..3 {
        db.enqueue(
            &format!("order:{n}"),
            "webhook",
            json!({"url": rx.url("/hooks"), "body": {"order": n, "b": [1, 2]},
                                                            "headers": {"X-Tenant": "acme"}}),
        )
        .await;
    }
    engine(db.store.clone(), &cfg).run_once().await.unwrap();

    assert_eq!(db.count("state = 'delivered'").await, 3);
    let reqs = rx.requests();
    assert_eq!(reqs.len(), 3);
    let key = SigningKey::parse(&Secret::new(SECRET)).unwrap();
    for r in &reqs {
        let id = r.webhook_id();
        assert!(id.starts_with("msg_") && !id.contains('.'), "{id}");
        assert_eq!(r.header("idempotency-key").as_deref(), Some(id.as_str()));
        assert_eq!(
            r.header("content-type").as_deref(),
            Some("application/json")
        );
        assert_eq!(r.header("x-tenant").as_deref(), Some("acme"));
        assert_eq!(r.path, "/hooks");
        let ts: i64 = r.header("webhook-timestamp").unwrap().parse().unwrap();
        assert!((ts - chrono::Utc::now().timestamp()).abs() < 60);
        assert_eq!(
            r.header("webhook-signature").unwrap(),
            key.sign(&id, ts, &r.body)
        );
        let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        let n = body["order"].as_i64().unwrap();
        assert_eq!(
            id,
            outbox_providers::keys::webhook_id(&format!("order:{n}"), 0)
        );
        let intent = db.store.find(&format!("order:{n}")).await.unwrap();
        assert_eq!(intent.provider_ref.as_deref(), Some(id.as_str()));
        assert_eq!(intent.attempts, 1);
        assert!(intent.delivered_at.is_some() && intent.owner.is_none());
    }
    let attempts = db
        .store
        .attempts(db.store.find("order:0").await.unwrap().id)
        .await
        .unwrap();
    assert_eq!(attempts.len(), 1);
    assert_eq!(
        (
            attempts[0].outcome.as_str(),
            attempts[0].status,
            attempts[0].accepted
        ),
        ("delivered", Some(200), true)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_503_twice_then_200_is_delivered_on_the_third_attempt_under_one_id() {
    let db = TestDb::new().await;
    let rx = Receiver::start(|_, nth| {
        if nth <= 2 {
            Reply::status(503).header("retry-after", "1")
        } else {
            Reply::status(200)
        }
    })
    .await;
    db.enqueue(
        "flaky",
        "webhook",
        json!({"url": rx.url("/"), "body": {"x": 1}}),
    )
    .await;
    common::run_until_state(
        engine(db.store.clone(), &config()),
        &db.store,
        "flaky",
        "delivered",
        Duration::from_secs(20),
    )
    .await;

    let reqs = rx.requests();
    assert_eq!(reqs.len(), 3);
    assert!(
        reqs.iter().all(|r| r.webhook_id() == reqs[0].webhook_id()),
        "one webhook-id on every attempt"
    );
    assert!(
        reqs.iter().all(|r| r.body == reqs[0].body),
        "byte-identical bodies"
    );
    // Retry-After: 1 is honoured although the schedule says 50ms
    for pair in reqs.windows(2) {
        let gap = pair[1].at - pair[0].at;
        assert!(
            gap >= Duration::from_millis(990),
            "retried after {gap:?}, before Retry-After"
        );
    }
    let intent = db.store.find("flaky").await.unwrap();
    assert_eq!(intent.attempts, 3);
    let attempts = db.store.attempts(intent.id).await.unwrap();
    let outcomes: Vec<_> = attempts
        .iter()
        .map(|a| (a.outcome.as_str(), a.status))
        .collect();
    assert_eq!(
        outcomes,
        [
            ("transient", Some(503)),
            ("transient", Some(503)),
            ("delivered", Some(200))
        ]
    );
    // delivered: the earlier failure's reason is cleared; the attempts keep it
    assert_eq!(intent.last_error, None);
    assert_eq!(
        attempts[0].error.as_deref(),
        Some("receiver answered HTTP 503")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deliberate_refusal_is_terminal_and_keeps_the_answer() {
    let db = TestDb::new().await;
    let rx = Receiver::start(|r, _| match r.path.as_str() {
        "/gone" => Reply::status(410).body("endpoint disabled"),
        _ => Reply::status(422).body("{\"error\":\"bad schema\"}"),
    })
    .await;
    db.enqueue(
        "gone",
        "webhook",
        json!({"url": rx.url("/gone"), "body": 1}),
    )
    .await;
    db.enqueue("bad", "webhook", json!({"url": rx.url("/bad"), "body": 1}))
        .await;
    engine(db.store.clone(), &config())
        .run_once()
        .await
        .unwrap();
    let gone = db.store.find("gone").await.unwrap();
    assert_eq!(gone.state, "rejected");
    assert!(gone.last_error.unwrap().contains("HTTP 410"));
    assert_eq!(
        gone.response,
        Some(json!({"status": 410, "body": "endpoint disabled"}))
    );
    assert_eq!(db.state("bad").await, "rejected");
    assert_eq!(rx.requests().len(), 2, "a refusal is not retried");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_failures_end_dead_only_when_the_budget_is_spent() {
    let db = TestDb::new().await;
    let rx = Receiver::start(|_, _| Reply::status(500)).await;
    let mut cfg = config();
    cfg.retry.max_attempts = 3;
    db.enqueue("doomed", "webhook", json!({"url": rx.url("/"), "body": 1}))
        .await;
    common::run_until_state(
        engine(db.store.clone(), &cfg),
        &db.store,
        "doomed",
        "dead",
        Duration::from_secs(20),
    )
    .await;
    let intent = db.store.find("doomed").await.unwrap();
    assert_eq!(intent.state, "dead");
    assert_eq!(intent.attempts, 3);
    assert!(intent
        .last_error
        .unwrap()
        .contains("gave up after 3 attempts"));
    assert_eq!(rx.requests().len(), 3);
    // no attempt ever recorded a 5xx as terminal
    let terminal_5xx: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox.attempt_history WHERE status >= 500 AND outcome IN ('delivered', 'rejected')",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(terminal_5xx, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_ends_rejected_with_a_reason_and_the_relay_keeps_going() {
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    let mut cfg = config();
    // only 127.0.0.1 is opened: 127.0.0.2 is loopback outside allowed_networks
    cfg.webhook.allowed_networks = vec!["127.0.0.1/32".into()];
    let guarded = format!("http://127.0.0.2:{}/", rx.addr.port());
    let cases = [
        (
            "not-object",
            "webhook",
            json!([1, 2, 3]),
            "must be a JSON object",
        ),
        ("no-url", "webhook", json!({"body": 1}), "no \"url\""),
        (
            "ftp",
            "webhook",
            json!({"url": "ftp://127.0.0.1/x", "body": 1}),
            "scheme \"ftp\"",
        ),
        (
            "bad-header",
            "webhook",
            json!({"url": rx.url("/"), "body": 1, "headers": {"X-A": "a\r\nX-B: b"}}),
            "control characters",
        ),
        (
            "unknown-kind",
            "sms",
            json!({"to": "+100"}),
            "unknown kind \"sms\"",
        ),
        (
            "guarded",
            "webhook",
            json!({"url": guarded, "body": 1}),
            "127.0.0.2 is loopback",
        ),
    ];
    for (key, kind, payload, _) in &cases {
        db.enqueue(key, kind, payload.clone()).await;
    }
    db.enqueue("good", "webhook", json!({"url": rx.url("/ok"), "body": 1}))
        .await;
    engine(db.store.clone(), &cfg).run_once().await.unwrap();
    for (key, _, _, needle) in cases {
        let i = db.store.find(key).await.unwrap();
        assert_eq!(i.state, "rejected", "{key}");
        let err = i.last_error.unwrap_or_default();
        assert!(
            err.contains(needle),
            "{key}: {err:?} should mention {needle:?}"
        );
    }
    assert_eq!(db.state("good").await, "delivered");
    let paths: Vec<_> = rx.requests().iter().map(|r| r.path.clone()).collect();
    assert_eq!(paths, ["/ok"], "nothing refused reached the receiver");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn known_kinds_without_a_provider_wait_for_a_relay_that_has_one() {
    let db = TestDb::new().await;
    db.enqueue(
        "mail",
        "email",
        json!({"to": ["a@example.com"], "subject": "s", "text": "t"}),
    )
    .await;
    engine(db.store.clone(), &config())
        .run_once()
        .await
        .unwrap();
    let i = db.store.find("mail").await.unwrap();
    assert_eq!((i.state.as_str(), i.attempts), ("pending", 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guard_checks_resolved_names_before_connecting() {
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    let mut cfg = config();
    cfg.webhook.allowed_networks = vec![]; // the default: nothing non-public
    db.enqueue(
        "by-name",
        "webhook",
        json!({"url": format!("http://localhost:{}/", rx.addr.port()), "body": 1}),
    )
    .await;
    db.enqueue(
        "by-number",
        "webhook",
        json!({"url": format!("http://2130706433:{}/", rx.addr.port()), "body": 1}),
    )
    .await;
    engine(db.store.clone(), &cfg).run_once().await.unwrap();
    let by_name = db.store.find("by-name").await.unwrap();
    assert_eq!(by_name.state, "rejected");
    let err = by_name.last_error.unwrap();
    assert!(
        err.contains("webhook host localhost refused") && err.contains("loopback"),
        "{err}"
    );
    let by_number = db.store.find("by-number").await.unwrap();
    assert_eq!(by_number.state, "rejected");
    assert!(by_number
        .last_error
        .unwrap()
        .contains("127.0.0.1 is loopback"));
    assert!(rx.requests().is_empty(), "no connection was made");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_slow_receiver_cannot_take_every_delivery_slot() {
    let db = TestDb::new().await;
    let slow = Receiver::start(|_, _| Reply::status(200).after(Duration::from_millis(400))).await;
    let fast = Receiver::ok().await;
    let mut cfg = config();
    cfg.webhook.max_in_flight_per_host = 2;
    for n in 0..8 {
        db.enqueue(
            &format!("slow:{n}"),
            "webhook",
            json!({"url": slow.url("/"), "body": n}),
        )
        .await;
    }
    for n in 0..4 {
        db.enqueue(
            &format!("fast:{n}"),
            "webhook",
            json!({"url": fast.url("/"), "body": n}),
        )
        .await;
    }
    let store = db.store.clone();
    run_until(
        engine(db.store.clone(), &cfg),
        Duration::from_secs(30),
        || {
            let store = store.clone();
            async move {
                let s = store.stats().await.unwrap();
                let delivered: i64 = s
                    .by_state
                    .iter()
                    .filter(|r| r.state == "delivered")
                    .map(|r| r.count)
                    .sum();
                delivered == 12
            }
        },
    )
    .await;
    let lead: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM max(delivered_at) FILTER (WHERE key LIKE 'slow:%')
                                - max(delivered_at) FILTER (WHERE key LIKE 'fast:%'))::float8
           FROM outbox.intents",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert!(
        lead > 0.8,
        "the fast host finished {lead}s before the slow one: it was not starved"
    );
    assert!(
        slow.max_in_flight() <= 2,
        "at most 2 in flight to the slow host, saw {}",
        slow.max_in_flight()
    );
    let extra: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox.attempt_history WHERE outcome <> 'delivered'",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(extra, 0, "deferrals are not attempts");
    assert_eq!(db.count("attempts = 1").await, 12);
}

/// `run_once` with a backlog many times `concurrency + batch_size`: it claims
/// in rounds as slots free up, never more than `concurrency` at once reach
/// the endpoint, and it returns once every intent is delivered, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_once_delivers_a_backlog_larger_than_its_claims() {
    let db = TestDb::new().await;
    let rx = Receiver::start(|_, _| Reply::status(200).after(Duration::from_millis(5))).await;
    for n in 0..60 {
        db.enqueue(
            &format!("once:{n}"),
            "webhook",
            json!({"url": rx.url("/once"), "body": {"n": n}}),
        )
        .await;
    }
    let mut cfg = config();
    cfg.relay.concurrency = 2;
    cfg.relay.batch_size = 3;
    run_once_within(&db, &cfg, Duration::from_secs(60)).await;
    assert_eq!(db.count("state = 'delivered'").await, 60);
    assert_eq!(db.count("attempts = 1").await, 60);
    assert_eq!(rx.requests().len(), 60);
    assert!(rx.max_in_flight() <= 2, "{}", rx.max_in_flight());
}

/// A receiver that answers 200 only after the timeout: the POST may have
/// taken effect, so the attempt is ambiguous (never transient), and the
/// webhook's policy decides, the same way every time.
async fn answered_after_the_timeout(
    policy: outbox_providers::AmbiguityPolicy,
) -> (TestDb, Receiver) {
    let db = TestDb::new().await;
    // the first request is answered 1.5 s late, later ones at once
    let rx = Receiver::start(|_, nth| {
        if nth == 1 {
            Reply::status(200).after(Duration::from_millis(1500))
        } else {
            Reply::status(200)
        }
    })
    .await;
    let mut cfg = config();
    cfg.webhook.timeout = outbox_relay::config::Dur(Duration::from_secs(1));
    cfg.webhook.on_ambiguous = policy;
    db.enqueue("slow", "webhook", json!({"url": rx.url("/"), "body": 1}))
        .await;
    let store = db.store.clone();
    run_until(
        engine(db.store.clone(), &cfg),
        Duration::from_secs(20),
        || {
            let store = store.clone();
            async move {
                store
                    .find("slow")
                    .await
                    .map(|i| matches!(i.state.as_str(), "ambiguous" | "delivered" | "dead"))
                    .unwrap_or(false)
            }
        },
    )
    .await;
    (db, rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_answered_after_the_timeout_is_parked_after_exactly_one_post() {
    let (db, rx) = answered_after_the_timeout(outbox_providers::AmbiguityPolicy::Park).await;
    let i = db.store.find("slow").await.unwrap();
    assert_eq!(i.state, "ambiguous", "{i:?}");
    let attempts = db.store.attempts(i.id).await.unwrap();
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    assert_eq!(attempts[0].outcome, "ambiguous", "{attempts:?}");
    assert!(
        i.last_error
            .as_deref()
            .unwrap_or("")
            .contains("no answer within 1s"),
        "{i:?}"
    );
    // the receiver's late 200 has been sent by now: nothing followed it
    assert!(
        !common::wait_for(Duration::from_millis(1500), || async {
            rx.requests().len() > 1
        })
        .await,
        "a parked intent is not sent again"
    );
    assert_eq!(rx.requests().len(), 1, "exactly one POST");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_answered_after_the_timeout_is_redelivered_under_the_same_id() {
    let (db, rx) = answered_after_the_timeout(outbox_providers::AmbiguityPolicy::Redeliver).await;
    let i = db.store.find("slow").await.unwrap();
    assert_eq!(i.state, "delivered", "{i:?}");
    let attempts = db.store.attempts(i.id).await.unwrap();
    let outcomes: Vec<&str> = attempts.iter().map(|a| a.outcome.as_str()).collect();
    assert_eq!(outcomes, ["ambiguous", "delivered"], "{attempts:?}");
    let reqs = rx.requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[0].webhook_id(), reqs[1].webhook_id(), "one webhook-id");
    assert_eq!(reqs[0].body, reqs[1].body, "byte-identical bodies");
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

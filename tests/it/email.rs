//! Email against a real SMTP server (aiosmtpd), through the SQL API and the engine.

use std::time::Duration;

use crate::common;
use crate::common::smtp::SmtpPeer;
use crate::common::{config, engine, run_once_within, run_until, TestDb};
use outbox_providers::{AmbiguityPolicy, Secret};
use outbox_relay::config::{Config, Dur};
use serde_json::json;

fn email_config(peer: &SmtpPeer) -> Config {
    let mut c = config();
    c.email.smtp_url = Some(Secret::new(peer.url()));
    c.email.from = Some("Shop <shop@example.com>".into());
    c.email.timeout = Dur(Duration::from_secs(3));
    c
}

fn mail(to: &str, subject: &str) -> serde_json::Value {
    json!({"to": [to], "subject": subject, "text": "Thank you for your order.\nIt ships tomorrow."})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_arrives_with_its_derived_message_id_and_queue_reference() {
    let db = TestDb::new().await;
    let peer = SmtpPeer::start().await;
    db.enqueue(
        "order:7:confirmation",
        "email",
        json!({"to": ["alice@example.com"], "cc": ["bob@example.com"], "bcc": ["audit@example.com"],
               "reply_to": "help@example.com", "subject": "Order 7 confirmed", "text": "Thanks!", "html": "<p>Thanks!</p>"}),
    )
    .await;
    engine(db.store.clone(), &email_config(&peer))
        .run_once()
        .await
        .unwrap();

    let intent = db.store.find("order:7:confirmation").await.unwrap();
    assert_eq!(intent.state, "delivered", "{:?}", intent.last_error);
    let msgs = peer.messages();
    assert_eq!(msgs.len(), 1);
    let m = &msgs[0];
    assert_eq!(m["mail_from"], "shop@example.com");
    let rcpts: Vec<&str> = m["rcpt_tos"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(
        rcpts,
        ["alice@example.com", "bob@example.com", "audit@example.com"]
    );
    let data = m["data"].as_str().unwrap();
    let expected_id = format!(
        "<{}@example.com>",
        &outbox_providers::keys::effect_key("order:7:confirmation", "email", 0)[..32]
    );
    assert!(
        data.contains(&format!("Message-ID: {expected_id}")),
        "{data}"
    );
    assert!(data.contains("Subject: Order 7 confirmed"));
    assert!(data.contains("From: Shop <shop@example.com>"));
    assert!(data.contains("Reply-To: help@example.com"));
    assert!(
        !data.contains("audit@example.com"),
        "Bcc never appears in the headers"
    );
    assert!(data.contains("Thanks!") && data.contains("text/html"));
    let queue_id = m["queue_id"].as_str().unwrap();
    assert_eq!(
        intent.provider_ref.as_deref(),
        Some(format!("{queue_id} {expected_id}").as_str())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_550_is_rejected_with_the_reply_and_a_451_is_retried() {
    let db = TestDb::new().await;
    let peer = SmtpPeer::start().await;
    db.enqueue("to-unknown", "email", mail("unknown@example.com", "hello"))
        .await;
    db.enqueue(
        "to-greylist",
        "email",
        mail("greylist@example.com", "hello"),
    )
    .await;
    let store = db.store.clone();
    run_until(
        engine(db.store.clone(), &email_config(&peer)),
        Duration::from_secs(20),
        || {
            let store = store.clone();
            async move {
                store.find("to-unknown").await.unwrap().state == "rejected"
                    && store.find("to-greylist").await.unwrap().state == "delivered"
            }
        },
    )
    .await;
    let rejected = db.store.find("to-unknown").await.unwrap();
    let reason = rejected.last_error.unwrap();
    assert!(
        reason.contains("550") && reason.contains("User unknown"),
        "{reason}"
    );
    assert_eq!(rejected.response.unwrap()["code"], 550);
    assert_eq!(rejected.attempts, 1, "a 5yz is not retried");

    let greylisted = db.store.find("to-greylist").await.unwrap();
    let attempts = db.store.attempts(greylisted.id).await.unwrap();
    let outcomes: Vec<_> = attempts
        .iter()
        .map(|a| (a.outcome.as_str(), a.status))
        .collect();
    assert_eq!(
        outcomes,
        [("transient", Some(451)), ("delivered", Some(250))]
    );
    assert_eq!(
        peer.messages().len(),
        1,
        "only the greylisted message was accepted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_dropped_after_data_is_parked_then_resolved_by_an_operator() {
    let db = TestDb::new().await;
    let peer = SmtpPeer::start().await;
    db.enqueue("to-drop", "email", mail("drop@example.com", "lost reply"))
        .await;
    engine(db.store.clone(), &email_config(&peer))
        .run_once()
        .await
        .unwrap();
    let intent = db.store.find("to-drop").await.unwrap();
    assert_eq!(intent.state, "ambiguous");
    let reason = intent.last_error.unwrap();
    assert!(
        reason.contains("after the message body was sent"),
        "{reason}"
    );
    let msgs = peer.messages();
    assert_eq!(msgs.len(), 1);
    assert_eq!(
        msgs[0]["dropped"], true,
        "the server did receive the whole message"
    );

    let out = common::cli(
        &db,
        &[
            "resolve",
            "to-drop",
            "--delivered",
            "--ref",
            "checked-in-mail-log-77",
        ],
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let intent = db.store.find("to-drop").await.unwrap();
    assert_eq!(intent.state, "delivered");
    assert_eq!(
        intent.provider_ref.as_deref(),
        Some("checked-in-mail-log-77")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redelivery_after_a_lost_lease_reuses_the_message_id() {
    let db = TestDb::new().await;
    let peer = SmtpPeer::start().await;
    db.enqueue("resend", "email", mail("carol@example.com", "again"))
        .await;
    // the first delivery
    engine(db.store.clone(), &email_config(&peer))
        .run_once()
        .await
        .unwrap();
    assert_eq!(db.state("resend").await, "delivered");
    // the intent is due again (as after a retry) and a relay claims it, then
    // dies: its lease expires with no recorded outcome
    sqlx::query(
        "UPDATE outbox.intents SET state = 'pending', run_after = now() WHERE key = 'resend'",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let claims = db.store.claim("crashed-relay", 10, 100, &[]).await.unwrap();
    assert_eq!(claims.len(), 1);
    tokio::time::sleep(Duration::from_millis(150)).await;
    let mut cfg = email_config(&peer);
    cfg.email.on_ambiguous = AmbiguityPolicy::Redeliver;
    engine(db.store.clone(), &cfg).run_once().await.unwrap();
    assert_eq!(db.state("resend").await, "delivered");
    let ids: Vec<String> = peer
        .messages()
        .iter()
        .map(|m| {
            let data = m["data"].as_str().unwrap();
            data.lines()
                .find(|l| l.starts_with("Message-ID:"))
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(ids.len(), 2);
    assert_eq!(ids[0], ids[1], "one Message-ID across attempts and relays");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_addresses_and_injection_attempts_never_reach_the_server() {
    let db = TestDb::new().await;
    let peer = SmtpPeer::start().await;
    let cases = [
        (
            "bad-to",
            json!({"to": ["not-an-address"], "subject": "s", "text": "t"}),
            "invalid",
        ),
        (
            "crlf-to",
            json!({"to": ["a@example.com\r\nRCPT TO:<evil@example.com>"], "subject": "s", "text": "t"}),
            "line break",
        ),
        (
            "no-body",
            json!({"to": ["a@example.com"], "subject": "s"}),
            "\"text\" or \"html\"",
        ),
    ];
    for (key, payload, _) in &cases {
        db.enqueue(key, "email", payload.clone()).await;
    }
    db.enqueue(
        "crlf-subject",
        "email",
        json!({"to": ["dave@example.com"], "subject": "hi\r\nBcc: evil@example.com", "text": "t"}),
    )
    .await;
    engine(db.store.clone(), &email_config(&peer))
        .run_once()
        .await
        .unwrap();
    for (key, _, needle) in cases {
        let i = db.store.find(key).await.unwrap();
        assert_eq!(i.state, "rejected", "{key}");
        assert!(
            i.last_error.as_deref().unwrap().contains(needle),
            "{key}: {:?}",
            i.last_error
        );
    }
    // the subject is encoded, not interpreted: one recipient, no new header
    assert_eq!(db.state("crlf-subject").await, "delivered");
    let msgs = peer.messages();
    assert_eq!(msgs.len(), 1);
    assert_eq!(msgs[0]["rcpt_tos"], json!(["dave@example.com"]));
    assert!(!msgs[0]["data"].as_str().unwrap().contains("\nBcc:"));
}

/// The intent's trace context goes with the message as its `traceparent`
/// and `tracestate` headers (with no span export, unchanged); the
/// Message-ID stays the one derived from the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trace_context_goes_as_headers_of_the_message() {
    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let db = TestDb::new().await;
    let peer = SmtpPeer::start().await;
    sqlx::query(
        "SELECT outbox.enqueue('order:8:confirmation', 'email', $1, p_traceparent => $2,
                               p_tracestate => 'shop=checkout')",
    )
    .bind(mail("alice@example.com", "Order 8 confirmed"))
    .bind(TP)
    .execute(db.pool())
    .await
    .unwrap();
    db.enqueue(
        "order:9:confirmation",
        "email",
        mail("bob@example.com", "Order 9 confirmed"),
    )
    .await;
    engine(db.store.clone(), &email_config(&peer))
        .run_once()
        .await
        .unwrap();
    let msgs = peer.messages();
    assert_eq!(msgs.len(), 2);
    let data = |to: &str| {
        msgs.iter()
            .find(|m| m["rcpt_tos"][0] == to)
            .and_then(|m| m["data"].as_str())
            .unwrap()
            .to_string()
    };
    let traced = data("alice@example.com");
    assert!(traced.contains(&format!("traceparent: {TP}")), "{traced}");
    assert!(traced.contains("tracestate: shop=checkout"), "{traced}");
    let id = &outbox_providers::keys::effect_key("order:8:confirmation", "email", 0)[..32];
    assert!(traced.contains(&format!("Message-ID: <{id}@example.com>")));
    let plain = data("bob@example.com");
    assert!(
        !plain.contains("traceparent") && !plain.contains("tracestate"),
        "{plain}"
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

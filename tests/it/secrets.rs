//! Secrets never reach logs, error messages or the database; payload bodies
//! never reach logs.

use crate::common;
use crate::common::smtp::SmtpPeer;
use crate::common::stripe::{FakeStripe, API_KEY};
use crate::common::{Receiver, TestDb};
use serde_json::json;

const SIGNING_SECRET: &str = "whsec_c2VjcmV0LXNpZ25pbmcta2V5LTEyMzQ1Njc4OTA=";
const SMTP_PASSWORD: &str = "Smtp-Pw-7f3a9c";
const DB_PASSWORD: &str = "Db-Pw-2b8e11";
const BODY_MARKER: &str = "body-marker-6d0c4e";
const AMQP_PASSWORD: &str = "Amqp-Pw-91c2d0";
const NATS_TOKEN: &str = "Nats-Tok-5e7a13";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_debug_run_leaks_no_secret_and_no_payload_body() {
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    let smtp = SmtpPeer::start().await;
    let stripe = FakeStripe::start().await;
    let rabbit = common::amqp::Rabbit::shared();
    let nats = common::nats::NatsServer::start().await;
    // a broker that refuses the password, a server that takes the token
    db.enqueue(
        "s:amqp",
        "amqp",
        json!({"exchange": "", "routing_key": "nowhere", "body": {"note": BODY_MARKER}}),
    )
    .await;
    db.enqueue(
        "s:nats",
        "nats",
        json!({"subject": "no.stream", "body": {"note": BODY_MARKER}}),
    )
    .await;
    db.enqueue(
        "s:webhook",
        "webhook",
        json!({"url": rx.url("/"), "body": {"note": BODY_MARKER}}),
    )
    .await;
    db.enqueue(
        "s:email",
        "email",
        json!({"to": ["a@example.com"], "subject": "s", "text": BODY_MARKER}),
    )
    .await;
    db.enqueue(
        "s:charge",
        "charge",
        json!({"amount": 100, "currency": "usd", "payment_method": "pm_card_visa",
                                            "description": BODY_MARKER}),
    )
    .await;
    db.enqueue(
        "s:charge-500",
        "charge",
        json!({"amount": 100, "currency": "usd", "payment_method": "pm_500_before_create"}),
    )
    .await;

    // a password in the database URL (trust auth ignores it, the relay must not print it)
    let mut url = reqwest::Url::parse(&db.url).unwrap();
    url.set_password(Some(DB_PASSWORD)).unwrap();
    let smtp_url = format!("smtp://mailer:{SMTP_PASSWORD}@127.0.0.1:{}", smtp.port);
    let out = common::relay_command(url.as_str())
        .args(["run", "--once"])
        .env("RUST_LOG", "debug")
        .env("STRIPE_API_KEY", API_KEY)
        .env("OUTBOX_RELAY__CHARGE__API_BASE", &stripe.base)
        .env(
            "OUTBOX_RELAY__WEBHOOK__SIGNING_SECRETS",
            format!("[\"{SIGNING_SECRET}\"]"),
        )
        .env("OUTBOX_RELAY__EMAIL__SMTP_URL", &smtp_url)
        .env("OUTBOX_RELAY__EMAIL__FROM", "shop@example.com")
        .env("OUTBOX_RELAY__AMQP__URL", rabbit.url())
        .env("OUTBOX_RELAY__AMQP__PASSWORD", AMQP_PASSWORD)
        .env("OUTBOX_RELAY__NATS__URL", nats.url())
        .env("OUTBOX_RELAY__NATS__TOKEN", NATS_TOKEN)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let logs = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(logs.contains("DEBUG"), "the run logged at debug level");

    // the run did real work with every secret
    assert_eq!(db.state("s:webhook").await, "delivered");
    assert!(rx.requests()[0].header("webhook-signature").is_some());
    assert_eq!(db.state("s:charge").await, "delivered");
    let email = db.store.find("s:email").await.unwrap();
    assert!(
        email
            .last_error
            .as_deref()
            .unwrap()
            .contains("authentication"),
        "{:?}",
        email.last_error
    );

    let amqp = db.store.find("s:amqp").await.unwrap();
    assert!(
        amqp.last_error
            .as_deref()
            .is_some_and(|e| e.contains("cannot connect to AMQP")),
        "{:?}",
        amqp.last_error
    );
    let nats = db.store.find("s:nats").await.unwrap();
    assert!(
        nats.last_error
            .as_deref()
            .is_some_and(|e| e.contains("no responders")),
        "{:?}",
        nats.last_error
    );

    let dump: String = sqlx::query_scalar(
        "SELECT concat((SELECT string_agg(t::text, ' ') FROM outbox.intents t),
                       (SELECT string_agg(t::text, ' ') FROM outbox.attempts t),
                       (SELECT string_agg(t::text, ' ') FROM outbox.operator_actions t))",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert!(
        dump.contains(BODY_MARKER),
        "the payloads are in the database, as they should be"
    );
    for secret in [
        SIGNING_SECRET,
        &SIGNING_SECRET[6..],
        API_KEY,
        SMTP_PASSWORD,
        DB_PASSWORD,
        AMQP_PASSWORD,
        NATS_TOKEN,
    ] {
        assert!(
            !logs.contains(secret),
            "a secret reached the logs: {secret}"
        );
        assert!(
            !dump.contains(secret),
            "a secret reached the database: {secret}"
        );
    }
    assert!(
        !logs.contains(BODY_MARKER),
        "a payload body reached the logs"
    );
}

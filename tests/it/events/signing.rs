//! Deliveries: one per matching subscription, in Standard Webhooks' shape,
//! signed with the subscription's own secret (both during a rotation).

use serde_json::{json, Value};

use super::*;
use crate::common::{engine, run_until, Receiver};

#[tokio::test]
async fn each_matching_subscription_of_the_tenant_gets_one_signed_delivery() {
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    let (orders, orders_secret) = subscribe(
        &db,
        &[
            "--url",
            &rx.url("/acme-orders"),
            "--tenant",
            "acme",
            "--event-types",
            "order.*",
        ],
    )
    .await;
    let (exact, exact_secret) = subscribe(
        &db,
        &[
            "--url",
            &rx.url("/acme-paid"),
            "--tenant",
            "acme",
            "--event-types",
            "invoice.created,order.paid",
            "--header",
            "X-Team: billing",
        ],
    )
    .await;
    // another tenant's, one of another type, and one without a tenant
    subscribe(&db, &["--url", &rx.url("/globex"), "--tenant", "globex"]).await;
    subscribe(
        &db,
        &[
            "--url",
            &rx.url("/acme-invoices"),
            "--tenant",
            "acme",
            "--event-types",
            "invoice.*",
        ],
    )
    .await;
    subscribe(&db, &["--url", &rx.url("/untenanted")]).await;

    let data = json!({"order": 42, "amount": 123456789012345678901234567890u128.to_string()});
    let (event, duplicate) = publish(
        &db,
        "order-42-paid",
        "order.paid",
        data.clone(),
        Some("acme"),
    )
    .await
    .unwrap();
    assert!(!duplicate);
    // the same key and payload again: a duplicate; another payload: OB409
    let (again, duplicate) = publish(
        &db,
        "order-42-paid",
        "order.paid",
        data.clone(),
        Some("acme"),
    )
    .await
    .unwrap();
    assert_eq!((again, duplicate), (event, true));
    let err = publish(
        &db,
        "order-42-paid",
        "order.paid",
        json!({"order": 43}),
        Some("acme"),
    )
    .await
    .unwrap_err();
    assert_eq!(
        err.as_database_error().and_then(|e| e.code()).as_deref(),
        Some("OB409"),
        "{err}"
    );

    let cfg = events_config();
    run_until(engine(db.store.clone(), &cfg), LIMIT, || async {
        rx.requests().len() >= 2 && deliveries_in(&db, "delivered").await == 2
    })
    .await;

    let requests = rx.requests();
    let mut paths: Vec<&str> = requests.iter().map(|r| r.path.as_str()).collect();
    paths.sort();
    assert_eq!(
        paths,
        ["/acme-orders", "/acme-paid"],
        "only the matching subscriptions of acme"
    );
    for r in &requests {
        let (id, secret, other) = if r.path == "/acme-orders" {
            (&orders, &orders_secret, &exact_secret)
        } else {
            (&exact, &exact_secret, &orders_secret)
        };
        assert!(
            verifies(r, secret),
            "{} verifies with its subscription's secret",
            r.path
        );
        assert!(
            !verifies(r, other),
            "{} does not verify with another's",
            r.path
        );
        let body: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(body["type"], "order.paid");
        assert_eq!(body["data"], data);
        let timestamp = body["timestamp"].as_str().unwrap();
        chrono::DateTime::parse_from_rfc3339(timestamp).expect("an RFC 3339 timestamp");
        // webhook-id: stable per (event, subscription)
        let key: String = sqlx::query_scalar("SELECT outbox.derive_key($1, 'subscription ' || $2)")
            .bind("order-42-paid")
            .bind(id)
            .fetch_one(db.pool())
            .await
            .unwrap();
        assert_eq!(r.webhook_id(), outbox_providers::keys::webhook_id(&key, 0));
    }
    let paid = requests.iter().find(|r| r.path == "/acme-paid").unwrap();
    assert_eq!(paid.header("x-team").as_deref(), Some("billing"));

    // the event is delivered, its effect counted; each delivery is linked to it
    assert_eq!(db.state("order-42-paid").await, "delivered");
    let reference: String =
        sqlx::query_scalar("SELECT provider_ref FROM outbox.intents WHERE id = $1")
            .bind(event)
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(reference, "2 of 2 matching subscriptions");
    let linked: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox.event_deliveries WHERE event_id = $1")
            .bind(event)
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(linked, 2);
    // and no payload or log line of the outbox holds a secret
    let payloads: Vec<String> = sqlx::query_scalar("SELECT payload::text FROM outbox.intents")
        .fetch_all(db.pool())
        .await
        .unwrap();
    for p in payloads {
        assert!(!p.contains("whsec_"), "{p}");
    }
}

#[tokio::test]
async fn during_a_rotation_deliveries_verify_with_the_old_and_the_new_secret() {
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    let (id, first) = subscribe(&db, &["--url", &rx.url("/hook")]).await;
    let rotate = |grace: &'static str| {
        let db = &db;
        let id = id.clone();
        async move {
            let out = relay_cli(
                db,
                &["subscriptions", "rotate-secret", &id, "--grace", grace],
            )
            .await;
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let secret = String::from_utf8(out.stdout).unwrap().trim().to_string();
            assert!(secret.starts_with("whsec_"), "{secret}");
            secret
        }
    };
    let second = rotate("1h").await;
    publish(&db, "during-grace", "user.created", json!({"n": 1}), None)
        .await
        .unwrap();
    let cfg = events_config();
    run_until(engine(db.store.clone(), &cfg), LIMIT, || async {
        rx.requests().len() == 1
    })
    .await;
    let during = &rx.requests()[0];
    assert!(verifies(during, &second), "the new secret verifies");
    assert!(
        verifies(during, &first),
        "the old secret verifies during the grace window"
    );
    assert_eq!(
        during
            .header("webhook-signature")
            .unwrap()
            .split(' ')
            .count(),
        2,
        "two signatures: v1,<new> v1,<old>"
    );

    // a rotation without grace: only the newest signs
    let third = rotate("0s").await;
    publish(&db, "after-grace", "user.created", json!({"n": 2}), None)
        .await
        .unwrap();
    run_until(engine(db.store.clone(), &cfg), LIMIT, || async {
        rx.requests().len() == 2
    })
    .await;
    let after = &rx.requests()[1];
    assert!(verifies(after, &third));
    assert!(!verifies(after, &second));
    assert!(!verifies(after, &first));
}

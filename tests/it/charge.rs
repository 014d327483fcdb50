//! Charges against a fake that implements Stripe's idempotency semantics.

use std::time::Duration;

use crate::common;
use crate::common::stripe::{FakeStripe, Running, API_KEY};
use crate::common::{config, engine, run_once_within, TestDb};
use outbox_providers::charge::request::idempotency_key;
use outbox_providers::Secret;
use outbox_relay::config::Config;
use outbox_relay::store::operator::RetryOptions;
use serde_json::json;

fn charge_config(fake: &Running) -> Config {
    let mut c = config();
    c.charge.api_key = Some(Secret::new(API_KEY));
    c.charge.api_base = fake.base.clone();
    c
}

fn charge(pm: &str) -> serde_json::Value {
    json!({"amount": 1999, "currency": "usd", "payment_method": pm, "customer": "cus_42",
           "description": "Order 42", "metadata": {"order": "42"}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_is_created_once_with_the_derived_key_and_its_id_recorded() {
    let db = TestDb::new().await;
    let stripe = FakeStripe::start().await;
    db.enqueue("order:42:charge", "charge", charge("pm_card_visa"))
        .await;
    engine(db.store.clone(), &charge_config(&stripe))
        .run_once()
        .await
        .unwrap();

    let payments = stripe.fake.payments();
    assert_eq!(payments.len(), 1);
    let pi = &payments[0];
    assert_eq!(
        (pi["amount"].as_i64(), pi["currency"].as_str()),
        (Some(1999), Some("usd"))
    );
    assert_eq!(pi["metadata"]["outbox_intent_key"], "order:42:charge");
    assert_eq!(pi["metadata"]["order"], "42");
    let intent = db.store.find("order:42:charge").await.unwrap();
    assert_eq!(intent.state, "delivered");
    assert_eq!(intent.provider_ref.as_deref(), pi["id"].as_str());
    let reqs = stripe.fake.requests();
    assert_eq!(reqs, [(idempotency_key("order:42:charge", 0), false, 200)]);

    // an operator retry re-sends under the same key: the provider replays,
    // no second payment, and the replay is recorded on the attempt
    let force = RetryOptions {
        force: true,
        ..RetryOptions::default()
    };
    db.store.retry("order:42:charge", force).await.unwrap();
    engine(db.store.clone(), &charge_config(&stripe))
        .run_once()
        .await
        .unwrap();
    assert_eq!(stripe.fake.payments().len(), 1);
    let attempts = db.store.attempts(intent.id).await.unwrap();
    assert_eq!(
        attempts.iter().map(|a| a.replayed).collect::<Vec<_>>(),
        [false, true]
    );
    assert_eq!(
        db.store.find("order:42:charge").await.unwrap().provider_ref,
        intent.provider_ref
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decline_is_rejected_and_only_new_effect_charges_again() {
    let db = TestDb::new().await;
    let stripe = FakeStripe::start().await;
    db.enqueue("declined", "charge", charge("pm_card_chargeDeclined"))
        .await;
    let cfg = charge_config(&stripe);
    engine(db.store.clone(), &cfg).run_once().await.unwrap();
    let intent = db.store.find("declined").await.unwrap();
    assert_eq!(intent.state, "rejected");
    let reason = intent.last_error.unwrap();
    assert!(
        reason.contains("card declined") && reason.contains("generic_decline"),
        "{reason}"
    );
    assert_eq!(
        intent.response.unwrap()["error"]["decline_code"],
        "generic_decline"
    );

    // a plain retry replays the stored decline; --new-effect is a new key
    db.store
        .retry("declined", RetryOptions::default())
        .await
        .unwrap();
    engine(db.store.clone(), &cfg).run_once().await.unwrap();
    let new_effect = RetryOptions {
        new_effect: true,
        ..RetryOptions::default()
    };
    db.store.retry("declined", new_effect).await.unwrap();
    engine(db.store.clone(), &cfg).run_once().await.unwrap();
    let keys: Vec<(String, bool)> = stripe
        .fake
        .requests()
        .into_iter()
        .map(|(k, r, _)| (k, r))
        .collect();
    assert_eq!(
        keys,
        [
            (idempotency_key("declined", 0), false),
            (idempotency_key("declined", 0), true),
            (idempotency_key("declined", 1), false),
        ]
    );
    let attempts = db.store.attempts(intent.id).await.unwrap();
    assert_eq!(
        attempts
            .iter()
            .map(|a| a.key_generation)
            .collect::<Vec<_>>(),
        [0, 0, 1]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_500_after_the_payment_was_created_is_reconciled_to_exactly_one_payment() {
    let db = TestDb::new().await;
    let stripe = FakeStripe::start().await;
    db.enqueue("half-failed", "charge", charge("pm_500_after_create"))
        .await;
    engine(db.store.clone(), &charge_config(&stripe))
        .run_once()
        .await
        .unwrap();
    let payments = stripe.fake.payments();
    assert_eq!(payments.len(), 1, "exactly one payment exists");
    let intent = db.store.find("half-failed").await.unwrap();
    assert_eq!(intent.state, "delivered");
    assert_eq!(
        intent.provider_ref.as_deref(),
        payments[0]["id"].as_str(),
        "the intent carries its id"
    );
    let attempts = db.store.attempts(intent.id).await.unwrap();
    assert_eq!(
        (attempts[0].outcome.as_str(), attempts[0].status),
        ("delivered", None)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_500_with_no_payment_is_retried_under_the_same_key_and_never_duplicates() {
    let db = TestDb::new().await;
    let stripe = FakeStripe::start().await;
    let mut cfg = charge_config(&stripe);
    cfg.retry.max_attempts = 3;
    db.enqueue("no-payment", "charge", charge("pm_500_before_create"))
        .await;
    common::run_until_state(
        engine(db.store.clone(), &cfg),
        &db.store,
        "no-payment",
        "dead",
        Duration::from_secs(20),
    )
    .await;
    assert!(stripe.fake.payments().is_empty());
    let reqs = stripe.fake.requests();
    assert_eq!(reqs.len(), 3);
    assert!(reqs
        .iter()
        .all(|(k, _, s)| *k == idempotency_key("no-payment", 0) && *s == 500));
    assert!(reqs[1].1 && reqs[2].1, "the stored 500 is replayed");
    let reason = db
        .store
        .find("no-payment")
        .await
        .unwrap()
        .last_error
        .unwrap();
    assert!(
        reason.contains("no such effect") && reason.contains("gave up after 3"),
        "{reason}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_key_with_other_parameters_is_rejected_not_replayed() {
    let db = TestDb::new().await;
    let stripe = FakeStripe::start().await;
    // another client used our derived key first, with another amount
    let form = [
        ("amount", "5"),
        ("currency", "usd"),
        ("payment_method", "pm_card_visa"),
        ("confirm", "true"),
    ];
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/payment_intents", stripe.base))
        .bearer_auth(API_KEY)
        .header("idempotency-key", idempotency_key("collide", 0))
        .form(&form)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    db.enqueue("collide", "charge", charge("pm_card_visa"))
        .await;
    engine(db.store.clone(), &charge_config(&stripe))
        .run_once()
        .await
        .unwrap();
    let intent = db.store.find("collide").await.unwrap();
    assert_eq!(intent.state, "rejected");
    assert!(intent
        .last_error
        .unwrap()
        .contains("idempotency key reused with different parameters"));
    assert_eq!(
        stripe.fake.payments().len(),
        1,
        "only the other client's payment"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_409_for_a_key_in_use_is_transient_and_bad_credentials_are_dead() {
    let db = TestDb::new().await;
    let stripe = FakeStripe::start().await;
    stripe.fake.hold(&idempotency_key("busy", 0));
    db.enqueue("busy", "charge", charge("pm_card_visa")).await;
    let mut cfg = charge_config(&stripe);
    // long enough that `run --once` cannot see the retry fall due
    cfg.retry.schedule = vec![outbox_relay::config::Dur(Duration::from_secs(30))];
    engine(db.store.clone(), &cfg).run_once().await.unwrap();
    let busy = db.store.find("busy").await.unwrap();
    assert_eq!((busy.state.as_str(), busy.attempts), ("pending", 1));
    assert!(busy.last_error.unwrap().contains("409"));
    stripe.fake.release(&idempotency_key("busy", 0));
    // the retry falls due
    sqlx::query("UPDATE outbox.intents SET run_after = now() WHERE key = 'busy'")
        .execute(db.pool())
        .await
        .unwrap();
    common::run_until_state(
        engine(db.store.clone(), &cfg),
        &db.store,
        "busy",
        "delivered",
        Duration::from_secs(10),
    )
    .await;

    let mut wrong = charge_config(&stripe);
    wrong.charge.api_key = Some(Secret::new("sk_test_wrong"));
    db.enqueue("unauthorized", "charge", charge("pm_card_visa"))
        .await;
    engine(db.store.clone(), &wrong).run_once().await.unwrap();
    let dead = db.store.find("unauthorized").await.unwrap();
    assert_eq!((dead.state.as_str(), dead.attempts), ("dead", 1));
    assert!(dead.last_error.unwrap().contains("STRIPE_API_KEY"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_lost_lease_reconcile_finds_the_payment_or_redelivers_with_the_same_key() {
    let db = TestDb::new().await;
    let stripe = FakeStripe::start().await;
    db.enqueue("sent-then-died", "charge", charge("pm_card_visa"))
        .await;
    db.enqueue("died-before-sending", "charge", charge("pm_card_visa"))
        .await;
    // a relay claims both and dies; it had already sent the first one
    let claims = db.store.claim("crashed-relay", 10, 100, &[]).await.unwrap();
    assert_eq!(claims.len(), 2);
    let form =
        outbox_providers::charge::request::form(&charge("pm_card_visa"), "sent-then-died", 0)
            .unwrap();
    reqwest::Client::new()
        .post(format!("{}/v1/payment_intents", stripe.base))
        .bearer_auth(API_KEY)
        .header("idempotency-key", idempotency_key("sent-then-died", 0))
        .form(&form)
        .send()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;

    engine(db.store.clone(), &charge_config(&stripe))
        .run_once()
        .await
        .unwrap();
    let payments = stripe.fake.payments();
    assert_eq!(payments.len(), 2, "one payment per intent, none twice");
    for key in ["sent-then-died", "died-before-sending"] {
        let i = db.store.find(key).await.unwrap();
        assert_eq!(i.state, "delivered", "{key}");
        let pi = payments
            .iter()
            .find(|p| p["metadata"]["outbox_intent_key"] == key)
            .unwrap();
        assert_eq!(i.provider_ref.as_deref(), pi["id"].as_str());
    }
    let keys: Vec<String> = stripe
        .fake
        .requests()
        .into_iter()
        .map(|(k, _, _)| k)
        .collect();
    assert_eq!(
        keys,
        [
            idempotency_key("sent-then-died", 0),
            idempotency_key("died-before-sending", 0)
        ],
        "the found payment was not charged again; the other was sent once, under its derived key"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_charge_payloads_are_rejected_before_any_call() {
    let db = TestDb::new().await;
    let stripe = FakeStripe::start().await;
    for (key, payload) in [
        (
            "zero",
            json!({"amount": 0, "currency": "usd", "payment_method": "pm_card_visa"}),
        ),
        (
            "negative",
            json!({"amount": -100, "currency": "usd", "payment_method": "pm_card_visa"}),
        ),
        (
            "currency",
            json!({"amount": 100, "currency": "xyz", "payment_method": "pm_card_visa"}),
        ),
        ("no-pm", json!({"amount": 100, "currency": "usd"})),
    ] {
        db.enqueue(key, "charge", payload).await;
    }
    engine(db.store.clone(), &charge_config(&stripe))
        .run_once()
        .await
        .unwrap();
    assert_eq!(db.count("state = 'rejected'").await, 4);
    assert!(stripe.fake.requests().is_empty());
}

/// The intent's trace context goes to the payment API as the request's
/// `traceparent` and `tracestate` headers (with no span export, unchanged),
/// and never into the PaymentIntent's parameters: an operator's retry
/// under the same Idempotency-Key is a replay, not an idempotency error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trace_context_goes_as_headers_of_the_payment_apis_request() {
    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let db = TestDb::new().await;
    let stripe = FakeStripe::start().await;
    sqlx::query(
        "SELECT outbox.enqueue('order:43:charge', 'charge', $1, p_traceparent => $2,
                               p_tracestate => 'shop=checkout')",
    )
    .bind(charge("pm_card_visa"))
    .bind(TP)
    .execute(db.pool())
    .await
    .unwrap();
    engine(db.store.clone(), &charge_config(&stripe))
        .run_once()
        .await
        .unwrap();
    assert_eq!(db.state("order:43:charge").await, "delivered");
    assert_eq!(
        stripe.fake.trace_headers(),
        [(
            "/v1/payment_intents".to_string(),
            Some(TP.to_string()),
            Some("shop=checkout".to_string())
        )]
    );
    let pi = &stripe.fake.payments()[0];
    assert!(!pi.to_string().contains(&TP[3..35]), "{pi}");

    let force = RetryOptions {
        force: true,
        ..RetryOptions::default()
    };
    db.store.retry("order:43:charge", force).await.unwrap();
    engine(db.store.clone(), &charge_config(&stripe))
        .run_once()
        .await
        .unwrap();
    assert_eq!(db.state("order:43:charge").await, "delivered");
    let key = idempotency_key("order:43:charge", 0);
    assert_eq!(
        stripe.fake.requests(),
        [(key.clone(), false, 200), (key, true, 200)]
    );
    assert_eq!(stripe.fake.payments().len(), 1);
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

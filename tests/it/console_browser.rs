//! The console as a person uses it, in a real headless Chromium driven over
//! WebDriver: log in, find the incident, filter by state and a payload
//! field, read an intent's timeline, bulk-retry the failure group after its
//! dry-run count, and see the intents delivered at a real receiver; a
//! hostile payload stays text; a viewer cannot act; a subscription made
//! through its form shows its secret once, and is disabled and enabled
//! from its page. The run writes its
//! screenshots under target/tmp/screenshots/, and over the README's
//! (docs/screenshots/) only with OUTBOX_REFRESH_SCREENSHOTS=1.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fantoccini::{Client, Locator};
use outbox_relay::console::Role;
use serde_json::json;

use crate::common::console::{Browser, ConsoleServer};
use crate::common::{config, engine, run_until, Receiver, Reply, TestDb};

async fn text(c: &Client, css: &str) -> String {
    c.find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
        .text()
        .await
        .unwrap()
}

async fn rows(c: &Client, css: &str) -> usize {
    c.find_all(Locator::Css(css)).await.unwrap().len()
}

async fn log_in(c: &Client, console: &ConsoleServer, user: &str, password: &str) {
    c.goto(&console.url("/login")).await.unwrap();
    c.find(Locator::Id("login-user"))
        .await
        .unwrap()
        .send_keys(user)
        .await
        .unwrap();
    c.find(Locator::Id("login-password"))
        .await
        .unwrap()
        .send_keys(password)
        .await
        .unwrap();
    c.find(Locator::Id("login-submit"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    c.wait()
        .for_element(Locator::Id("user"))
        .await
        .expect("logged in");
    assert_eq!(text(c, "#user").await, user);
}

/// Wait (with a deadline) until the browser's URL contains `part`: the
/// next page has loaded, not just the old one still shown.
async fn until_url(c: &Client, part: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !c.current_url().await.unwrap().as_str().contains(part) {
        assert!(
            std::time::Instant::now() < deadline,
            "no page with {part:?} in its URL"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Wait (with a deadline) until the element's text satisfies `ok`.
async fn until_text(c: &Client, css: &str, ok: impl Fn(&str) -> bool) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let t = match c.find(Locator::Css(css)).await {
            Ok(e) => e.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        if ok(&t) || std::time::Instant::now() > deadline {
            return t;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_finds_an_incident_retries_it_in_bulk_and_sees_it_delivered() {
    let db = TestDb::new().await;
    let healthy = Arc::new(AtomicBool::new(false));
    let flag = healthy.clone();
    let partner = Receiver::start(move |_, _| {
        Reply::status(if flag.load(Ordering::SeqCst) {
            200
        } else {
            503
        })
    })
    .await;
    let shop = Receiver::ok().await;
    for i in 0..30 {
        db.enqueue(
            &format!("order:{i}:confirmation"),
            "webhook",
            json!({"url": partner.url("/orders"), "body": {"order": 1000 + i, "customer": format!("c-{}", i % 3)}}),
        )
        .await;
    }
    let evil = db
        .enqueue(
            "order:evil",
            "webhook",
            json!({"url": partner.url("/orders"), "body": {
                "note": "<script>window.pwned = 1</script><img src=x onerror=\"window.pwned = 2\">",
                "customer": "c-9"}}),
        )
        .await;
    for i in 0..20 {
        db.enqueue(
            &format!("receipt:{i}"),
            "webhook",
            json!({"url": shop.url("/receipts"), "body": {"receipt": i}}),
        )
        .await;
    }
    let mut c = config();
    c.retry.max_attempts = 2;
    c.breaker.enabled = false;
    run_until(
        engine(db.store.clone(), &c),
        Duration::from_secs(30),
        || async {
            db.count("state = 'dead'").await == 31 && db.count("state = 'delivered'").await == 20
        },
    )
    .await;

    let console = ConsoleServer::start(
        &db,
        &[
            ("ops", Role::Operator, "ops-password-1"),
            ("val", Role::Viewer, "viewer-password"),
        ],
    )
    .await;
    let browser = Browser::start().await;
    let b = &browser.client;

    // a page asks for a login first
    b.goto(&console.url("/failures")).await.unwrap();
    assert!(b.current_url().await.unwrap().path().starts_with("/login"));
    log_in(b, &console, "ops", "ops-password-1").await;

    // the incident: one group, not 31 rows
    b.goto(&console.url("/failures")).await.unwrap();
    assert_eq!(rows(b, "#groups tbody tr").await, 1);
    let group = text(b, "#groups tbody tr").await;
    assert!(
        group.contains("31") && group.contains("HTTP 503") && group.contains(&partner.url("")),
        "{group}"
    );
    browser.screenshot("failures").await;

    // filter by state and a payload field
    b.goto(&console.url("/intents")).await.unwrap();
    b.find(Locator::Id("f-state"))
        .await
        .unwrap()
        .select_by_value("dead")
        .await
        .unwrap();
    b.find(Locator::Id("f-payload"))
        .await
        .unwrap()
        .send_keys(r#"{"body": {"customer": "c-1"}}"#)
        .await
        .unwrap();
    b.find(Locator::Id("f-apply"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    until_url(b, "payload=").await;
    assert_eq!(
        rows(b, "#intents tbody tr").await,
        10,
        "orders 1, 4, ... 28"
    );
    let listed = text(b, "#intents tbody").await;
    assert!(listed.contains("order:1:confirmation") && !listed.contains("order:2:confirmation"));

    // open one: its timeline
    b.find(Locator::Css("#intents tbody tr td a"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    until_url(b, "/intents/").await;
    assert_eq!(text(b, "#state").await, "dead");
    assert_eq!(rows(b, "#attempts tbody tr").await, 2);
    let timeline = text(b, "#attempts").await;
    assert!(
        timeline.contains("transient") && timeline.contains("503"),
        "{timeline}"
    );
    assert!(text(b, "#provider-key")
        .await
        .starts_with("webhook-id msg_"));
    // no trace context was enqueued: the trace the relay derives from the key
    let trace = text(b, "#trace-id").await;
    assert!(
        trace.ends_with("derived from the key") && trace.len() > 32,
        "{trace}"
    );
    let opened = b.current_url().await.unwrap();

    // a hostile payload is shown as text and runs nothing
    b.goto(&console.url(&format!("/intents/{evil}")))
        .await
        .unwrap();
    let payload = text(b, "#payload").await;
    assert!(
        payload.contains("<script>window.pwned = 1</script>"),
        "{payload}"
    );
    let pwned = b
        .execute("return typeof window.pwned", vec![])
        .await
        .unwrap();
    assert_eq!(pwned, json!("undefined"));
    assert_eq!(rows(b, "#payload script, #payload img").await, 0);

    // a POST from the page without its CSRF token is refused, and changes nothing
    let refused = b
        .execute_async(
            "const done = arguments[arguments.length - 1];
             fetch('/actions', {method: 'POST',
                 headers: {'content-type': 'application/x-www-form-urlencoded'},
                 body: 'action=cancel&state=dead&up_to=999999&expected=31&nonce=browser-without-csrf-0'})
               .then(r => done(r.status), e => done(String(e)));",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(refused, json!(403));
    assert_eq!(db.count("state = 'dead'").await, 31);

    // the partner is back: retry the whole group, after its dry-run count
    healthy.store(true, Ordering::SeqCst);
    b.goto(&console.url("/failures")).await.unwrap();
    b.find(Locator::Css(".group-action"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    until_url(b, "/actions/new").await;
    assert_eq!(text(b, "#count").await, "31");
    assert!(text(b, "#confirm").await.contains("31 intent(s)"));
    b.find(Locator::Id("confirm"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    b.wait()
        .for_element(Locator::Id("job-state"))
        .await
        .unwrap();
    assert!(!b.current_url().await.unwrap().as_str().contains("/new"));
    let status = until_text(b, "#job-status", |t| t == "finished").await;
    assert_eq!(status, "finished");
    assert!(text(b, "#job-state").await.contains("31 of 31 changed"));

    // the relay delivers them; the console shows it
    run_until(
        engine(db.store.clone(), &c),
        Duration::from_secs(30),
        || async { db.count("state = 'delivered'").await == 51 },
    )
    .await;
    b.goto(&console.url(&format!("/intents?state=delivered&host={}", partner.addr)))
        .await
        .unwrap();
    assert_eq!(rows(b, "#intents tbody tr").await, 31);
    b.goto(&console.url(&format!("/intents/{evil}")))
        .await
        .unwrap();
    assert_eq!(text(b, "#state").await, "delivered");
    assert!(text(b, "#operator-actions").await.contains("console:ops"));
    assert!(text(b, "#effects").await.starts_with("1 effect(s)"));
    // the intent opened earlier: its whole timeline, with the operator's retry
    b.goto(opened.as_str()).await.unwrap();
    assert_eq!(text(b, "#state").await, "delivered");
    assert_eq!(rows(b, "#attempts tbody tr").await, 3);
    assert!(text(b, "#operator-actions").await.contains("retry"));
    browser.screenshot("intent").await;
    b.goto(&console.url("/")).await.unwrap();
    assert!(text(b, "#counts").await.contains("51"));
    browser.screenshot("overview").await;
    assert_eq!(rows(b, "svg.chart").await, 2);

    // a viewer sees no actions, and is refused the ones it asks for
    b.find(Locator::Css("header form button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    until_url(b, "/login").await;
    log_in(b, &console, "val", "viewer-password").await;
    b.goto(&console.url("/intents?state=delivered"))
        .await
        .unwrap();
    assert_eq!(rows(b, "#bulk").await, 0);
    b.goto(&console.url(&format!("/intents/{evil}")))
        .await
        .unwrap();
    assert_eq!(rows(b, "#actions").await, 0);
    b.goto(&console.url("/failures")).await.unwrap();
    assert_eq!(rows(b, ".group-action").await, 0);
    b.goto(&console.url("/actions/new?action=retry&state=delivered&force=on"))
        .await
        .unwrap();
    assert!(text(b, "#refusal").await.contains("is a viewer"));
    browser.close().await;
    assert_eq!(db.count("state = 'delivered'").await, 51);
}

async fn type_into(c: &Client, id: &str, text: &str) {
    let field = c
        .find(Locator::Id(id))
        .await
        .unwrap_or_else(|e| panic!("#{id}: {e}"));
    field.clear().await.unwrap();
    field.send_keys(text).await.unwrap();
}

async fn click(c: &Client, id: &str) {
    c.find(Locator::Id(id))
        .await
        .unwrap_or_else(|e| panic!("#{id}: {e}"))
        .click()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_makes_a_subscription_sees_its_secret_once_and_disables_it() {
    let db = TestDb::new().await;
    let console =
        ConsoleServer::start_with(&db, &[("ops", Role::Operator, "ops-password-1")], |c| {
            c.subscriptions.secret_key = Some(outbox_providers::Secret::new(crate::events::KEY));
        })
        .await;
    let browser = Browser::start().await;
    let b = &browser.client;
    log_in(b, &console, "ops", "ops-password-1").await;
    b.goto(&console.url("/subscriptions")).await.unwrap();
    assert!(text(b, "#none").await.starts_with("No subscriptions"));
    click(b, "new-subscription").await;
    until_url(b, "/subscriptions/new").await;

    // a refused field: the form again, as typed, the field named
    type_into(b, "new-url", "http://127.0.0.1:9/hooks").await;
    type_into(b, "new-event-types", "order.*, invoice.paid").await;
    type_into(b, "new-headers", "X-Token: HEADERVALUE").await;
    type_into(b, "new-rate", "fast").await;
    click(b, "new-submit").await;
    let error = until_text(b, "#form-error", |t| !t.is_empty()).await;
    assert!(error.starts_with("rate: "), "{error}");
    let kept = b.find(Locator::Id("new-url")).await.unwrap();
    assert_eq!(
        kept.prop("value").await.unwrap().as_deref(),
        Some("http://127.0.0.1:9/hooks")
    );
    type_into(b, "new-rate", "5/s").await;
    click(b, "new-submit").await;

    // the secret, once
    let secret = until_text(b, "#secret", |t| t.starts_with("whsec_")).await;
    assert!(secret.starts_with("whsec_"), "{secret}");
    assert!(text(b, "#secret-note").await.contains("shown this once"));
    browser.screenshot("subscription-secret").await;
    click(b, "to-subscription").await;
    until_url(b, "/subscriptions/sub_").await;
    let page = b.source().await.unwrap();
    assert!(!page.contains(&secret) && !page.contains("HEADERVALUE"));
    assert_eq!(text(b, "#headers").await, "X-Token");
    assert_eq!(text(b, "#state").await, "enabled");

    // disabled with a reason, then enabled
    type_into(b, "disable-reason", "receiver moving").await;
    click(b, "disable").await;
    assert_eq!(
        until_text(b, "#state", |t| t == "disabled").await,
        "disabled"
    );
    assert!(text(b, "#disabled-reason")
        .await
        .contains("receiver moving (console user ops)"));
    click(b, "enable").await;
    assert_eq!(until_text(b, "#state", |t| t == "enabled").await, "enabled");
    b.goto(&console.url("/subscriptions")).await.unwrap();
    assert_eq!(rows(b, "#subscriptions tbody tr").await, 1);
    assert!(!b.source().await.unwrap().contains(&secret));
    browser.close().await;
    let (n, enabled): (i64, bool) =
        sqlx::query_as("SELECT count(*), bool_and(disabled_at IS NULL) FROM outbox.subscriptions")
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!((n, enabled), (1, true));
}

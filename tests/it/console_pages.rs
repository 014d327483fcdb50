//! What the console's pages say about rejected intents and recovered
//! destinations, and why the API refuses a body that is not JSON.

use outbox_relay::console::Role;
use serde_json::json;

use crate::common::console::{ConsoleServer, Session};
use crate::common::{config, engine, TestDb};

#[tokio::test]
async fn failures_show_rejected_intents_apart() {
    let db = TestDb::new().await;
    db.enqueue("odd:1", "fax", json!({"to": "+1"})).await;
    db.enqueue(
        "bad-url:1",
        "webhook",
        json!({"url": "ftp://example.invalid/x", "body": {}}),
    )
    .await;
    // the relay rejects both: an unknown kind, a URL it cannot use
    engine(db.store.clone(), &config())
        .run_once()
        .await
        .unwrap();
    assert_eq!(db.count("state = 'rejected'").await, 2);
    let console = ConsoleServer::start(&db, &[]).await;
    let mut s = Session::new(&console);
    let page = s.get("/failures").await;
    assert_eq!(page.status, 200);
    let rejected = &page.body[page
        .body
        .find("id=\"rejected\"")
        .unwrap_or_else(|| panic!("no rejected section: {}", page.body))..];
    assert!(
        rejected.contains(">fax<") && rejected.contains(">webhook<"),
        "{rejected}"
    );
    assert!(!page.body.contains("Nothing is failing"), "{}", page.body);
    assert!(
        page.body.contains("id=\"none\""),
        "nothing dead, ambiguous or failing"
    );
    let api: serde_json::Value =
        serde_json::from_str(&s.get("/api/v1/failures").await.body).unwrap();
    assert_eq!(
        api.as_array()
            .unwrap()
            .iter()
            .filter(|g| g["state"] == "rejected")
            .count(),
        2,
        "{api}"
    );
}

#[tokio::test]
async fn a_recovered_destination_says_so_instead_of_its_old_error() {
    let db = TestDb::new().await;
    // as outbox.destination_succeeded leaves a breaker it closed ten minutes ago
    sqlx::query(
        "INSERT INTO outbox.destinations (name, state, failures, last_error, updated_at)
         VALUES ('http://127.0.0.1:9', 'closed', 0, 'receiver answered HTTP 500', now() - interval '10 minutes'),
                ('http://127.0.0.1:8', 'closed', 2, 'receiver answered HTTP 502', now() - interval '2 minutes')",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let console = ConsoleServer::start(&db, &[]).await;
    let mut s = Session::new(&console);
    let page = s.get("/destinations").await;
    let row = |name: &str| -> String {
        let at = page
            .body
            .find(&format!(">{name}<"))
            .unwrap_or_else(|| panic!("{}", page.body));
        page.body[at..].split("</tr>").next().unwrap().to_string()
    };
    let recovered = row("http://127.0.0.1:9");
    assert!(recovered.contains("recovered 10m ago"), "{recovered}");
    let failing = row("http://127.0.0.1:8");
    assert!(
        failing.contains("HTTP 502") && !failing.contains("recovered"),
        "{failing}"
    );
    assert!(failing.contains("ago)"), "the error's age: {failing}");
}

#[tokio::test]
async fn an_api_post_that_is_not_json_is_told_so_and_a_cross_site_form_is_still_refused() {
    let db = TestDb::new().await;
    let console = ConsoleServer::start(&db, &[("ops", Role::Operator, "ops-password-1")]).await;
    let http = reqwest::Client::new();
    let body = r#"{"action": "retry", "filter": {"state": "dead"}, "dry_run": true}"#;
    let plain = http
        .post(console.url("/api/v1/actions"))
        .basic_auth("ops", Some("ops-password-1"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(plain.status(), 415);
    let text = plain.text().await.unwrap();
    assert!(
        text.contains("Content-Type: application/json") && !text.contains("CSRF"),
        "{text}"
    );
    let json = http
        .post(console.url("/api/v1/actions"))
        .basic_auth("ops", Some("ops-password-1"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(json.status(), 200, "{}", json.text().await.unwrap());
    // a logged-in browser's cross-site form post carries no token: refused
    let mut s = Session::new(&console);
    s.login("ops", "ops-password-1").await;
    let cross = s
        .post_form("/api/v1/actions", &[("action", "retry"), ("state", "dead")])
        .await;
    assert_eq!(cross.status, 403, "{}", cross.body);
    assert!(cross.body.contains("CSRF"), "{}", cross.body);
}

/// The intent page names the intent's trace (the application's, else the
/// one derived from its key) and links it through `console.trace_url`,
/// escaped.
#[tokio::test]
async fn the_intent_page_names_and_links_its_trace() {
    let db = TestDb::new().await;
    let traced: i64 = sqlx::query_scalar(
        "SELECT id FROM outbox.enqueue('traced', 'webhook', '{\"url\": \"http://127.0.0.1:9/\", \"body\": 1}', \
         p_traceparent => '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01')",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    let plain = db
        .enqueue(
            "plain",
            "webhook",
            json!({"url": "http://127.0.0.1:9/", "body": 2}),
        )
        .await;
    let console = ConsoleServer::start_with(&db, &[], |c| {
        c.console.trace_url =
            Some("https://tracing.example/trace/{trace_id}?from=outbox&x=\"".into());
    })
    .await;
    let mut s = Session::new(&console);
    let page = s.get(&format!("/intents/{traced}")).await.body;
    assert!(
        page.contains(
            "<a href=\"https://tracing.example/trace/0af7651916cd43dd8448eb211c80319c?from=outbox&#38;x=&#34;\""
        ) || page.contains(
            "<a href=\"https://tracing.example/trace/0af7651916cd43dd8448eb211c80319c?from=outbox&amp;x=&quot;\""
        ),
        "{page}"
    );
    assert!(
        page.contains("the application&#39;s") || page.contains("the application's"),
        "{page}"
    );
    let page = s.get(&format!("/intents/{plain}")).await.body;
    let derived = db.store.find("plain").await.unwrap().trace_id();
    assert!(
        page.contains(&derived) && page.contains("derived from the key"),
        "{page}"
    );
    let api: serde_json::Value =
        serde_json::from_str(&s.get(&format!("/api/v1/intents/{traced}")).await.body).unwrap();
    assert_eq!(
        api["intent"]["traceparent"]
            .as_str()
            .or(api["traceparent"].as_str()),
        Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
        "{api}"
    );
}

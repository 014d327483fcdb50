//! Bulk actions change only the intents their dry run counted: one that
//! left the filter since is skipped (and reported), one that joined it
//! after the count is never touched. Through the console's API and form,
//! and the CLI's `retry --state`.

use std::time::Duration;

use outbox_relay::console::Role;
use outbox_relay::store::operator::{Filter, RetryOptions};
use outbox_relay::store::IntentState;
use serde_json::{json, Value};

use crate::common::console::{field_of, ConsoleServer, Session};
use crate::common::{cli, TestDb};

/// A webhook intent, pending.
async fn intent(db: &TestDb, key: &str) -> i64 {
    db.enqueue(
        key,
        "webhook",
        json!({"url": "http://127.0.0.1:9/hook", "body": {"k": key}}),
    )
    .await
}

async fn set(db: &TestDb, id: i64, state: &str) {
    sqlx::query(
        "UPDATE outbox.intents SET state = $2, attempts = 3, last_error = 'receiver answered HTTP 503' WHERE id = $1",
    )
    .bind(id)
    .bind(state)
    .execute(db.pool())
    .await
    .unwrap();
}

async fn state_of(db: &TestDb, id: i64) -> String {
    sqlx::query_scalar("SELECT state FROM outbox.intents WHERE id = $1")
        .bind(id)
        .fetch_one(db.pool())
        .await
        .unwrap()
}

/// Poll the job at `path` until it is no longer running.
async fn finished(
    http: &reqwest::Client,
    console: &ConsoleServer,
    path: &str,
    basic: &str,
) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let job: Value = http
            .get(console.url(path))
            .header("authorization", basic)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if job["state"] != "running" {
            return job;
        }
        assert!(std::time::Instant::now() < deadline, "{job}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test]
async fn a_bulk_action_changes_only_intents_its_dry_run_counted() {
    let db = TestDb::new().await;
    let one = intent(&db, "one").await;
    let two = intent(&db, "two").await;
    let filler = intent(&db, "three").await;
    let four = intent(&db, "four").await;
    let five = intent(&db, "five").await;
    set(&db, one, "dead").await;
    set(&db, two, "dead").await;
    set(&db, filler, "delivered").await;
    set(&db, four, "pending").await; // failing
    set(&db, five, "pending").await; // failing
    let console = ConsoleServer::start(&db, &[("alice", Role::Operator, "alice-password-1")]).await;
    let basic = format!("Basic {}", base64_of("alice:alice-password-1"));
    let http = reqwest::Client::new();
    let post = |body: Value| {
        http.post(console.url("/api/v1/actions"))
            .header("authorization", &basic)
            .json(&body)
            .send()
    };

    // the dry run counts 1 and 2; then 1 is cancelled by hand and 5 goes dead
    let dry: Value =
        post(json!({"action": "cancel", "filter": {"state": "dead"}, "dry_run": true}))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
    assert_eq!(dry["count"], 2, "{dry}");
    assert!(dry["up_to"].as_i64().unwrap() >= five);
    let out = cli(&db, &["cancel", &one.to_string()]).await;
    assert!(out.status.success(), "{out:?}");
    set(&db, five, "dead").await;
    let started = post(json!({"action": "cancel", "filter": dry["filter"],
                              "up_to": dry["up_to"], "expected": 2}))
    .await
    .unwrap();
    assert_eq!(started.status(), 202);
    let job: Value = started.json().await.unwrap();
    let job = finished(
        &http,
        &console,
        &format!("/api/v1/actions/{}", job["id"]),
        &basic,
    )
    .await;
    assert_eq!(job["state"], "finished", "{job}");
    assert_eq!(
        (job["changed"].as_u64(), job["skipped"].as_u64()),
        (Some(1), Some(1)),
        "{job}"
    );
    assert_eq!(state_of(&db, two).await, "cancelled");
    assert_eq!(
        state_of(&db, five).await,
        "dead",
        "not counted by the dry run"
    );
    let by_alice: Vec<i64> = sqlx::query_scalar(
        "SELECT intent_id FROM outbox.operator_actions WHERE actor = 'console:alice' ORDER BY intent_id",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    assert_eq!(by_alice, vec![two]);
    // the same confirmation again starts nothing: its set was used
    let again = post(json!({"action": "cancel", "filter": dry["filter"],
                            "up_to": dry["up_to"], "expected": 2}))
    .await
    .unwrap();
    assert_eq!(again.status(), 409);
    assert_eq!(state_of(&db, five).await, "dead");

    // resolve as delivered, through the form: 5 is counted, 4 goes dead after
    let mut s = Session::new(&console);
    s.login("alice", "alice-password-1").await;
    let page = s
        .get("/actions/new?action=resolve&resolve_as=delivered&state=dead")
        .await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains("id=\"count\">1<"), "{}", page.body);
    set(&db, four, "dead").await;
    let mut form: Vec<(String, String)> = Vec::new();
    for name in [
        "csrf",
        "nonce",
        "up_to",
        "expected",
        "state",
        "action",
        "resolve_as",
    ] {
        let value = field_of(&page.body, name).unwrap_or_else(|| panic!("{name}: {}", page.body));
        form.push((name.into(), value));
    }
    let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let confirmed = s.post_form("/actions", &form).await;
    assert_eq!(confirmed.status, 303, "{}", confirmed.body);
    let path = format!("/api/v1{}", confirmed.location.unwrap());
    let job = finished(&http, &console, &path, &basic).await;
    assert_eq!(
        (job["changed"].as_u64(), job["skipped"].as_u64()),
        (Some(1), Some(0)),
        "{job}"
    );
    assert_eq!(state_of(&db, five).await, "delivered");
    assert_eq!(
        state_of(&db, four).await,
        "dead",
        "never resolved as delivered: no one counted it"
    );
}

#[tokio::test]
async fn the_cli_bulk_retry_retries_only_what_it_counted() {
    let db = TestDb::new().await;
    let a = intent(&db, "a").await;
    let b = intent(&db, "b").await;
    let c = intent(&db, "c").await;
    for id in [a, b] {
        set(&db, id, "dead").await;
    }
    set(&db, c, "pending").await;
    let filter = Filter {
        state: IntentState::Dead,
        kind: None,
    };
    let how = RetryOptions::default();
    // what `retry --state dead` counts, then acts on
    let counted = db.store.select_matching(&filter, how).await.unwrap();
    assert_eq!(counted, vec![a, b]);
    set(&db, c, "dead").await; // joins the filter after the count
    sqlx::query("UPDATE outbox.intents SET state = 'cancelled' WHERE id = $1")
        .bind(b) // leaves it
        .execute(db.pool())
        .await
        .unwrap();
    let mut progress = Vec::new();
    let done = db
        .store
        .retry_selected(&filter, &counted, how, 1, |n| progress.push(n))
        .await
        .unwrap();
    assert_eq!(done, 1);
    assert_eq!(progress, vec![1, 1]);
    assert_eq!(state_of(&db, a).await, "pending");
    assert_eq!(state_of(&db, b).await, "cancelled");
    assert_eq!(state_of(&db, c).await, "dead", "not counted");

    // the command end to end: it reports what it retried
    let out = cli(&db, &["retry", "--state", "dead", "--json"]).await;
    assert!(out.status.success(), "{out:?}");
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (answer["retried"].as_u64(), answer["skipped"].as_u64()),
        (Some(1), Some(0))
    );
    assert_eq!(state_of(&db, c).await, "pending");
}

fn base64_of(text: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(text)
}

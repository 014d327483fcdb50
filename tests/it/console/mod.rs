//! The console over HTTP: authentication, roles, CSRF, filters, keyset
//! pages, failure groups and bulk actions through the JSON API, against a
//! real database. (A person's use, in a real browser: console_browser.rs.)

use std::time::Duration;

use outbox_relay::console::Role;
use serde_json::{json, Value};

use crate::common::console::{field_of, ConsoleServer, Session};
use crate::common::{cli, relay_bin, wait_for, TestDb};

mod access;
mod failures;
mod filters;
mod subscriptions;
mod views;

/// `n` webhook intents for `host`, made dead with `error` (as the relay
/// leaves them after their retries).
async fn dead(db: &TestDb, prefix: &str, host: &str, n: usize, error: &str) -> Vec<i64> {
    let mut ids = Vec::new();
    for i in 0..n {
        let payload =
            json!({"url": format!("{host}/hook"), "body": {"order": i, "tenant": prefix}});
        ids.push(
            db.enqueue(&format!("{prefix}:{i}"), "webhook", payload)
                .await,
        );
    }
    sqlx::query(
        "UPDATE outbox.intents SET state = 'dead', attempts = 3, last_error = $2 WHERE id = ANY($1)",
    )
    .bind(&ids)
    .bind(error)
    .execute(db.pool())
    .await
    .unwrap();
    ids
}

async fn json_of(a: &crate::common::console::Answer) -> Value {
    serde_json::from_str(&a.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", a.body))
}

async fn s_with_basic(console: &ConsoleServer, path: &str, basic: &str) -> String {
    let a = reqwest::Client::new()
        .get(console.url(path))
        .header("authorization", basic)
        .send()
        .await
        .unwrap();
    assert_eq!(a.status(), 200, "{path}");
    a.text().await.unwrap()
}

fn base64_of(text: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(text)
}

//! Events and subscriptions: `outbox.publish` in the application's
//! transaction, one signed delivery per matching subscription, verified
//! by a real receiver with the Standard Webhooks reference library.

mod cli;
mod expansion;
mod fairness;
mod headers;
mod health;
mod lookup;
mod replay;
mod signing;

use std::time::Duration;

use outbox_providers::Secret;
use outbox_relay::config::Config;
use serde_json::Value;

use crate::common::{config, relay_bin, Received, TestDb};

/// The sealing key of these tests (32 bytes in base64).
pub const KEY: &str = "c3Vic2NyaXB0aW9ucy10ZXN0LXNlYWxpbmcta2V5ISE=";

/// The test configuration, with the sealing key.
pub fn events_config() -> Config {
    let mut c = config();
    c.subscriptions.secret_key = Some(Secret::new(KEY));
    c
}

/// `outbox-relay ARGS` with the sealing key and loopback allowed.
pub async fn relay_cli(db: &TestDb, args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(relay_bin())
        .args(args)
        .env("DATABASE_URL", &db.url)
        .env_remove("OUTBOX_RELAY_CONFIG")
        .env("OUTBOX_RELAY__SUBSCRIPTIONS__SECRET_KEY", KEY)
        .env(
            "OUTBOX_RELAY__WEBHOOK__ALLOWED_NETWORKS",
            "[\"127.0.0.0/8\"]",
        )
        .output()
        .await
        .expect("run outbox-relay")
}

/// A subscription made with the CLI: its id and its secret.
pub async fn subscribe(db: &TestDb, args: &[&str]) -> (String, String) {
    let mut all = vec!["subscriptions", "add"];
    all.extend_from_slice(args);
    let out = relay_cli(db, &all).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "subscriptions add {args:?}: {}{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut lines = stdout.lines();
    let id = lines.next().expect("the id").to_string();
    let secret = lines.next().expect("the secret").to_string();
    assert!(id.starts_with("sub_"), "{id}");
    assert!(secret.starts_with("whsec_"), "{secret}");
    (id, secret)
}

/// Publish one event in a transaction that writes a business row first;
/// returns (id, duplicate).
pub async fn publish(
    db: &TestDb,
    key: &str,
    event_type: &str,
    data: Value,
    tenant: Option<&str>,
) -> Result<(i64, bool), sqlx::Error> {
    let mut tx = db.pool().begin().await?;
    sqlx::query("CREATE TEMP TABLE IF NOT EXISTS orders (id text)")
        .execute(&mut *tx)
        .await?;
    sqlx::query("INSERT INTO orders VALUES ($1)")
        .bind(key)
        .execute(&mut *tx)
        .await?;
    let row: (i64, bool) =
        sqlx::query_as("SELECT id, duplicate FROM outbox.publish($1, $2, $3, $4)")
            .bind(key)
            .bind(event_type)
            .bind(&data)
            .bind(tenant)
            .fetch_one(&mut *tx)
            .await?;
    tx.commit().await?;
    Ok(row)
}

/// Does the request verify with `secret`, by the Standard Webhooks
/// reference library?
pub fn verifies(request: &Received, secret: &str) -> bool {
    standardwebhooks::Webhook::new(secret)
        .expect("a whsec_ secret")
        .verify(&request.body, &request.headers)
        .is_ok()
}

/// Deliveries made of events, by state.
pub async fn deliveries_in(db: &TestDb, state: &str) -> i64 {
    db.count(&format!(
        "state = '{state}' AND id IN (SELECT intent_id FROM outbox.event_deliveries)"
    ))
    .await
}

/// Long enough for a loaded machine.
pub const LIMIT: Duration = Duration::from_secs(30);

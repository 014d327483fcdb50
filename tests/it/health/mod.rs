//! Destination health against real receivers, with several relay
//! processes: an outage that opens a breaker and drains by itself, a rate
//! limit held across three relays, a 429 storm absorbed, a manual pause,
//! and the operator alerts each raises once.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{self, cli, config, engine, Receiver, Reply, TestDb};
use outbox_providers::AmbiguityPolicy;
use outbox_relay::config::Dur;

mod alerts;
mod breakers;
mod limits;
mod pauses;
mod reads;

/// A subprocess relay configuration with destination health settings.
/// (The lease leaves 2.4 s past what an attempt needs: three debug-built
/// relays on a loaded two-core machine may take a second to start a
/// claimed attempt, and a claim without room for its attempt is handed
/// back.)
fn relay_config(extra: &str) -> std::path::PathBuf {
    common::config_file(&format!(
        r#"
[relay]
concurrency = 16
lease = "6s"
poll_interval = "50ms"
sweep_interval = "100ms"
shutdown_timeout = "5s"

[webhook]
timeout = "2s"
allowed_networks = ["127.0.0.0/8"]
{extra}
"#
    ))
}

/// The alerts the receiver got: (type, subject), in order.
fn alerts(rx: &Receiver) -> Vec<(String, String)> {
    rx.requests()
        .iter()
        .filter_map(|r| serde_json::from_slice::<Value>(&r.body).ok())
        .map(|b| {
            (
                b["type"].as_str().unwrap_or_default().to_string(),
                b["subject"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// How many attempts the retry schedule alone makes of one intent in
/// `span` (the last step repeating).
fn scheduled_attempts(steps: &[f64], span: f64) -> usize {
    let (mut t, mut n) = (0.0, 0);
    while t < span {
        n += 1;
        t += steps[(n - 1).min(steps.len() - 1)];
    }
    n
}

/// Run `engine` until `done` holds or `limit` passes; whether it held.
async fn run_for<F, Fut>(engine: outbox_relay::engine::Engine, limit: Duration, done: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let handle = tokio::spawn(engine.run(async {
        let _ = rx.await;
    }));
    let ok = common::wait_for(limit, done).await;
    let _ = tx.send(());
    handle.await.unwrap().unwrap();
    ok
}

/// `SELECT count(*) FROM <from_where>`.
async fn rows(db: &TestDb, from_where: &str) -> i64 {
    sqlx::query_scalar(&format!("SELECT count(*) FROM {from_where}"))
        .fetch_one(db.pool())
        .await
        .unwrap()
}

/// `n` webhook origins on loopback that refuse every connection, and the
/// sockets that hold their ports: bound but never listening, so a
/// connection is refused and no other test can take the port meanwhile.
fn refused_origins(n: usize) -> (Vec<String>, Vec<tokio::net::TcpSocket>) {
    (0..n)
        .map(|_| {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
            let port = socket.local_addr().unwrap().port();
            (format!("http://127.0.0.1:{port}"), socket)
        })
        .unzip()
}

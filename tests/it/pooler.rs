//! Behind a pooler that passes LISTEN but never delivers notifications
//! (PgBouncer in transaction mode), the relay notices at start, says so, and
//! delivers by polling. With notifications it says they work, and with
//! `relay.listen = false` it polls without checking.

use std::time::Duration;

use crate::common;
use crate::common::logged::LoggedRelay;
use crate::common::proxy::Proxy;
use crate::common::{wait_for, Receiver, TestDb};
use serde_json::json;

/// `outbox-relay run` polling every 300 ms, its log lines collected.
fn start_relay(url: &str, extra: &[(&str, &str)]) -> LoggedRelay {
    let mut cmd = common::relay_command(url);
    cmd.arg("run")
        .env("OUTBOX_RELAY__RELAY__POLL_INTERVAL", "300ms")
        .env("OUTBOX_RELAY__RELAY__LEASE", "5s")
        .env("OUTBOX_RELAY__WEBHOOK__TIMEOUT", "2s")
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null());
    for (k, v) in extra {
        cmd.env(k, v);
    }
    LoggedRelay::spawn(&mut cmd)
}

async fn delivers(db: &TestDb, rx: &Receiver, key: &str) {
    db.enqueue(
        key,
        "webhook",
        json!({"url": rx.url("/"), "body": {"k": key}}),
    )
    .await;
    assert!(
        wait_for(Duration::from_secs(15), || async {
            db.state(key).await == "delivered"
        })
        .await,
        "{key} was not delivered: {}",
        db.state(key).await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_notifications_the_relay_says_so_and_polls() {
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    let proxy = Proxy::without_notifications().await;
    let relay = start_relay(&proxy.url_for(&db), &[]);

    assert!(
        relay.wait_for_log("did not arrive").await,
        "the relay did not say that notifications do not reach it:\n{}",
        relay.logs()
    );
    let logs = relay.logs();
    assert!(logs.contains("PgBouncer"), "{logs}");
    assert!(!logs.contains("LISTEN/NOTIFY works"), "{logs}");

    // enqueued directly (the NOTIFY goes nowhere the relay can hear): the
    // poll picks it up
    for i in 0..3 {
        delivers(&db, &rx, &format!("polled-{i}")).await;
    }
    assert!(relay.stop().await.0.success());
    assert_eq!(rx.requests().len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_notifications_the_relay_says_they_work() {
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    // a poll interval far longer than the wait below: only a NOTIFY can
    // deliver this fast
    let relay = start_relay(&db.url, &[("OUTBOX_RELAY__RELAY__POLL_INTERVAL", "60s")]);
    assert!(
        relay.wait_for_log("LISTEN/NOTIFY works").await,
        "{}",
        relay.logs()
    );
    delivers(&db, &rx, "notified").await;
    assert!(!relay.logs().contains("did not arrive"));
    assert!(relay.stop().await.0.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_false_polls_without_checking() {
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    let relay = start_relay(&db.url, &[("OUTBOX_RELAY__RELAY__LISTEN", "false")]);
    assert!(
        relay
            .wait_for_log("relay.listen is false: delivering by polling")
            .await,
        "{}",
        relay.logs()
    );
    delivers(&db, &rx, "polled").await;
    let logs = relay.logs();
    assert!(!logs.contains("LISTEN/NOTIFY works"), "{logs}");
    assert!(!logs.contains("did not arrive"), "{logs}");
    assert!(relay.stop().await.0.success());
}

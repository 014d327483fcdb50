//! Behind a pooler that passes LISTEN but never delivers notifications
//! (PgBouncer in transaction mode), the relay notices at start, says so, and
//! delivers by polling. With notifications it says they work, and with
//! `relay.listen = false` it polls without checking.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common;
use crate::common::proxy::Proxy;
use crate::common::{terminate, wait_for, Receiver, TestDb};
use serde_json::json;
use tokio::io::AsyncBufReadExt;

/// A relay subprocess whose log lines are collected.
struct LoggedRelay {
    child: tokio::process::Child,
    logs: Arc<Mutex<String>>,
}

impl LoggedRelay {
    fn start(url: &str, extra: &[(&str, &str)]) -> LoggedRelay {
        let mut cmd = common::relay_command(url);
        cmd.arg("run")
            .env("OUTBOX_RELAY__RELAY__POLL_INTERVAL", "300ms")
            .env("OUTBOX_RELAY__RELAY__LEASE", "5s")
            .env("OUTBOX_RELAY__WEBHOOK__TIMEOUT", "2s")
            .env("RUST_LOG", "info")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        for (k, v) in extra {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn relay");
        let logs = Arc::new(Mutex::new(String::new()));
        let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
        let sink = logs.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        LoggedRelay { child, logs }
    }

    fn logs(&self) -> String {
        self.logs.lock().unwrap().clone()
    }

    async fn wait_for_log(&self, needle: &str) -> bool {
        wait_for(Duration::from_secs(15), || async {
            self.logs().contains(needle)
        })
        .await
    }
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
    let mut relay = LoggedRelay::start(&proxy.url_for(&db), &[]);

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
    assert!(terminate(&mut relay.child).await.success());
    assert_eq!(rx.requests().len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_notifications_the_relay_says_they_work() {
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    // a poll interval far longer than the wait below: only a NOTIFY can
    // deliver this fast
    let mut relay = LoggedRelay::start(&db.url, &[("OUTBOX_RELAY__RELAY__POLL_INTERVAL", "60s")]);
    assert!(
        relay.wait_for_log("LISTEN/NOTIFY works").await,
        "{}",
        relay.logs()
    );
    delivers(&db, &rx, "notified").await;
    assert!(!relay.logs().contains("did not arrive"));
    assert!(terminate(&mut relay.child).await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_false_polls_without_checking() {
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    let mut relay = LoggedRelay::start(&db.url, &[("OUTBOX_RELAY__RELAY__LISTEN", "false")]);
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
    assert!(terminate(&mut relay.child).await.success());
}

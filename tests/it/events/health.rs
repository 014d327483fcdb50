//! Each subscription is a destination: paused, limited and broken on its
//! own; one that keeps failing is disabled, with an alert and an event.

use serde_json::{json, Value};

use super::*;
use crate::common::{
    config_file, engine, run_until, spawn_relay, terminate, wait_for, Receiver, Reply,
};

#[tokio::test]
async fn a_paused_subscription_waits_while_the_others_deliver() {
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    let (held, _) = subscribe(&db, &["--url", &rx.url("/held")]).await;
    subscribe(&db, &["--url", &rx.url("/free")]).await;
    let out = relay_cli(
        &db,
        &[
            "destinations",
            "pause",
            &held,
            "--reason",
            "receiver upgrade",
        ],
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    publish(&db, "p-1", "a.b", json!(1), None).await.unwrap();
    let cfg = events_config();
    run_until(engine(db.store.clone(), &cfg), LIMIT, || async {
        deliveries_in(&db, "delivered").await == 1
    })
    .await;
    let paths: Vec<String> = rx.requests().iter().map(|r| r.path.clone()).collect();
    assert_eq!(paths, ["/free"]);
    assert_eq!(
        deliveries_in(&db, "pending").await,
        1,
        "the paused one waits, pending"
    );
    let out = relay_cli(&db, &["destinations", "resume", &held]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    run_until(engine(db.store.clone(), &cfg), LIMIT, || async {
        deliveries_in(&db, "delivered").await == 2
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_failing_past_disable_after_is_disabled_with_an_alert_and_an_event() {
    let db = TestDb::new().await;
    let failing = Receiver::start(|_, _| Reply::status(500)).await;
    let ops = Receiver::ok().await;
    let alerts = Receiver::ok().await;
    let (broken, _) = subscribe(&db, &["--url", &failing.url("/hook"), "--tenant", "acme"]).await;
    let (watcher, watcher_secret) = subscribe(
        &db,
        &[
            "--url",
            &ops.url("/ops"),
            "--event-types",
            "outbox.subscription.*",
        ],
    )
    .await;
    publish(
        &db,
        "order-1",
        "order.paid",
        json!({"order": 1}),
        Some("acme"),
    )
    .await
    .unwrap();
    let file = config_file(&format!(
        "[relay]\nlease = \"10s\"\npoll_interval = \"50ms\"\nsweep_interval = \"100ms\"\n\
         [retry]\nschedule = [\"100ms\"]\nmax_attempts = 1000\njitter = 0.0\n\
         [webhook]\nallowed_networks = [\"127.0.0.0/8\"]\ntimeout = \"2s\"\n\
         [breaker]\nfailures = 1\ncooldown = \"200ms\"\nmax_cooldown = \"400ms\"\n\
         [alerts]\nurl = \"{}\"\n\
         [subscriptions]\nsecret_key = \"{KEY}\"\ndisable_after = \"2s\"\n",
        alerts.url("/alerts")
    ));
    let mut relay = spawn_relay(&db, &file, "upkeep");
    let disabled = wait_for(LIMIT, || async { !ops.requests().is_empty() }).await;
    terminate(&mut relay).await;
    assert!(disabled, "the disabled event reached its subscriber");

    // the subscription is disabled, with the reason
    let out = relay_cli(&db, &["subscriptions", "show", &broken, "--json"]).await;
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(shown["disabled_at"].is_string(), "{shown}");
    let reason = shown["disabled_reason"].as_str().unwrap();
    assert!(reason.contains("subscriptions.disable_after"), "{reason}");
    // the event: signed for its subscriber, naming the subscription
    let event = &ops.requests()[0];
    assert!(
        verifies(event, &watcher_secret),
        "{watcher}'s secret verifies it"
    );
    let body: Value = serde_json::from_slice(&event.body).unwrap();
    assert_eq!(body["type"], "outbox.subscription.disabled");
    assert_eq!(body["data"]["subscription"], broken.as_str());
    assert_eq!(body["data"]["tenant"], "acme");
    // and the alert
    assert!(
        alerts
            .requests()
            .iter()
            .any(|r| r.body_str("type") == "subscription.disabled"),
        "alerts: {:?}",
        alerts
            .requests()
            .iter()
            .map(|r| r.body_str("type"))
            .collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn a_subscriptions_rate_spaces_its_deliveries() {
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    subscribe(&db, &["--url", &rx.url("/slow"), "--rate", "5/s"]).await;
    for n in 0..10 {
        publish(&db, &format!("r-{n}"), "a.b", json!(n), None)
            .await
            .unwrap();
    }
    let cfg = events_config();
    run_until(engine(db.store.clone(), &cfg), LIMIT, || async {
        deliveries_in(&db, "delivered").await == 10
    })
    .await;
    let at: Vec<_> = rx.requests().iter().map(|r| r.at).collect();
    let span = *at.iter().max().unwrap() - *at.iter().min().unwrap();
    // 5 a second, one at once: the tenth at least 1.8 s after the first
    // (less a little for the clocks)
    assert!(
        span >= std::time::Duration::from_millis(1500),
        "10 deliveries at 5/s took {span:?}"
    );
}

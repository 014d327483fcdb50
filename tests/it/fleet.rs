//! The fleet: kinds a relay does not know wait for one that does, and
//! `relays` and `stats` say who serves what.

use std::time::Duration;

use crate::common::{self, config, run_once_within, TestDb};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kind_this_relay_does_not_know_waits_while_a_live_relay_knows_it() {
    let db = TestDb::new().await;
    // a newer relay of the fleet knows "sms" (and is not configured for it)
    db.store
        .register_relay(
            "newer:1",
            "9.9.9",
            &["webhook"],
            &["webhook", "email", "charge", "sms"],
        )
        .await
        .unwrap();
    db.enqueue("text-1", "sms", json!({"to": "+15550100"}))
        .await;
    run_once_within(&db, &config(), Duration::from_secs(20)).await;
    assert_eq!(
        db.state("text-1").await,
        "pending",
        "left for the relay that knows it"
    );
    let waiting = db.store.unserved_kinds().await.unwrap();
    assert_eq!(waiting.len(), 1);
    assert_eq!((waiting[0].kind.as_str(), waiting[0].pending), ("sms", 1));
    assert_eq!(waiting[0].known_by, ["newer:1"]);
    // once no live relay knows it, it is rejected as unknown
    db.store.deregister_relay("newer:1").await.unwrap();
    run_once_within(&db, &config(), Duration::from_secs(20)).await;
    let i = db.store.find("text-1").await.unwrap();
    assert_eq!(i.state, "rejected");
    assert!(i.last_error.unwrap().contains("no live relay knows it"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_lists_the_fleet_and_stats_says_why_a_kind_waits() {
    let db = TestDb::new().await;
    db.store
        .register_relay(
            "a:1",
            "0.1.0",
            &["webhook", "email"],
            &["webhook", "email", "charge"],
        )
        .await
        .unwrap();
    db.store
        .register_relay(
            "b:2",
            "0.0.9",
            &["webhook"],
            &["webhook", "email", "charge"],
        )
        .await
        .unwrap();
    db.store.deregister_relay("b:2").await.unwrap();
    db.enqueue(
        "c1",
        "charge",
        json!({"amount": 1, "currency": "usd", "payment_method": "pm"}),
    )
    .await;
    let out = common::cli(&db, &["relays", "--json"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let fleet: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(fleet[0]["owner"], "a:1");
    assert_eq!(fleet[0]["live"], true);
    assert_eq!(fleet[0]["kinds"], json!(["webhook", "email"]));
    assert_eq!(fleet[1]["owner"], "b:2");
    assert_eq!(fleet[1]["live"], false);
    let table = common::cli(&db, &["relays"]).await;
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.contains("OWNER") && text.contains("a:1") && text.contains("live"),
        "{text}"
    );
    assert!(text.contains("stopped"), "{text}");
    let stats = common::cli(&db, &["stats"]).await;
    let text = String::from_utf8_lossy(&stats.stdout);
    assert!(
        text.contains("waiting: 1 pending charge intent(s): known to a:1 but no live relay is configured for it"),
        "{text}"
    );
}

//! "Did it happen?" for an event, and retention: an event and its
//! deliveries are purged like any intent, and the ledger still answers for
//! the event's key.

use serde_json::{json, Value};

use super::*;
use crate::common::{engine, run_until, Receiver};

#[tokio::test]
async fn show_names_the_subscriptions_an_event_reached_and_purging_keeps_its_key() {
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    let (a, _) = subscribe(&db, &["--url", &rx.url("/a")]).await;
    let (b, _) = subscribe(&db, &["--url", &rx.url("/b")]).await;
    publish(&db, "order-7-paid", "order.paid", json!({"order": 7}), None)
        .await
        .unwrap();
    let cfg = events_config();
    run_until(engine(db.store.clone(), &cfg), LIMIT, || async {
        deliveries_in(&db, "delivered").await == 2
    })
    .await;

    let out = relay_cli(&db, &["show", "order-7-paid", "--json"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    let deliveries = shown["deliveries"]
        .as_array()
        .expect("an event's deliveries");
    let mut subs: Vec<&str> = deliveries
        .iter()
        .map(|d| d["subscription_id"].as_str().unwrap())
        .collect();
    subs.sort();
    let mut want = vec![a.as_str(), b.as_str()];
    want.sort();
    assert_eq!(subs, want);
    for d in deliveries {
        assert_eq!(d["state"], "delivered", "{d}");
        assert!(d["delivered_at"].is_string(), "{d}");
    }
    let out = relay_cli(&db, &["show", "order-7-paid"]).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("SUBSCRIPTION") && text.contains(&a), "{text}");

    // retention purges the event and its deliveries into the ledger
    let out = relay_cli(&db, &["purge", "--older-than", "0s"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(db.count("true").await, 0);
    let linked: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox.event_deliveries")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(linked, 0);
    // and the key still answers: the same event is a duplicate, another a conflict
    let (_, duplicate) = publish(&db, "order-7-paid", "order.paid", json!({"order": 7}), None)
        .await
        .unwrap();
    assert!(duplicate);
    let err = publish(&db, "order-7-paid", "order.paid", json!({"order": 8}), None)
        .await
        .unwrap_err();
    assert_eq!(
        err.as_database_error().and_then(|e| e.code()).as_deref(),
        Some("OB409")
    );
    let out = relay_cli(&db, &["show", "order-7-paid", "--json"]).await;
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["source"], "ledger", "{shown}");
    assert_eq!(rx.requests().len(), 2, "nothing went twice");
}

//! `replay`: the events a subscription received go again under the same
//! `webhook-id`; those it never received get their first delivery; only
//! what the dry run counted.

use serde_json::{json, Value};

use super::*;
use crate::common::{engine, run_until, Receiver};

fn replay_json(out: &std::process::Output) -> Value {
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

#[tokio::test]
async fn a_replay_sends_again_what_was_received_and_first_what_was_not() {
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    let cfg = events_config();
    // published before the subscription existed: never expanded to it
    publish(&db, "e1", "order.paid", json!(1), None)
        .await
        .unwrap();
    publish(&db, "e2", "invoice.paid", json!(2), None)
        .await
        .unwrap();
    run_until(engine(db.store.clone(), &cfg), LIMIT, || async {
        db.count("kind = 'event' AND state = 'delivered'").await == 2
    })
    .await;
    let (sub, secret) = subscribe(&db, &["--url", &rx.url("/hook")]).await;
    // received
    publish(&db, "e3", "order.paid", json!(3), None)
        .await
        .unwrap();
    run_until(engine(db.store.clone(), &cfg), LIMIT, || async {
        rx.requests().len() == 1 && deliveries_in(&db, "delivered").await == 1
    })
    .await;
    // published while it was disabled: not expanded to it
    let out = relay_cli(&db, &["subscriptions", "disable", &sub]).await;
    assert!(out.status.success());
    publish(&db, "e4", "order.paid", json!(4), None)
        .await
        .unwrap();
    run_until(engine(db.store.clone(), &cfg), LIMIT, || async {
        db.count("kind = 'event' AND state = 'delivered'").await == 4
    })
    .await;
    assert_eq!(rx.requests().len(), 1);

    // a disabled subscription is not replayed to
    let args = |extra: &[&'static str]| {
        let mut a = vec!["replay", "--subscription", &sub, "--since", "1h", "--json"];
        a.extend_from_slice(extra);
        a.into_iter().map(String::from).collect::<Vec<_>>()
    };
    let run = |a: Vec<String>| {
        let db = &db;
        async move {
            let refs: Vec<&str> = a.iter().map(String::as_str).collect();
            relay_cli(db, &refs).await
        }
    };
    let out = run(args(&["--dry-run"])).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is disabled"));
    assert!(relay_cli(&db, &["subscriptions", "enable", &sub])
        .await
        .status
        .success());

    let dry = replay_json(&run(args(&["--dry-run"])).await)["plan"].clone();
    assert_eq!(dry["events"], 4);
    assert_eq!(dry["first_deliveries"], 3);
    assert_eq!(dry["sent_again"], 1);
    assert_eq!(dry["on_their_way"], 0);
    let only_orders =
        replay_json(&run(args(&["--dry-run", "--event-type", "order.*"])).await)["plan"].clone();
    assert_eq!(only_orders["events"], 3);
    let until = dry["until"].as_str().unwrap().to_string();

    // an event after the dry run's window is not the replay's
    publish(&db, "e5", "order.paid", json!(5), None)
        .await
        .unwrap();
    let mut with_until = args(&[]);
    with_until.extend(["--until".to_string(), until]);
    let done = replay_json(&run(with_until).await);
    assert_eq!(done["plan"]["events"], 4, "{done}");
    assert_eq!(done["first_deliveries"], 3);
    assert_eq!(done["sent_again"], 1);

    run_until(engine(db.store.clone(), &cfg), LIMIT, || async {
        rx.requests().len() == 6 && deliveries_in(&db, "delivered").await == 5
    })
    .await;
    let mut data: Vec<i64> = rx
        .requests()
        .iter()
        .map(|r| {
            assert!(verifies(r, &secret));
            serde_json::from_slice::<Value>(&r.body).unwrap()["data"]
                .as_i64()
                .unwrap()
        })
        .collect();
    data.sort();
    assert_eq!(data, [1, 2, 3, 3, 4, 5], "e3 twice, every other once");
    let ids = rx.counts_by_id();
    assert_eq!(ids.len(), 5, "e3 went again under its webhook-id");
    assert_eq!(ids.values().filter(|n| **n == 2).count(), 1);
}

#[tokio::test]
async fn replay_refuses_bad_input_by_flag() {
    let db = TestDb::new().await;
    let (sub, _) = subscribe(&db, &["--url", "http://127.0.0.1:9/hook"]).await;
    for (args, code, says) in [
        (
            vec!["--subscription", "sub_nothere1", "--since", "1h"],
            3,
            "no subscription",
        ),
        (
            vec!["--subscription", &sub, "--since", "yesterday"],
            2,
            "--since",
        ),
        (
            vec!["--subscription", &sub, "--since", "1h", "--until", "2h"],
            2,
            "--since must be before --until",
        ),
        (
            vec![
                "--subscription",
                &sub,
                "--since",
                "1h",
                "--event-type",
                "a b",
            ],
            2,
            "--event-type",
        ),
    ] {
        let mut all = vec!["replay", "--dry-run"];
        all.extend(args.iter().copied());
        let out = relay_cli(&db, &all).await;
        let text = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(out.status.code(), Some(code), "{args:?}: {text}");
        assert!(text.contains(says), "{args:?}: {text}");
    }
}

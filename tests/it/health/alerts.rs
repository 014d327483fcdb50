//! The operator alerts: raised once per crossing by any number of relays,
//! and a handful for an incident across many origins.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dead_count_alert_is_raised_once_per_crossing_by_any_number_of_relays() {
    let db = TestDb::new().await;
    let rx = Receiver::start(|_, _| Reply::status(503)).await;
    let alert_rx = Receiver::ok().await;
    for n in 0..3 {
        db.enqueue(
            &format!("doomed:{n}"),
            "webhook",
            json!({"url": rx.url("/hook"), "body": {"n": n}}),
        )
        .await;
    }
    let mut cfg = config();
    cfg.retry.max_attempts = 1;
    cfg.alerts.url = Some(alert_rx.url("/alerts"));
    cfg.alerts.dead_threshold = Some(3);
    engine(db.store.clone(), &cfg).run_once().await.unwrap();
    assert_eq!(db.count("state = 'dead'").await, 3);
    let settings = cfg.health().unwrap();
    // three relays' health loops at the same moment, twice
    for _ in 0..2 {
        let checks = (0..3).map(|_| {
            let store = db.store.clone();
            let settings = settings.clone();
            tokio::spawn(async move {
                outbox_relay::services::health::check_dead_alert(&store, &settings).await
            })
        });
        for c in checks.collect::<Vec<_>>() {
            c.await.unwrap();
        }
    }
    engine(db.store.clone(), &cfg).run_once().await.unwrap();
    let got = alerts(&alert_rx);
    assert_eq!(got, [("dead.threshold".to_string(), "dead".to_string())]);
    let body: Value = serde_json::from_slice(&alert_rx.requests()[0].body).unwrap();
    assert_eq!(body["detail"]["dead"], 3);
    // below the threshold the latch drops; the next crossing alerts again
    sqlx::query("UPDATE outbox.intents SET state = 'cancelled' WHERE key = 'doomed:0'")
        .execute(db.pool())
        .await
        .unwrap();
    outbox_relay::services::health::check_dead_alert(&db.store, &settings).await;
    sqlx::query("UPDATE outbox.intents SET state = 'dead' WHERE key = 'doomed:0'")
        .execute(db.pool())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    outbox_relay::services::health::check_dead_alert(&db.store, &settings).await;
    engine(db.store.clone(), &cfg).run_once().await.unwrap();
    assert_eq!(alerts(&alert_rx).len(), 2, "{:?}", alerts(&alert_rx));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incident_across_many_origins_is_a_handful_of_alerts() {
    let db = TestDb::new().await;
    let alert_rx = Receiver::ok().await;
    let (origins, _held) = refused_origins(50);
    for (n, o) in origins.iter().enumerate() {
        db.enqueue(
            &format!("refused:{n}"),
            "webhook",
            json!({"url": format!("{o}/hook"), "body": n}),
        )
        .await;
    }
    let mut cfg = config();
    cfg.retry.max_attempts = 1;
    cfg.breaker.failures = 1;
    cfg.alerts.url = Some(alert_rx.url("/alerts"));
    let settings = cfg.health().unwrap();
    engine(db.store.clone(), &cfg).run_once().await.unwrap();
    let opened: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox.destination_events WHERE event = 'opened'")
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(
        opened,
        origins.len() as i64,
        "every origin's breaker opened"
    );
    engine(db.store.clone(), &cfg).run_once().await.unwrap();
    let got = alerts(&alert_rx);
    assert_eq!(
        got.iter().filter(|a| a.0 == "breaker.opened").count(),
        3,
        "the first three are raised one by one: {got:?}"
    );
    // the window is over (five minutes later): one summary, whichever of
    // three relays' health loops raises it
    sqlx::query("UPDATE outbox.alert_windows SET started_at = started_at - interval '5 minutes'")
        .execute(db.pool())
        .await
        .unwrap();
    for _ in 0..3 {
        outbox_relay::services::health::raise_alert_summaries(&db.store, &settings).await;
    }
    engine(db.store.clone(), &cfg).run_once().await.unwrap();
    let summaries: Vec<Value> = alert_rx
        .requests()
        .iter()
        .filter_map(|r| serde_json::from_slice::<Value>(&r.body).ok())
        .filter(|b| b["type"] == "alerts.suppressed")
        .collect();
    assert_eq!(summaries.len(), 1, "{summaries:?}");
    let detail = &summaries[0]["detail"];
    assert_eq!(summaries[0]["subject"], "breaker.opened");
    assert_eq!(detail["suppressed"], origins.len() - 3, "{detail}");
    assert_eq!(detail["raised"], 3);
    assert_eq!(detail["subjects"].as_array().unwrap().len(), 20, "{detail}");
    assert_eq!(
        alert_rx.requests().len(),
        4,
        "an incident of {} origins is 4 messages",
        origins.len()
    );
}

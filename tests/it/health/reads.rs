//! What `stats`, readyz and the backlog read say of destinations.

use super::*;

/// Deliveries held back for the standbys are plain to see: `stats` counts
/// the intents held back (a held-up relay claims nothing, so they are due
/// and unclaimed) and `/readyz`, still 200, says which relay holds them
/// and for how long.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_hold_is_counted_by_stats_and_told_by_readyz() {
    let db = TestDb::new().await;
    sqlx::query(
        "INSERT INTO outbox.relays (owner, version, kinds, known_kinds, standbys_needed,
                                    standbys_streaming, standby_waits, standbys_behind_since)
         VALUES ('held-relay', 'test', '{webhook}', '{webhook}', 1, 0, 0,
                 now() - interval '75 seconds')",
    )
    .execute(db.pool())
    .await
    .unwrap();
    for n in 0..5 {
        db.enqueue(
            &format!("held:{n}"),
            "webhook",
            json!({"url": "http://127.0.0.1:9/", "body": n}),
        )
        .await;
    }
    let out = cli(&db, &["stats"]).await;
    let stats = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{stats}");
    assert!(
        stats.contains(
            "held back: 5 intent(s) wait for the standbys (relay.wait_for_standbys): \
             5 due and not claimed, 0 claimed; held up for 7"
        ),
        "{stats}"
    );

    let health = std::sync::Arc::new(outbox_relay::observe::readiness::Health::default());
    health
        .registered
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let access = outbox_relay::services::lookup::Access {
        enabled: false,
        token: None,
    };
    let (addr, server) = outbox_relay::services::endpoint::serve(
        "127.0.0.1:0".parse().unwrap(),
        db.store.clone(),
        health,
        access,
    )
    .await
    .unwrap();
    let server = tokio::spawn(server);
    let ready = reqwest::get(format!("http://{addr}/readyz")).await.unwrap();
    assert_eq!(ready.status(), 200);
    let body = ready.text().await.unwrap();
    assert!(body.starts_with("ready\n"), "{body}");
    assert!(
        body.contains("held up: relay held-relay has held deliveries back for 7")
            && body.contains("must reach 1 standby(s), 0 streaming (relay.wait_for_standbys)"),
        "{body}"
    );
    // once the standbys catch up, readyz says only that it is ready
    sqlx::query("UPDATE outbox.relays SET standbys_behind_since = NULL")
        .execute(db.pool())
        .await
        .unwrap();
    let body = reqwest::get(format!("http://{addr}/readyz"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(body, "ready\n");
    server.abort();
}

/// The backlog read counts each pending or claimed row where
/// `outbox.destination_of` puts it, whatever names its destination: the
/// kind, the `destination` column, a delivery's subscription, or a
/// webhook's URL however spelled (or not a string, as a row written past
/// `outbox.enqueue` may hold).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backlog_read_counts_each_row_where_destination_of_puts_it() {
    let db = TestDb::new().await;
    let rows = [
        (
            "webhook",
            None,
            json!({"url": "https://a.example/x", "body": 1}),
        ),
        (
            "webhook",
            None,
            json!({"url": "https://a.example:443/y?z=1", "body": 2}),
        ),
        (
            "webhook",
            None,
            json!({"url": "HTTPS://A.example./y", "body": 3}),
        ),
        (
            "webhook",
            Some("partner"),
            json!({"url": "https://b.example/x", "body": 4}),
        ),
        ("webhook", None, json!({"url": 42, "body": 5})),
        (
            "webhook",
            None,
            json!({"url": {"host": "c.example"}, "body": 6}),
        ),
        ("webhook", None, json!({"body": 7})),
        // an event's delivery: its subscription is its destination
        (
            "webhook",
            None,
            json!({"subscription": "sub_0123456789", "body": {"type": "a.b"}}),
        ),
        ("email", Some("ignored"), json!({"to": "a@example.com"})),
        ("nats", None, json!({"subject": "s"})),
        ("kafka", Some("ignored"), json!({"topic": "t"})),
    ];
    for (n, (kind, destination, payload)) in rows.iter().enumerate() {
        sqlx::query(
            "INSERT INTO outbox.intents (key, kind, destination, payload) VALUES ($1, $2, $3, $4)",
        )
        .bind(format!("row:{n}"))
        .bind(kind)
        .bind(destination)
        .bind(payload)
        .execute(db.pool())
        .await
        .unwrap();
    }
    // one claimed (counted), one delivered (not)
    sqlx::query(
        "UPDATE outbox.intents SET state = 'claimed', owner = 'r', lease_expires_at = now() + interval '1 minute'
          WHERE key = 'row:0'",
    )
    .execute(db.pool())
    .await
    .unwrap();
    sqlx::query(
        "UPDATE outbox.intents SET state = 'delivered', delivered_at = now() WHERE key = 'row:1'",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let mut per_row: Vec<(Option<String>, i64)> = sqlx::query_as(
        "SELECT outbox.destination_of(kind, destination, payload), count(*)
           FROM outbox.intents WHERE state IN ('pending', 'claimed') GROUP BY 1",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    let mut grouped = db.store.destination_backlogs().await.unwrap();
    per_row.sort();
    grouped.sort();
    assert_eq!(grouped, per_row);
    assert_eq!(grouped.iter().map(|r| r.1).sum::<i64>(), 10);
    assert!(
        grouped.contains(&(Some("https://a.example".into()), 2)),
        "{grouped:?}"
    );
    assert!(
        grouped.contains(&(Some("sub_0123456789".into()), 1)),
        "{grouped:?}"
    );
}

//! `relay.wait_for_standbys` without a standby to wait for: deliveries
//! wait (nothing fails, no attempt is spent), `stats`, the CLI and the
//! console say which relay waits, and lowering the setting lets them go.
//! The failover drill (failover.rs) covers standbys that stream, fall
//! behind, catch up and get promoted.

use std::time::Duration;

use serde_json::json;

use crate::common::console::{ConsoleServer, Session};
use crate::common::{self, Receiver, TestDb};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_standby_deliveries_wait_visibly_and_go_once_the_setting_is_lowered() {
    let db = TestDb::new().await;
    let streaming: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_stat_replication")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(
        streaming, 0,
        "this test needs a test server without standbys"
    );
    let rx = Receiver::ok().await;
    for i in 0..5 {
        db.enqueue(
            &format!("sb-{i}"),
            "webhook",
            json!({"url": rx.url("/h"), "body": {"i": i}}),
        )
        .await;
    }

    let mut config = common::config();
    config.relay.wait_for_standbys = 1;
    let engine = common::engine(db.store.clone(), &config);
    let owner = engine.owner().to_string();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(engine.run(async {
        let _ = stopped.await;
    }));
    // held up after a second: stats names the relay and what it waits for
    let seen = common::wait_for(Duration::from_secs(10), || async {
        !db.store.stats().await.unwrap().standby_waits.is_empty()
    })
    .await;
    assert!(seen, "stats never showed the relay waiting for standbys");
    let waits = db.store.stats().await.unwrap().standby_waits;
    assert_eq!(waits[0].owner, owner);
    assert_eq!((waits[0].needed, waits[0].streaming), (1, Some(0)));
    let line = waits[0].describe();
    assert!(line.contains("reach 1 standby(s)"), "{line}");

    let out = common::cli(&db, &["stats"]).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("waiting: ")
            && text.contains(&format!(
                "deliveries on relay {owner} wait for their commits"
            )),
        "stats does not say deliveries wait:\n{text}"
    );
    let console = ConsoleServer::start(&db, &[]).await;
    let page = Session::new(&console).get("/").await;
    assert_eq!(page.status, 200);
    assert!(
        page.body.contains("standby-wait")
            && page
                .body
                .contains(&format!("on relay {owner} wait for their commits")),
        "the console's overview does not say deliveries wait:\n{}",
        page.body
    );
    assert!(
        rx.requests().is_empty(),
        "a webhook went out before its commit reached a standby"
    );
    let _ = stop.send(());
    running.await.unwrap().unwrap();

    // nothing failed for the wait, and no attempt was spent on it
    let (not_pending, attempts): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE state <> 'pending'), coalesce(sum(attempts), 0)::bigint
           FROM outbox.intents",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(
        (not_pending, attempts),
        (0, 0),
        "waiting spent attempts or changed states"
    );

    // the setting lowered: everything goes, once each
    let mut config = common::config();
    config.relay.wait_for_standbys = 0;
    let engine = common::engine(db.store.clone(), &config);
    common::run_until(engine, Duration::from_secs(15), || async {
        db.count("state = 'delivered'").await == 5
    })
    .await;
    assert_eq!(rx.requests().len(), 5);
}

//! `relay.wait_for_standbys` without a standby to wait for: deliveries
//! wait (nothing fails, no attempt is spent), `stats`, the CLI and the
//! console say which relay waits, and lowering the setting lets them go.
//! A WAL archiver (`pg_receivewal --synchronous`) is no standby: only the
//! walsenders a failover may promote count (`relay.standby_names`).
//! The failover drill (failover.rs) covers standbys that stream, fall
//! behind, catch up and get promoted.

use std::time::Duration;

use outbox_relay::store::Store;
use serde_json::json;

use crate::common::cluster::Cluster;
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

/// Walsenders of `url`'s server in state streaming, by application_name.
async fn streaming_walsenders(store: &Store) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT application_name FROM pg_stat_replication
          WHERE state = 'streaming' ORDER BY application_name",
    )
    .fetch_all(store.pool())
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wal_archiver_is_not_a_standby_and_standby_names_picks_the_standbys() {
    let primary = Cluster::start("standbys-archiver");
    let store = Store::connect(&primary.url, 4).await.unwrap();
    store.migrate().await.unwrap();
    let rx = Receiver::ok().await;
    let enqueue = |key: String| {
        let store = store.clone();
        let url = rx.url("/h");
        async move {
            sqlx::query("SELECT outbox.enqueue($1, 'webhook', $2)")
                .bind(&key)
                .bind(json!({"url": url, "body": {"k": key}}))
                .execute(store.pool())
                .await
                .unwrap();
        }
    };
    for i in 0..3 {
        enqueue(format!("archived-{i}")).await;
    }

    // pg_receivewal --synchronous streams and flushes at once, but a
    // failover cannot promote it
    let archiver = tokio::task::block_in_place(|| primary.archive_wal(None));
    let streaming = common::wait_for(Duration::from_secs(15), || async {
        streaming_walsenders(&store).await == ["pg_receivewal"]
    })
    .await;
    assert!(streaming, "pg_receivewal never streamed from the primary");
    let positions = store.standby_positions(None).await.unwrap();
    assert_eq!(
        (positions.streaming, positions.ignored.clone()),
        (0, vec!["pg_receivewal".to_string()]),
        "an archiver counted as a standby: {positions:?}"
    );

    let mut config = common::config();
    config.relay.wait_for_standbys = 1;
    let engine = common::engine(store.clone(), &config);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(engine.run(async {
        let _ = stopped.await;
    }));
    let held = common::wait_for(Duration::from_secs(10), || async {
        !store.stats().await.unwrap().standby_waits.is_empty()
    })
    .await;
    assert!(held, "stats never showed the relay waiting for a standby");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        rx.requests().is_empty(),
        "webhooks went out with only a WAL archiver streaming: {} requests",
        rx.requests().len()
    );
    let waits = store.stats().await.unwrap().standby_waits;
    assert_eq!(waits[0].streaming, Some(0), "{waits:?}");

    // a real standby: the held intents go
    let standby = tokio::task::block_in_place(|| primary.replica("standbys-archiver-standby"));
    let delivered = common::wait_for(Duration::from_secs(30), || async {
        rx.requests().len() == 3
    })
    .await;
    assert!(
        delivered,
        "a streaming standby did not release the held intents"
    );
    let _ = stop.send(());
    running.await.unwrap().unwrap();

    // relay.standby_names: only the walsenders it names count, by the
    // application_name they connect with, case-insensitively
    let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let standby_name = common::wait_for(Duration::from_secs(15), || async {
        streaming_walsenders(&store).await.len() == 2
    })
    .await;
    assert!(
        standby_name,
        "the standby never streamed beside the archiver"
    );
    let walsenders = streaming_walsenders(&store).await;
    let standby_is = walsenders
        .iter()
        .find(|n| *n != "pg_receivewal")
        .unwrap()
        .clone();
    let p = store.standby_positions(None).await.unwrap();
    assert_eq!((p.streaming, p.flushed.len()), (1, 1), "{p:?}");
    let p = store
        .standby_positions(Some(&names(&[&standby_is.to_uppercase()])))
        .await
        .unwrap();
    assert_eq!((p.streaming, p.ignored), (1, names(&["pg_receivewal"])));
    let p = store
        .standby_positions(Some(&names(&["standby-elsewhere"])))
        .await
        .unwrap();
    assert_eq!(
        (p.streaming, p.flushed.len(), p.ignored.len()),
        (0, 0, 2),
        "a walsender outside relay.standby_names counted"
    );
    // named, an archiver counts (the operator says a failover promotes it)
    let p = store
        .standby_positions(Some(&names(&["pg_receivewal"])))
        .await
        .unwrap();
    assert_eq!(p.streaming, 1);

    // under relay.standby_names naming no streaming server, deliveries wait
    enqueue("named-0".into()).await;
    let mut config = common::config();
    config.relay.wait_for_standbys = 1;
    config.relay.standby_names = Some(names(&["standby-elsewhere"]));
    let engine = common::engine(store.clone(), &config);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(engine.run(async {
        let _ = stopped.await;
    }));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        rx.requests().len(),
        3,
        "a webhook went out although no standby in relay.standby_names streams"
    );
    let _ = stop.send(());
    running.await.unwrap().unwrap();
    drop(archiver);
    drop(standby);
}

//! TLS to Postgres: the relay connects with `sslmode=require` and with
//! `sslmode=verify-full` against the server's CA, and refuses a server whose
//! certificate it cannot verify, with an error that says so.
//!
//! Runs against a private cluster (tests/peers/pg-cluster.sh) that has TLS
//! with a self-signed certificate for localhost and 127.0.0.1.

use crate::common;
use crate::common::cluster::Cluster;
use crate::common::Receiver;
use outbox_relay::store::Store;
use serde_json::json;

async fn run_once(url: &str) -> std::process::Output {
    common::relay_command(url)
        .args(["run", "--once"])
        .env("RUST_LOG", "warn")
        .output()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_speaks_tls_to_postgres_and_verifies_the_server() {
    let cluster = Cluster::start("tls");
    let ca = cluster.certificate().expect(
        "the private cluster has no TLS certificate: openssl is missing (apt-get install openssl)",
    );
    let rx = Receiver::ok().await;

    // verify-full against the cluster's own CA: migrate, enqueue, deliver
    let verified = format!(
        "{}?sslmode=verify-full&sslrootcert={}",
        cluster.url,
        ca.display()
    );
    let store = Store::connect(&verified, 2).await.unwrap();
    store.migrate().await.unwrap();
    let (ssl, version): (bool, String) =
        sqlx::query_as("SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert!(ssl, "the connection is encrypted");
    assert!(version.starts_with("TLS"), "{version}");
    sqlx::query("SELECT outbox.enqueue('tls-1', 'webhook', $1)")
        .bind(json!({"url": rx.url("/"), "body": 1}))
        .execute(store.pool())
        .await
        .unwrap();
    let out = run_once(&verified).await;
    assert!(out.status.success(), "{out:?}");
    let state: String = sqlx::query_scalar("SELECT state FROM outbox.intents WHERE key = 'tls-1'")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(state, "delivered");

    // require: encrypted, not verified
    let required = format!("{}?sslmode=require", cluster.url);
    sqlx::query("SELECT outbox.enqueue('tls-2', 'webhook', $1)")
        .bind(json!({"url": rx.url("/"), "body": 2}))
        .execute(store.pool())
        .await
        .unwrap();
    let out = run_once(&required).await;
    assert!(out.status.success(), "{out:?}");
    assert_eq!(rx.requests().len(), 2);

    // and every connection the running relay holds is encrypted: watched
    // from a plain connection, so that only the relay's carry its name
    let watcher = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&format!("{}?sslmode=disable", cluster.url))
        .await
        .unwrap();
    let mut relay = common::relay_command(&required)
        .arg("run")
        .env("RUST_LOG", "warn")
        .spawn()
        .unwrap();
    store.pool().close().await;
    let relay_conns = || async {
        sqlx::query_as::<_, (i64, i64)>(
            "SELECT count(*), count(*) FILTER (WHERE s.ssl)
               FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
              WHERE a.application_name = 'outbox-relay'",
        )
        .fetch_one(&watcher)
        .await
        .unwrap()
    };
    // the claim loop, the LISTEN connection and the sweeper: at least two
    assert!(
        common::wait_for(std::time::Duration::from_secs(15), || async {
            relay_conns().await.0 >= 2
        })
        .await,
        "the relay connected"
    );
    let (all, encrypted) = relay_conns().await;
    assert_eq!(all, encrypted, "every relay connection uses TLS");
    assert!(common::terminate(&mut relay).await.success());
    let store = Store::connect(&verified, 2).await.unwrap();

    // verify-full with only the system's roots: a self-signed server is
    // refused, and the error says why
    let out = run_once(&format!("{}?sslmode=verify-full", cluster.url)).await;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.to_lowercase().contains("certificate"),
        "the error names the certificate problem: {stderr}"
    );
    // a missing CA file is a clear error too
    let out = run_once(&format!(
        "{}?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
        cluster.url
    ))
    .await;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("/nonexistent/ca.pem"), "{stderr}");
    assert_eq!(rx.requests().len(), 2, "nothing more was delivered");
    store.pool().close().await;
}

//! A database of the bench's own on the server it is given: created fresh,
//! migrated, and dropped afterwards unless the run keeps it.

use std::future::Future;

use outbox_relay::store::Store;
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection, Executor};

/// Run `work` against a fresh, migrated database `outbox_bench_<what>_<pid>`
/// reached through a pool of `connections`; the pool is closed after it,
/// and the database dropped unless `keep`.
pub async fn with_database<T, F, Fut>(
    server_url: &str,
    what: &str,
    connections: u32,
    keep: bool,
    work: F,
) -> anyhow::Result<T>
where
    F: FnOnce(Store) -> Fut,
    Fut: Future<Output = anyhow::Result<T>>,
{
    let admin: PgConnectOptions = server_url.parse()?;
    let name = format!("outbox_bench_{what}_{}", std::process::id());
    let mut conn = admin.connect().await?;
    conn.execute(format!("DROP DATABASE IF EXISTS {name}").as_str())
        .await?;
    conn.execute(format!("CREATE DATABASE {name}").as_str())
        .await?;
    let url = admin.clone().database(&name).to_url_lossy().to_string();
    let result = async {
        let store = Store::connect(&url, connections).await?;
        store.migrate().await?;
        let done = work(store.clone()).await;
        store.pool().close().await;
        done
    }
    .await;
    if keep {
        eprintln!("bench: kept database {name}");
    } else {
        conn.execute(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)").as_str())
            .await?;
    }
    conn.close().await.ok();
    result
}

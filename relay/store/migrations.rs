//! Running a set of migrations, again while one gives up on its locks.
//!
//! A migration that changes a table relays and applications use takes its
//! locks 100 ms at a time for about a minute, so that nobody's statements
//! queue behind it, and gives up with "could not lock …" when the relays'
//! transactions held them all that while (a busy database on a slow
//! machine). Its transaction rolls back, and running the migrations again is
//! what its hint asks: [`apply`] does that itself, for a while.

use std::time::Duration;

use sqlx::migrate::{MigrateError, Migrator};
use sqlx::{Connection, PgPool};

/// Run `migrator`'s pending migrations. A migration that gave up on its
/// locks is tried again after a pause, for as long as `patience` lasts;
/// any other failure is returned at once.
///
/// Each run has a connection of its own, closed after a failure: sqlx's
/// migrator keeps its advisory lock when a migration fails, and a
/// connection returned to the pool with it would keep the next run
/// waiting.
pub async fn apply(pool: &PgPool, migrator: &Migrator, patience: Duration) -> anyhow::Result<()> {
    let started = tokio::time::Instant::now();
    let mut tries: u32 = 0;
    loop {
        tries += 1;
        let mut conn = pool
            .acquire()
            .await
            .map_err(|e| anyhow::anyhow!("applying migrations failed: {e}"))?;
        let err = match migrator.run_direct(&mut *conn).await {
            Ok(()) => return Ok(()),
            Err(err) => err,
        };
        let _ = conn.detach().close().await;
        let Some(version) = gave_up_on_locks(&err) else {
            return Err(anyhow::anyhow!("applying migrations failed: {err}"));
        };
        if started.elapsed() + PAUSE >= patience {
            return Err(anyhow::anyhow!(
                "applying migrations failed after {tries} tries in {}s: {err}",
                started.elapsed().as_secs()
            ));
        }
        tracing::warn!(
            migration = version,
            tries,
            "a migration could not take its locks while the relays' transactions held them; trying again"
        );
        tokio::time::sleep(PAUSE).await;
    }
}

/// Between two tries.
const PAUSE: Duration = Duration::from_secs(1);

/// The version of the migration that gave up on its locks, when that is
/// what failed (its `RAISE EXCEPTION 'could not lock …'`, SQLSTATE P0001).
fn gave_up_on_locks(err: &MigrateError) -> Option<i64> {
    let MigrateError::ExecuteMigration(sqlx::Error::Database(db), version) = err else {
        return None;
    };
    (db.code().as_deref() == Some("P0001") && db.message().starts_with("could not lock"))
        .then_some(*version)
}

//! `migrate` runs a migration again when it gave up on its locks (the
//! relays' transactions held them through all its tries), and only then:
//! any other failure ends it at once. Each try's connection is closed after
//! it failed, so the migrator's advisory lock never keeps the next try
//! waiting.
//!
//! The migrations here count their tries in a sequence, which a rolled-back
//! transaction does not take back.

use std::time::{Duration, Instant};

use outbox_relay::store::migrations;
use sqlx::migrate::Migrator;

use crate::common::TestDb;

/// A migrator of one migration, written under the target directory.
async fn migrator(name: &str, sql: &str) -> Migrator {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "migrate-retry-{name}-{}-{:08x}",
        std::process::id(),
        fastrand::u32(..)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("1_{name}.sql")), sql).unwrap();
    Migrator::new(dir.as_path()).await.unwrap()
}

/// What a migration of the schema raises when it gave up on its locks,
/// until its `n`th try.
fn gives_up_until(n: i64) -> String {
    format!(
        "DO $$ BEGIN
             IF nextval('tries') < {n} THEN
                 RAISE EXCEPTION 'could not lock outbox.t within a minute'
                     USING HINT = 'run outbox-relay migrate again';
             END IF;
         END $$;
         CREATE TABLE migrated (x int);"
    )
}

/// An unmigrated database with the sequence `tries` the migrations count in.
async fn counting_db() -> TestDb {
    let db = TestDb::unmigrated().await;
    sqlx::query("CREATE SEQUENCE tries")
        .execute(db.pool())
        .await
        .unwrap();
    db
}

async fn tries(db: &TestDb) -> i64 {
    sqlx::query_scalar("SELECT last_value FROM tries")
        .fetch_one(db.pool())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_that_gave_up_on_its_locks_is_run_again() {
    let db = counting_db().await;
    let m = migrator("third", &gives_up_until(3)).await;
    let began = Instant::now();
    migrations::apply(db.pool(), &m, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(
        tries(&db).await,
        3,
        "two tries gave up, the third applied it"
    );
    assert!(
        began.elapsed() >= Duration::from_secs(2),
        "a pause after each"
    );
    let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations WHERE success")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(applied, 1);
    sqlx::query("SELECT x FROM migrated")
        .fetch_all(db.pool())
        .await
        .unwrap();
    // and the advisory lock went with the failed tries: a migrate beside
    // it, on the same pool, finds nothing to do and does not wait
    tokio::time::timeout(
        Duration::from_secs(10),
        migrations::apply(db.pool(), &m, Duration::from_secs(60)),
    )
    .await
    .expect("no advisory lock left held")
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_locks_are_waited_for_and_only_for_so_long() {
    let db = counting_db().await;
    // another failure: at once, with the database's message
    let broken = migrator(
        "broken",
        "SELECT nextval('tries'); SELECT * FROM no_such_table;",
    )
    .await;
    let err = migrations::apply(db.pool(), &broken, Duration::from_secs(60))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("no_such_table"), "{err}");
    assert_eq!(tries(&db).await, 1, "not tried again");

    // locks never taken: tried until the patience runs out, then the error
    // says how often and for how long
    let locked = migrator("locked", &gives_up_until(i64::MAX)).await;
    let err = migrations::apply(db.pool(), &locked, Duration::from_millis(2500))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("could not lock outbox.t"), "{err}");
    let counted: i64 = err
        .split_once("failed after ")
        .and_then(|(_, rest)| rest.split_once(" tries in "))
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("the error counts the tries and the seconds: {err}"));
    // a try and a pause a second, for 2.5 s: two tries or three
    assert!((2..=3).contains(&counted), "{err}");
    assert_eq!(tries(&db).await, 1 + counted, "each try it counts was made");
    let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(applied, 0, "nothing recorded as applied");
}

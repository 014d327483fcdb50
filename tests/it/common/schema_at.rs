//! A database at an earlier schema: the numbered migrations up to a
//! version, applied from the files themselves, as a deployment of an
//! earlier release has them.

use super::TestDb;

/// Apply the migrations of `schema/` numbered up to `version` (those not
/// applied yet) to `db`; returns how many files there are up to it.
pub async fn migrate_up_to(db: &TestDb, version: i64) -> usize {
    let dir = std::env::temp_dir().join(format!(
        "outbox-schema-at-{}-{:08x}",
        std::process::id(),
        fastrand::u32(..)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let mut copied = 0;
    let schema = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("schema");
    for file in super::files_under(&schema, "sql") {
        let name = file.file_name().unwrap().to_str().unwrap();
        // the numbered migrations (schema/current.sql is their outcome)
        let Ok(v) = name.split('_').next().unwrap().parse::<i64>() else {
            continue;
        };
        if v <= version {
            std::fs::copy(&file, dir.join(name)).unwrap();
            copied += 1;
        }
    }
    let earlier = sqlx::migrate::Migrator::new(dir.as_path()).await.unwrap();
    earlier.run(db.pool()).await.unwrap();
    std::fs::remove_dir_all(&dir).ok();
    copied
}

/// A new database at the migrations up to `version`, and how many files
/// made it.
pub async fn schema_up_to(version: i64) -> (TestDb, usize) {
    let db = TestDb::unmigrated().await;
    let copied = migrate_up_to(&db, version).await;
    assert!(!db.store.migrations_current().await.unwrap());
    (db, copied)
}

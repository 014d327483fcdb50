//! schema/current.sql against a fresh migration.
//!
//! The migrations under schema/ are the history: one function may be
//! defined in several of them, the last one winning. schema/current.sql is
//! the outcome, every table, view, index, trigger and function of the
//! `outbox` schema defined once, as `pg_dump --schema-only --schema=outbox`
//! prints a freshly migrated database (without owners, grants, or the
//! lines that name the server's version or a per-run token). This test
//! makes that dump and fails when the file says anything else; it writes
//! the dump to target/schema/current.sql, which is the file to commit.

use crate::common::TestDb;

/// The dump's lines that change from run to run or from one server build
/// to another, and say nothing about the schema.
fn is_noise(line: &str) -> bool {
    line.starts_with("\\restrict ")
        || line.starts_with("\\unrestrict ")
        || line.starts_with("-- Dumped from database version")
        || line.starts_with("-- Dumped by pg_dump version")
}

/// `dump` without its noise lines, and with one newline at the end.
fn normalized(dump: &str) -> String {
    let kept: Vec<&str> = dump.lines().filter(|l| !is_noise(l)).collect();
    format!("{}\n", kept.join("\n").trim_end())
}

#[test]
fn noise_lines_go_and_the_schema_stays() {
    let dump = "--\n\\restrict AbC\n-- Dumped from database version 15.2\n\
                -- Dumped by pg_dump version 15.2\nCREATE SCHEMA outbox;\n\n\\unrestrict AbC\n\n";
    assert_eq!(normalized(dump), "--\nCREATE SCHEMA outbox;\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_current_sql_is_what_the_migrations_make() {
    let db = TestDb::new().await;
    let out = std::process::Command::new("pg_dump")
        .args([
            "--schema-only",
            "--schema=outbox",
            "--no-owner",
            "--no-privileges",
            "--dbname",
            &db.url,
        ])
        .output()
        .expect("pg_dump runs (Debian: postgresql-client, installed with postgresql)");
    assert!(
        out.status.success(),
        "pg_dump failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dump = normalized(&String::from_utf8(out.stdout).unwrap());
    let target = format!("{}/target/schema", super::ROOT);
    std::fs::create_dir_all(&target).unwrap();
    std::fs::write(format!("{target}/current.sql"), &dump).unwrap();
    let file = std::fs::read_to_string(format!("{}/schema/current.sql", super::ROOT))
        .expect("schema/current.sql exists");
    if file != dump {
        let first = file
            .lines()
            .zip(dump.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(file.lines().count().min(dump.lines().count()));
        panic!(
            "schema/current.sql differs from the migrated schema from line {}: \
             copy target/schema/current.sql over it (it is this run's dump)\n  file: {:?}\n  dump: {:?}",
            first + 1,
            file.lines().nth(first).unwrap_or("(end)"),
            dump.lines().nth(first).unwrap_or("(end)"),
        );
    }
}

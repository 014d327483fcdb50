//! docs/reference/sql.md against the migrated schema.
//!
//! Page format:
//! - tables headed `| object | ... |`, a row per function or view of the
//!   SQL API: `` `outbox.enqueue(p_key text, ...)` `` (the name is what
//!   comes before `(`), `` `outbox.outbox` `` for a view.
//! - tables headed `| SQLSTATE | ... |`, a row per SQLSTATE the schema's
//!   functions raise: `` `OB409` ``. (A table headed otherwise, such as the
//!   codes Postgres itself raises, is not compared.)
//!
//! The code's side is a database migrated by the relay with
//! deploy/sql/roles.sql applied: the SQL API is every function of the
//! `outbox` schema that the application, operator or console role may
//! execute, and every view of it; the SQLSTATEs are every `ERRCODE = '...'`
//! in the bodies of the schema's functions as they stand after the last
//! migration (a superseded body raises nothing), and a `RAISE EXCEPTION`
//! without an `ERRCODE` fails the test (it would raise P0001).

use std::collections::BTreeSet;

use crate::common::TestDb;

use super::{page, rows_of, same, tables};

const PAGE: &str = "sql.md";

/// deploy/sql/roles.sql, applied. Roles are cluster-wide and another test
/// may be creating them at this moment: a race is retried.
async fn apply_roles(db: &TestDb) {
    let script = std::fs::read_to_string(format!("{}/deploy/sql/roles.sql", super::ROOT)).unwrap();
    let mut tries = 0;
    loop {
        match sqlx::raw_sql(&script).execute(db.pool()).await {
            Ok(_) => return,
            Err(e) if tries < 5 => {
                tries += 1;
                eprintln!("roles.sql: {e}; again");
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            Err(e) => panic!("roles.sql does not apply: {e}"),
        }
    }
}

/// The SQLSTATEs of `source`'s `ERRCODE = '...'` clauses, and how many
/// `RAISE EXCEPTION`s it has.
fn errcodes(source: &str) -> (BTreeSet<String>, usize) {
    let upper = source.to_uppercase();
    let raises = upper.matches("RAISE EXCEPTION").count();
    let mut codes = BTreeSet::new();
    for (at, _) in upper.match_indices("ERRCODE") {
        let rest = source[at + "ERRCODE".len()..].trim_start();
        let Some(rest) = rest.strip_prefix('=') else {
            continue;
        };
        let Some(rest) = rest.trim_start().strip_prefix('\'') else {
            continue;
        };
        if let Some((code, _)) = rest.split_once('\'') {
            codes.insert(code.to_string());
        }
    }
    (codes, raises)
}

#[test]
fn errcodes_are_read_from_function_bodies() {
    let (codes, raises) = errcodes(
        "RAISE EXCEPTION 'a; b' USING ERRCODE = '22023';\n raise exception 'x'\n USING errcode='OB409', HINT = 'h';",
    );
    assert_eq!(codes, ["22023".to_string(), "OB409".to_string()].into());
    assert_eq!(raises, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sql_api_and_every_sqlstate_are_in_the_reference_and_no_other() {
    let text = page(PAGE);
    let tables = tables(&text);
    let db = TestDb::new().await;
    apply_roles(&db).await;

    let api: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT 'outbox.' || p.proname
           FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
          WHERE n.nspname = 'outbox'
            AND (has_function_privilege('outbox_app', p.oid, 'EXECUTE')
                 OR has_function_privilege('outbox_operator', p.oid, 'EXECUTE')
                 OR has_function_privilege('outbox_console', p.oid, 'EXECUTE'))
         UNION
         SELECT 'outbox.' || c.relname
           FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
          WHERE n.nspname = 'outbox' AND c.relkind = 'v'",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    let api: BTreeSet<String> = api.into_iter().collect();
    for name in ["outbox.enqueue", "outbox.enqueue_many", "outbox.outbox"] {
        assert!(api.contains(name), "the query missed {name}: {api:?}");
    }
    let documented: Vec<String> = rows_of(&tables, "object", PAGE)
        .iter()
        .map(|r| {
            let name = r.name(PAGE);
            name.split('(').next().unwrap().trim().to_string()
        })
        .collect();
    same("functions and views", PAGE, &api, &documented);

    let bodies: Vec<(String, String)> = sqlx::query_as(
        "SELECT p.proname::text, p.prosrc
           FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
          WHERE n.nspname = 'outbox'",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    let mut raised = BTreeSet::new();
    let mut unnamed = Vec::new();
    for (name, body) in &bodies {
        let (codes, raises) = errcodes(body);
        if raises > body.to_uppercase().matches("ERRCODE").count() {
            unnamed.push(format!("outbox.{name}"));
        }
        raised.extend(codes);
    }
    assert!(
        unnamed.is_empty(),
        "a RAISE EXCEPTION without an ERRCODE (it raises P0001) in {}: give it a SQLSTATE \
         and document it in docs/reference/{PAGE}",
        unnamed.join(", ")
    );
    for code in ["22023", "OB409", "OB413"] {
        assert!(raised.contains(code), "the scan missed {code}: {raised:?}");
    }
    let documented: Vec<String> = rows_of(&tables, "SQLSTATE", PAGE)
        .iter()
        .map(|r| r.name(PAGE))
        .collect();
    same("SQLSTATEs", PAGE, &raised, &documented);
}

//! The SQL API: outbox.enqueue and outbox.derive_key, through real Postgres.

use crate::common::plans::plans_both_ways;
use crate::common::TestDb;
use outbox_relay::store::claims::COMPLETE_SQL;
use outbox_relay::store::{enqueue, ClaimQuery, EnqueueError, NewIntent};
use serde_json::json;

async fn call(db: &TestDb, key: &str, payload: &str) -> Result<(i64, bool), sqlx::Error> {
    sqlx::query_as("SELECT id, duplicate FROM outbox.enqueue($1, 'webhook', $2::jsonb)")
        .bind(key)
        .bind(payload)
        .fetch_one(db.pool())
        .await
}

/// The first SQL example of the README and of the enqueueing guide runs as
/// copied, on a migrated database.
#[tokio::test]
async fn the_readme_enqueue_example_runs_as_copied() {
    for page in [
        include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")),
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/docs/guides/enqueue.md"
        )),
    ] {
        let start = page.find("```sql\n").expect("a SQL example") + "```sql\n".len();
        let example = &page[start..start + page[start..].find("```").unwrap()];
        assert!(example.contains("outbox.enqueue("), "{example}");
        let db = TestDb::new().await;
        sqlx::raw_sql(example)
            .execute(db.pool())
            .await
            .unwrap_or_else(|e| panic!("{e}:\n{example}"));
        assert_eq!(db.state("order:42:confirmation").await, "pending");
    }
}

#[tokio::test]
async fn same_key_same_payload_is_a_duplicate_with_the_same_id() {
    let db = TestDb::new().await;
    let (id, dup) = call(&db, "order:1", r#"{"url":"http://x/","body":{"n":1}}"#)
        .await
        .unwrap();
    assert!(!dup);
    let (id2, dup2) = call(&db, "order:1", r#"{"url":"http://x/","body":{"n":1}}"#)
        .await
        .unwrap();
    assert_eq!((id2, dup2), (id, true));
    let (id3, dup3) = call(&db, "order:1", r#"{"url":"http://x/","body":{"n":1}}"#)
        .await
        .unwrap();
    assert_eq!((id3, dup3), (id, true));
    assert_eq!(db.count("true").await, 1);
    // the per-row duplicate counter went up once per duplicate
    let dups: i32 = db.store.find("order:1").await.unwrap().duplicates;
    assert_eq!(dups, 2);
    // and folding it into the row counts each exactly once
    let folded = db.store.fold_duplicates(100).await.unwrap();
    assert_eq!(folded, vec![("webhook".to_string(), None, 2)]);
    assert!(db.store.fold_duplicates(100).await.unwrap().is_empty());
    assert_eq!(db.store.find("order:1").await.unwrap().duplicates, 2);
}

#[tokio::test]
async fn same_key_different_payload_raises_ob409_naming_the_key() {
    let db = TestDb::new().await;
    call(&db, "order:2", r#"{"url":"http://x/","body":{"n":1}}"#)
        .await
        .unwrap();
    let err = call(&db, "order:2", r#"{"url":"http://x/","body":{"n":2}}"#)
        .await
        .unwrap_err();
    let dbe = err.as_database_error().expect("database error");
    assert_eq!(dbe.code().as_deref(), Some("OB409"));
    assert!(dbe.message().contains("order:2"), "{}", dbe.message());
    // a different kind or destination under the same key is a conflict too
    let err = sqlx::query("SELECT * FROM outbox.enqueue('order:2', 'email', '{\"url\":\"http://x/\",\"body\":{\"n\":1}}')")
        .execute(db.pool())
        .await
        .unwrap_err();
    assert_eq!(
        err.as_database_error().unwrap().code().as_deref(),
        Some("OB409")
    );
    let err = sqlx::query("SELECT * FROM outbox.enqueue('order:2', 'webhook', '{\"url\":\"http://x/\",\"body\":{\"n\":1}}', 'billing')")
        .execute(db.pool())
        .await
        .unwrap_err();
    assert_eq!(
        err.as_database_error().unwrap().code().as_deref(),
        Some("OB409")
    );
    // the Rust helper maps it to a typed conflict
    let e = enqueue(
        db.pool(),
        &NewIntent::new("order:2", "webhook", json!({"other": true})),
    )
    .await
    .unwrap_err();
    assert!(matches!(e, EnqueueError::Conflict { .. }), "{e:?}");
    assert!(e.to_string().contains("order:2"));
    assert_eq!(db.count("true").await, 1);
}

#[tokio::test]
async fn key_order_and_whitespace_never_manufacture_a_conflict() {
    let db = TestDb::new().await;
    let (id, _) = call(
        &db,
        "k",
        r#"{"url":"http://x/","body":{"a":1,"b":[1,2],"c":{"y":1,"x":2}}}"#,
    )
    .await
    .unwrap();
    let (id2, dup) = call(
        &db,
        "k",
        "{ \"body\" : { \"c\": {\"x\":2, \"y\":1},\n \"b\": [ 1 , 2 ], \"a\":1 },\t\"url\": \"http://x/\" }",
    )
    .await
    .unwrap();
    assert_eq!((id2, dup), (id, true));
    // numbers compare by value: 1.0 is 1
    let (_, dup) = call(&db, "n", r#"{"v": 1}"#).await.unwrap();
    assert!(!dup);
    let (_, dup) = call(&db, "n", r#"{"v": 1.0}"#).await.unwrap();
    assert!(dup);
    // but array order is meaningful
    call(&db, "arr", r#"{"v": [1, 2]}"#).await.unwrap();
    assert!(call(&db, "arr", r#"{"v": [2, 1]}"#).await.is_err());
}

#[tokio::test]
async fn enqueue_in_a_rolled_back_transaction_leaves_nothing() {
    let db = TestDb::new().await;
    let mut tx = db.pool().begin().await.unwrap();
    let r = enqueue(
        &mut *tx,
        &NewIntent::new("rolled-back", "webhook", json!({"body": 1})),
    )
    .await
    .unwrap();
    assert!(!r.duplicate);
    tx.rollback().await.unwrap();
    assert_eq!(db.count("true").await, 0);
    assert_eq!(db.count("key = 'rolled-back'").await, 0);
    // committed: exactly one row, and the key is free to use again after a rollback
    let mut tx = db.pool().begin().await.unwrap();
    enqueue(
        &mut *tx,
        &NewIntent::new("rolled-back", "webhook", json!({"body": 2})),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(db.count("key = 'rolled-back'").await, 1);
}

#[tokio::test]
async fn concurrent_enqueues_of_one_key_create_one_intent() {
    let db = TestDb::new().await;
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let pool = db.pool().clone();
        tasks.push(tokio::spawn(async move {
            enqueue(
                &pool,
                &NewIntent::new("race", "webhook", json!({"body": 1})),
            )
            .await
            .unwrap()
        }));
    }
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap());
    }
    assert_eq!(results.iter().filter(|r| !r.duplicate).count(), 1);
    assert!(results.iter().all(|r| r.id == results[0].id));
    assert_eq!(db.count("true").await, 1);
}

#[tokio::test]
async fn enqueue_refuses_bad_input_with_clear_errors() {
    let db = TestDb::new().await;
    for (key, kind, payload, needle) in [
        ("", "webhook", json!({}), "key must not be empty"),
        ("k", "Not A Kind", json!({}), "not a valid kind name"),
    ] {
        let e = enqueue(db.pool(), &NewIntent::new(key, kind, payload))
            .await
            .unwrap_err();
        assert!(matches!(e, EnqueueError::Invalid { .. }), "{e:?}");
        assert!(e.to_string().contains(needle), "{e}");
    }
    // the size limit has its own SQLSTATE (OB413) and error; the message
    // names the key, the size and the limit (more in tests/it/bad_input.rs)
    let e = enqueue(
        db.pool(),
        &NewIntent::new("k", "webhook", json!({"big": "x".repeat(2 << 20)})),
    )
    .await
    .unwrap_err();
    assert!(matches!(e, EnqueueError::PayloadTooLarge { .. }), "{e:?}");
    assert!(
        e.to_string()
            .contains("payload for key k is 2097163 bytes; the limit is 1048576 bytes (1 MiB)"),
        "{e}"
    );
    // exactly at the limit is accepted: the limit is on payload::text
    let at_limit = json!({"b": "x".repeat((1 << 20) - r#"{"b": ""}"#.len())});
    enqueue(db.pool(), &NewIntent::new("at-limit", "webhook", at_limit))
        .await
        .unwrap();
    assert_eq!(db.count("key = 'at-limit'").await, 1);
    let over = json!({"b": "x".repeat((1 << 20) - r#"{"b": ""}"#.len() + 1)});
    let e = enqueue(db.pool(), &NewIntent::new("over", "webhook", over))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("is 1048577 bytes"), "{e}");
    sqlx::query("DELETE FROM outbox.intents")
        .execute(db.pool())
        .await
        .unwrap();
    let long_key = "k".repeat(600);
    let e = enqueue(db.pool(), &NewIntent::new(long_key, "webhook", json!({})))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("limit is 512"), "{e}");
    assert_eq!(db.count("true").await, 0);
}

#[tokio::test]
async fn replacing_enqueue_kept_its_least_privilege_setup() {
    // 0004 re-creates outbox.enqueue, and 0016 drops it for a new signature:
    // it must still run as its owner with a fixed search_path (0003), and
    // PUBLIC must still not execute it
    let db = TestDb::new().await;
    let (definer, config, public): (bool, Vec<String>, bool) = sqlx::query_as(
        "SELECT p.prosecdef, p.proconfig,
                has_function_privilege('public', p.oid, 'EXECUTE')
           FROM pg_proc p
          WHERE p.oid = 'outbox.enqueue(text, text, jsonb, text, timestamptz, text, text, text, text)'::regprocedure",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert!(definer, "SECURITY DEFINER");
    assert_eq!(config, ["search_path=pg_catalog, outbox, pg_temp"]);
    assert!(!public, "PUBLIC cannot execute outbox.enqueue");
}

#[tokio::test]
async fn enqueue_notifies_listeners_on_commit() {
    let db = TestDb::new().await;
    let mut listener = sqlx::postgres::PgListener::connect_with(db.pool())
        .await
        .unwrap();
    listener
        .listen(outbox_relay::engine::claim::CHANNEL)
        .await
        .unwrap();
    db.enqueue("notify-me", "webhook", json!({"body": 1})).await;
    let n = tokio::time::timeout(std::time::Duration::from_secs(5), listener.recv())
        .await
        .expect("a notification arrives")
        .unwrap();
    assert_eq!(n.channel(), outbox_relay::engine::claim::CHANNEL);
    drop(listener); // it holds a pooled connection
}

#[tokio::test]
async fn derive_key_agrees_between_sql_and_rust() {
    let db = TestDb::new().await;
    for (parent, step) in [
        ("order:42", "charge"),
        ("order:42", "reserve-inventory"),
        ("", ""),
        ("é", "x"),
        ("a", "bc"),
        ("ab", "c"),
        ("schedule:daily:2026-01-01T09:00:00Z", "email"),
    ] {
        let sql: String = sqlx::query_scalar("SELECT outbox.derive_key($1, $2)")
            .bind(parent)
            .bind(step)
            .fetch_one(db.pool())
            .await
            .unwrap();
        assert_eq!(
            sql,
            outbox_providers::keys::derive_key(parent, step),
            "{parent:?} {step:?}"
        );
    }
}

/// 20,000 delivered rows of history, 2,000 pending webhooks and a few
/// emails, analyzed: the shape in which a bad claim plan would show.
async fn history_and_a_backlog(db: &TestDb) {
    run(
        db,
        "INSERT INTO outbox.intents (key, kind, payload, state, delivered_at)
         SELECT 'old-' || g, 'webhook', '{}'::jsonb, 'delivered', now() FROM generate_series(1, 20000) g",
    )
    .await;
    // with rows of their own (as retries have), which the claim of rows
    // reads; the intent log has its own claim
    run(
        db,
        "INSERT INTO outbox.intents (key, kind, payload, destination)
         SELECT 'due-' || g, CASE WHEN g % 500 = 0 THEN 'email' ELSE 'webhook' END,
                '{}'::jsonb, 'http://127.0.0.1:9/'
           FROM generate_series(1, 2000) g",
    )
    .await;
    run(db, "ANALYZE outbox.intent_rows").await;
}

/// Run one statement, expecting it to succeed.
async fn run(db: &TestDb, statement: &str) {
    sqlx::query(statement)
        .execute(db.pool())
        .await
        .unwrap_or_else(|e| panic!("{statement}: {e}"));
}

/// The relay's own claim statement, planned both ways Postgres may plan a
/// prepared statement: per call, and once for all calls (the generic plan,
/// which knows the cap and the kinds written into the text but not the
/// bound limit). Both read the partial due index in claim order; neither
/// scans and sorts every pending row.
#[tokio::test]
async fn claiming_uses_the_due_index_whatever_the_history() {
    let db = TestDb::new().await;
    history_and_a_backlog(&db).await;
    let query = ClaimQuery::new(100, &["email".to_string(), "payment".to_string()]);
    for n in [1, 16, 100] {
        let prepare = format!(
            "PREPARE claim_{n}(bigint, text, bigint) AS {}",
            query.sql_for(n)
        );
        let execute = format!("EXECUTE claim_{n}({n}, 'explain', 60000)");
        for (mode, plan) in plans_both_ways(&db, &prepare, &execute).await {
            assert!(
                plan.contains("Index Scan using intents_due"),
                "{mode}, a claim of {n}: the claim must read the partial due index:\n{plan}"
            );
            assert!(
                !plan.contains("Sort") && !plan.contains("Bitmap"),
                "{mode}, a claim of {n}: the claim must not sort the pending rows:\n{plan}"
            );
        }
    }
}

/// A large claim (a relay whose `batch_size` is 1,000) still updates the
/// rows it locked by primary key: joined to the claimed ids, Postgres
/// planned it as a hash join over a scan of every intent, history and all.
#[tokio::test]
async fn a_large_claim_updates_its_rows_by_primary_key() {
    let db = TestDb::new().await;
    history_and_a_backlog(&db).await;
    let query = ClaimQuery::new(1000, &[]);
    let prepare = format!(
        "PREPARE claim_large(bigint, text, bigint) AS {}",
        query.sql_for(1000)
    );
    let execute = "EXECUTE claim_large(1000, 'explain', 60000)";
    for (mode, plan) in plans_both_ways(&db, &prepare, execute).await {
        assert!(
            plan.contains("Index Scan using intents_pkey on intent_rows i"),
            "{mode}: the claimed rows must be updated by primary key:\n{plan}"
        );
        for other in ["Seq Scan on intent_rows i", "Hash Join"] {
            assert!(!plan.contains(other), "{mode}: {other}:\n{plan}");
        }
    }
}

/// The relay claims through prepared statements; after their first few
/// calls Postgres runs them from the cached generic plan instead of planning
/// every call (about a third of the time of a claim of 16 rows). That holds
/// for a claim of one intent (a busy relay asking for the one claim slot that
/// came back) as much as for a full batch: a claim runs the rung of the
/// ladder sized for it. With the cap as a bound
/// parameter, or a cap ten times the claims (1000 here, or 100 for a claim
/// of 1, 3 or 9 before the ladder), this finds 0 generic plans in 10 calls.
#[tokio::test]
async fn the_claim_plan_is_cached_after_the_first_calls() {
    let db = TestDb::new().await;
    history_and_a_backlog(&db).await;
    let query = ClaimQuery::new(100, &["email".to_string(), "payment".to_string()]);
    let mut conn = db.pool().acquire().await.unwrap();
    for n in [1i64, 3, 9, 16, 100] {
        for call in 0..10 {
            let rows: Vec<(i64, String)> = sqlx::query(query.sql_for(n))
                .bind(n)
                .bind("planner")
                .bind(60_000i64)
                .fetch_all(&mut *conn)
                .await
                .unwrap()
                .iter()
                .map(|r: &sqlx::postgres::PgRow| {
                    use sqlx::Row;
                    (r.get("id"), r.get("kind"))
                })
                .collect();
            assert_eq!(rows.len(), n as usize, "a claim of {n}, call {call}");
            assert!(
                rows.iter().all(|(_, kind)| kind == "webhook"),
                "unserved kinds are left alone: {rows:?}"
            );
        }
        let (generic, custom): (i64, i64) = sqlx::query_as(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1",
        )
        .bind(query.sql_for(n))
        .fetch_one(&mut *conn)
        .await
        .unwrap();
        assert!(
            generic >= 4 && custom <= 6,
            "a claim of {n} should run from its cached plan after the first calls: \
             {generic} generic, {custom} custom"
        );
    }
}

/// Completions find their intents by primary key whatever the statistics
/// say. Here they were taken while nothing was claimed; then 1,000 of
/// 20,000 intents are claimed (several relays' worth) and 27 completed.
/// Planned from those statistics, a completion that let an index on `state`
/// find its rows would read all 1,000 claims for its 27. (On a table of a
/// few thousand rows Postgres rightly prefers to read it whole.)
#[tokio::test]
async fn completing_reads_intents_by_primary_key_whatever_the_statistics() {
    let db = TestDb::new().await;
    run(
        &db,
        "INSERT INTO outbox.intents (key, kind, payload, destination)
         SELECT 'c-' || g, 'webhook', '{}'::jsonb, 'http://127.0.0.1:9/'
           FROM generate_series(1, 20000) g",
    )
    .await;
    run(&db, "ANALYZE outbox.intent_rows").await;
    let claims = db.store.claim("many", 1000, 60_000, &[]).await.unwrap();
    assert_eq!(claims.len(), 1000);
    let list = |f: &dyn Fn(&outbox_relay::store::Claimed) -> i64| {
        claims[..27]
            .iter()
            .map(|c| f(c).to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    let (ids, fences) = (list(&|c| c.id), list(&|c| c.fence));
    let fill = |value: &str, ty: &str| format!("array_fill({value}::{ty}, ARRAY[27])");
    let args = [
        format!("'{{{ids}}}'::bigint[]"),
        format!("'{{{fences}}}'::bigint[]"),
        fill("1", "int"),
        fill("0", "int"),
        fill("now()", "timestamptz"),
        fill("now()", "timestamptz"),
        fill("'delivered'", "text"),
        fill("200", "int"),
        fill("'ref'", "text"),
        fill("NULL", "text"),
        fill("false", "bool"),
        fill("'delivered'", "text"),
        fill("NULL", "timestamptz"),
        fill("NULL", "jsonb"),
        "'many'".to_string(),
        fill("false", "bool"),
    ]
    .join(", ");
    let prepare = format!(
        "PREPARE complete(bigint[], bigint[], int[], int[], timestamptz[], timestamptz[], text[],
                          int[], text[], text[], bool[], text[], timestamptz[], jsonb[], text,
                          bool[]) AS {COMPLETE_SQL}"
    );
    let execute = format!("EXECUTE complete({args})");
    for (mode, plan) in plans_both_ways(&db, &prepare, &execute).await {
        assert!(
            plan.contains("Index Scan using intents_pkey on intent_rows i"),
            "{mode}: completions must find their intents by primary key:\n{plan}"
        );
        for other in [
            "intents_leases on intent_rows i",
            "intents_unsettled on intent_rows i",
            "Seq Scan on intent_rows i",
        ] {
            assert!(!plan.contains(other), "{mode}: {other}:\n{plan}");
        }
    }
}

/// Many intents in one statement (the README's form): one round trip, each
/// row answered as a single call would be, and a conflict anywhere refuses
/// the whole statement.
#[tokio::test]
async fn many_intents_in_one_statement_through_unnest() {
    let db = TestDb::new().await;
    let many = |keys: Vec<&str>, payloads: Vec<serde_json::Value>| {
        sqlx::query_as::<_, (String, i64, bool)>(
            "SELECT u.key, e.id, e.duplicate
               FROM unnest($1::text[], $2::jsonb[]) WITH ORDINALITY AS u(key, payload, n)
                    CROSS JOIN LATERAL outbox.enqueue(u.key, 'webhook', u.payload) e
              ORDER BY u.n",
        )
        .bind(keys.into_iter().map(str::to_string).collect::<Vec<_>>())
        .bind(payloads)
        .fetch_all(db.pool())
    };
    let p = |n: i64| json!({"url": "http://x/", "body": {"n": n}});
    call(&db, "batch:0", &p(0).to_string()).await.unwrap();
    let rows = many(
        vec!["batch:0", "batch:1", "batch:2", "batch:1"],
        vec![p(0), p(1), p(2), p(1)],
    )
    .await
    .unwrap();
    let flags: Vec<(&str, bool)> = rows.iter().map(|r| (r.0.as_str(), r.2)).collect();
    assert_eq!(
        flags,
        vec![
            ("batch:0", true),
            ("batch:1", false),
            ("batch:2", false),
            ("batch:1", true)
        ]
    );
    // a key repeated within the statement gets the id of its first row
    assert_eq!(rows[1].1, rows[3].1);
    assert_eq!(db.count("key LIKE 'batch:%'").await, 3);

    // one conflicting row: OB409 naming its key, and none of the statement's rows stay
    let err = many(vec!["batch:3", "batch:2"], vec![p(3), p(99)])
        .await
        .unwrap_err();
    let dbe = err.as_database_error().expect("database error");
    assert_eq!(dbe.code().as_deref(), Some("OB409"));
    assert!(dbe.message().contains("batch:2"), "{}", dbe.message());
    assert_eq!(db.count("key = 'batch:3'").await, 0);
}

/// The kind's shape is tested as `length <= 64` and an unbounded pattern
/// (0010), a cheaper equal of the bounded pattern it replaced: the CHECK,
/// `outbox.enqueue` and `outbox.enqueue_many` each accept exactly the kinds
/// `^[a-z][a-z0-9_.-]{0,63}$` accepts, at the length edge and around it.
#[tokio::test]
async fn the_kind_shape_accepts_exactly_what_the_bounded_pattern_accepted() {
    let db = TestDb::new().await;
    let kinds = [
        "webhook".to_string(),
        "a".to_string(),
        format!("a{}", "b".repeat(63)),
        format!("a{}", "b".repeat(64)),
        format!("a{}", "9".repeat(62)) + "-",
        "amqp.orders_v2-x".to_string(),
        "Webhook".to_string(),
        "9lives".to_string(),
        "_x".to_string(),
        "web hook".to_string(),
        "webhook\n".to_string(),
        "\nwebhook".to_string(),
        "wébhook".to_string(),
        String::new(),
    ];
    for (i, kind) in kinds.iter().enumerate() {
        let expected: bool = sqlx::query_scalar("SELECT $1 ~ '^[a-z][a-z0-9_.-]{0,63}$'")
            .bind(kind)
            .fetch_one(db.pool())
            .await
            .unwrap();
        let check =
            sqlx::query("INSERT INTO outbox.intents (key, kind, payload) VALUES ($1, $2, '{}')")
                .bind(format!("direct:{i}"))
                .bind(kind)
                .execute(db.pool())
                .await;
        let single = sqlx::query("SELECT * FROM outbox.enqueue($1, $2, '{}')")
            .bind(format!("single:{i}"))
            .bind(kind)
            .execute(db.pool())
            .await;
        let many = sqlx::query(
            "SELECT * FROM outbox.enqueue_many(ARRAY[$1], ARRAY[$2], ARRAY['{}'::jsonb])",
        )
        .bind(format!("many:{i}"))
        .bind(kind)
        .execute(db.pool())
        .await;
        for (how, got) in [
            ("CHECK", check),
            ("enqueue", single),
            ("enqueue_many", many),
        ] {
            assert_eq!(got.is_ok(), expected, "{how} on {kind:?}: {got:?}");
        }
    }
}

/// The SQLSTATE of a statement's error, or "ok".
async fn sqlstate_of(result: Result<sqlx::postgres::PgQueryResult, sqlx::Error>) -> String {
    match result {
        Ok(_) => "ok".into(),
        Err(e) => e
            .as_database_error()
            .and_then(|d| d.code())
            .map(|c| c.into_owned())
            .unwrap_or_else(|| format!("{e}")),
    }
}

/// With the setting `outbox.require_transaction` on, an enqueue in a
/// transaction that has written nothing yet is refused with OB428 and
/// writes nothing: an autocommit `outbox.enqueue`, `outbox.enqueue_many`
/// and `INSERT INTO outbox.outbox`, and one after `BEGIN` alone. An enqueue
/// after the business rows, in their transaction, in a trigger of their
/// INSERT or in the same statement, passes. A value that is neither on nor
/// off is refused naming the setting.
#[tokio::test]
async fn require_transaction_refuses_an_enqueue_that_would_commit_on_its_own() {
    let db = TestDb::new().await;
    let mut conn = db.pool().acquire().await.unwrap();
    for sql in [
        "CREATE TABLE orders (id bigint PRIMARY KEY)",
        "CREATE FUNCTION orders_intent() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             PERFORM outbox.enqueue('trigger:' || NEW.id, 'webhook', '{\"url\": \"https://x.example/\"}');
             RETURN NEW;
         END $$",
        "CREATE TRIGGER orders_intent AFTER INSERT ON orders FOR EACH ROW EXECUTE FUNCTION orders_intent()",
        "SET outbox.require_transaction = on",
    ] {
        sqlx::raw_sql(sql).execute(&mut *conn).await.unwrap();
    }
    let hook = r#"'{"url": "https://x.example/"}'"#;
    let refused = [
        format!("SELECT outbox.enqueue('alone', 'webhook', {hook})"),
        format!(
            "SELECT outbox.enqueue_many(ARRAY['many'], ARRAY['webhook'], ARRAY[{hook}::jsonb])"
        ),
        format!(
            "INSERT INTO outbox.outbox (key, kind, payload) VALUES ('view', 'webhook', {hook})"
        ),
    ];
    for sql in &refused {
        let got = sqlstate_of(sqlx::query(sql).execute(&mut *conn).await).await;
        assert_eq!(got, "OB428", "{sql}");
    }
    // BEGIN alone is no write: the intent would still commit by itself
    sqlx::raw_sql("BEGIN").execute(&mut *conn).await.unwrap();
    let got = sqlstate_of(sqlx::query(&refused[0]).execute(&mut *conn).await).await;
    assert_eq!(got, "OB428");
    sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await.unwrap();
    let err = sqlx::query(&refused[0])
        .execute(&mut *conn)
        .await
        .unwrap_err();
    let db_err = err.as_database_error().unwrap();
    assert!(
        db_err
            .message()
            .starts_with("outbox.enqueue: nothing has been written in this transaction yet"),
        "{db_err}"
    );

    for sql in [
        // after the business row, in its transaction
        format!(
            "BEGIN; INSERT INTO orders VALUES (1); SELECT outbox.enqueue('after', 'webhook', {hook}); COMMIT"
        ),
        // in a trigger of the business row's INSERT, autocommit
        "INSERT INTO orders VALUES (2)".to_string(),
        // in the statement that writes the business row
        format!(
            "WITH o AS (INSERT INTO orders VALUES (3) RETURNING id)
             SELECT e.* FROM o, outbox.enqueue('with:' || o.id, 'webhook', {hook}) e"
        ),
    ] {
        sqlx::raw_sql(&sql)
            .execute(&mut *conn)
            .await
            .unwrap_or_else(|e| panic!("{e}: {sql}"));
    }
    assert_eq!(
        db.count("key IN ('after', 'trigger:1', 'trigger:2', 'trigger:3', 'with:3')")
            .await,
        5
    );
    assert_eq!(db.count("key IN ('alone', 'many', 'view')").await, 0);

    sqlx::raw_sql("SET outbox.require_transaction = sometimes")
        .execute(&mut *conn)
        .await
        .unwrap();
    let err = sqlx::query(&refused[0])
        .execute(&mut *conn)
        .await
        .unwrap_err();
    let db_err = err.as_database_error().unwrap();
    assert_eq!(db_err.code().as_deref(), Some("22023"));
    assert!(
        db_err
            .message()
            .contains("outbox.require_transaction is 'sometimes'"),
        "{db_err}"
    );
    // off, and unset: written as before
    sqlx::raw_sql("SET outbox.require_transaction = off")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query(&refused[0]).execute(&mut *conn).await.unwrap();
    assert_eq!(db.count("key = 'alone'").await, 1);
}

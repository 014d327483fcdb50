//! The context stored with each intent: explicit values from SQL, Rust
//! and the view, the transaction's setting, batches, and duplicates.

use super::*;

#[tokio::test]
async fn explicit_values_are_stored_from_sql_rust_and_the_view() {
    let db = TestDb::new().await;
    let (_, dup) = enqueue_with(db.pool(), "sql", Some(TP), Some(TS)).await;
    assert!(!dup);
    assert_eq!(context(&db, "sql").await, ctx(Some(TP), Some(TS)));

    // positionally, after p_source, as an application may call it
    sqlx::query(
        "SELECT * FROM outbox.enqueue('positional', 'webhook', '{}', NULL, now(), NULL,
                                      'checkout', $1, $2)",
    )
    .bind(TP2)
    .bind(TS2)
    .execute(db.pool())
    .await
    .unwrap();
    assert_eq!(context(&db, "positional").await, ctx(Some(TP2), Some(TS2)));
    let source: String =
        sqlx::query_scalar("SELECT source FROM outbox.intents WHERE key = 'positional'")
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(source, "checkout");

    // the Rust API, one and many
    let intent = NewIntent {
        traceparent: Some(TP.into()),
        tracestate: Some(TS.into()),
        ..NewIntent::new("rust", "webhook", p(2))
    };
    assert!(!enqueue(db.pool(), &intent).await.unwrap().duplicate);
    assert_eq!(context(&db, "rust").await, ctx(Some(TP), Some(TS)));

    // the view
    sqlx::query(
        "INSERT INTO outbox.outbox (key, kind, payload, traceparent, tracestate)
         VALUES ('view', 'webhook', $1, $2, $3)",
    )
    .bind(p(3))
    .bind(TP2)
    .bind(TS)
    .execute(db.pool())
    .await
    .unwrap();
    assert_eq!(context(&db, "view").await, ctx(Some(TP2), Some(TS)));

    // and without any: nothing stored
    db.enqueue("plain", "webhook", p(4)).await;
    assert_eq!(context(&db, "plain").await, ctx(None, None));
}

#[tokio::test]
async fn the_rust_batch_sends_each_intents_own_context() {
    let db = TestDb::new().await;
    let with = |key: &str, tp: Option<&str>, ts: Option<&str>, source: Option<&str>| NewIntent {
        traceparent: tp.map(str::to_string),
        tracestate: ts.map(str::to_string),
        source: source.map(str::to_string),
        ..NewIntent::new(key, "webhook", p(1))
    };
    let mut tx = db.pool().begin().await.unwrap();
    set_local(&mut tx, Some(TP2), Some(TS2)).await;
    let batch = [
        with("b1", Some(TP), Some(TS), None),
        with("b2", None, None, None),
        with("b3", Some(TP), None, None),
        // a run of its own (another source), with no traceparent at all:
        // every intent of it takes the setting
        with("b4", None, Some(TS), Some("other")),
        with("b5", None, None, Some("other")),
    ];
    let out = enqueue_many(&mut tx, &batch).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(out.len(), 5);
    assert!(out.iter().all(|r| !r.duplicate));
    assert_eq!(context(&db, "b1").await, ctx(Some(TP), Some(TS)));
    assert_eq!(context(&db, "b2").await, ctx(Some(TP2), Some(TS2)));
    assert_eq!(context(&db, "b3").await, ctx(Some(TP), None));
    assert_eq!(context(&db, "b4").await, ctx(Some(TP2), Some(TS2)));
    assert_eq!(context(&db, "b5").await, ctx(Some(TP2), Some(TS2)));
}

#[tokio::test]
async fn set_local_is_taken_by_enqueue_enqueue_many_and_the_view() {
    let db = TestDb::new().await;
    let mut tx = db.pool().begin().await.unwrap();
    sqlx::query(&format!("SET LOCAL outbox.traceparent = '{TP}'"))
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query(&format!("SET LOCAL outbox.tracestate = '{TS}'"))
        .execute(&mut *tx)
        .await
        .unwrap();
    db_enqueue(&mut tx, "one").await;
    let rows: Vec<(i32, i64, bool)> =
        sqlx::query_as("SELECT ord, id, duplicate FROM outbox.enqueue_many($1, $2, $3)")
            .bind(["many:1", "many:2"])
            .bind(["webhook", "webhook"])
            .bind([p(1), p(2)])
            .fetch_all(&mut *tx)
            .await
            .unwrap();
    assert_eq!(rows.len(), 2);
    // the set-based path with ordering keys is a statement of its own
    sqlx::query("SELECT * FROM outbox.enqueue_many($1, $2, $3, p_ordering_keys => $4)")
        .bind(["ordered:1", "ordered:2"])
        .bind(["webhook", "webhook"])
        .bind([p(1), p(2)])
        .bind(["acct", "acct"])
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("INSERT INTO outbox.outbox (key, kind, payload) VALUES ('view', 'webhook', $1)")
        .bind(p(3))
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    for key in ["one", "many:1", "many:2", "ordered:1", "ordered:2", "view"] {
        assert_eq!(context(&db, key).await, ctx(Some(TP), Some(TS)), "{key}");
    }
    let waiting: bool =
        sqlx::query_scalar("SELECT waiting FROM outbox.intents WHERE key = 'ordered:2'")
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert!(waiting, "ordering is unchanged by the context");
}

#[tokio::test]
async fn an_explicit_traceparent_wins_over_the_setting_and_brings_its_own_tracestate() {
    let db = TestDb::new().await;
    let mut tx = db.pool().begin().await.unwrap();
    set_local(&mut tx, Some(TP), Some(TS)).await;
    enqueue_with(&mut *tx, "explicit", Some(TP2), Some(TS2)).await;
    enqueue_with(&mut *tx, "explicit-no-state", Some(TP2), None).await;
    // a tracestate without a traceparent is not "explicit": the setting's pair
    enqueue_with(&mut *tx, "state-only", None, Some(TS2)).await;
    // an explicit malformed traceparent counts: no context, not the setting's
    enqueue_with(&mut *tx, "explicit-bad", Some("00-nope"), Some(TS2)).await;
    enqueue_with(&mut *tx, "explicit-empty", Some(""), None).await;
    sqlx::query(
        "INSERT INTO outbox.outbox (key, kind, payload, traceparent)
         VALUES ('view-explicit', 'webhook', $1, $2)",
    )
    .bind(p(1))
    .bind(TP2)
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(context(&db, "explicit").await, ctx(Some(TP2), Some(TS2)));
    assert_eq!(
        context(&db, "explicit-no-state").await,
        ctx(Some(TP2), None)
    );
    assert_eq!(context(&db, "state-only").await, ctx(Some(TP), Some(TS)));
    assert_eq!(context(&db, "explicit-bad").await, ctx(None, None));
    assert_eq!(context(&db, "explicit-empty").await, ctx(None, None));
    assert_eq!(context(&db, "view-explicit").await, ctx(Some(TP2), None));
}

#[tokio::test]
async fn a_setting_does_not_leak_into_the_next_transaction() {
    let db = TestDb::new().await;
    // one connection throughout, as a pooled application's would be
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    set_local(&mut tx, Some(TP), Some(TS)).await;
    db_enqueue(&mut tx, "first").await;
    tx.commit().await.unwrap();
    // what is left of it: '' (the placeholder outlives the transaction)
    let left: Option<String> =
        sqlx::query_scalar("SELECT current_setting('outbox.traceparent', true)")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert_eq!(left.as_deref(), Some(""));
    let mut tx = conn.begin().await.unwrap();
    db_enqueue(&mut tx, "second").await;
    sqlx::query("SELECT * FROM outbox.enqueue_many($1, $2, $3)")
        .bind(["second-many"])
        .bind(["webhook"])
        .bind([p(1)])
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    // outside a transaction block too
    db_enqueue(&mut conn, "autocommit").await;
    // and one rolled back leaves nothing either
    let mut tx = conn.begin().await.unwrap();
    set_local(&mut tx, Some(TP2), None).await;
    tx.rollback().await.unwrap();
    db_enqueue(&mut conn, "after-rollback").await;
    conn.close().await.unwrap();

    assert_eq!(context(&db, "first").await, ctx(Some(TP), Some(TS)));
    for key in ["second", "second-many", "autocommit", "after-rollback"] {
        assert_eq!(context(&db, key).await, ctx(None, None), "{key}");
    }
}

#[tokio::test]
async fn enqueue_many_takes_each_rows_context_and_the_setting_for_the_others() {
    let db = TestDb::new().await;
    let keys = ["r1", "r2", "r3", "r4", "r5"];
    let tps = [Some(TP), None, Some("garbage"), Some(TP2), None];
    let tss = [Some(TS), Some(TS), Some(TS), None, None];
    let run = |ordering: bool, prefix: &'static str| {
        let keys: Vec<String> = keys.iter().map(|k| format!("{prefix}{k}")).collect();
        let okeys: Option<Vec<&str>> = ordering.then(|| vec!["acct"; 5]);
        sqlx::query_as::<_, (i32, i64, bool)>(
            "SELECT ord, id, duplicate FROM outbox.enqueue_many($1, $2, $3,
                    p_ordering_keys => $4, p_traceparents => $5, p_tracestates => $6)",
        )
        .bind(keys)
        .bind(vec!["webhook"; 5])
        .bind((1..=5).map(p).collect::<Vec<_>>())
        .bind(okeys)
        .bind(tps)
        .bind(tss)
    };
    // without the setting: a NULL traceparent is no context
    let rows = run(false, "a").fetch_all(db.pool()).await.unwrap();
    assert_eq!(rows.len(), 5);
    let expect_without = [
        ctx(Some(TP), Some(TS)),
        ctx(None, None),
        ctx(None, None),
        ctx(Some(TP2), None),
        ctx(None, None),
    ];
    for (k, want) in keys.iter().zip(&expect_without) {
        assert_eq!(&context(&db, &format!("a{k}")).await, want, "a{k}");
    }
    // with it, on both set-based paths: a NULL traceparent takes the
    // setting's pair; a malformed one still gives none
    let mut tx = db.pool().begin().await.unwrap();
    set_local(&mut tx, Some(TP2), Some(TS2)).await;
    run(false, "b").fetch_all(&mut *tx).await.unwrap();
    run(true, "c").fetch_all(&mut *tx).await.unwrap();
    tx.commit().await.unwrap();
    let expect_with = [
        ctx(Some(TP), Some(TS)),
        ctx(Some(TP2), Some(TS2)),
        ctx(None, None),
        ctx(Some(TP2), None),
        ctx(Some(TP2), Some(TS2)),
    ];
    for prefix in ["b", "c"] {
        for (k, want) in keys.iter().zip(&expect_with) {
            let key = format!("{prefix}{k}");
            assert_eq!(&context(&db, &key).await, want, "{key}");
        }
    }

    // arrays of another length are refused like any other
    let err = sqlx::query("SELECT * FROM outbox.enqueue_many($1, $2, $3, p_traceparents => $4)")
        .bind(["len"])
        .bind(["webhook"])
        .bind([p(1)])
        .bind([TP, TP])
        .execute(db.pool())
        .await
        .unwrap_err();
    let dbe = err.as_database_error().unwrap();
    assert_eq!(dbe.code().as_deref(), Some("22023"));
    assert!(
        dbe.message().contains("the same length"),
        "{}",
        dbe.message()
    );
}

#[tokio::test]
async fn rows_enqueue_many_hands_to_enqueue_keep_their_own_context() {
    // A key repeated within the batch, and keys already used, are answered
    // by outbox.enqueue row by row: a duplicate keeps the first context,
    // and the new rows of the same batch get theirs.
    let db = TestDb::new().await;
    enqueue_with(db.pool(), "used", Some(TP), Some(TS)).await;
    let rows: Vec<(i32, i64, bool)> = sqlx::query_as(
        "SELECT ord, id, duplicate FROM outbox.enqueue_many($1, $2, $3,
                p_traceparents => $4, p_tracestates => $5)",
    )
    .bind(["used", "new", "new", "other"])
    .bind(["webhook"; 4])
    .bind([p(1), p(1), p(1), p(1)])
    .bind([Some(TP2), Some(TP2), Some(TP), None])
    .bind([Some(TS2), None, Some(TS), None])
    .fetch_all(db.pool())
    .await
    .unwrap();
    let dups: Vec<bool> = rows.iter().map(|r| r.2).collect();
    assert_eq!(dups, [true, false, true, false]);
    assert_eq!(rows[1].1, rows[2].1);
    assert_eq!(context(&db, "used").await, ctx(Some(TP), Some(TS)));
    assert_eq!(context(&db, "new").await, ctx(Some(TP2), None));
    assert_eq!(context(&db, "other").await, ctx(None, None));
}

#[tokio::test]
async fn a_duplicate_with_another_context_is_a_duplicate_and_keeps_the_first() {
    let db = TestDb::new().await;
    let (id, _) = enqueue_with(db.pool(), "order:1", Some(TP), Some(TS)).await;
    // another traceparent: a duplicate, not OB409
    assert_eq!(
        enqueue_with(db.pool(), "order:1", Some(TP2), Some(TS2)).await,
        (id, true)
    );
    // none at all, and a malformed one
    assert_eq!(
        enqueue_with(db.pool(), "order:1", None, None).await,
        (id, true)
    );
    assert_eq!(
        enqueue_with(db.pool(), "order:1", Some("garbage"), None).await,
        (id, true)
    );
    // from the setting, through enqueue_many and the view
    let mut tx = db.pool().begin().await.unwrap();
    set_local(&mut tx, Some(TP2), None).await;
    let rows: Vec<(i32, i64, bool)> =
        sqlx::query_as("SELECT ord, id, duplicate FROM outbox.enqueue_many($1, $2, $3)")
            .bind(["order:1"])
            .bind(["webhook"])
            .bind([p(1)])
            .fetch_all(&mut *tx)
            .await
            .unwrap();
    assert_eq!(rows, [(1, id, true)]);
    sqlx::query("INSERT INTO outbox.outbox (key, kind, payload) VALUES ('order:1', 'webhook', $1)")
        .bind(p(1))
        .execute(&mut *tx)
        .await
        .expect("a duplicate through the view is a no-op");
    tx.commit().await.unwrap();
    assert_eq!(context(&db, "order:1").await, ctx(Some(TP), Some(TS)));
    assert_eq!(db.count("true").await, 1);
    let counted: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox.enqueue_duplicates")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(counted, 5, "each duplicate counted as before");

    // the identity is unchanged: another payload is still OB409
    let err =
        sqlx::query("SELECT * FROM outbox.enqueue('order:1', 'webhook', $1, p_traceparent => $2)")
            .bind(p(2))
            .bind(TP)
            .execute(db.pool())
            .await
            .unwrap_err();
    assert_eq!(
        err.as_database_error().unwrap().code().as_deref(),
        Some("OB409")
    );
}

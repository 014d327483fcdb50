//! The W3C trace context stored with each intent: explicit
//! (`p_traceparent`, `p_traceparents`, the view's columns, the Rust API and
//! the CLI) or from the transaction's `outbox.traceparent` setting;
//! malformed values dropped without failing the enqueue; duplicates keep
//! the first context; and the upgrade that changed the functions'
//! signatures keeps the EXECUTE grants a deployment made.

use crate::common::{self, TestDb};
use outbox_relay::store::{enqueue, enqueue_many, NewIntent};
use serde_json::{json, Value};
use sqlx::Connection;

const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const TP2: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
const TS: &str = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE";
const TS2: &str = "vendor@tenant=opaque-1";

fn p(n: i64) -> Value {
    json!({"url": "http://127.0.0.1:9/", "body": {"n": n}})
}

type Context = (Option<String>, Option<String>);

/// The stored (traceparent, tracestate) of the intent `key`.
async fn context(db: &TestDb, key: &str) -> Context {
    sqlx::query_as("SELECT traceparent, tracestate FROM outbox.intents WHERE key = $1")
        .bind(key)
        .fetch_one(db.pool())
        .await
        .unwrap_or_else(|e| panic!("intent {key}: {e}"))
}

fn ctx(tp: Option<&str>, ts: Option<&str>) -> Context {
    (tp.map(str::to_string), ts.map(str::to_string))
}

/// `outbox.enqueue(key, 'webhook', payload, p_traceparent, p_tracestate)`.
async fn enqueue_with<'e>(
    conn: impl sqlx::PgExecutor<'e>,
    key: &str,
    traceparent: Option<&str>,
    tracestate: Option<&str>,
) -> (i64, bool) {
    sqlx::query_as(
        "SELECT id, duplicate FROM outbox.enqueue($1, 'webhook', $2,
                p_traceparent => $3, p_tracestate => $4)",
    )
    .bind(key)
    .bind(p(1))
    .bind(traceparent)
    .bind(tracestate)
    .fetch_one(conn)
    .await
    .unwrap_or_else(|e| panic!("enqueue {key}: {e}"))
}

/// `SET LOCAL` both settings (None: leave that one unset).
async fn set_local(conn: &mut sqlx::PgConnection, tp: Option<&str>, ts: Option<&str>) {
    // SET takes no parameters; set_config(..., true) is SET LOCAL
    sqlx::query(
        "SELECT set_config('outbox.traceparent', $1, true)
          WHERE $1 IS NOT NULL
         UNION ALL
         SELECT set_config('outbox.tracestate', $2, true)
          WHERE $2 IS NOT NULL",
    )
    .bind(tp)
    .bind(ts)
    .execute(&mut *conn)
    .await
    .unwrap();
}

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

async fn db_enqueue(conn: &mut sqlx::PgConnection, key: &str) -> (i64, bool) {
    sqlx::query_as("SELECT id, duplicate FROM outbox.enqueue($1, 'webhook', $2)")
        .bind(key)
        .bind(p(1))
        .fetch_one(&mut *conn)
        .await
        .unwrap()
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

/// Malformed traceparents, each with a valid tracestate (which must not be
/// stored without a valid traceparent).
const BAD_TRACEPARENTS: &[(&str, &str)] = &[
    (
        "one character short",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
    ),
    (
        "version 00 with more after it",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
    ),
    (
        "a later version with more, not after a dash",
        "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
    ),
    (
        "uppercase hex",
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",
    ),
    (
        "version ff",
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    ),
    (
        "all-zero trace-id",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
    ),
    (
        "all-zero parent-id",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
    ),
    (
        "a dash moved (31 and 17 digits)",
        "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
    ),
    (
        "not hex",
        "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
    ),
    (
        "spaces around it",
        " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    ),
    ("garbage", "not a traceparent"),
    ("empty", ""),
];

/// Malformed tracestates, each with a valid traceparent (which is stored).
fn bad_tracestates() -> Vec<(&'static str, String)> {
    vec![
        ("over 512 characters", format!("rojo={}", "x".repeat(508))),
        ("a member without '='", "rojo=1,congo".into()),
        ("a key with an uppercase letter", "Rojo=1".into()),
        ("a key beginning with '_'", "_rojo=1".into()),
        ("a key with a space", "ro jo=1".into()),
        ("a value with '='", "rojo=a=b".into()),
        ("an empty value", "rojo=".into()),
        ("not printable ASCII", "rojo=caf\u{e9}".into()),
        ("a tab", "rojo=1\tcongo=2".into()),
        (
            "33 members",
            (0..33)
                .map(|i| format!("k{i}=v"))
                .collect::<Vec<_>>()
                .join(","),
        ),
        ("garbage", "{\"not\": \"a tracestate\"}".into()),
        ("no member", " , ".into()),
        ("empty", String::new()),
    ]
}

#[tokio::test]
async fn malformed_values_are_not_stored_and_never_fail_the_enqueue() {
    let db = TestDb::new().await;
    for (i, (why, tp)) in BAD_TRACEPARENTS.iter().enumerate() {
        let key = format!("tp:{i}");
        let (_, dup) = enqueue_with(db.pool(), &key, Some(tp), Some(TS)).await;
        assert!(!dup, "{why}");
        assert_eq!(context(&db, &key).await, ctx(None, None), "{why}: {tp:?}");
        // the same from the setting
        let key = format!("tp-set:{i}");
        let mut tx = db.pool().begin().await.unwrap();
        set_local(&mut tx, Some(tp), Some(TS)).await;
        db_enqueue(&mut tx, &key).await;
        tx.commit().await.unwrap();
        assert_eq!(context(&db, &key).await, ctx(None, None), "{why} (setting)");
    }
    for (i, (why, ts)) in bad_tracestates().iter().enumerate() {
        let key = format!("ts:{i}");
        enqueue_with(db.pool(), &key, Some(TP), Some(ts.as_str())).await;
        assert_eq!(
            context(&db, &key).await,
            ctx(Some(TP), None),
            "{why}: {ts:?}"
        );
        let key = format!("ts-set:{i}");
        let mut tx = db.pool().begin().await.unwrap();
        set_local(&mut tx, Some(TP), Some(ts.as_str())).await;
        db_enqueue(&mut tx, &key).await;
        tx.commit().await.unwrap();
        assert_eq!(
            context(&db, &key).await,
            ctx(Some(TP), None),
            "{why} (setting)"
        );
    }
    let total = (BAD_TRACEPARENTS.len() + bad_tracestates().len()) as i64 * 2;
    assert_eq!(db.count("true").await, total, "every enqueue went through");
}

#[tokio::test]
async fn valid_values_at_the_edges_are_stored_as_given() {
    let db = TestDb::new().await;
    let max_state = format!("rojo={}", "x".repeat(507));
    assert_eq!(max_state.len(), 512);
    let members = (0..32)
        .map(|i| format!("k{i}=v"))
        .collect::<Vec<_>>()
        .join(",");
    let cases: Vec<(&str, &str, String)> = vec![
        (
            "a later version, longer after a dash",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes-next",
            TS.into(),
        ),
        (
            "a later version, 55 characters",
            "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-09",
            TS.into(),
        ),
        ("flags 00", TP2, "1tenant@sys-id=x y".into()),
        ("512 characters", TP, max_state),
        ("32 members", TP, members),
        (
            "empty members and spaces",
            TP,
            " rojo=1 ,, congo=b*/_- ,".into(),
        ),
    ];
    for (i, (why, tp, ts)) in cases.iter().enumerate() {
        let key = format!("edge:{i}");
        enqueue_with(db.pool(), &key, Some(tp), Some(ts.as_str())).await;
        // a later version keeps the fields this version knows, no more
        assert_eq!(
            context(&db, &key).await,
            ctx(Some(&tp[..55]), Some(ts.as_str())),
            "{why}"
        );
    }
    // what follows them is never stored, so it never reaches a header
    let smuggled =
        "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x\r\nNats-Msg-Id: forged";
    enqueue_with(db.pool(), "edge:smuggled", Some(smuggled), None).await;
    assert_eq!(
        context(&db, "edge:smuggled").await,
        ctx(Some(&smuggled[..55]), None)
    );
}

#[tokio::test]
async fn a_tracestate_without_a_traceparent_is_not_stored() {
    let db = TestDb::new().await;
    enqueue_with(db.pool(), "explicit", None, Some(TS)).await;
    assert_eq!(context(&db, "explicit").await, ctx(None, None));
    let mut tx = db.pool().begin().await.unwrap();
    set_local(&mut tx, None, Some(TS)).await;
    db_enqueue(&mut tx, "setting").await;
    sqlx::query("SELECT * FROM outbox.enqueue_many($1, $2, $3, p_tracestates => $4)")
        .bind(["many"])
        .bind(["webhook"])
        .bind([p(1)])
        .bind([TS])
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO outbox.outbox (key, kind, payload, tracestate)
         VALUES ('view', 'webhook', $1, $2)",
    )
    .bind(p(1))
    .bind(TS)
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    for key in ["setting", "many", "view"] {
        assert_eq!(context(&db, key).await, ctx(None, None), "{key}");
    }
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

#[tokio::test]
async fn the_cli_enqueues_with_a_trace_context() {
    let db = TestDb::new().await;
    let payload = p(1).to_string();
    let out = common::cli(
        &db,
        &[
            "enqueue",
            "--key",
            "cli:traced",
            "--kind",
            "webhook",
            "--payload",
            &payload,
            "--traceparent",
            TP,
            "--tracestate",
            TS,
        ],
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(context(&db, "cli:traced").await, ctx(Some(TP), Some(TS)));
    // `show` names the trace and where it came from
    let shown = common::cli(&db, &["show", "cli:traced"]).await;
    let shown = String::from_utf8_lossy(&shown.stdout);
    let trace_line = shown
        .lines()
        .find(|l| l.starts_with("trace "))
        .unwrap_or_default();
    assert!(
        trace_line.contains(&TP[3..35]) && trace_line.contains(&format!("(traceparent {TP})")),
        "{shown}"
    );
    let out = common::cli(
        &db,
        &[
            "enqueue",
            "--key",
            "cli:malformed",
            "--kind",
            "webhook",
            "--payload",
            &payload,
            "--traceparent",
            "garbage",
        ],
    )
    .await;
    assert!(
        out.status.success(),
        "a malformed traceparent does not fail: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(context(&db, "cli:malformed").await, ctx(None, None));
    let shown = common::cli(&db, &["show", "cli:malformed"]).await;
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.contains("(derived from the key)"), "{shown}");
}

#[tokio::test]
async fn the_guides_example_stores_what_it_says() {
    let page = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/guides/enqueue.md"
    ))
    .unwrap();
    let section = &page[page
        .find("## Attaching a trace context")
        .expect("the guide's section")..];
    let start = section.find("```sql\n").expect("a SQL example") + "```sql\n".len();
    let example = &section[start..start + section[start..].find("```").unwrap()];
    assert!(
        example.contains("SET LOCAL outbox.traceparent"),
        "{example}"
    );
    assert!(example.contains("p_traceparent =>"), "{example}");
    let db = TestDb::new().await;
    sqlx::raw_sql(example)
        .execute(db.pool())
        .await
        .unwrap_or_else(|e| panic!("{e}:\n{example}"));
    assert_eq!(
        context(&db, "order:43:confirmation").await,
        ctx(Some(TP), Some("rojo=00f067aa0ba902b7"))
    );
    assert_eq!(
        context(&db, "order:43:invoice").await,
        ctx(
            Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
            None
        )
    );
}

/// The old signatures, as 0015 left them.
const OLD_ENQUEUE: &str = "outbox.enqueue(text, text, jsonb, text, timestamptz, text, text)";
const OLD_MANY: &str =
    "outbox.enqueue_many(text[], text[], jsonb[], text[], timestamptz[], text[], text)";
const NEW_ENQUEUE: &str =
    "outbox.enqueue(text, text, jsonb, text, timestamptz, text, text, text, text)";
const NEW_MANY: &str =
    "outbox.enqueue_many(text[], text[], jsonb[], text[], timestamptz[], text[], text, text[], text[])";

/// A database at the released migrations (up to 0015), from the files
/// themselves.
async fn released_schema() -> TestDb {
    let db = TestDb::unmigrated().await;
    let dir = std::env::temp_dir().join(format!(
        "outbox-trace-upgrade-{}-{:08x}",
        std::process::id(),
        fastrand::u32(..)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let mut copied = 0;
    let schema = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("schema");
    for file in common::files_under(&schema, "sql") {
        let name = file.file_name().unwrap().to_str().unwrap();
        // the numbered migrations (schema/current.sql is their outcome)
        let Ok(version) = name.split('_').next().unwrap().parse::<i64>() else {
            continue;
        };
        if version <= 15 {
            std::fs::copy(&file, dir.join(name)).unwrap();
            copied += 1;
        }
    }
    assert_eq!(copied, 14, "0001 to 0015 (0014 was never released)");
    let released = sqlx::migrate::Migrator::new(dir.as_path()).await.unwrap();
    released.run(db.pool()).await.unwrap();
    std::fs::remove_dir_all(&dir).ok();
    assert!(!db.store.migrations_current().await.unwrap());
    db
}

/// A deployment whose enqueue functions belong to a role other than the
/// one that migrates: the new ones, and the validators they call (which
/// PUBLIC may not execute), belong to it too, so enqueues with and without
/// a context keep working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_keeps_the_enqueue_functions_owner() {
    let db = released_schema().await;
    let owner = "t_trace_upgrade_owner";
    sqlx::raw_sql(&format!(
        "DO $$ BEGIN CREATE ROLE {owner} NOLOGIN NOSUPERUSER;
         EXCEPTION WHEN duplicate_object THEN NULL; END $$;
         GRANT USAGE ON SCHEMA outbox TO {owner};
         GRANT ALL ON ALL TABLES IN SCHEMA outbox TO {owner};
         GRANT ALL ON ALL SEQUENCES IN SCHEMA outbox TO {owner};
         GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA outbox TO {owner};
         ALTER FUNCTION {OLD_ENQUEUE} OWNER TO {owner};
         ALTER FUNCTION {OLD_MANY} OWNER TO {owner};"
    ))
    .execute(db.pool())
    .await
    .unwrap();
    db.store.migrate().await.unwrap();
    for f in [
        NEW_ENQUEUE,
        NEW_MANY,
        "outbox.valid_traceparent(text)",
        "outbox.valid_tracestate(text)",
    ] {
        let owned_by: String = sqlx::query_scalar(&format!(
            "SELECT pg_get_userbyid(proowner)::text FROM pg_proc WHERE oid = '{f}'::regprocedure"
        ))
        .fetch_one(db.pool())
        .await
        .unwrap();
        assert_eq!(owned_by, owner, "{f}");
    }
    enqueue_with(db.pool(), "owned:1", Some(TP), Some(TS)).await;
    assert_eq!(context(&db, "owned:1").await, ctx(Some(TP), Some(TS)));
    let rows: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox.enqueue_many(ARRAY['owned:2'], ARRAY['webhook'], ARRAY[$1::jsonb])",
    )
    .bind(p(1))
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(rows, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_keeps_the_execute_grants_made_on_the_old_signatures() {
    let db = released_schema().await;

    // a deployment's own role, granted EXECUTE on the old signatures (one
    // of them with the grant option), as deploy/sql/roles.sql did
    let role = "t_trace_upgrade_app";
    sqlx::raw_sql(&format!(
        "DO $$ BEGIN CREATE ROLE {role} LOGIN;
         EXCEPTION WHEN duplicate_object THEN NULL; END $$;
         GRANT USAGE ON SCHEMA outbox TO {role};
         GRANT EXECUTE ON FUNCTION {OLD_ENQUEUE} TO {role} WITH GRANT OPTION;
         GRANT EXECUTE ON FUNCTION {OLD_MANY} TO {role};"
    ))
    .execute(db.pool())
    .await
    .unwrap();
    // an application of the earlier version, mid-flight
    sqlx::query("SELECT * FROM outbox.enqueue('before', 'webhook', '{}')")
        .execute(db.pool())
        .await
        .unwrap();
    // and this version's Rust API without a context: the call it made
    // before the new parameters, so it works on the schema before them
    let plain = |key: &str| NewIntent::new(key, "webhook", p(1));
    assert!(
        !enqueue(db.pool(), &plain("before:rust"))
            .await
            .unwrap()
            .duplicate
    );
    let mut conn = db.pool().acquire().await.unwrap();
    enqueue_many(&mut conn, &[plain("before:batch")])
        .await
        .unwrap();
    drop(conn);

    let migrated = db.store.migrate().await.unwrap();
    // 0016 and every migration after it
    let from_16: Vec<i64> = outbox_relay::store::MIGRATOR
        .iter()
        .filter(|m| !m.migration_type.is_down_migration() && m.version >= 16)
        .map(|m| m.version)
        .collect();
    assert_eq!(
        migrated.applied.iter().map(|(v, _)| *v).collect::<Vec<_>>(),
        from_16
    );

    let old_gone: (Option<String>, Option<String>) = sqlx::query_as(&format!(
        "SELECT to_regprocedure('{OLD_ENQUEUE}')::text, to_regprocedure('{OLD_MANY}')::text"
    ))
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(old_gone, (None, None), "the old signatures are gone");
    let grants: (bool, bool, bool, bool, bool, bool, bool) = sqlx::query_as(&format!(
        "SELECT has_function_privilege('{role}', '{NEW_ENQUEUE}', 'EXECUTE'),
                has_function_privilege('{role}', '{NEW_ENQUEUE}', 'EXECUTE WITH GRANT OPTION'),
                has_function_privilege('{role}', '{NEW_MANY}', 'EXECUTE'),
                has_function_privilege('{role}', '{NEW_MANY}', 'EXECUTE WITH GRANT OPTION'),
                has_function_privilege('public', '{NEW_ENQUEUE}', 'EXECUTE'),
                has_function_privilege('public', '{NEW_MANY}', 'EXECUTE'),
                has_function_privilege('public', 'outbox.valid_traceparent(text)', 'EXECUTE')"
    ))
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(
        grants,
        (true, true, true, false, false, false, false),
        "(role: enqueue, its grant option, enqueue_many, its grant option; \
         PUBLIC: enqueue, enqueue_many, valid_traceparent)"
    );
    let (definer, config): (bool, Vec<String>) = sqlx::query_as(&format!(
        "SELECT prosecdef, proconfig FROM pg_proc WHERE oid = '{NEW_MANY}'::regprocedure"
    ))
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert!(definer);
    assert_eq!(config, ["search_path=pg_catalog, outbox, pg_temp"]);

    // the role enqueues, with a context and with the earlier 7-argument
    // call, without any right on the tables
    let mut url = reqwest::Url::parse(&db.url).unwrap();
    url.set_username(role).unwrap();
    let mut app = sqlx::PgConnection::connect(url.as_str()).await.unwrap();
    enqueue_with(&mut app, "after", Some(TP), Some(TS)).await;
    sqlx::query(
        "SELECT * FROM outbox.enqueue('after:7', 'webhook', '{}', NULL, now(), NULL, 'old-app')",
    )
    .execute(&mut app)
    .await
    .expect("the 7-argument call resolves to the new function");
    let mut tx = app.begin().await.unwrap();
    set_local(&mut tx, Some(TP2), None).await;
    sqlx::query("SELECT * FROM outbox.enqueue_many($1, $2, $3)")
        .bind(["after:many"])
        .bind(["webhook"])
        .bind([p(1)])
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    app.close().await.unwrap();
    // the pool's statements prepared before the upgrade still run
    assert!(
        !enqueue(db.pool(), &plain("after:rust"))
            .await
            .unwrap()
            .duplicate
    );
    let mut conn = db.pool().acquire().await.unwrap();
    enqueue_many(&mut conn, &[plain("after:batch")])
        .await
        .unwrap();
    drop(conn);
    assert_eq!(db.count("key LIKE 'before%' OR key LIKE 'after%'").await, 8);
    assert_eq!(context(&db, "before").await, ctx(None, None));
    assert_eq!(context(&db, "after").await, ctx(Some(TP), Some(TS)));
    assert_eq!(context(&db, "after:7").await, ctx(None, None));
    assert_eq!(context(&db, "after:many").await, ctx(Some(TP2), None));
}

/// A database that ran the released migrations as first worded upgrades:
/// their reworded comments are accepted, nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_accepts_the_reworded_comments_of_released_migrations() {
    let db = released_schema().await;
    // as the first texts of 0005, 0006, 0007, 0008 and 0010 recorded them
    let earlier = [
        (5, "a3148e17ffc7d6d734288c5b3803cb8b8b204287061df52eba9f8b011af2fe4083e58301588f04c5b3eda1c6643d55ac"),
        (8, "e2e72c78a7c159edb69f7878f2b59bf2d36319d3b5ef50d875d68784fef45c1b7f90f7b651756b326f52183cc84079d0"),
    ];
    for (version, checksum) in earlier {
        sqlx::query("UPDATE _sqlx_migrations SET checksum = decode($1, 'hex') WHERE version = $2")
            .bind(checksum)
            .bind(version)
            .execute(db.pool())
            .await
            .unwrap();
    }
    db.store.migrate().await.unwrap();
    assert!(db.store.migrations_current().await.unwrap());
    // any other text is still refused, as sqlx refuses it
    let other = TestDb::new().await;
    sqlx::query("UPDATE _sqlx_migrations SET checksum = '\\x00' WHERE version = 5")
        .execute(other.pool())
        .await
        .unwrap();
    sqlx::query("DELETE FROM _sqlx_migrations WHERE version = 16")
        .execute(other.pool())
        .await
        .unwrap();
    let err = other.store.migrate().await.unwrap_err();
    assert!(format!("{err:#}").contains("modified"), "{err:#}");
}

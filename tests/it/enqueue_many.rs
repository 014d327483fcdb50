//! `outbox.enqueue_many` (one statement, each row as `outbox.enqueue` would
//! answer it), the Rust `enqueue_many` over it, and the insertable view
//! `outbox.outbox`.

use std::time::Duration;

use crate::common::TestDb;
use outbox_relay::store::{enqueue, enqueue_many, EnqueueError, NewIntent};
use serde_json::{json, Value};

fn p(n: i64) -> Value {
    json!({"url": "http://127.0.0.1:9/", "body": {"n": n}})
}

type Row = (i32, i64, bool);

async fn many(db: &TestDb, keys: &[&str], payloads: &[Value]) -> Result<Vec<Row>, sqlx::Error> {
    let kinds = vec!["webhook"; keys.len()];
    sqlx::query_as("SELECT ord, id, duplicate FROM outbox.enqueue_many($1, $2, $3)")
        .bind(keys)
        .bind(&kinds)
        .bind(payloads)
        .fetch_all(db.pool())
        .await
}

/// `enqueue_many` with ordering keys (one per row, `None` for none).
async fn many_ordered(
    db: &TestDb,
    keys: &[&str],
    payloads: &[Value],
    ordering_keys: &[Option<&str>],
) -> Vec<Row> {
    sqlx::query_as("SELECT ord, id, duplicate FROM outbox.enqueue_many($1, $2, $3, NULL, NULL, $4)")
        .bind(keys)
        .bind(vec!["webhook"; keys.len()])
        .bind(payloads)
        .bind(ordering_keys)
        .fetch_all(db.pool())
        .await
        .unwrap()
}

/// Every intent's key and `waiting` flag, in id order.
async fn waiting(db: &TestDb) -> Vec<(String, bool)> {
    sqlx::query_as("SELECT key, waiting FROM outbox.intents ORDER BY id")
        .fetch_all(db.pool())
        .await
        .unwrap()
}

fn sqlstate(err: &sqlx::Error) -> (String, String) {
    let dbe = err.as_database_error().expect("a database error");
    (
        dbe.code().unwrap_or_default().into_owned(),
        dbe.message().to_string(),
    )
}

#[tokio::test]
async fn new_keys_are_one_statement_and_ord_is_the_input_position() {
    let db = TestDb::new().await;
    let keys: Vec<String> = (0..500).map(|i| format!("m:{i}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let payloads: Vec<Value> = (0..500).map(p).collect();
    let rows = many(&db, &keys, &payloads).await.unwrap();
    assert_eq!(rows.len(), 500);
    for (i, r) in rows.iter().enumerate() {
        assert_eq!((r.0, r.2), (i as i32 + 1, false));
    }
    assert!(
        rows.windows(2).all(|w| w[0].1 < w[1].1),
        "ids follow the input order"
    );
    let stored: Vec<(String, Value)> =
        sqlx::query_as("SELECT key, payload FROM outbox.intents ORDER BY id")
            .fetch_all(db.pool())
            .await
            .unwrap();
    assert_eq!(stored[7], ("m:7".to_string(), p(7)));
}

#[tokio::test]
async fn every_row_is_answered_as_a_single_enqueue_would_answer_it() {
    let db = TestDb::new().await;
    // an existing key, a key the ledger remembers, then a batch mixing them
    // with new keys and a key repeated within the batch
    enqueue(db.pool(), &NewIntent::new("old", "webhook", p(1)))
        .await
        .unwrap();
    let gone = enqueue(db.pool(), &NewIntent::new("gone", "webhook", p(2)))
        .await
        .unwrap();
    sqlx::query("UPDATE outbox.intents SET state = 'delivered', updated_at = now() - interval '1 hour' WHERE key = 'gone'")
        .execute(db.pool())
        .await
        .unwrap();
    db.store
        .purge(Duration::from_secs(1), false, false, 100)
        .await
        .unwrap();
    let old_id: i64 = sqlx::query_scalar("SELECT id FROM outbox.intents WHERE key = 'old'")
        .fetch_one(db.pool())
        .await
        .unwrap();
    let rows = many(
        &db,
        &["new-a", "old", "gone", "new-b", "new-a"],
        &[p(10), p(1), p(2), p(11), p(10)],
    )
    .await
    .unwrap();
    assert!(!rows[0].2);
    assert_eq!(
        (rows[1].1, rows[1].2),
        (old_id, true),
        "existing: its id, duplicate"
    );
    assert_eq!(
        (rows[2].1, rows[2].2),
        (gone.id, true),
        "purged: the ledger's id, duplicate"
    );
    assert!(!rows[3].2);
    assert_eq!(
        (rows[4].1, rows[4].2),
        (rows[0].1, true),
        "repeated: the first row's id"
    );
    assert_eq!(db.count("key IN ('new-a', 'new-b')").await, 2);
    assert_eq!(
        db.count("key = 'gone'").await,
        0,
        "a ledger key never becomes an intent again"
    );
    // the duplicates are counted as outbox.enqueue counts them
    let dups: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox.enqueue_duplicates")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(dups, 3);
}

#[tokio::test]
async fn a_conflict_names_the_first_such_key_and_refuses_the_whole_statement() {
    let db = TestDb::new().await;
    many(&db, &["c:1", "c:2"], &[p(1), p(2)]).await.unwrap();
    let err = many(&db, &["c:3", "c:2", "c:1"], &[p(3), p(99), p(98)])
        .await
        .unwrap_err();
    let (code, message) = sqlstate(&err);
    assert_eq!(code, "OB409");
    assert!(
        message.contains("c:2") && !message.contains("c:1"),
        "{message}"
    );
    assert_eq!(db.count("key = 'c:3'").await, 0);
    // a purged key with another payload, and a key repeated with another
    // payload within the batch
    let err = many(&db, &["c:4", "c:4"], &[p(4), p(5)]).await.unwrap_err();
    assert_eq!(sqlstate(&err).0, "OB409");
    assert_eq!(db.count("key = 'c:4'").await, 0);
}

#[tokio::test]
async fn a_row_enqueue_would_refuse_refuses_the_statement_with_its_error() {
    let db = TestDb::new().await;
    /// keys, kinds, payloads, the SQLSTATE, what the message says
    type Case<'a> = (Vec<&'a str>, Vec<&'a str>, Vec<Value>, &'a str, &'a str);
    let cases: Vec<Case> = vec![
        (
            vec!["ok", ""],
            vec!["webhook", "webhook"],
            vec![p(1), p(2)],
            "22023",
            "key must not be empty",
        ),
        (
            vec!["ok", "k"],
            vec!["webhook", "Bad Kind"],
            vec![p(1), p(2)],
            "22023",
            "not a valid kind name",
        ),
        (
            vec!["ok", "big"],
            vec!["webhook", "webhook"],
            vec![p(1), json!({"url": "x", "body": "y".repeat(1_100_000)})],
            "OB413",
            "payload for key big",
        ),
    ];
    for (keys, kinds, payloads, code, says) in cases {
        let err = sqlx::query("SELECT * FROM outbox.enqueue_many($1, $2, $3)")
            .bind(&keys)
            .bind(&kinds)
            .bind(&payloads)
            .execute(db.pool())
            .await
            .unwrap_err();
        let (got, message) = sqlstate(&err);
        assert_eq!(got, code, "{message}");
        assert!(message.contains(says), "{message}");
    }
    let err = sqlx::query("SELECT * FROM outbox.enqueue_many($1, $2, $3)")
        .bind(vec!["a", "b"])
        .bind(vec!["webhook"])
        .bind(vec![p(1), p(2)])
        .execute(db.pool())
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&err).0, "22023");
    assert_eq!(
        db.count("true").await,
        0,
        "nothing of a refused statement stays"
    );
}

#[tokio::test]
async fn rows_of_one_ordering_key_wait_behind_the_first() {
    let db = TestDb::new().await;
    let okeys = [Some("cart"), None, Some("cart"), Some("cart")];
    let rows = many_ordered(
        &db,
        &["o1", "free", "o2", "o3"],
        &[p(1), p(0), p(2), p(3)],
        &okeys,
    )
    .await;
    assert_eq!(rows.len(), 4);
    assert_eq!(
        waiting(&db).await,
        [("o1", false), ("free", false), ("o2", true), ("o3", true)]
            .map(|(k, w)| (k.to_string(), w))
    );
    let claimed = db.store.claim("r", 10, 60_000, &[]).await.unwrap();
    let mut keys: Vec<&str> = claimed.iter().map(|c| c.key.as_str()).collect();
    keys.sort();
    assert_eq!(keys, ["free", "o1"]);
}

#[tokio::test]
async fn under_repeatable_read_every_row_still_gets_its_answer() {
    let db = TestDb::new().await;
    many(&db, &["rr:1"], &[p(1)]).await.unwrap();
    let mut tx = db.pool().begin().await.unwrap();
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut *tx)
        .await
        .unwrap();
    let rows: Vec<Row> =
        sqlx::query_as("SELECT ord, id, duplicate FROM outbox.enqueue_many($1, $2, $3)")
            .bind(vec!["rr:1", "rr:2"])
            .bind(vec!["webhook"; 2])
            .bind(vec![p(1), p(2)])
            .fetch_all(&mut *tx)
            .await
            .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(rows.iter().map(|r| r.2).collect::<Vec<_>>(), [true, false]);
}

#[tokio::test]
async fn enqueue_many_sends_a_slice_in_one_statement_per_source() {
    let db = TestDb::new().await;
    let mut intents: Vec<NewIntent> = (0..5)
        .map(|i| NewIntent::new(format!("r:{i}"), "webhook", p(i)))
        .collect();
    intents[3].source = Some("billing".into());
    intents[4].source = Some("billing".into());
    let mut conn = db.pool().acquire().await.unwrap();
    let got = enqueue_many(&mut conn, &intents).await.unwrap();
    assert_eq!(got.len(), 5);
    assert!(got.iter().all(|e| !e.duplicate));
    let again = enqueue_many(&mut conn, &intents).await.unwrap();
    assert_eq!(
        again.iter().map(|e| e.id).collect::<Vec<_>>(),
        got.iter().map(|e| e.id).collect::<Vec<_>>()
    );
    assert!(again.iter().all(|e| e.duplicate));
    let sources: Vec<Option<String>> =
        sqlx::query_scalar("SELECT source FROM outbox.intents ORDER BY id")
            .fetch_all(db.pool())
            .await
            .unwrap();
    assert_eq!(sources[2], None);
    assert_eq!(sources[3].as_deref(), Some("billing"));
    intents[1].payload = p(100);
    match enqueue_many(&mut conn, &intents).await {
        Err(EnqueueError::Conflict { message, .. }) => {
            assert!(message.contains("r:1"), "{message}")
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn an_insert_into_the_outbox_view_is_an_enqueue() {
    let db = TestDb::new().await;
    let insert = |key: &'static str, payload: Value| {
        sqlx::query(
            "INSERT INTO outbox.outbox (key, kind, payload, ordering_key, source)
             VALUES ($1, 'webhook', $2, NULL, 'orm')",
        )
        .bind(key)
        .bind(payload)
        .execute(db.pool())
    };
    insert("v:1", p(1)).await.unwrap();
    insert("v:1", p(1)).await.unwrap(); // a duplicate: a no-op
    let err = insert("v:1", p(2)).await.unwrap_err();
    assert_eq!(sqlstate(&err).0, "OB409");
    assert_eq!(db.count("key = 'v:1'").await, 1);
    let (source, state): (String, String) =
        sqlx::query_as("SELECT source, state FROM outbox.intents WHERE key = 'v:1'")
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!((source.as_str(), state.as_str()), ("orm", "pending"));
    // a multi-row INSERT works as well, and the view reads nothing
    sqlx::query(
        "INSERT INTO outbox.outbox (key, kind, payload)
         SELECT 'v:' || g, 'webhook', jsonb_build_object('url', 'http://127.0.0.1:9/', 'body', g)
           FROM generate_series(2, 4) g",
    )
    .execute(db.pool())
    .await
    .unwrap();
    assert_eq!(db.count("key LIKE 'v:%'").await, 4);
    let seen: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox.outbox")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(seen, 0);
}

/// An ORM that can only insert rows (SQLAlchemy, a well-kept peer) writes
/// intents through `outbox.outbox` in its business transaction, and the
/// relay delivers them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orm_writes_intents_through_the_outbox_view() {
    let db = TestDb::new().await;
    let rx = crate::common::Receiver::ok().await;
    let python = std::env::var("OUTBOX_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/peers/orm_outbox.py");
    let out = tokio::process::Command::new(&python)
        .arg(script)
        .arg(&db.url)
        .arg(rx.url("/orm"))
        .output()
        .await
        .expect("run python3");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the SQLAlchemy peer failed with {python} (tests/run.sh installs \
         tests/peers/requirements.txt into target/test-venv and names its \
         interpreter in OUTBOX_TEST_PYTHON): {stderr}"
    );
    let said: Value = serde_json::from_slice(&out.stdout).expect("one JSON line");
    assert_eq!(
        said,
        json!({"first": "committed", "batch": "committed", "duplicate": "committed", "conflict": "OB409"})
    );
    assert_eq!(db.count("key LIKE 'orm:%' AND source = 'orm'").await, 4);
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orm_orders")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(
        orders, 2,
        "the conflicting transaction's business row was rolled back"
    );
    crate::common::engine(db.store.clone(), &crate::common::config())
        .run_once()
        .await
        .unwrap();
    assert_eq!(db.count("state = 'delivered'").await, 4);
    assert_eq!(rx.requests().len(), 4);
}

/// The payload checks at their edges: the depth limit (64 levels), and the
/// number walk, skipped when the text is too short to hold a number beyond
/// 1e308 (309 characters). Both functions refuse what they refused.
#[tokio::test]
async fn the_payload_checks_shortcuts_hold_at_their_edges() {
    let db = TestDb::new().await;
    let nest =
        |levels: usize, inner: &str| format!("{}{inner}{}", "[".repeat(levels), "]".repeat(levels));
    // (payload text, refused?) — 1.5e308 prints as 309 digits, the least
    // text a number beyond 1e308 can have
    let cases = [
        (nest(64, ""), false),
        (nest(64, "1"), true),
        (nest(65, ""), true),
        (format!("[\"{}\"]", "[".repeat(100)), false),
        ("1e308".to_string(), false),
        ("1.5e308".to_string(), true),
        ("-1.5e308".to_string(), true),
        ("{\"n\": 1e309}".to_string(), true),
    ];
    for (i, (text, refused)) in cases.iter().enumerate() {
        let key = format!("edge:{i}");
        let single = sqlx::query("SELECT * FROM outbox.enqueue($1, 'webhook', $2::jsonb)")
            .bind(&key)
            .bind(text)
            .execute(db.pool())
            .await;
        let set = sqlx::query(
            "SELECT * FROM outbox.enqueue_many(ARRAY[$1 || ':many'], ARRAY['webhook'], ARRAY[$2::jsonb])",
        )
        .bind(&key)
        .bind(text)
        .execute(db.pool())
        .await;
        for (how, got) in [("enqueue", single), ("enqueue_many", set)] {
            match got {
                Ok(_) => assert!(!refused, "{how} accepted {text:.80}"),
                Err(err) => {
                    assert!(refused, "{how} refused {text:.80}: {err}");
                    let (code, message) = sqlstate(&err);
                    assert_eq!(code, "22023", "{how}: {message}");
                    assert!(
                        message.contains("nested more than 63 levels")
                            || message.contains("number beyond +/-1e308"),
                        "{how}: {message}"
                    );
                }
            }
        }
    }
    let accepted = cases.iter().filter(|c| !c.1).count() as i64;
    assert_eq!(db.count("true").await, 2 * accepted);
}

/// A key repeated within a batch that has ordering keys: the first row is
/// written, the repeat is answered as a duplicate of it, and only the
/// first row of each ordering key is claimable.
#[tokio::test]
async fn a_repeated_key_in_an_ordered_batch_is_a_duplicate_of_its_first_row() {
    let db = TestDb::new().await;
    let rows = many_ordered(
        &db,
        &["r1", "r2", "r1", "r3"],
        &[p(1), p(2), p(1), p(3)],
        &[Some("acct"), Some("acct"), Some("acct"), None],
    )
    .await;
    assert_eq!(
        rows.iter().map(|r| (r.0, r.2)).collect::<Vec<_>>(),
        [(1, false), (2, false), (3, true), (4, false)]
    );
    assert_eq!(rows[2].1, rows[0].1);
    assert_eq!(
        waiting(&db).await,
        [("r1", false), ("r2", true), ("r3", false)].map(|(k, w)| (k.to_string(), w))
    );
}

//! `outbox.enqueue_many` is `outbox.enqueue` row after row: random batches
//! (repeated keys, keys of live, cancelled, delivered and purged intents,
//! shared ordering keys) give the same answers, rows and `waiting` flags
//! both ways; and two batches sharing keys in opposite orders do not
//! deadlock.

use std::time::Duration;

use serde_json::{json, Value};
use sqlx::{Connection, PgConnection};

use crate::common::{wait_for, TestDb};

const KEYS: usize = 8;
const ORDERING: [Option<&str>; 3] = [None, Some("A"), Some("B")];

fn payload(key: &str) -> Value {
    json!({"url": "http://127.0.0.1:9/", "body": {"key": key}})
}

/// One random case: what exists before, and the batch.
#[derive(Debug)]
struct Case {
    repeatable_read: bool,
    /// (key, ordering key, state or "purged")
    existing: Vec<(String, Option<&'static str>, &'static str)>,
    /// (key, ordering key)
    batch: Vec<(String, Option<&'static str>)>,
}

fn case(seed: u64) -> Case {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut existing = Vec::new();
    for k in 0..KEYS {
        let state = match rng.u8(..100) {
            0..=39 => continue,
            40..=59 => "pending",
            60..=74 => "cancelled",
            75..=84 => "delivered",
            _ => "purged",
        };
        existing.push((format!("k{k}"), ORDERING[rng.usize(..3)], state));
    }
    rng.shuffle(&mut existing);
    let batch = (0..rng.usize(1..=8))
        .map(|_| (format!("k{}", rng.usize(..KEYS)), ORDERING[rng.usize(..3)]))
        .collect();
    Case {
        repeatable_read: rng.u8(..4) == 0,
        existing,
        batch,
    }
}

/// What an arm left: its answers (an id named by its intent's key, or as
/// a ledger entry), the intents in id order, the duplicates recorded.
#[derive(Debug, PartialEq)]
struct Outcome {
    answers: Vec<(String, bool)>,
    intents: Vec<(String, Option<String>, bool, String)>,
    duplicates: Vec<(String, i64)>,
}

async fn observe(conn: &mut PgConnection, answers: Vec<(i64, bool)>) -> Outcome {
    let mut named = Vec::new();
    for (id, dup) in answers {
        let key: Option<String> =
            sqlx::query_scalar("SELECT key FROM outbox.intents WHERE id = $1")
                .bind(id)
                .fetch_optional(&mut *conn)
                .await
                .unwrap();
        named.push((key.unwrap_or_else(|| format!("ledger:{id}")), dup));
    }
    Outcome {
        answers: named,
        intents: sqlx::query_as(
            "SELECT key, ordering_key, waiting, state FROM outbox.intents ORDER BY id",
        )
        .fetch_all(&mut *conn)
        .await
        .unwrap(),
        duplicates: sqlx::query_as(
            "SELECT coalesce(i.key, 'ledger:' || d.intent_id), count(*)
               FROM outbox.enqueue_duplicates d LEFT JOIN outbox.intents i ON i.id = d.intent_id
              GROUP BY 1 ORDER BY 1",
        )
        .fetch_all(&mut *conn)
        .await
        .unwrap(),
    }
}

async fn run_case(conn: &mut PgConnection, c: &Case) -> (Outcome, Outcome) {
    let mut tx = conn.begin().await.unwrap();
    if c.repeatable_read {
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            .execute(&mut *tx)
            .await
            .unwrap();
    }
    for (n, (key, okey, state)) in c.existing.iter().enumerate() {
        if *state == "purged" {
            sqlx::query(
                "INSERT INTO outbox.ledger (key, intent_id, kind, fingerprint, state, created_at, completed_at)
                 VALUES ($1, $2, 'webhook', outbox.fingerprint($3), 'delivered', now(), now())",
            )
            .bind(key)
            .bind(1_000_000 + n as i64)
            .bind(payload(key))
            .execute(&mut *tx)
            .await
            .unwrap();
            continue;
        }
        sqlx::query("SELECT outbox.enqueue($1, 'webhook', $2, NULL, now(), $3)")
            .bind(key)
            .bind(payload(key))
            .bind(okey)
            .execute(&mut *tx)
            .await
            .unwrap();
        sqlx::query("UPDATE outbox.intents SET state = $2 WHERE key = $1")
            .bind(key)
            .bind(state)
            .execute(&mut *tx)
            .await
            .unwrap();
    }
    sqlx::query("SAVEPOINT arms")
        .execute(&mut *tx)
        .await
        .unwrap();
    let keys: Vec<&str> = c.batch.iter().map(|r| r.0.as_str()).collect();
    let okeys: Vec<Option<&str>> = c.batch.iter().map(|r| r.1).collect();
    let payloads: Vec<Value> = keys.iter().map(|k| payload(k)).collect();
    let rows: Vec<(i32, i64, bool)> = sqlx::query_as(
        "SELECT ord, id, duplicate FROM outbox.enqueue_many($1, $2, $3, NULL, NULL, $4)",
    )
    .bind(&keys)
    .bind(vec!["webhook"; keys.len()])
    .bind(&payloads)
    .bind(&okeys)
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    assert_eq!(
        rows.iter().map(|r| r.0).collect::<Vec<_>>(),
        (1..=keys.len() as i32).collect::<Vec<_>>()
    );
    let many = observe(&mut tx, rows.iter().map(|r| (r.1, r.2)).collect()).await;
    sqlx::query("ROLLBACK TO SAVEPOINT arms")
        .execute(&mut *tx)
        .await
        .unwrap();
    let mut answers = Vec::new();
    for ((key, okey), payload) in c.batch.iter().zip(&payloads) {
        answers.push(
            sqlx::query_as(
                "SELECT id, duplicate FROM outbox.enqueue($1, 'webhook', $2, NULL, now(), $3)",
            )
            .bind(key)
            .bind(payload)
            .bind(okey)
            .fetch_one(&mut *tx)
            .await
            .unwrap(),
        );
    }
    let single = observe(&mut tx, answers).await;
    tx.rollback().await.unwrap();
    (many, single)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_batches_are_answered_and_flagged_as_one_enqueue_after_another() {
    let db = TestDb::new().await;
    let mut conn = PgConnection::connect(&db.url).await.unwrap();
    let first: u64 = std::env::var("OUTBOX_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    for seed in first..first + 400 {
        let c = case(seed);
        let (many, single) = run_case(&mut conn, &c).await;
        assert_eq!(
            many, single,
            "seed {seed}: enqueue_many (left) differs from one enqueue after another (right) for {c:#?}"
        );
    }
}

/// Sessions of this database waiting for a lock.
async fn lock_waiters(db: &TestDb) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
          WHERE datname = current_database() AND wait_event_type = 'Lock'",
    )
    .fetch_one(db.pool())
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_batches_sharing_keys_in_opposite_orders_do_not_deadlock() {
    let db = TestDb::new().await;
    let keys: Vec<String> = (0..400).map(|n| format!("shared-{n:04}")).collect();
    // a third transaction holds the middle key: each batch takes what it
    // can before it, then both wait there together
    let mut blocker = PgConnection::connect(&db.url).await.unwrap();
    sqlx::query("BEGIN").execute(&mut blocker).await.unwrap();
    sqlx::query("SELECT outbox.enqueue($1, 'webhook', $2)")
        .bind(&keys[200])
        .bind(payload(&keys[200]))
        .execute(&mut blocker)
        .await
        .unwrap();
    let batch = |keys: Vec<String>| {
        let url = db.url.clone();
        tokio::spawn(async move {
            let mut conn = PgConnection::connect(&url).await.unwrap();
            let payloads: Vec<Value> = keys.iter().map(|k| payload(k)).collect();
            let mut tx = conn.begin().await.unwrap();
            let rows: Vec<(i32, i64, bool)> =
                sqlx::query_as("SELECT ord, id, duplicate FROM outbox.enqueue_many($1, $2, $3)")
                    .bind(&keys)
                    .bind(vec!["webhook"; keys.len()])
                    .bind(&payloads)
                    .fetch_all(&mut *tx)
                    .await?;
            tx.commit().await?;
            Ok::<_, sqlx::Error>(rows)
        })
    };
    let up = batch(keys.clone());
    let down = batch(keys.iter().rev().cloned().collect());
    assert!(
        wait_for(Duration::from_secs(10), || async {
            lock_waiters(&db).await >= 2
        })
        .await,
        "both batches wait for the blocker"
    );
    sqlx::query("ROLLBACK").execute(&mut blocker).await.unwrap();
    let (up, down) = (up.await.unwrap(), down.await.unwrap());
    let (up, down) = match (up, down) {
        (Ok(up), Ok(down)) => (up, down),
        (up, down) => panic!(
            "a batch failed: {:?} / {:?}",
            up.err().map(|e| e.to_string()),
            down.err().map(|e| e.to_string())
        ),
    };
    // every key is one intent; each was new to exactly one batch
    assert_eq!(db.count("true").await, keys.len() as i64);
    let new = up.iter().filter(|r| !r.2).count() + down.iter().filter(|r| !r.2).count();
    assert_eq!(new, keys.len());
}

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

mod storing;
mod tools;
mod upgrade;
mod validation;

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

async fn db_enqueue(conn: &mut sqlx::PgConnection, key: &str) -> (i64, bool) {
    sqlx::query_as("SELECT id, duplicate FROM outbox.enqueue($1, 'webhook', $2)")
        .bind(key)
        .bind(p(1))
        .fetch_one(&mut *conn)
        .await
        .unwrap()
}

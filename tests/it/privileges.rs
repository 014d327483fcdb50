//! Least privilege: deploy/sql/roles.sql, and each role doing only its job.

use crate::common;
use crate::common::{Receiver, TestDb};
use outbox_relay::store::operator::RetryOptions;
use outbox_relay::store::{enqueue, NewIntent, Store};
use serde_json::json;

fn roles_sql() -> std::io::Result<String> {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/sql/roles.sql"))
}

/// Apply roles.sql and create a login role in each group (roles are
/// cluster-wide; every step tolerates another test having done it first).
async fn roles(db: &TestDb) {
    let script = roles_sql().unwrap();
    sqlx::raw_sql(&script)
        .execute(db.pool())
        .await
        .expect("roles.sql applies");
    sqlx::raw_sql(
        "DO $$ DECLARE r text[]; BEGIN
           FOREACH r SLICE 1 IN ARRAY ARRAY[['t_outbox_app','outbox_app'],['t_outbox_relay','outbox_relay'],
                                           ['t_outbox_operator','outbox_operator']] LOOP
             BEGIN EXECUTE format('CREATE ROLE %I LOGIN IN ROLE %I', r[1], r[2]);
             EXCEPTION WHEN duplicate_object THEN NULL; END;
           END LOOP;
         END $$;",
    )
    .execute(db.pool())
    .await
    .unwrap();
}

fn url_as(db: &TestDb, user: &str) -> String {
    let mut url = reqwest::Url::parse(&db.url).unwrap();
    url.set_username(user).unwrap();
    url.set_password(None).unwrap();
    url.to_string()
}

fn denied(err: sqlx::Error) -> bool {
    err.as_database_error().and_then(|e| e.code()).as_deref() == Some("42501")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_application_role_can_only_enqueue_and_the_operator_role_only_read_and_pause() {
    let db = TestDb::new().await;
    roles(&db).await;
    sqlx::raw_sql(&roles_sql().unwrap())
        .execute(db.pool())
        .await
        .expect("roles.sql is idempotent");
    let rx = Receiver::ok().await;

    // the application: enqueue and derive_key, nothing else
    let app = Store::connect(&url_as(&db, "t_outbox_app"), 2)
        .await
        .unwrap();
    let intent = NewIntent::new(
        "priv:1",
        "webhook",
        json!({"url": rx.url("/"), "body": {"secret": "payload"}}),
    );
    let r = enqueue(app.pool(), &intent).await.unwrap();
    assert!(!r.duplicate);
    let again = enqueue(app.pool(), &intent).await.unwrap();
    assert!(again.duplicate, "dedupe works under the application role");
    let key: String = sqlx::query_scalar("SELECT outbox.derive_key('order:1', 'charge')")
        .fetch_one(app.pool())
        .await
        .unwrap();
    assert_eq!(key.len(), 64);
    // ... the set form, and an INSERT into the outbox view
    let mut conn = app.pool().acquire().await.unwrap();
    let batch = outbox_relay::store::enqueue_all(
        &mut conn,
        &[NewIntent::new(
            "priv:2",
            "webhook",
            json!({"url": rx.url("/"), "body": 2}),
        )],
    )
    .await
    .unwrap();
    assert!(!batch[0].duplicate);
    sqlx::query("INSERT INTO outbox.outbox (key, kind, payload) VALUES ('priv:3', 'webhook', $1)")
        .bind(json!({"url": rx.url("/"), "body": 3}))
        .execute(app.pool())
        .await
        .expect("the application role inserts into outbox.outbox");
    for sql in [
        "SELECT * FROM outbox.outbox",
        "UPDATE outbox.outbox SET kind = 'email'",
        "SELECT payload FROM outbox.intents",
        "UPDATE outbox.intents SET state = 'delivered'",
        "DELETE FROM outbox.intents",
        "SELECT * FROM outbox.attempts",
        "INSERT INTO outbox.intents (key, kind, payload) VALUES ('x', 'webhook', '{}')",
    ] {
        let err = sqlx::query(sql).execute(app.pool()).await.unwrap_err();
        assert!(denied(err), "the application role must not run: {sql}");
    }

    // the relay role delivers (and does not need to migrate)
    let out = common::relay_command(&url_as(&db, "t_outbox_relay"))
        .args(["run", "--once"])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(db.state("priv:1").await, "delivered");
    assert_eq!(db.state("priv:3").await, "delivered");

    // the operator role reads, and cannot change anything
    let operator = Store::connect(&url_as(&db, "t_outbox_operator"), 2)
        .await
        .unwrap();
    assert_eq!(operator.list(None, None, 10).await.unwrap().len(), 3);
    assert!(operator.stats().await.is_ok());
    let force = RetryOptions {
        force: true,
        ..RetryOptions::default()
    };
    let err = operator.retry("priv:1", force).await.unwrap_err();
    assert!(err.to_string().contains("permission denied"), "{err}");
    assert_eq!(db.state("priv:1").await, "delivered");
    // ... but it may pause and resume a destination (recorded as itself),
    // and cannot enqueue an alert of its own making
    sqlx::query("SELECT outbox.pause_destination('https://partner.example', 'maintenance')")
        .execute(operator.pool())
        .await
        .unwrap();
    let by: String =
        sqlx::query_scalar("SELECT actor FROM outbox.destination_events WHERE event = 'paused'")
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(by, "t_outbox_operator");
    let resumed: bool =
        sqlx::query_scalar("SELECT outbox.resume_destination('https://partner.example')")
            .fetch_one(operator.pool())
            .await
            .unwrap();
    assert!(resumed);
    let err = sqlx::query(
        "SELECT outbox.raise_alert('x', 'y', now(), NULL, 'https://attacker.example/', NULL)",
    )
    .execute(operator.pool())
    .await
    .unwrap_err();
    assert!(err.to_string().contains("permission denied"), "{err}");

    app.pool().close().await;
    operator.pool().close().await;
}

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
                                           ['t_outbox_operator','outbox_operator'],
                                           ['t_outbox_console','outbox_console']] LOOP
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
    let batch = outbox_relay::store::enqueue_many(
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
        "SELECT * FROM outbox.attempt_history",
        "INSERT INTO outbox.intents (key, kind, payload) VALUES ('x', 'webhook', '{}')",
    ] {
        let err = sqlx::query(sql).execute(app.pool()).await.unwrap_err();
        assert!(denied(err), "the application role must not run: {sql}");
    }

    // the standbys' positions (relay.wait_for_standbys) are the relay's to
    // read, through the one function, without a statistics privilege
    let standbys = "SELECT * FROM outbox.standby_flush_positions()";
    let err = sqlx::query(standbys).execute(app.pool()).await.unwrap_err();
    assert!(
        denied(err),
        "the application role must not read the standbys' positions"
    );
    let relay = Store::connect(&url_as(&db, "t_outbox_relay"), 2)
        .await
        .unwrap();
    let positions = relay.standby_positions(None).await.unwrap();
    assert_eq!(
        (positions.hidden, positions.flushed.len() as i32),
        (0, positions.streaming)
    );
    let stats_role: bool =
        sqlx::query_scalar("SELECT pg_has_role('t_outbox_relay', 'pg_read_all_stats', 'USAGE')")
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert!(!stats_role, "the relay role needs no statistics privilege");

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_application_role_enqueues_with_a_trace_context() {
    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const TP2: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let db = TestDb::new().await;
    roles(&db).await;
    let app = Store::connect(&url_as(&db, "t_outbox_app"), 2)
        .await
        .unwrap();
    let target = json!({"url": "http://127.0.0.1:9/", "body": 1});
    // explicit, through outbox.enqueue and outbox.enqueue_many
    let traced = NewIntent {
        traceparent: Some(TP.into()),
        tracestate: Some("rojo=1".into()),
        ..NewIntent::new("trace:1", "webhook", target.clone())
    };
    assert!(!enqueue(app.pool(), &traced).await.unwrap().duplicate);
    let mut conn = app.pool().acquire().await.unwrap();
    let batch = [NewIntent {
        traceparent: Some(TP2.into()),
        ..NewIntent::new("trace:2", "webhook", target.clone())
    }];
    outbox_relay::store::enqueue_many(&mut conn, &batch)
        .await
        .unwrap();
    drop(conn);
    // from SET LOCAL, through the view
    let mut tx = app.pool().begin().await.unwrap();
    sqlx::query(&format!("SET LOCAL outbox.traceparent = '{TP2}'"))
        .execute(&mut *tx)
        .await
        .expect("the application role sets outbox.traceparent");
    sqlx::query("INSERT INTO outbox.outbox (key, kind, payload) VALUES ('trace:3', 'webhook', $1)")
        .bind(&target)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let stored: Vec<(String, Option<String>, Option<String>)> =
        sqlx::query_as("SELECT key, traceparent, tracestate FROM outbox.intents ORDER BY key")
            .fetch_all(db.pool())
            .await
            .unwrap();
    assert_eq!(
        stored,
        [
            ("trace:1".into(), Some(TP.into()), Some("rojo=1".into())),
            ("trace:2".into(), Some(TP2.into()), None),
            ("trace:3".into(), Some(TP2.into()), None),
        ]
    );
    // the checks behind it are not the application's to call
    let err = sqlx::query("SELECT outbox.valid_traceparent('x')")
        .execute(app.pool())
        .await
        .unwrap_err();
    assert!(denied(err));
    app.pool().close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_role_reads_and_acts_but_never_touches_payloads_or_creates_intents() {
    use outbox_relay::console::Role;
    use outbox_relay::store::console::Search;
    use outbox_relay::store::operator::Change;

    let db = TestDb::new().await;
    roles(&db).await;
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(
            db.enqueue(
                &format!("con:{i}"),
                "webhook",
                json!({"url": "http://127.0.0.1:9/h", "body": i}),
            )
            .await,
        );
    }
    sqlx::query(
        "UPDATE outbox.intents SET state = 'dead', last_error = 'receiver answered HTTP 502'",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let console = Store::connect(&url_as(&db, "t_outbox_console"), 4)
        .await
        .unwrap();
    // every read the pages make
    assert!(console.stats().await.is_ok());
    assert_eq!(console.failure_groups().await.unwrap()[0].count, 3);
    assert!(console.attempt_counts(0, 60).await.unwrap().is_empty());
    let page = console
        .search(
            &Search {
                host: Some("127.0.0.1".into()),
                payload: Some(json!({"body": 1})),
                ..Search::default()
            },
            None,
            50,
        )
        .await
        .unwrap();
    assert_eq!(page.intents.len(), 1);
    assert!(console.lookup_key("con:0").await.is_ok());
    // and through a console served under the role: a dry run and its confirmation
    let served = common::console::ConsoleServer::start_on(
        console.clone(),
        &[("ops", Role::Operator, "ops-password-1")],
    )
    .await;
    let mut s = common::console::Session::new(&served);
    s.login("ops", "ops-password-1").await;
    let dry = s
        .get("/actions/new?action=retry&state=dead&key=con:1")
        .await;
    assert!(dry.body.contains("id=\"count\">1<"), "{}", dry.body);
    let field = |n: &str| common::console::field_of(&dry.body, n).unwrap();
    let ok = s
        .post_form(
            "/actions",
            &[
                ("action", "retry"),
                ("state", "dead"),
                ("key", "con:1"),
                ("up_to", &field("up_to")),
                ("expected", "1"),
                ("nonce", &field("nonce")),
                ("csrf", &field("csrf")),
            ],
        )
        .await;
    assert_eq!(ok.status, 303, "{}", ok.body);
    assert!(
        common::wait_for(std::time::Duration::from_secs(10), || async {
            db.state("con:1").await == "pending"
        })
        .await
    );
    // the store's own changes, recorded as the console's user
    let acting = console.acting_as("console:ops");
    assert_eq!(
        acting.change_ids(&ids[2..], &Change::Cancel).await.unwrap(),
        1
    );
    let actors: Vec<String> =
        sqlx::query_scalar("SELECT actor FROM outbox.operator_actions ORDER BY id")
            .fetch_all(db.pool())
            .await
            .unwrap();
    assert_eq!(actors, vec!["console:ops", "console:ops"]);
    sqlx::query("SELECT outbox.pause_destination('http://127.0.0.1:9', 'console test')")
        .execute(console.pool())
        .await
        .expect("the console role pauses");
    for sql in [
        "UPDATE outbox.intents SET payload = '{}'",
        "UPDATE outbox.intents SET key = 'x'",
        "INSERT INTO outbox.intents (key, kind, payload) VALUES ('x', 'webhook', '{}')",
        "DELETE FROM outbox.intents",
        "DELETE FROM outbox.operator_actions",
        "UPDATE outbox.operator_actions SET actor = 'someone else'",
        "SELECT * FROM outbox.enqueue('x', 'webhook', '{}')",
        "INSERT INTO outbox.outbox (key, kind, payload) VALUES ('x', 'webhook', '{}')",
        "UPDATE outbox.attempts SET accepted = false",
        "SELECT outbox.raise_alert('x', 'y', now(), NULL, 'https://attacker.example/', NULL)",
    ] {
        let err = sqlx::query(sql).execute(console.pool()).await.unwrap_err();
        assert!(denied(err), "the console role must not run: {sql}");
    }
    console.pool().close().await;
}

/// A role granted the functions of a schema before 0022 (a relay of the
/// previous version, before roles.sql is run again) keeps calling them
/// once they call the functions 0022 adds: the migration grants those to
/// whoever may call their callers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_granted_before_an_upgrade_may_call_what_their_functions_now_call() {
    let db = TestDb::unmigrated().await;
    let dir = std::env::temp_dir().join(format!(
        "outbox-grants-upgrade-{}-{:08x}",
        std::process::id(),
        fastrand::u32(..)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let schema = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("schema");
    for file in common::files_under(&schema, "sql") {
        let name = file.file_name().unwrap().to_str().unwrap();
        // the numbered migrations (schema/current.sql is their outcome)
        let Ok(version) = name.split('_').next().unwrap().parse::<i64>() else {
            continue;
        };
        if version <= 21 {
            std::fs::copy(&file, dir.join(name)).unwrap();
        }
    }
    let before = sqlx::migrate::Migrator::new(dir.as_path()).await.unwrap();
    before.run(db.pool()).await.unwrap();
    std::fs::remove_dir_all(&dir).ok();
    let role = "t_grants_before_0022";
    sqlx::raw_sql(&format!(
        "DO $$ BEGIN CREATE ROLE {role} LOGIN NOSUPERUSER;
         EXCEPTION WHEN duplicate_object THEN NULL; END $$;
         GRANT USAGE ON SCHEMA outbox TO {role};
         GRANT ALL ON ALL TABLES IN SCHEMA outbox TO {role};
         GRANT EXECUTE ON FUNCTION outbox.destination_of(text, text, jsonb) TO {role};
         GRANT EXECUTE ON FUNCTION outbox.forget_stale_failures(interval) TO {role};"
    ))
    .execute(db.pool())
    .await
    .unwrap();
    db.store.migrate().await.unwrap();

    let relay = sqlx::PgPool::connect(&url_as(&db, role)).await.unwrap();
    let origin: Option<String> = sqlx::query_scalar(
        "SELECT outbox.destination_of('webhook', NULL, '{\"url\": \"http://LocalHost.:80/x\"}')",
    )
    .fetch_one(&relay)
    .await
    .expect("destination_of, which now calls url_origin");
    assert_eq!(origin.as_deref(), Some("http://localhost"));
    let _: i32 = sqlx::query_scalar("SELECT outbox.forget_stale_failures('1 day')")
        .fetch_one(&relay)
        .await
        .expect("forget_stale_failures, which now calls expire_probes");
    relay.close().await;
}

/// The relay's role sees every holder of the xmin horizon and its age in
/// transaction ids; when another role's transaction began only with
/// pg_read_all_stats (roles.sql, production.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_role_sees_the_xmin_horizon_and_with_pg_read_all_stats_how_old() {
    use sqlx::Connection;
    let db = TestDb::new().await;
    roles(&db).await;
    sqlx::raw_sql(
        "DO $$ BEGIN CREATE ROLE t_outbox_relay_stats LOGIN IN ROLE outbox_relay, pg_read_all_stats;
         EXCEPTION WHEN duplicate_object THEN NULL; END $$;",
    )
    .execute(db.pool())
    .await
    .unwrap();
    // another role's (the superuser's) report holds a snapshot
    let mut report = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::raw_sql("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM outbox.intents;")
        .execute(&mut report)
        .await
        .unwrap();
    for _ in 0..5 {
        sqlx::query("SELECT txid_current()")
            .execute(db.pool())
            .await
            .unwrap();
    }
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let oldest = |store: Store| async move {
        let held = store.xmin_horizon().await.expect("the views are public");
        store.pool().close().await;
        held.into_iter()
            .find(|h| h.holder == "transaction")
            .expect("the report holds the horizon")
    };
    let plain = oldest(
        Store::connect(&url_as(&db, "t_outbox_relay"), 2)
            .await
            .unwrap(),
    )
    .await;
    assert!(plain.age_transactions >= 5, "{plain:?}");
    assert_eq!(plain.age_seconds, None, "another role's start is hidden");
    let reader = oldest(
        Store::connect(&url_as(&db, "t_outbox_relay_stats"), 2)
            .await
            .unwrap(),
    )
    .await;
    assert!(reader.age_transactions >= 5, "{reader:?}");
    assert!(reader.age_seconds >= Some(1.0), "{reader:?}");
    sqlx::query("ROLLBACK").execute(&mut report).await.unwrap();
}

/// A relay of an earlier release writes its log batches without `max_id`
/// (schema 0034), as the relay role: the trigger that fills it in needs
/// no grant of its own, so nothing waits for `roles.sql` to run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_role_writes_a_batch_without_its_highest_id_as_an_earlier_release_does() {
    let db = TestDb::new().await;
    roles(&db).await;
    let relay = Store::connect(&url_as(&db, "t_outbox_relay"), 1)
        .await
        .unwrap();
    let may_run: bool = sqlx::query_scalar(
        "SELECT has_function_privilege(current_user, 'outbox.log_batch_max_id()', 'EXECUTE')",
    )
    .fetch_one(relay.pool())
    .await
    .unwrap();
    assert!(!may_run, "the trigger's function is granted to no one");
    let max_id: i64 = sqlx::query_scalar(
        "INSERT INTO outbox.log_batches (owner, lease_expires_at, ids)
         VALUES ('earlier release', now() + interval '1 minute', '{3, 9, 4}')
         RETURNING max_id",
    )
    .fetch_one(relay.pool())
    .await
    .expect("the relay role writes a batch as an earlier release does");
    assert_eq!(max_id, 9);
    relay.pool().close().await;
}

/// The relay role rotates, closes and retires the log's segments (tables
/// it could not create or drop itself), through the schema's functions;
/// the application role cannot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_role_rotates_and_retires_segments_and_the_application_role_cannot() {
    use std::time::Duration;
    let db = TestDb::new().await;
    roles(&db).await;
    let rx = Receiver::start(|_, _| common::Reply::status(200)).await;
    db.enqueue("seg", "webhook", json!({"url": rx.url("/ok"), "body": {}}))
        .await;
    let relay = Store::connect(&url_as(&db, "t_outbox_relay"), 2)
        .await
        .unwrap();
    common::run_once_within(&db, &common::config(), Duration::from_secs(30)).await;
    let pass = relay
        .maintain_log_segments(Duration::ZERO, Some(Duration::ZERO))
        .await
        .expect("the relay role rotates");
    assert_eq!(pass.opened, 1, "{pass:?}");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let pass = crate::log_segments::passes_until_a_drop(&relay).await;
    let done = (pass.closed, pass.dropped);
    assert_eq!(done, (1, 1), "closed and dropped");
    relay.pool().close().await;
    let app = Store::connect(&url_as(&db, "t_outbox_app"), 2)
        .await
        .unwrap();
    let err = app
        .maintain_log_segments(Duration::ZERO, Some(Duration::ZERO))
        .await
        .unwrap_err();
    assert!(denied(err));
    app.pool().close().await;
}

//! A subscription's headers: their values stored sealed (no column of its
//! row holds one in clear), sent with each delivery, shown by name only;
//! a row that still holds them in clear is sealed by the first relay that
//! starts with the key, and delivers with them.

use std::path::Path;

use outbox_relay::config::subscriptions::new_signing_secret;
use outbox_relay::config::SealingKey;
use outbox_relay::console::Role;
use serde_json::{json, Map, Value};

use super::*;
use crate::common::console::{ConsoleServer, Session};
use crate::common::{config_file, engine, relay_command, run_until, terminate, wait_for, Receiver};

/// The value no column, page, answer or log line may hold.
const VALUE: &str = "s3cr3t";

const OPS: (&str, Role, &str) = ("ops", Role::Operator, "ops-password-1");

fn key() -> SealingKey {
    SealingKey::parse(&Secret::new(KEY)).unwrap()
}

/// Every column of subscription `id`'s row, as text: a `bytea` with its
/// printable bytes as they are (`encode(..., 'escape')`), so that a value
/// stored as bytes would show too.
async fn row_as_text(db: &TestDb, id: &str) -> Vec<(String, String)> {
    let columns: Vec<(String, String)> = sqlx::query_as(
        "SELECT column_name::text, data_type::text FROM information_schema.columns
          WHERE table_schema = 'outbox' AND table_name = 'subscriptions'
          ORDER BY ordinal_position",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    assert!(columns.len() > 10, "{columns:?}");
    let mut row = Vec::new();
    for (column, data_type) in columns {
        let text = if data_type == "bytea" {
            format!("encode({column}, 'escape')")
        } else {
            format!("{column}::text")
        };
        let value: Option<String> = sqlx::query_scalar(&format!(
            "SELECT {text} FROM outbox.subscriptions WHERE id = $1"
        ))
        .bind(id)
        .fetch_one(db.pool())
        .await
        .unwrap();
        row.push((column, value.unwrap_or_default()));
    }
    // and the whole row as Postgres prints it
    let whole: String =
        sqlx::query_scalar("SELECT s::text FROM outbox.subscriptions s WHERE id = $1")
            .bind(id)
            .fetch_one(db.pool())
            .await
            .unwrap();
    row.push(("(row)".into(), whole));
    row
}

/// No column of subscription `id` holds [`VALUE`]; its headers are sealed,
/// open with the key to `headers`, and their names are readable.
async fn assert_sealed(db: &TestDb, id: &str, headers: &Map<String, Value>) {
    for (column, text) in row_as_text(db, id).await {
        assert!(
            !text.contains(VALUE),
            "{id}'s column {column} holds a header's value: {text}"
        );
    }
    let (clear, names, sealed): (Option<Value>, Vec<String>, Option<Vec<u8>>) = sqlx::query_as(
        "SELECT headers, header_names, headers_sealed FROM outbox.subscriptions WHERE id = $1",
    )
    .bind(id)
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(clear, None, "nothing in clear");
    assert_eq!(names, headers.keys().cloned().collect::<Vec<_>>());
    let sealed = sealed.expect("the headers, sealed");
    assert_eq!(&key().open_headers(id, &sealed).unwrap(), headers);
    assert!(
        key().open(id, &sealed).is_err(),
        "sealed headers never open as a secret"
    );
}

fn headers(pairs: &[(&str, &str)]) -> Map<String, Value> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), Value::from(*v)))
        .collect()
}

/// `outbox-relay run` with the sealing key, its log (at debug) written to
/// `log`.
fn spawn_relay_logging(db: &TestDb, log: &Path) -> tokio::process::Child {
    let file = config_file(&format!(
        "[relay]\npoll_interval = \"50ms\"\n\
         [webhook]\nallowed_networks = [\"127.0.0.0/8\"]\n\
         [subscriptions]\nsecret_key = \"{KEY}\"\n"
    ));
    relay_command(&db.url)
        .arg("run")
        .env("OUTBOX_RELAY_CONFIG", &file)
        .env("OUTBOX_RELAY__RELAY__NAME", "\"headers\"")
        .env("RUST_LOG", "debug")
        .stdout(std::process::Stdio::from(
            std::fs::File::create(log).unwrap(),
        ))
        .stderr(std::process::Stdio::from(
            std::fs::File::create(log.with_extension("err")).unwrap(),
        ))
        .spawn()
        .expect("spawn relay")
}

/// What the relay logged (stdout and stderr).
fn logged(log: &Path) -> String {
    let text = format!(
        "{}{}",
        std::fs::read_to_string(log).unwrap_or_default(),
        std::fs::read_to_string(log.with_extension("err")).unwrap_or_default()
    );
    std::fs::remove_file(log).ok();
    std::fs::remove_file(log.with_extension("err")).ok();
    text
}

/// Publish an event, run a relay (logging to a file of `name`) until its
/// one delivery is delivered or [`LIMIT`] passes: whether it was, and what
/// the relay logged.
async fn one_delivered_by_a_relay(db: &TestDb, name: &str) -> (bool, String) {
    publish(db, "order-1", "order.paid", json!({"order": 1}), None)
        .await
        .unwrap();
    let log = log_path(name);
    let mut relay = spawn_relay_logging(db, &log);
    let delivered = wait_for(LIMIT, || async {
        deliveries_in(db, "delivered").await == 1
    })
    .await;
    terminate(&mut relay).await;
    (delivered, logged(&log))
}

fn log_path(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "outbox-relay-headers-{name}-{}-{:08x}.log",
        std::process::id(),
        fastrand::u32(..)
    ))
}

/// Rows of outbox tables (other than the subscriptions) that hold
/// [`VALUE`]: the deliveries' payloads, errors and attempts.
async fn elsewhere(db: &TestDb) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT t FROM (SELECT i::text FROM outbox.intents i
                        UNION ALL SELECT a::text FROM outbox.attempt_history a
                        UNION ALL SELECT d::text FROM outbox.destinations d) AS r(t)
          WHERE strpos(t, $1) > 0",
    )
    .bind(VALUE)
    .fetch_all(db.pool())
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_value_is_stored_sealed_sent_with_each_delivery_and_shown_by_name_only() {
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    let bearer = format!("Bearer {VALUE}");
    let (id, secret) = subscribe(
        &db,
        &[
            "--url",
            &rx.url("/hook"),
            "--header",
            &format!("Authorization: {bearer}"),
            "--header",
            "X-Team: billing",
        ],
    )
    .await;
    assert_sealed(
        &db,
        &id,
        &headers(&[("Authorization", &bearer), ("X-Team", "billing")]),
    )
    .await;

    // one without headers has none, sealed or not
    let (bare, _) = subscribe(
        &db,
        &["--url", &rx.url("/bare"), "--event-types", "other.*"],
    )
    .await;
    let row: (Option<Value>, Vec<String>, Option<Vec<u8>>) = sqlx::query_as(
        "SELECT headers, header_names, headers_sealed FROM outbox.subscriptions WHERE id = $1",
    )
    .bind(&bare)
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(row, (Some(json!({})), vec![], None));

    // the console's API makes one the same way
    let console = ConsoleServer::start_with(&db, &[OPS], |c| {
        c.subscriptions.secret_key = Some(Secret::new(KEY));
    })
    .await;
    let http = reqwest::Client::new();
    let made: Value = http
        .post(console.url("/api/v1/subscriptions"))
        .basic_auth(OPS.0, Some(OPS.2))
        .json(&json!({"url": rx.url("/api"), "event_types": ["other.*"],
                      "headers": {"X-Token": format!("api-{VALUE}")}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let api_id = made["id"].as_str().expect("made").to_string();
    assert_eq!(made["subscription"]["header_names"], json!(["X-Token"]));
    assert_sealed(
        &db,
        &api_id,
        &headers(&[("X-Token", &format!("api-{VALUE}"))]),
    )
    .await;

    // list, show, the API and the console's pages: names, never a value
    for args in [
        &["subscriptions", "list"][..],
        &["subscriptions", "list", "--json"],
        &["subscriptions", "show", &id],
        &["subscriptions", "show", &id, "--json"],
    ] {
        let out = relay_cli(&db, args).await;
        let shown = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{args:?}: {shown}");
        assert!(!shown.contains(VALUE), "{args:?} shows a header's value");
    }
    let out = relay_cli(&db, &["subscriptions", "show", &id, "--json"]).await;
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["header_names"], json!(["Authorization", "X-Team"]));
    for path in [
        "/api/v1/subscriptions".to_string(),
        format!("/api/v1/subscriptions/{id}"),
    ] {
        let answer = http
            .get(console.url(&path))
            .basic_auth(OPS.0, Some(OPS.2))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200, "{path}");
        let body = answer.text().await.unwrap();
        assert!(
            !body.contains(VALUE),
            "{path} shows a header's value: {body}"
        );
        assert!(body.contains("Authorization"), "{path}: {body}");
    }
    let mut session = Session::new(&console);
    session.login(OPS.0, OPS.2).await;
    for path in ["/subscriptions".to_string(), format!("/subscriptions/{id}")] {
        let page = session.get(&path).await;
        assert_eq!(page.status, 200, "{path}");
        assert!(!page.body.contains(VALUE), "{path} shows a header's value");
    }
    let page = session.get(&format!("/subscriptions/{id}")).await;
    assert!(page.body.contains("Authorization, X-Team"), "{}", page.body);

    // a real relay delivers with the headers, opened; its log holds none
    let (delivered, log) = one_delivered_by_a_relay(&db, "sealed").await;
    assert!(delivered, "the delivery; the relay logged:\n{log}");
    let requests = rx.requests();
    assert_eq!(requests.len(), 1);
    let r = &requests[0];
    assert_eq!(r.path, "/hook");
    assert_eq!(r.header("authorization").as_deref(), Some(bearer.as_str()));
    assert_eq!(r.header("x-team").as_deref(), Some("billing"));
    assert!(verifies(r, &secret));
    assert!(!log.contains(VALUE), "the relay logged a header's value");
    assert!(
        !log.trim().is_empty(),
        "the relay's log, at debug, was read"
    );
    assert_eq!(elsewhere(&db).await, Vec::<String>::new());
    assert_sealed(
        &db,
        &id,
        &headers(&[("Authorization", &bearer), ("X-Team", "billing")]),
    )
    .await;
}

/// Apply the migrations numbered up to `last`, as a relay of that schema
/// left the database.
async fn migrate_until(db: &TestDb, last: i64) {
    let dir = std::env::temp_dir().join(format!(
        "outbox-migrations-until-{last}-{}-{:08x}",
        std::process::id(),
        fastrand::u32(..)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let schema = Path::new(env!("CARGO_MANIFEST_DIR")).join("schema");
    for file in crate::common::files_under(&schema, "sql") {
        let name = file.file_name().unwrap().to_str().unwrap();
        // the numbered migrations (schema/current.sql is their outcome)
        let Ok(version) = name.split('_').next().unwrap().parse::<i64>() else {
            continue;
        };
        if version <= last {
            std::fs::copy(&file, dir.join(name)).unwrap();
        }
    }
    let before = sqlx::migrate::Migrator::new(dir.as_path()).await.unwrap();
    before.run(db.pool()).await.unwrap();
    std::fs::remove_dir_all(&dir).ok();
}

/// The SQLSTATE of a refused statement.
fn sqlstate(result: Result<sqlx::postgres::PgQueryResult, sqlx::Error>) -> String {
    let err = result.expect_err("refused");
    err.as_database_error()
        .and_then(|e| e.code())
        .map(|c| c.to_string())
        .unwrap_or_else(|| panic!("{err}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_a_row_holds_in_clear_are_sealed_by_the_relay_that_starts_with_the_key() {
    let db = TestDb::unmigrated().await;
    let rx = Receiver::ok().await;
    migrate_until(&db, 29).await;
    // a subscription made while headers were stored in clear
    let id = "sub_Legacy0000000001";
    let secret = new_signing_secret().unwrap();
    let bearer = format!("Bearer {VALUE}");
    let clear = headers(&[("X-Team", "billing"), ("Authorization", &bearer)]);
    sqlx::query(
        "INSERT INTO outbox.subscriptions (id, url, headers, secret) VALUES ($1, $2, $3, $4)",
    )
    .bind(id)
    .bind(rx.url("/legacy"))
    .bind(Value::Object(clear.clone()))
    .bind(key().seal(id, &secret))
    .execute(db.pool())
    .await
    .unwrap();

    // the migration has no key: it keeps the values, and copies the names
    db.store.migrate().await.unwrap();
    let (held, names, sealed): (Value, Vec<String>, Option<Vec<u8>>) = sqlx::query_as(
        "SELECT headers, header_names, headers_sealed FROM outbox.subscriptions WHERE id = $1",
    )
    .bind(id)
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(held, Value::Object(clear.clone()));
    assert_eq!(names, ["Authorization", "X-Team"]);
    assert_eq!(sealed, None);
    let out = relay_cli(&db, &["subscriptions", "show", id, "--json"]).await;
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["header_names"], json!(["Authorization", "X-Team"]));
    assert!(!String::from_utf8_lossy(&out.stdout).contains(VALUE));

    // no statement writes a value in clear; the row's other columns change
    let refused = sqlx::query(
        "INSERT INTO outbox.subscriptions (id, url, headers, secret)
         VALUES ('sub_NewClear00000001', 'http://127.0.0.1:9/x', '{\"X-A\": \"b\"}', '\\x00')",
    )
    .execute(db.pool())
    .await;
    assert_eq!(sqlstate(refused), "23514");
    let refused =
        sqlx::query("UPDATE outbox.subscriptions SET headers = '{\"X-A\": \"b\"}' WHERE id = $1")
            .bind(id)
            .execute(db.pool())
            .await;
    assert_eq!(sqlstate(refused), "23514");
    sqlx::query("UPDATE outbox.subscriptions SET description = 'made early' WHERE id = $1")
        .bind(id)
        .execute(db.pool())
        .await
        .expect("a row in clear keeps changing otherwise");

    // the relay seals them as it starts, and delivers with them
    let (delivered, log) = one_delivered_by_a_relay(&db, "legacy").await;
    assert!(delivered, "the delivery; the relay logged:\n{log}");
    assert!(
        log.contains("sealed the header values of subscriptions that held them in clear"),
        "{log}"
    );
    assert!(!log.contains(VALUE), "the relay logged a header's value");
    let requests = rx.requests();
    assert_eq!(requests.len(), 1);
    let r = &requests[0];
    assert_eq!(r.header("authorization").as_deref(), Some(bearer.as_str()));
    assert_eq!(r.header("x-team").as_deref(), Some("billing"));
    assert!(verifies(r, secret.expose()));
    assert_sealed(&db, id, &clear).await;
    assert_eq!(elsewhere(&db).await, Vec::<String>::new());
    // a relay built for 0029 alone, which reads its target's headers from
    // `headers`, cannot read this one (rather than send it without them)
    let read_as_0029 = sqlx::query_as::<_, (String, sqlx::types::Json<Map<String, Value>>)>(
        "SELECT url, headers FROM outbox.subscriptions WHERE id = $1",
    )
    .bind(id)
    .fetch_one(db.pool())
    .await;
    assert!(read_as_0029.is_err(), "{read_as_0029:?}");

    // sealed once: a relay starting again finds nothing in clear
    let before: Vec<u8> =
        sqlx::query_scalar("SELECT headers_sealed FROM outbox.subscriptions WHERE id = $1")
            .bind(id)
            .fetch_one(db.pool())
            .await
            .unwrap();
    outbox_relay::services::subscriptions::check_key(&db.store, &events_config())
        .await
        .unwrap();
    let after: Vec<u8> =
        sqlx::query_scalar("SELECT headers_sealed FROM outbox.subscriptions WHERE id = $1")
            .bind(id)
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(before, after);
}

#[tokio::test]
async fn headers_that_do_not_open_refuse_the_delivery_and_the_relay_start() {
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    let (id, _) = subscribe(
        &db,
        &[
            "--url",
            &rx.url("/hook"),
            "--header",
            &format!("Authorization: Bearer {VALUE}"),
        ],
    )
    .await;
    // its sealed secret where its headers were: sealed for another use, it
    // does not open as headers
    sqlx::query("UPDATE outbox.subscriptions SET headers_sealed = secret WHERE id = $1")
        .bind(&id)
        .execute(db.pool())
        .await
        .unwrap();
    publish(&db, "order-1", "order.paid", json!({"order": 1}), None)
        .await
        .unwrap();
    let cfg = events_config();
    run_until(engine(db.store.clone(), &cfg), LIMIT, || async {
        deliveries_in(&db, "dead").await == 1
    })
    .await;
    assert!(rx.requests().is_empty(), "never sent without its headers");
    let error: String = sqlx::query_scalar(
        "SELECT last_error FROM outbox.intents
          WHERE id IN (SELECT intent_id FROM outbox.event_deliveries)",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert!(
        error.contains(&format!("does not open subscription {id}'s headers")),
        "{error}"
    );

    // nor does a relay start
    let err = outbox_relay::services::subscriptions::check_key(&db.store, &cfg)
        .await
        .unwrap_err();
    let err = format!("{err:#}");
    assert!(err.contains(&format!("{id}'s headers")), "{err}");
    assert!(!err.contains(VALUE), "{err}");
}

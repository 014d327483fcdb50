//! Every CLI verb against a real database, through the real binary.

use crate::common;
use crate::common::{relay_bin, Receiver, TestDb};
use serde_json::{json, Value};

pub(crate) struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.stdout))
    }
}

pub(crate) async fn cli_env(db_url: Option<&str>, args: &[&str], env: &[(&str, &str)]) -> Out {
    let mut cmd = tokio::process::Command::new(relay_bin());
    cmd.args(args)
        .env_remove("DATABASE_URL")
        .env_remove("OUTBOX_RELAY_CONFIG")
        .env(
            "OUTBOX_RELAY__WEBHOOK__ALLOWED_NETWORKS",
            "[\"127.0.0.0/8\"]",
        )
        .env("OUTBOX_RELAY__RELAY__METRICS_ADDR", "\"127.0.0.1:0\"")
        .env("RUST_LOG", "warn");
    if let Some(url) = db_url {
        cmd.env("DATABASE_URL", url);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().await.expect("run outbox-relay");
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

async fn cli(db: &TestDb, args: &[&str]) -> Out {
    cli_env(Some(&db.url), args, &[]).await
}

async fn ok(db: &TestDb, args: &[&str]) -> Out {
    let out = cli(db, args).await;
    assert_eq!(out.code, 0, "{args:?} failed: {}{}", out.stdout, out.stderr);
    out
}

fn payload(rx: &Receiver, path: &str) -> String {
    json!({"url": rx.url(path), "body": {"hello": "world"}}).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_enqueue_list_show() {
    let db = TestDb::new().await;
    let latest = outbox_relay::store::MIGRATOR
        .iter()
        .map(|m| m.version)
        .max()
        .unwrap();
    // the harness migrated it: nothing to apply, and `migrate` says so
    let current = ok(&db, &["migrate"]).await.stdout;
    assert_eq!(
        current.trim(),
        format!("the schema is current (version {latest})")
    );
    // from an empty database it names each migration it applies
    sqlx::query("DROP SCHEMA outbox CASCADE")
        .execute(db.pool())
        .await
        .unwrap();
    sqlx::query("DROP TABLE _sqlx_migrations")
        .execute(db.pool())
        .await
        .unwrap();
    let applied = ok(&db, &["migrate"]).await.stdout;
    assert!(applied.starts_with("applied 0001 core\n"), "{applied}");
    assert!(
        applied.ends_with(&format!(
            "applied {} migration(s); the schema is at version {latest}\n",
            outbox_relay::store::MIGRATOR.iter().count()
        )),
        "{applied}"
    );
    assert!(ok(&db, &["migrate"]).await.stdout.contains("is current")); // idempotent

    let p = r#"{"url":"http://127.0.0.1:9/x","body":{"a":1,"b":2}}"#;
    let first = ok(
        &db,
        &[
            "enqueue",
            "--key",
            "cli:1",
            "--kind",
            "webhook",
            "--payload",
            p,
            "--json",
        ],
    )
    .await
    .json();
    assert_eq!(first["duplicate"], false);
    let reordered = r#"{ "body": {"b":2, "a":1}, "url":"http://127.0.0.1:9/x" }"#;
    let again = ok(
        &db,
        &[
            "enqueue",
            "--key",
            "cli:1",
            "--kind",
            "webhook",
            "--payload",
            reordered,
            "--json",
        ],
    )
    .await
    .json();
    assert_eq!(
        (again["id"].clone(), again["duplicate"].clone()),
        (first["id"].clone(), json!(true))
    );

    let conflict = cli(
        &db,
        &[
            "enqueue",
            "--key",
            "cli:1",
            "--kind",
            "webhook",
            "--payload",
            r#"{"body":3}"#,
        ],
    )
    .await;
    assert_eq!(conflict.code, 4, "{}", conflict.stderr);
    assert!(
        conflict.stderr.contains("cli:1") && conflict.stderr.contains("different intent"),
        "{}",
        conflict.stderr
    );

    let bad = cli(
        &db,
        &[
            "enqueue",
            "--key",
            "cli:2",
            "--kind",
            "webhook",
            "--payload",
            "{nope",
        ],
    )
    .await;
    assert_eq!(bad.code, 2);
    assert!(
        bad.stderr.contains("--payload is not valid JSON"),
        "{}",
        bad.stderr
    );

    // over the size limit (SQLSTATE OB413): invalid input, named plainly
    let big = common::config_file(
        &json!({"url": "http://127.0.0.1:9/x", "body": "x".repeat(1 << 20)}).to_string(),
    );
    let too_large = cli(
        &db,
        &[
            "enqueue",
            "--key",
            "cli:big",
            "--kind",
            "webhook",
            "--payload",
            &format!("@{}", big.display()),
        ],
    )
    .await;
    std::fs::remove_file(big).ok();
    assert_eq!(too_large.code, 2, "{}", too_large.stderr);
    assert!(
        too_large.stderr.contains(
            "payload for key cli:big is 1048619 bytes; the limit is 1048576 bytes (1 MiB)"
        ) && too_large.stderr.contains("store large content elsewhere"),
        "{}",
        too_large.stderr
    );

    ok(
        &db,
        &[
            "enqueue",
            "--key",
            "cli:later",
            "--kind",
            "webhook",
            "--payload",
            p,
            "--run-after",
            "1h",
            "--ordering-key",
            "o1",
            "--source",
            "checkout",
        ],
    )
    .await;

    let list = ok(&db, &["list", "--json"]).await.json();
    assert_eq!(list.as_array().unwrap().len(), 2);
    assert_eq!(list[0]["key"], "cli:later", "newest first");
    let pending = ok(
        &db,
        &[
            "list", "--state", "pending", "--kind", "webhook", "--limit", "1", "--json",
        ],
    )
    .await
    .json();
    assert_eq!(pending.as_array().unwrap().len(), 1);
    let table = ok(&db, &["list"]).await.stdout;
    assert!(
        table.starts_with("ID") && table.contains("cli:later"),
        "{table}"
    );
    assert_eq!(cli(&db, &["list", "--state", "bogus"]).await.code, 2);

    let shown = ok(&db, &["show", "cli:later", "--json"]).await.json();
    assert_eq!(shown["intent"]["ordering_key"], "o1");
    assert_eq!(shown["intent"]["source"], "checkout");
    let by_id = ok(&db, &["show", &first["id"].to_string(), "--json"])
        .await
        .json();
    assert_eq!(by_id["intent"]["key"], "cli:1");
    assert_eq!(by_id["intent"]["duplicates"], 1);
    let human = ok(&db, &["show", "cli:1"]).await.stdout;
    assert!(human.contains("state           pending"), "{human}");

    let missing = cli(&db, &["show", "no-such-key"]).await;
    assert_eq!(missing.code, 3);
    assert!(missing.stderr.contains("no-such-key"));
}

/// `list` cuts a long last error from the middle: the end of a reason is
/// usually what to do about it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_keeps_the_end_of_a_long_error() {
    let db = TestDb::new().await;
    db.enqueue(
        "guarded",
        "webhook",
        json!({"url": "http://127.0.0.1:9/x", "body": 1}),
    )
    .await;
    // the destination guard refuses loopback when nothing is allowed
    let no_exceptions = [("OUTBOX_RELAY__WEBHOOK__ALLOWED_NETWORKS", "[]")];
    let run = cli_env(Some(&db.url), &["run", "--once"], &no_exceptions).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let reason = db.store.find("guarded").await.unwrap().last_error.unwrap();
    assert!(reason.len() > 80, "{reason}");
    let table = ok(&db, &["list"]).await.stdout;
    let column = table.lines().next().unwrap().find("LAST ERROR").unwrap();
    let row = table.lines().find(|l| l.contains("guarded")).unwrap();
    let shown = &row[column..];
    assert!(
        shown.starts_with("destination address 127.0.0.1 is")
            && shown.contains('…')
            && shown.ends_with("webhook.allowed_networks to allow it"),
        "{row}"
    );
    assert_eq!(shown.chars().count(), 80, "{row}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_once_retry_and_new_effect() {
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    ok(
        &db,
        &[
            "enqueue",
            "--key",
            "r:1",
            "--kind",
            "webhook",
            "--payload",
            &payload(&rx, "/a"),
        ],
    )
    .await;
    ok(&db, &["run", "--once"]).await;
    assert_eq!(db.state("r:1").await, "delivered");

    // a delivered intent is re-sent only when forced, saying what that means
    let refused = cli(&db, &["retry", "r:1"]).await;
    assert_eq!(refused.code, 4, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("is delivered")
            && refused.stderr.contains("same idempotency key")
            && refused.stderr.contains("replays its first answer")
            && refused.stderr.contains("performs the effect again")
            && refused.stderr.contains("--force"),
        "{}",
        refused.stderr
    );
    assert_eq!(db.state("r:1").await, "delivered");
    let dry = ok(&db, &["retry", "r:1", "--dry-run", "--json"])
        .await
        .json();
    assert_eq!(
        (dry[0]["would_retry"].clone(), dry[0]["needs_force"].clone()),
        (json!(false), json!(true))
    );
    let dry = ok(&db, &["retry", "r:1", "--dry-run", "--force", "--json"])
        .await
        .json();
    assert_eq!(dry[0]["would_retry"], true);
    assert_eq!(
        db.state("r:1").await,
        "delivered",
        "a dry run changes nothing"
    );
    assert_eq!(rx.requests().len(), 1);

    // retry reuses the key...
    let retried = ok(&db, &["retry", "r:1", "--force", "--json"]).await.json();
    assert_eq!(
        (
            retried[0]["state"].clone(),
            retried[0]["key_generation"].clone()
        ),
        (json!("pending"), json!(0))
    );
    ok(&db, &["run", "--once"]).await;
    // ...unless a new effect is asked for explicitly
    let fresh = ok(&db, &["retry", "r:1", "--new-effect", "--force", "--json"])
        .await
        .json();
    assert_eq!(fresh[0]["key_generation"], 1);
    ok(&db, &["run", "--once"]).await;
    let ids: Vec<String> = rx.requests().iter().map(|r| r.webhook_id()).collect();
    assert_eq!(ids.len(), 3);
    assert_eq!(ids[0], ids[1], "operator retry: same webhook-id");
    assert_ne!(ids[1], ids[2], "--new-effect: a new webhook-id");

    let shown = ok(&db, &["show", "r:1", "--json"]).await.json();
    assert_eq!(shown["attempts"].as_array().unwrap().len(), 3);
    let actions = shown["operator_actions"].as_array().unwrap();
    assert_eq!(actions.len(), 2);
    assert_eq!(actions[1]["detail"]["new_effect"], true);
    assert_eq!(actions[1]["detail"]["from"], "delivered");
    let human = ok(&db, &["show", "r:1"]).await.stdout;
    assert!(
        human.contains("OUTCOME") && human.contains("delivered"),
        "{human}"
    );

    // a live claim cannot be retried
    ok(
        &db,
        &[
            "enqueue",
            "--key",
            "r:2",
            "--kind",
            "webhook",
            "--payload",
            &payload(&rx, "/b"),
        ],
    )
    .await;
    db.store.claim("someone", 10, 60_000, &[]).await.unwrap();
    let busy = cli(&db, &["retry", "r:2"]).await;
    assert_eq!(busy.code, 4, "{}", busy.stderr);
    assert!(busy.stderr.contains("in flight"));
    assert_eq!(cli(&db, &["retry", "nope"]).await.code, 3);
}

/// A change reads back the intent it changed, also when another intent's
/// key is that intent's id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_reports_the_intent_it_changed() {
    let db = TestDb::new().await;
    let target = json!({"url": "http://127.0.0.1:9/", "body": 1});
    let id = db.enqueue("by-key", "webhook", target.clone()).await;
    db.enqueue(&id.to_string(), "webhook", target).await;
    let cancelled = ok(&db, &["cancel", "by-key", "--json"]).await.json();
    assert_eq!(
        (cancelled[0]["id"].clone(), cancelled[0]["key"].clone()),
        (json!(id), json!("by-key"))
    );
    assert_eq!(cancelled[0]["state"], "cancelled");
    let retried = ok(&db, &["retry", "by-key", "--json"]).await.json();
    assert_eq!(
        (retried[0]["key"].clone(), retried[0]["state"].clone()),
        (json!("by-key"), json!("pending"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_retry_by_state_with_dry_run() {
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    for n in 0..5 {
        db.enqueue(
            &format!("d:{n}"),
            "webhook",
            json!({"url": rx.url("/"), "body": n}),
        )
        .await;
    }
    sqlx::query("UPDATE outbox.intents SET state = 'dead', attempts = 10, last_error = 'gave up'")
        .execute(db.pool())
        .await
        .unwrap();
    let dry = ok(
        &db,
        &[
            "retry",
            "--state",
            "dead",
            "--kind",
            "webhook",
            "--dry-run",
            "--json",
        ],
    )
    .await
    .json();
    assert_eq!(dry["would_retry"], 5);
    assert_eq!(
        db.count("state = 'dead'").await,
        5,
        "dry run changes nothing"
    );
    let out = ok(&db, &["retry", "--state", "dead"]).await;
    assert!(out.stdout.contains("retried 5 intent(s)"), "{}", out.stdout);
    assert!(
        out.stderr.contains("retrying: 5/5"),
        "progress is shown: {}",
        out.stderr
    );
    assert_eq!(
        db.count("state = 'pending' AND attempts_base = 10").await,
        5
    );
    ok(&db, &["run", "--once"]).await;
    assert_eq!(db.count("state = 'delivered'").await, 5);

    // re-sending delivered intents in bulk needs --force; a dry run does not
    let refused = cli(&db, &["retry", "--state", "delivered"]).await;
    assert_eq!(refused.code, 4, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("5 delivered intent(s) match")
            && refused.stderr.contains("same idempotency key")
            && refused.stderr.contains("--force"),
        "{}",
        refused.stderr
    );
    let dry = ok(
        &db,
        &["retry", "--state", "delivered", "--dry-run", "--json"],
    )
    .await
    .json();
    assert_eq!(
        (dry["matched"].clone(), dry["needs_force"].clone()),
        (json!(5), json!(true))
    );
    assert_eq!(db.count("state = 'delivered'").await, 5);
    let out = ok(&db, &["retry", "--state", "delivered", "--force"]).await;
    assert!(out.stdout.contains("retried 5 intent(s)"), "{}", out.stdout);
    assert_eq!(db.count("state = 'pending'").await, 5);
    assert_eq!(rx.requests().len(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_resolve_stats_purge() {
    let db = TestDb::new().await;
    for key in ["c:pending", "c:amb1", "c:amb2", "c:amb3", "c:done"] {
        db.enqueue(
            key,
            "webhook",
            json!({"url": "http://127.0.0.1:9/", "body": key}),
        )
        .await;
    }
    // ambiguous and delivered states as a parked email or a finished delivery would leave them
    sqlx::query("UPDATE outbox.intents SET state = 'ambiguous', last_error = 'lost after DATA' WHERE key LIKE 'c:amb%'")
        .execute(db.pool())
        .await
        .unwrap();
    sqlx::query(
        "UPDATE outbox.intents SET state = 'delivered', delivered_at = now() WHERE key = 'c:done'",
    )
    .execute(db.pool())
    .await
    .unwrap();

    let cancelled = ok(&db, &["cancel", "c:pending", "--json"]).await.json();
    assert_eq!(cancelled[0]["state"], "cancelled");
    let refused = cli(&db, &["cancel", "c:done"]).await;
    assert_eq!(refused.code, 4, "a delivered intent cannot be cancelled");
    assert_eq!(cli(&db, &["cancel", "nope"]).await.code, 3);

    let r = ok(
        &db,
        &[
            "resolve",
            "c:amb1",
            "--delivered",
            "--ref",
            "queue-id-77",
            "--json",
        ],
    )
    .await
    .json();
    assert_eq!(
        (r["state"].clone(), r["provider_ref"].clone()),
        (json!("delivered"), json!("queue-id-77"))
    );
    ok(
        &db,
        &["resolve", "c:amb2", "--reject", "customer asked us not to"],
    )
    .await;
    let rejected = db.store.find("c:amb2").await.unwrap();
    assert_eq!(rejected.state, "rejected");
    assert!(rejected
        .last_error
        .unwrap()
        .contains("customer asked us not to"));
    ok(&db, &["resolve", "c:amb3", "--redeliver"]).await;
    assert_eq!(db.state("c:amb3").await, "pending");
    assert_eq!(
        cli(&db, &["resolve", "c:amb3", "--delivered"]).await.code,
        4,
        "only ambiguous or dead"
    );
    assert_eq!(
        cli(&db, &["resolve", "c:amb3"]).await.code,
        2,
        "a resolution is required"
    );
    let shown = ok(&db, &["show", "c:amb1", "--json"]).await.json();
    assert_eq!(shown["operator_actions"][0]["action"], "resolve");

    let stats = ok(&db, &["stats", "--json"]).await.json();
    let count = |state: &str| {
        stats["by_state"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["state"] == state)
            .map_or(0, |r| r["count"].as_i64().unwrap())
    };
    assert_eq!(
        (
            count("delivered"),
            count("rejected"),
            count("cancelled"),
            count("pending")
        ),
        (2, 1, 1, 1)
    );
    assert_eq!(stats["due"][0]["due"], 1);
    let human = ok(&db, &["stats"]).await.stdout;
    assert!(
        human.contains("KIND") && human.contains("webhook"),
        "{human}"
    );

    let dry = ok(&db, &["purge", "--older-than", "0s", "--dry-run", "--json"])
        .await
        .json();
    assert_eq!(dry["matched"], 4);
    assert_eq!(db.count("true").await, 5);
    let purged = ok(&db, &["purge", "--older-than", "0s"]).await;
    assert!(purged.stdout.contains("purged 4"), "{}", purged.stdout);
    assert_eq!(db.count("true").await, 1, "only the pending intent is left");
    ok(&db, &["purge", "--older-than", "30d"]).await;
    assert_eq!(cli(&db, &["purge", "--older-than", "soon"]).await.code, 2);
}

/// `--help` names the environment variables without a dangling `=` (and
/// without their values: DATABASE_URL may carry a password).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn help_names_the_environment_variables_plainly() {
    for env in [
        vec![],
        vec![("OUTBOX_RELAY_CONFIG", "/etc/outbox-relay/x.toml")],
    ] {
        for args in [&["--help"][..], &["run", "--help"], &["retry", "--help"]] {
            let out = cli_env(Some("postgres://u:hunter2@h/db"), args, &env).await;
            assert_eq!(out.code, 0, "{}", out.stderr);
            assert!(
                out.stdout.contains("[env: OUTBOX_RELAY_CONFIG]")
                    && out.stdout.contains("[env: DATABASE_URL]"),
                "{args:?}: {}",
                out.stdout
            );
            assert!(!out.stdout.contains("=]"), "{}", out.stdout);
            assert!(!out.stdout.contains("hunter2") && !out.stdout.contains("x.toml"));
        }
    }
}

/// Every operator change logs one info line: the action, which intent or
/// how many, the new state; never the payload or a rejection's reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_actions_log_one_line_each() {
    let db = TestDb::new().await;
    let marker = "payload-marker-never-logged";
    let mut ids = Vec::new();
    for key in ["log:a", "log:b", "log:c"] {
        let target = json!({"url": "http://127.0.0.1:9/", "body": marker});
        ids.push(db.enqueue(key, "webhook", target).await);
    }
    sqlx::query("UPDATE outbox.intents SET state = 'ambiguous' WHERE key = 'log:b'")
        .execute(db.pool())
        .await
        .unwrap();
    sqlx::query("UPDATE outbox.intents SET state = 'dead' WHERE key = 'log:c'")
        .execute(db.pool())
        .await
        .unwrap();
    let info = [("RUST_LOG", "info")];
    let logged = |args: &'static [&'static str], want: &'static [&'static str]| {
        let url = db.url.clone();
        async move {
            let out = cli_env(Some(&url), args, &info).await;
            assert_eq!(out.code, 0, "{args:?}: {}", out.stderr);
            let lines: Vec<&str> = out
                .stderr
                .lines()
                .filter(|l| l.contains("operator"))
                .collect();
            assert_eq!(lines.len(), 1, "{args:?}: {}", out.stderr);
            assert!(lines[0].contains(" INFO "), "{}", lines[0]);
            for w in want {
                assert!(lines[0].contains(w), "{args:?}: {w:?} not in {}", lines[0]);
            }
            assert!(!out.stderr.contains(marker), "{}", out.stderr);
            out.stderr
        }
    };
    let a = format!("intent={}", ids[0]);
    let out = logged(
        &["cancel", "log:a"],
        &["operator cancel", "key=log:a", "state=cancelled"],
    )
    .await;
    assert!(out.contains(&a), "{out}");
    let out = logged(
        &["resolve", "log:b", "--reject", "reason-not-logged"],
        &[
            "operator resolve",
            "resolution=\"reject\"",
            "key=log:b",
            "state=rejected",
        ],
    )
    .await;
    assert!(!out.contains("reason-not-logged"), "{out}");
    logged(
        &["retry", "log:c"],
        &[
            "operator retry",
            "key=log:c",
            "state=pending",
            "force=false",
        ],
    )
    .await;
    logged(
        &["retry", "--state", "rejected"],
        &[
            "operator retry: 1 intent(s)",
            "count=1",
            "from=rejected",
            "state=pending",
        ],
    )
    .await;
    logged(
        &["purge", "--older-than", "0s"],
        &["operator purge: 1 intent(s)", "count=1", "older_than=0s"],
    )
    .await;
    // a dry run changes nothing and logs nothing
    let dry = cli_env(
        Some(&db.url),
        &["purge", "--older-than", "0s", "--dry-run"],
        &info,
    )
    .await;
    assert!(!dry.stderr.contains("operator"), "{}", dry.stderr);
}

/// Logs written to a pipe (or a file) carry no colour codes; NO_COLOR is
/// honoured too (the terminal case is the unit test in telemetry.rs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_to_a_pipe_are_plain_text() {
    let db = TestDb::new().await;
    for env in [
        vec![("RUST_LOG", "debug")],
        vec![("RUST_LOG", "debug"), ("NO_COLOR", "1")],
    ] {
        let out = cli_env(Some(&db.url), &["run", "--once"], &env).await;
        assert_eq!(out.code, 0, "{}", out.stderr);
        assert!(out.stderr.contains("DEBUG"), "{}", out.stderr);
        assert!(!out.stderr.contains('\x1b'), "{:?}", out.stderr);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_name_the_problem_and_exit_codes_mean_something() {
    let none = cli_env(None, &["stats"], &[]).await;
    assert_eq!(none.code, 2);
    assert!(none.stderr.contains("DATABASE_URL"), "{}", none.stderr);

    let down = cli_env(
        Some("postgres://postgres:s3cret@127.0.0.1:1/x"),
        &["stats"],
        &[],
    )
    .await;
    assert_eq!(down.code, 5, "{}", down.stderr);
    assert!(
        down.stderr
            .contains("cannot connect to Postgres at 127.0.0.1:1"),
        "{}",
        down.stderr
    );
    assert!(!down.stderr.contains("s3cret"), "the password never prints");

    // a URL that is not a usable Postgres URL is invalid configuration (2),
    // said once, naming what was given but never its password
    for (url, needle) in [
        (
            "mysql://root:s3cret@127.0.0.1/app",
            "the database URL is a mysql:// URL; the relay needs PostgreSQL: postgres:// or postgresql://",
        ),
        (
            "postgres://postgres:s3cret@127.0.0.1:5432/x?sslmode=bogus",
            "not a valid Postgres URL: unknown value \"bogus\" for `ssl_mode`",
        ),
        ("postgres://postgres:s3cret@127.0.0.1:port/x", "the database URL is not a URL (invalid port number)"),
        ("s3cret", "the database URL is not a URL"),
    ] {
        for out in [
            cli_env(Some(url), &["stats"], &[]).await,
            cli_env(None, &["--database-url", url, "list"], &[]).await,
        ] {
            assert_eq!(out.code, 2, "{url}: {}", out.stderr);
            assert!(out.stderr.contains(needle), "{url}: {}", out.stderr);
            assert!(!out.stderr.contains("s3cret"), "{}", out.stderr);
            assert!(
                !out.stderr.contains("error with configuration"),
                "{}",
                out.stderr
            );
        }
    }

    let cfg = common::config_file("[relay]\nconcurency = 4\n");
    let bad = cli_env(
        Some("postgres://127.0.0.1:1/x"),
        &["--config", cfg.to_str().unwrap(), "stats"],
        &[],
    )
    .await;
    assert_eq!(bad.code, 2);
    assert!(bad.stderr.contains("concurency"), "{}", bad.stderr);
    std::fs::remove_file(cfg).ok();
    // a bad override from the environment names its variable
    let bad = cli_env(
        Some("postgres://127.0.0.1:1/x"),
        &["stats"],
        &[("OUTBOX_RELAY__RELAY__CONCURRENCY", "lots")],
    )
    .await;
    assert_eq!(bad.code, 2);
    assert!(
        bad.stderr
            .contains("in environment variable OUTBOX_RELAY__RELAY__CONCURRENCY: "),
        "{}",
        bad.stderr
    );

    // the URL from a file (a mounted secret); its password never prints
    let url_file = common::config_file("postgres://postgres:s3cret@127.0.0.1:1/x\n");
    let from_file = cli_env(
        None,
        &["stats"],
        &[("DATABASE_URL_FILE", url_file.to_str().unwrap())],
    )
    .await;
    assert_eq!(from_file.code, 5, "{}", from_file.stderr);
    assert!(
        from_file.stderr.contains("127.0.0.1:1"),
        "{}",
        from_file.stderr
    );
    assert!(!from_file.stderr.contains("s3cret"), "{}", from_file.stderr);
    std::fs::remove_file(url_file).ok();
    let unreadable = cli_env(
        None,
        &["stats"],
        &[("DATABASE_URL_FILE", "/nonexistent/db-url")],
    )
    .await;
    assert_eq!(unreadable.code, 2);
    assert!(
        unreadable
            .stderr
            .contains("DATABASE_URL_FILE: cannot read /nonexistent/db-url"),
        "{}",
        unreadable.stderr
    );

    let db = TestDb::new().await;
    sqlx::query("DROP SCHEMA outbox CASCADE")
        .execute(db.pool())
        .await
        .unwrap();
    let unmigrated = cli(&db, &["list"]).await;
    assert_eq!(unmigrated.code, 1);
    assert!(
        unmigrated.stderr.contains("outbox-relay migrate"),
        "{}",
        unmigrated.stderr
    );
}

/// A number that is one intent's id and another's key (live, or purged
/// into the ledger) names neither: `show`, `cancel` and `retry` refuse it
/// with both candidates, and `id:N` and `key:K` say which.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_number_that_is_an_id_and_a_key_is_refused_until_id_or_key_says_which() {
    let db = TestDb::new().await;
    let later = db
        .enqueue(
            "order-later",
            "webhook",
            json!({"url": "http://127.0.0.1:9/"}),
        )
        .await;
    let number = later.to_string();
    // an intent whose key is that number, delivered and purged
    let purged = db
        .enqueue(&number, "webhook", json!({"url": "http://127.0.0.1:9/"}))
        .await;
    sqlx::query(
        "UPDATE outbox.intents SET state = 'delivered', delivered_at = now(),
                provider_ref = 'ref-of-the-number' WHERE id = $1",
    )
    .bind(purged)
    .execute(db.pool())
    .await
    .unwrap();
    db.store
        .purge(std::time::Duration::ZERO, false, false, 100)
        .await
        .unwrap();
    assert_eq!(db.count("true").await, 1);

    for verb in [
        vec!["show", number.as_str()],
        vec!["cancel", number.as_str()],
        vec!["retry", number.as_str()],
        vec!["resolve", number.as_str(), "--redeliver"],
    ] {
        let out = cli(&db, &verb).await;
        assert_eq!(out.code, 2, "{verb:?}: {}{}", out.stdout, out.stderr);
        for candidate in [
            format!("intent {later} with key \"order-later\" (id:{later})"),
            format!("purged intent {purged} with key \"{number}\" (key:{number})"),
        ] {
            assert!(out.stderr.contains(&candidate), "{verb:?}: {}", out.stderr);
        }
    }
    assert_eq!(
        db.count("key = 'order-later' AND state = 'pending'").await,
        1,
        "a refused reference changed an intent"
    );

    let by_key = ok(&db, &["show", &format!("key:{number}"), "--json"])
        .await
        .json();
    assert_eq!(
        (
            by_key["source"].as_str(),
            by_key["provider_ref"].as_str(),
            by_key["intent_id"].as_i64()
        ),
        (Some("ledger"), Some("ref-of-the-number"), Some(purged)),
        "{by_key}"
    );
    let by_id = ok(&db, &["show", &format!("id:{later}"), "--json"])
        .await
        .json();
    assert_eq!(by_id["intent"]["key"], "order-later", "{by_id}");
    ok(&db, &["cancel", &format!("id:{later}")]).await;
    assert_eq!(
        db.count("key = 'order-later' AND state = 'cancelled'")
            .await,
        1
    );
    // a purged intent cannot be cancelled, by whatever name
    let out = cli(&db, &["cancel", &format!("key:{number}")]).await;
    assert_eq!(out.code, 3, "{}{}", out.stdout, out.stderr);

    // two live intents: one's id is the other's key
    let first = db
        .enqueue("first", "webhook", json!({"url": "http://127.0.0.1:9/"}))
        .await;
    db.enqueue(
        &first.to_string(),
        "webhook",
        json!({"url": "http://127.0.0.1:9/"}),
    )
    .await;
    let out = cli(&db, &["show", &first.to_string()]).await;
    assert_eq!(out.code, 2, "{}{}", out.stdout, out.stderr);
    let shown = ok(&db, &["show", &format!("key:{first}"), "--json"])
        .await
        .json();
    assert_eq!(shown["intent"]["key"], first.to_string().as_str());
    // a number no key shares is an id, as before
    let only = db
        .enqueue("only", "webhook", json!({"url": "http://127.0.0.1:9/"}))
        .await;
    let shown = ok(&db, &["show", &only.to_string(), "--json"]).await.json();
    assert_eq!(shown["intent"]["key"], "only");
}

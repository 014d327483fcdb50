//! What the CLI says: its help, its logs to a pipe, and errors that name
//! the problem with exit codes that mean something.

use super::*;

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

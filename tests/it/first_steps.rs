//! What a newcomer meets first, through the real binary: `migrate` says
//! what it did, `enqueue` warns at once about a kind no relay will deliver,
//! and the verbs that only read and change intents are not stopped by a
//! provider setting meant for the daemon.

use serde_json::json;

use crate::cli::cli_env;
use crate::common::TestDb;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_warns_at_once_about_a_kind_no_relay_knows() {
    let db = TestDb::new().await;
    let payload = json!({"to": ["a@example.com"], "subject": "s", "text": "t"}).to_string();
    let args = |key: &'static str, kind: &'static str| {
        ["enqueue", "--key", key, "--kind", kind, "--payload"]
            .map(String::from)
            .into_iter()
            .chain([payload.clone()])
            .collect::<Vec<_>>()
    };
    let run = |a: Vec<String>| {
        let url = db.url.clone();
        async move {
            let a: Vec<&str> = a.iter().map(String::as_str).collect();
            cli_env(Some(&url), &a, &[]).await
        }
    };

    // no relay is live: this build's kinds are the measure
    let typo = run(args("first:1", "emial")).await;
    assert_eq!(typo.code, 0, "the intent is enqueued: {}", typo.stderr);
    assert!(
        typo.stdout.starts_with("enqueued intent "),
        "{}",
        typo.stdout
    );
    assert!(
        typo.stderr.contains(
            "warning: no kind \"emial\" (did you mean email?): this relay knows webhook, email, \
             charge, nats, amqp, kafka, event; a relay will reject this intent when it claims it"
        ),
        "{}",
        typo.stderr
    );
    let fine = run(args("first:2", "email")).await;
    assert_eq!(fine.code, 0);
    assert!(!fine.stderr.contains("warning"), "{}", fine.stderr);

    // a live relay that knows email but delivers webhooks only
    db.store
        .register_relay("relay-a", "test", &["webhook"], &["webhook", "email"])
        .await
        .unwrap();
    let waits = run(args("first:3", "email")).await;
    assert_eq!(waits.code, 0);
    assert!(
        waits.stderr.contains(
            "warning: no live relay delivers email intents (they deliver webhook); \
             this one waits until one does"
        ),
        "{}",
        waits.stderr
    );
    let unknown = run(args("first:4", "nats")).await;
    assert!(
        unknown
            .stderr
            .contains("no kind \"nats\": the live relays know email, webhook"),
        "{}",
        unknown.stderr
    );
    assert_eq!(
        db.count("key LIKE 'first:%'").await,
        4,
        "every one enqueued"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_verbs_ignore_provider_settings_they_do_not_use() {
    let db = TestDb::new().await;
    // a pod's environment shares the daemon's AMQP password, but not the
    // file that holds amqp.url
    let env = [("OUTBOX_RELAY__AMQP__PASSWORD", "\"s3cret\"")];
    for verb in [&["migrate"][..], &["list"], &["stats"], &["relays"]] {
        let out = cli_env(Some(&db.url), verb, &env).await;
        assert_eq!(out.code, 0, "{verb:?}: {}", out.stderr);
    }
    // the daemon, which would deliver, still refuses the half setting
    let run = cli_env(Some(&db.url), &["run", "--once"], &env).await;
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(
        run.stderr
            .contains("amqp.password is set but amqp.url is not"),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains("s3cret"), "{}", run.stderr);
}

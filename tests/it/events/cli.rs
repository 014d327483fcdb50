//! `outbox-relay subscriptions`: bad input refused by field, secrets shown
//! once, and a relay that cannot sign refusing to start.

use super::*;
use crate::common::{config_file, relay_command};

fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test]
async fn every_bad_field_is_refused_with_its_name_and_nothing_is_made() {
    let db = TestDb::new().await;
    let url = "http://127.0.0.1:9/hook";
    let cases: &[(&[&str], &str)] = &[
        (&["--url", "ftp://127.0.0.1/x"], "url: "),
        (&["--url", "http://10.0.0.1/x"], "url: "),
        (&["--url", "http://user:pw@127.0.0.1/x"], "url: "),
        (&["--url", url, "--tenant", ""], "tenant: "),
        (
            &["--url", url, "--event-types", "order.**"],
            "event-types: ",
        ),
        (&["--url", url, "--event-types", "a,a"], "event-types: "),
        (&["--url", url, "--header", "no colon"], "header: "),
        (&["--url", url, "--header", "webhook-id: x"], "header: "),
        (
            &["--url", url, "--header", "X-A: 1", "--header", "X-A: 2"],
            "header: ",
        ),
        (&["--url", url, "--rate", "lots"], "rate: "),
        (&["--url", url, "--rate", "0/s"], "rate: "),
        (
            &["--url", url, "--description", &"d".repeat(1001)],
            "description: ",
        ),
    ];
    for (args, field) in cases {
        let mut all = vec!["subscriptions", "add"];
        all.extend_from_slice(args);
        let out = relay_cli(&db, &all).await;
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(
            text(&out).contains(field),
            "{args:?} names {field}: {}",
            text(&out)
        );
    }
    let made: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox.subscriptions")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(made, 0);

    // the other verbs: an unknown id is not found (3), a bad grace is bad input (2)
    for args in [
        &["subscriptions", "show", "sub_nothere1"][..],
        &["subscriptions", "disable", "sub_nothere1"],
        &["subscriptions", "enable", "sub_nothere1"],
        &["subscriptions", "remove", "sub_nothere1"],
        &["subscriptions", "rotate-secret", "sub_nothere1"],
    ] {
        let out = relay_cli(&db, args).await;
        assert_eq!(out.status.code(), Some(3), "{args:?}: {}", text(&out));
    }
    let (id, _) = subscribe(&db, &["--url", url]).await;
    let out = relay_cli(
        &db,
        &["subscriptions", "rotate-secret", &id, "--grace", "soon"],
    )
    .await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("--grace"), "{}", text(&out));

    // without a sealing key, nothing can be made
    let out = crate::common::cli(
        &db,
        &["subscriptions", "add", "--url", "https://example.com/x"],
    )
    .await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("secret_key"), "{}", text(&out));
}

#[tokio::test]
async fn the_secret_is_shown_once_and_list_and_show_never_show_it() {
    let db = TestDb::new().await;
    let (id, secret) = subscribe(
        &db,
        &[
            "--url",
            "http://127.0.0.1:9/hook",
            "--tenant",
            "acme",
            "--event-types",
            "order.*",
            "--header",
            "Authorization: Bearer sk-abc",
            "--rate",
            "50/s",
            "--description",
            "billing",
        ],
    )
    .await;
    for args in [
        &["subscriptions", "list"][..],
        &["subscriptions", "list", "--json"],
        &["subscriptions", "list", "--tenant", "acme"],
        &["subscriptions", "show", &id],
        &["subscriptions", "show", &id, "--json"],
    ] {
        let out = relay_cli(&db, args).await;
        let shown = text(&out);
        assert!(out.status.success(), "{args:?}: {shown}");
        assert!(shown.contains(&id), "{args:?}: {shown}");
        assert!(!shown.contains(&secret), "{args:?} shows the secret");
        assert!(!shown.contains("sk-abc"), "{args:?} shows a header's value");
    }
    let out = relay_cli(&db, &["subscriptions", "show", &id, "--json"]).await;
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["tenant"], "acme");
    assert_eq!(shown["event_types"], serde_json::json!(["order.*"]));
    assert_eq!(shown["header_names"], serde_json::json!(["Authorization"]));
    assert_eq!(shown["rate"], 50.0);
    let out = relay_cli(&db, &["subscriptions", "list", "--tenant", "globex"]).await;
    assert!(String::from_utf8_lossy(&out.stdout).contains("no subscriptions"));
    // the database holds it sealed
    let stored: Vec<u8> = sqlx::query_scalar("SELECT secret FROM outbox.subscriptions")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert!(!String::from_utf8_lossy(&stored).contains("whsec_"));
}

#[tokio::test]
async fn a_relay_that_cannot_sign_for_the_subscriptions_refuses_to_start() {
    let db = TestDb::new().await;
    subscribe(&db, &["--url", "http://127.0.0.1:9/hook"]).await;
    let other = "b3RoZXItc3Vic2NyaXB0aW9ucy1zZWFsaW5nLWtleSE=";
    for (section, says) in [
        (String::new(), "secret_key"),
        (
            format!("[subscriptions]\nsecret_key = \"{other}\"\n"),
            "sealed with another key",
        ),
    ] {
        let file = config_file(&format!(
            "[webhook]\nallowed_networks = [\"127.0.0.0/8\"]\n{section}"
        ));
        let out = relay_command(&db.url)
            .args(["run", "--once"])
            .env("OUTBOX_RELAY_CONFIG", &file)
            .output()
            .await
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(text(&out).contains(says), "{}", text(&out));
        assert!(
            !text(&out).contains(other),
            "the key stays out of the error"
        );
    }
}

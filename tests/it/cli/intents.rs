//! `migrate`, `enqueue`, `list` and `show`: the intents as the CLI writes
//! and reads them, and an argument that could be an id or a key.

use super::*;

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

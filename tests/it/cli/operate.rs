//! The operator's commands: `run --once`, `retry`, `cancel`, `resolve`,
//! `stats` and `purge`, bulk retries by state, and the log line of each
//! action.

use super::*;

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

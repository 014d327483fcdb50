//! What the pages show: the overview's charts, and no webhook URL's
//! secret anywhere.

use super::*;

#[tokio::test]
async fn the_overview_charts_count_every_attempt_and_keep_up_with_new_ones() {
    let db = TestDb::new().await;
    let id = db
        .enqueue(
            "chart:1",
            "webhook",
            json!({"url": "http://127.0.0.1:9/h", "body": {}}),
        )
        .await;
    let attempt = |fence: i64, outcome: &'static str, ago_secs: i64| {
        sqlx::query(
            "INSERT INTO outbox.attempts (intent_id, attempt, fence, owner, started_at, finished_at, outcome)
             VALUES ($1, $2, $2, 't', now() - $3 * interval '1 second', now(), $4)",
        )
        .bind(id)
        .bind(fence)
        .bind(ago_secs)
        .bind(outcome)
        .execute(db.pool())
    };
    // two hours ago (the day chart only), 40 minutes ago (settled), now
    attempt(1, "transient", 7200).await.unwrap();
    attempt(2, "transient", 2400).await.unwrap();
    attempt(3, "delivered", 5).await.unwrap();
    let console = ConsoleServer::start(&db, &[]).await;
    let mut s = Session::new(&console);
    let sums = |v: &Value, field: &str| -> (i64, i64) {
        let b = v[field].as_array().unwrap();
        (
            b.iter().map(|x| x["delivered"].as_i64().unwrap()).sum(),
            b.iter().map(|x| x["failed"].as_i64().unwrap()).sum(),
        )
    };
    let first = json_of(&s.get("/api/v1/overview").await).await;
    assert_eq!(first["attempts_last_hour"].as_array().unwrap().len(), 60);
    assert_eq!(first["attempts_last_day"].as_array().unwrap().len(), 96);
    assert_eq!(sums(&first, "attempts_last_hour"), (1, 1));
    assert_eq!(sums(&first, "attempts_last_day"), (1, 2));
    // a new attempt shows at once; the settled buckets are not reread wrong
    attempt(4, "ambiguous", 1).await.unwrap();
    let second = json_of(&s.get("/api/v1/overview").await).await;
    assert_eq!(sums(&second, "attempts_last_hour"), (1, 2));
    assert_eq!(sums(&second, "attempts_last_day"), (1, 3));
    let page = s.get("/").await;
    assert!(
        page.body.contains("delivered 1") && page.body.contains("failed 3"),
        "{}",
        page.body
    );
}

/// The console shows a webhook's URL and every error by the one rule for
/// shown URLs: the secret in the userinfo, the path, a bare query and a
/// query value is on no page and in no API answer, even in an error
/// written before the rule (as an older relay wrote it): an intent's last
/// error on its page and in the list, a failure group's example, an
/// attempt's error, a purged intent's ledger entry and a destination's
/// last error.
#[tokio::test]
async fn a_webhook_urls_secrets_are_on_no_page() {
    let db = TestDb::new().await;
    let url = "http://127.0.0.1:9/services/T0001/B0002/SECRETPATH?SECRETBARE&token=SECRETVALUE";
    let raw = "POST http://SECRETUSER:SECRETPW@127.0.0.1:9/services/T0001/B0002/SECRETPATH\
               ?SECRETBARE&token=SECRETVALUE: could not connect (nothing was sent)";
    let shown = "POST http://127.0.0.1:9/services/REDACTED/REDACTED/REDACTED\
                 ?REDACTED&token=REDACTED: could not connect (nothing was sent)";
    let id = db
        .enqueue("hook:1", "webhook", json!({"url": url, "body": 1}))
        .await;
    sqlx::query("UPDATE outbox.intents SET state = 'dead', last_error = $2 WHERE id = $1")
        .bind(id)
        .bind(raw)
        .execute(db.pool())
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO outbox.attempts (intent_id, attempt, fence, owner, started_at, finished_at, outcome, error)
         VALUES ($1, 1, 1, 't', now(), now(), 'transient', $2)",
    )
    .bind(id)
    .bind(raw)
    .execute(db.pool())
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO outbox.destinations (name, state, failures, last_error)
         VALUES ('http://127.0.0.1:9', 'closed', 2, $1)",
    )
    .bind(raw)
    .execute(db.pool())
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO outbox.ledger (key, intent_id, kind, fingerprint, state, last_error, created_at, completed_at)
         VALUES ('hook:purged', 1000000, 'webhook', outbox.fingerprint('{}'), 'dead', $1, now(), now())",
    )
    .bind(raw)
    .execute(db.pool())
    .await
    .unwrap();
    let console = ConsoleServer::start(&db, &[]).await;
    let mut s = Session::new(&console);
    // the shown error, as HTML escapes it
    let html = shown.replace('&', "&#38;");
    for path in [
        format!("/intents/{id}"),
        "/intents".to_string(),
        "/failures".to_string(),
        "/destinations".to_string(),
        "/lookup?key=hook:purged".to_string(),
    ] {
        let page = s.get(&path).await;
        assert_eq!(page.status, 200, "{path}");
        assert!(!page.body.contains("SECRET"), "{path}: {}", page.body);
        if path != "/lookup?key=hook:purged" {
            assert!(page.body.contains(&html), "{path}: {}", page.body);
        }
    }
    let page = s.get(&format!("/intents/{id}")).await;
    assert!(
        page.body
            .contains("http://127.0.0.1:9/services/REDACTED/REDACTED/REDACTED?REDACTED"),
        "{}",
        page.body
    );
    let api = json_of(&s.get(&format!("/api/v1/intents/{id}")).await).await;
    assert!(!api.to_string().contains("SECRET"), "{api}");
    assert_eq!(
        api["intent"]["payload"]["url"],
        "http://127.0.0.1:9/services/REDACTED/REDACTED/REDACTED?REDACTED&token=REDACTED"
    );
    assert_eq!(api["intent"]["last_error"], shown);
    assert_eq!(api["attempts"][0]["error"], shown, "{api}");
    let list = json_of(&s.get("/api/v1/intents").await).await;
    assert_eq!(list["intents"][0]["last_error"], shown, "{list}");
    let failures = json_of(&s.get("/api/v1/failures").await).await;
    assert!(failures.to_string().contains(shown), "{failures}");
    let destinations = json_of(&s.get("/api/v1/destinations").await).await;
    assert!(destinations.to_string().contains(shown), "{destinations}");
    let purged = json_of(&s.get("/api/v1/lookup?key=hook:purged").await).await;
    assert_eq!(purged["entry"]["last_error"], shown, "{purged}");
    for answer in [list, failures, destinations, purged] {
        assert!(!answer.to_string().contains("SECRET"), "{answer}");
    }
}

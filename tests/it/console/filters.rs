//! Finding intents: filters and keyset pages, the host filter over every
//! spelling of an origin, and the lookup that answers after a purge.

use super::*;

#[tokio::test]
async fn filters_page_by_keyset_and_refuse_bad_input_clearly() {
    let db = TestDb::new().await;
    for i in 0..130 {
        let tenant = if i % 2 == 0 { "acme" } else { "globex" };
        db.enqueue(
            &format!("order:{tenant}:{i:03}"),
            "webhook",
            json!({"url": format!("http://127.0.0.{}:8080/h", 1 + i % 3), "body": {"tenant": tenant, "n": i}}),
        )
        .await;
    }
    sqlx::query("UPDATE outbox.intents SET state = 'dead', last_error = 'POST http://x/h: could not connect: refused' WHERE id % 5 = 0")
        .execute(db.pool())
        .await
        .unwrap();
    let console = ConsoleServer::start(&db, &[]).await;
    let mut s = Session::new(&console);
    // every page of 50, newest first, no intent twice
    let mut seen = Vec::new();
    let mut before: Option<i64> = None;
    loop {
        let path = match before {
            Some(b) => format!("/api/v1/intents?limit=50&before={b}"),
            None => "/api/v1/intents?limit=50".into(),
        };
        let page = json_of(&s.get(&path).await).await;
        let ids: Vec<i64> = page["intents"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["id"].as_i64().unwrap())
            .collect();
        seen.extend(ids);
        match page["next_before"].as_i64() {
            Some(b) => before = Some(b),
            None => break,
        }
    }
    assert_eq!(seen.len(), 130);
    assert!(
        seen.windows(2).all(|w| w[0] > w[1]),
        "newest first, no repeats"
    );

    let count = |v: &Value| v["intents"].as_array().unwrap().len();
    let q = |s: &str| {
        s.replace('{', "%7B")
            .replace('}', "%7D")
            .replace('"', "%22")
            .replace(' ', "%20")
    };
    let by_payload = json_of(
        &s.get(&q(
            "/api/v1/intents?limit=500&state=dead&payload={\"body\":{\"tenant\":\"acme\"}}",
        ))
        .await,
    )
    .await;
    assert_eq!(
        count(&by_payload),
        13,
        "dead ids divisible by 5 and even-numbered orders"
    );
    assert!(by_payload["intents"]
        .as_array()
        .unwrap()
        .iter()
        .all(|i| i["key"].as_str().unwrap().contains("acme") && i["state"] == "dead"));
    let by_prefix = json_of(&s.get("/api/v1/intents?limit=500&key=order:globex:").await).await;
    assert_eq!(count(&by_prefix), 65);
    let by_host = json_of(&s.get("/api/v1/intents?limit=500&host=127.0.0.2").await).await;
    assert_eq!(count(&by_host), 43);
    let by_origin = json_of(
        &s.get("/api/v1/intents?limit=500&host=http://127.0.0.2:8080")
            .await,
    )
    .await;
    assert_eq!(count(&by_origin), 43);
    let by_host_port = json_of(&s.get("/api/v1/intents?limit=500&host=127.0.0.2:8080").await).await;
    assert_eq!(count(&by_host_port), 43);
    let other_port = json_of(&s.get("/api/v1/intents?limit=500&host=127.0.0.2:8081").await).await;
    assert_eq!(count(&other_port), 0);
    let by_error = json_of(
        &s.get("/api/v1/intents?limit=500&error=COULD%20NOT%20connect")
            .await,
    )
    .await;
    assert_eq!(count(&by_error), 26);
    let since = json_of(&s.get("/api/v1/intents?limit=500&since=10m").await).await;
    assert_eq!(count(&since), 130);
    let until = json_of(&s.get("/api/v1/intents?limit=500&until=2000-01-01").await).await;
    assert_eq!(count(&until), 0);

    // the page itself, filtered, with the filter kept in its next link
    let page = s.get("/intents?state=dead&limit=10").await;
    assert_eq!(page.status, 200);
    assert!(page.body.contains("Next page") && page.body.contains("state=dead&amp;before="));

    for (bad, says) in [
        ("/api/v1/intents?state=gone", "not one of"),
        ("/api/v1/intents?payload=%7Bnope", "not JSON"),
        ("/api/v1/intents?payload=%5B1%5D", "JSON object"),
        ("/api/v1/intents?since=someday", "not a time"),
        ("/api/v1/intents?limit=0", "limit"),
        ("/api/v1/intents?before=x", "not an id"),
    ] {
        let a = s.get(bad).await;
        assert_eq!(a.status, 400, "{bad}");
        assert!(
            json_of(&a).await["error"].as_str().unwrap().contains(says),
            "{bad}: {}",
            a.body
        );
    }
    let html = s.get("/intents?state=gone").await;
    assert_eq!(html.status, 200);
    assert!(html.body.contains("id=\"filter-error\"") && html.body.contains("not one of"));
}

/// The host filter counts every spelling of an origin, however the intents
/// and the operator write it: one normalisation on both sides.
#[tokio::test]
async fn the_host_filter_finds_every_spelling_of_an_origin() {
    let db = TestDb::new().await;
    for (n, url) in [
        "http://127.0.0.1:8080/a",
        "http://0x7f.1:8080/b",
        "http://2130706433:8080/c",
        "http://[::ffff:127.0.0.1]:08080/d",
        "http://localhost.:8081/e",
        "http://LocalHost:8081/f",
        "http://127.0.0.1:8082/other",
    ]
    .iter()
    .enumerate()
    {
        db.enqueue(
            &format!("spelled:{n}"),
            "webhook",
            json!({"url": url, "body": n}),
        )
        .await;
    }
    let console = ConsoleServer::start(&db, &[]).await;
    let mut s = Session::new(&console);
    for (typed, want) in [
        ("127.0.0.1:8080", 4),
        ("0x7f.1:8080", 4),
        ("http://127.1:8080", 4),
        ("localhost:8081", 2),
        ("LocalHost.:8081", 2),
        ("HTTP://LOCALHOST.:8081/x", 2),
        ("localhost.", 2),
        ("127.1", 5),
    ] {
        let found = json_of(
            &s.get(&format!("/api/v1/intents?limit=50&host={typed}"))
                .await,
        )
        .await;
        let n = found["intents"].as_array().map_or(0, Vec::len);
        assert_eq!(n, want, "{typed}: {found}");
    }
}

#[tokio::test]
async fn lookup_answers_from_the_ledger_after_a_purge_and_payload_secrets_are_masked() {
    let db = TestDb::new().await;
    let id = db
        .enqueue(
            "pay:1",
            "webhook",
            json!({"url": "http://127.0.0.1:9/h", "headers": {"Authorization": "Bearer sk_live_topsecret"},
                   "body": {"card_number": "4242424242424242", "note": "<b>bold</b>"}}),
        )
        .await;
    let console = ConsoleServer::start(&db, &[]).await;
    let mut s = Session::new(&console);
    let page = s.get(&format!("/intents/{id}")).await;
    assert!(!page.body.contains("topsecret") && !page.body.contains("4242424242424242"));
    assert!(page.body.contains("masked"));
    assert!(page.body.contains("&#60;b&#62;bold&#60;/b&#62;") && !page.body.contains("<b>bold"));
    let api = s.get(&format!("/api/v1/intents/{id}")).await;
    assert!(!api.body.contains("topsecret") && api.body.contains("webhook-id msg_"));

    let live = s.get("/lookup?key=pay:1").await;
    assert!(live.body.contains("Not yet") && live.body.contains("the live table"));
    sqlx::query("UPDATE outbox.intents SET state = 'delivered', delivered_at = now(), provider_ref = 'HTTP 200', updated_at = now() - interval '2 days' WHERE id = $1")
        .bind(id)
        .execute(db.pool())
        .await
        .unwrap();
    db.store
        .purge(Duration::from_secs(3600), false, false, 100)
        .await
        .unwrap();
    let purged = s.get("/lookup?key=pay:1").await;
    assert!(
        purged.body.contains("Yes: the effect happened") && purged.body.contains("the ledger"),
        "{}",
        purged.body
    );
    let unknown = s.get("/lookup?key=never").await;
    assert!(unknown.body.contains("Unknown"));
    let api = json_of(&s.get("/api/v1/lookup?key=pay:1").await).await;
    assert_eq!(api["source"], "ledger");
    assert_eq!(s.get("/api/v1/lookup?key=never").await.status, 404);
}

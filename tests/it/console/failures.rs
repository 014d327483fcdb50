//! Failure groups and the actions on them: incidents retried in batches,
//! a group that matches its own intents, and actions bounded by what was
//! asked.

use super::*;

#[tokio::test]
async fn failures_group_into_incidents_and_a_group_is_retried_in_batches_through_the_api() {
    let db = TestDb::new().await;
    dead(
        &db,
        "a",
        "http://127.0.0.1:9001",
        1_100,
        "receiver answered HTTP 503",
    )
    .await;
    dead(
        &db,
        "b",
        "http://127.0.0.1:9002",
        7,
        "POST http://127.0.0.1:9002/hook timed out after 15s",
    )
    .await;
    let amb = db
        .enqueue(
            "amb:1",
            "webhook",
            json!({"url": "http://127.0.0.1:9003/hook", "body": {}}),
        )
        .await;
    sqlx::query("UPDATE outbox.intents SET state = 'ambiguous', last_error = 'lease expired mid-request' WHERE id = $1")
        .bind(amb)
        .execute(db.pool())
        .await
        .unwrap();
    let console =
        ConsoleServer::start_with(&db, &[("ops", Role::Operator, "ops-password-1")], |c| {
            c.console.batch_size = 500;
        })
        .await;
    let mut s = Session::new(&console);
    let basic = format!("Basic {}", base64_of("ops:ops-password-1"));
    let groups = {
        let a = s_with_basic(&console, "/api/v1/failures", &basic).await;
        serde_json::from_str::<Value>(&a).unwrap()
    };
    let groups = groups.as_array().unwrap();
    assert_eq!(groups.len(), 3, "{groups:#?}");
    assert_eq!(groups[0]["count"], 1_100);
    assert_eq!(groups[0]["destination"], "http://127.0.0.1:9001");
    assert_eq!(groups[0]["class"], "HTTP 503");
    assert_eq!(groups[1]["count"], 7);
    assert_eq!(groups[1]["class"], "timed out after Ns");
    let filter = groups[0]["filter"].clone();

    // the dry run counts the group; an intent that joins it later is not acted on
    let http = reqwest::Client::new();
    let post = |body: Value| {
        http.post(console.url("/api/v1/actions"))
            .header("authorization", &basic)
            .json(&body)
            .send()
    };
    let dry: Value = post(json!({"action": "retry", "filter": filter, "dry_run": true}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(dry["count"], 1_100, "{dry}");
    let up_to = dry["up_to"].as_i64().unwrap();
    dead(
        &db,
        "late",
        "http://127.0.0.1:9001",
        1,
        "receiver answered HTTP 503",
    )
    .await;
    // a count that moved is refused with the new count
    let moved =
        post(json!({"action": "retry", "filter": filter, "up_to": up_to, "expected": 1_000}))
            .await
            .unwrap();
    assert_eq!(moved.status(), 409);
    let missing = post(json!({"action": "retry", "filter": filter}))
        .await
        .unwrap();
    assert_eq!(missing.status(), 400);
    let started =
        post(json!({"action": "retry", "filter": filter, "up_to": up_to, "expected": 1_100}))
            .await
            .unwrap();
    assert_eq!(started.status(), 202);
    let job: Value = started.json().await.unwrap();
    let path = format!("/api/v1/actions/{}", job["id"]);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let last = loop {
        let job: Value =
            serde_json::from_str(&s_with_basic(&console, &path, &basic).await).unwrap();
        if job["state"] != "running" || std::time::Instant::now() > deadline {
            break job;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(last["state"], "finished", "{last}");
    assert_eq!(last["changed"], 1_100);
    assert_eq!(last["batches"], 3, "batches of 500");
    assert_eq!(
        db.count("key LIKE 'a:%' AND state = 'pending'").await,
        1_100
    );
    assert_eq!(
        db.count("key = 'late:0' AND state = 'dead'").await,
        1,
        "joined after the dry run"
    );
    assert_eq!(
        db.count("key LIKE 'b:%' AND state = 'dead'").await,
        7,
        "another group"
    );
    let recorded: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox.operator_actions WHERE action = 'retry' AND actor = 'console:ops'
            AND detail->>'from' = 'dead' AND detail->>'new_effect' = 'false'",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(recorded, 1_100);
    // the ambiguous group is settled through the same path: resolve needs
    // a reason to reject
    let amb_filter = json!({"id": amb.to_string()});
    let no_reason = post(json!({"action": "resolve", "resolve_as": "reject", "filter": amb_filter, "up_to": amb, "expected": 1})).await.unwrap();
    assert_eq!(no_reason.status(), 400);
    s.login("ops", "ops-password-1").await;
    let page = s.get("/failures").await;
    assert!(
        page.body.contains("HTTP 503") && page.body.contains("lease expired"),
        "{}",
        page.body
    );
}

#[tokio::test]
async fn a_failure_group_matches_its_own_intents_whatever_its_class_or_destination() {
    let db = TestDb::new().await;
    // a class cut at 60 characters just before a space; no readable URL
    let long =
        "the receiver closed the connection while we were sending it the body of the request";
    dead(&db, "long", "http://127.0.0.1:9", 3, long).await;
    let none = db
        .enqueue("nourl:1", "webhook", json!({"url": 5, "body": {}}))
        .await;
    sqlx::query("UPDATE outbox.intents SET state = 'dead', last_error = 'payload: url must be a string' WHERE id = $1")
        .bind(none)
        .execute(db.pool())
        .await
        .unwrap();
    let console = ConsoleServer::start_with(&db, &[], |c| {
        c.webhook
            .endpoints
            .insert("Partner".into(), "http://127.0.0.1:9".into());
    })
    .await;
    let mut s = Session::new(&console);
    let groups = json_of(&s.get("/api/v1/failures").await).await;
    for g in groups.as_array().unwrap() {
        let listed = json_of(
            &s.get(&format!("/api/v1/intents?{}", g["query"].as_str().unwrap()))
                .await,
        )
        .await;
        assert_eq!(
            listed["intents"].as_array().unwrap().len() as i64,
            g["count"].as_i64().unwrap(),
            "group {g}"
        );
    }
    let classes: Vec<&str> = groups
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["class"].as_str().unwrap())
        .collect();
    assert!(
        classes.iter().all(|c| c.trim() == *c && !c.is_empty()),
        "{classes:?}"
    );
    // an endpoint's intents are found by the endpoint's origin and by its name, in any case
    db.enqueue("ep:1", "webhook", json!({"body": {}})).await;
    sqlx::query("UPDATE outbox.intents SET destination = 'Partner' WHERE key = 'ep:1'")
        .execute(db.pool())
        .await
        .unwrap();
    for host in ["http://127.0.0.1:9", "partner", "127.0.0.1:9"] {
        let found = json_of(&s.get(&format!("/api/v1/intents?host={host}&key=ep:")).await).await;
        assert_eq!(found["intents"].as_array().unwrap().len(), 1, "{host}");
    }
}

#[tokio::test]
async fn actions_never_reach_beyond_what_was_asked_and_the_open_console_answers_only_loopback_names(
) {
    let db = TestDb::new().await;
    dead(
        &db,
        "d",
        "http://127.0.0.1:9",
        2,
        "receiver answered HTTP 503",
    )
    .await;
    let live = db
        .enqueue(
            "live:1",
            "webhook",
            json!({"url": "http://127.0.0.1:9/h", "body": {"cvc": "123", "n": 1}}),
        )
        .await;
    sqlx::query("UPDATE outbox.intents SET state = 'delivered' WHERE id = $1")
        .bind(live)
        .execute(db.pool())
        .await
        .unwrap();
    let console = ConsoleServer::start(&db, &[]).await;
    let http = reqwest::Client::new();
    let post = |body: Value| http.post(console.url("/api/v1/actions")).json(&body).send();
    // a bulk action must name its states
    let no_state = post(json!({"action": "retry", "filter": {"kind": "webhook"}, "dry_run": true}))
        .await
        .unwrap();
    assert_eq!(no_state.status(), 400);
    assert!(no_state.text().await.unwrap().contains("needs the states"));
    // a filter of states the action does not apply to counts 0, and a
    // confirmation of that 0 starts nothing (it must never act on everything)
    let dry: Value =
        post(json!({"action": "cancel", "filter": {"state": "delivered"}, "dry_run": true}))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
    assert_eq!(dry["count"], 0);
    let confirmed = post(json!({"action": "cancel", "filter": {"state": "delivered"},
                                "up_to": dry["up_to"], "expected": 0}))
    .await
    .unwrap();
    assert_eq!(confirmed.status(), 409);
    assert_eq!(db.count("state = 'dead'").await, 2);
    assert_eq!(db.count("state = 'delivered'").await, 1);
    // a relative time is fixed by the dry run, and the states it acts on named
    let dry: Value = post(json!({"action": "retry", "filter": {"state": "dead,delivered", "since": "1h"}, "dry_run": true}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(dry["count"], 2);
    assert_eq!(dry["states"], json!(["dead"]), "delivered only with force");
    assert!(
        dry["filter"]["since"].as_str().unwrap().contains('T'),
        "{dry}"
    );

    // a masked field can be neither read nor searched for
    let mut s = Session::new(&console);
    let found = s.get("/api/v1/lookup?key=live:1").await;
    let found = json_of(&found).await;
    assert_eq!(found["source"], "live");
    assert_eq!(found["intent"]["payload"]["body"]["cvc"], "••• masked •••");
    let probe = s
        .get("/api/v1/intents?payload=%7B%22body%22%3A%7B%22cvc%22%3A%22123%22%7D%7D")
        .await;
    assert_eq!(probe.status, 400);
    assert!(probe.body.contains("masked field"));

    // DNS rebinding: another name that resolves here is not served
    let rebound = http
        .get(console.url("/api/v1/intents"))
        .header("host", format!("evil.example:{}", console.addr.port()))
        .send()
        .await
        .unwrap();
    assert_eq!(rebound.status(), 421);
    let rebound = http
        .post(console.url("/api/v1/actions"))
        .header("host", "evil.example")
        .header("origin", "http://evil.example")
        .json(&json!({"action": "retry", "filter": {"state": "dead"}, "dry_run": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(rebound.status(), 421);
    let local = http
        .get(format!(
            "http://localhost:{}/api/v1/failures",
            console.addr.port()
        ))
        .send()
        .await;
    // localhost may resolve to ::1 first where nothing listens: only the Host matters here
    if let Ok(r) = local {
        assert_eq!(r.status(), 200);
    }
}

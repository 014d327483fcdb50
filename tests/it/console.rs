//! The console over HTTP: authentication, roles, CSRF, filters, keyset
//! pages, failure groups and bulk actions through the JSON API, against a
//! real database. (A person's use, in a real browser: console_browser.rs.)

use std::time::Duration;

use outbox_relay::console::Role;
use serde_json::{json, Value};

use crate::common::console::{field_of, ConsoleServer, Session};
use crate::common::{cli, relay_bin, wait_for, TestDb};

/// `n` webhook intents for `host`, made dead with `error` (as the relay
/// leaves them after their retries).
async fn dead(db: &TestDb, prefix: &str, host: &str, n: usize, error: &str) -> Vec<i64> {
    let mut ids = Vec::new();
    for i in 0..n {
        let payload =
            json!({"url": format!("{host}/hook"), "body": {"order": i, "tenant": prefix}});
        ids.push(
            db.enqueue(&format!("{prefix}:{i}"), "webhook", payload)
                .await,
        );
    }
    sqlx::query(
        "UPDATE outbox.intents SET state = 'dead', attempts = 3, last_error = $2 WHERE id = ANY($1)",
    )
    .bind(&ids)
    .bind(error)
    .execute(db.pool())
    .await
    .unwrap();
    ids
}

async fn json_of(a: &crate::common::console::Answer) -> Value {
    serde_json::from_str(&a.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", a.body))
}

#[tokio::test]
async fn without_users_it_is_open_on_loopback_only_and_says_so() {
    let db = TestDb::new().await;
    // refused off loopback before it binds anything
    let out = cli(&db, &["console", "--addr", "0.0.0.0:0"]).await;
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not a loopback address") && err.contains("console.users"),
        "{err}"
    );

    // on loopback it starts, prints its address, and warns
    let mut child = crate::common::relay_command(&db.url)
        .args(["console", "--addr", "127.0.0.1:0"])
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use tokio::io::AsyncBufReadExt;
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect("the console prints its address")
        .unwrap()
        .unwrap();
    let url = first
        .strip_prefix("console listening on ")
        .expect(&first)
        .to_string();
    let page = reqwest::get(format!("{url}/")).await.unwrap();
    assert_eq!(page.status(), 200);
    let cookie = page.headers()["set-cookie"].to_str().unwrap().to_string();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    assert!(page.text().await.unwrap().contains("No login"));
    crate::common::terminate(&mut child).await;
    let mut err = String::new();
    use tokio::io::AsyncReadExt;
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .await
        .unwrap();
    assert!(err.contains("no login"), "{err}");
}

#[tokio::test]
async fn hash_password_makes_a_hash_the_console_accepts() {
    use std::io::Write;
    let mut child = std::process::Command::new(relay_bin())
        .args(["console", "--hash-password"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"correct horse battery\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let hash = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert!(hash.starts_with("$argon2id$"), "{hash}");
    assert!(outbox_relay::config::console::verify_password(
        "correct horse battery",
        &hash
    ));
    assert!(!hash.contains("correct horse"));
}

#[tokio::test]
async fn login_is_required_and_wrong_passwords_are_refused_then_locked_out() {
    let db = TestDb::new().await;
    let console = ConsoleServer::start(&db, &[("ops", Role::Operator, "ops-password-1")]).await;
    let mut s = Session::new(&console);
    let a = s.get("/intents?state=dead").await;
    assert_eq!(a.status, 303);
    assert_eq!(
        a.location.as_deref(),
        Some("/login?next=%2Fintents%3Fstate%3Ddead")
    );
    let api = s.get("/api/v1/intents").await;
    assert_eq!(api.status, 401, "{}", api.body);

    let csrf = s.csrf("/login").await;
    for _ in 0..5 {
        let a = s
            .post_form(
                "/login",
                &[("user", "ops"), ("password", "wrong"), ("csrf", &csrf)],
            )
            .await;
        assert_eq!(a.status, 401);
        assert!(a.body.contains("Wrong user name or password"));
    }
    // the sixth try is refused even with the right password
    let a = s
        .post_form(
            "/login",
            &[
                ("user", "ops"),
                ("password", "ops-password-1"),
                ("csrf", &csrf),
            ],
        )
        .await;
    assert_eq!(a.status, 401);
    assert!(a.body.contains("Too many failed logins"), "{}", a.body);

    // another name is not locked; a login replaces the session (new cookie, new token)
    let console = ConsoleServer::start(&db, &[("ops", Role::Operator, "ops-password-1")]).await;
    let mut s = Session::new(&console);
    let before = s.csrf("/login").await;
    s.login("ops", "ops-password-1").await;
    let after = s.csrf("/intents").await;
    assert_ne!(before, after, "the CSRF token changes at login");
    let page = s.get("/").await;
    assert_eq!(page.status, 200);
    assert!(page.body.contains("id=\"user\">ops<"));
    assert!(!page.body.contains("ops-password-1"));
}

#[tokio::test]
async fn a_viewer_sees_no_actions_and_the_server_refuses_those_it_sends() {
    let db = TestDb::new().await;
    let ids = dead(
        &db,
        "v",
        "http://127.0.0.1:9",
        3,
        "receiver answered HTTP 503",
    )
    .await;
    let console = ConsoleServer::start(
        &db,
        &[
            ("ops", Role::Operator, "ops-password-1"),
            ("val", Role::Viewer, "viewer-password"),
        ],
    )
    .await;
    let mut viewer = Session::new(&console);
    viewer.login("val", "viewer-password").await;
    let page = viewer.get(&format!("/intents/{}", ids[0])).await;
    assert_eq!(page.status, 200);
    assert!(
        !page.body.contains("/actions/new"),
        "no action links for a viewer"
    );
    let list = viewer.get("/intents?state=dead").await;
    assert!(!list.body.contains("bulk-retry"));
    let failures = viewer.get("/failures").await;
    assert!(failures.body.contains("HTTP 503") && !failures.body.contains("group-action"));

    // what a viewer sends anyway is refused: the dry run, the confirmation, the API
    let dry = viewer.get("/actions/new?action=retry&state=dead").await;
    assert_eq!(dry.status, 403, "{}", dry.body);
    assert!(dry.body.contains("is a viewer"));
    let csrf = viewer.csrf("/intents").await;
    let confirm = viewer
        .post_form(
            "/actions",
            &[
                ("csrf", &csrf),
                ("action", "retry"),
                ("state", "dead"),
                ("up_to", "1000"),
                ("expected", "3"),
                ("nonce", "0123456789abcdef0123"),
            ],
        )
        .await;
    assert_eq!(confirm.status, 403, "{}", confirm.body);
    let api = viewer
        .post_json(
            "/api/v1/actions",
            &json!({"action": "retry", "filter": {"state": "dead"}, "dry_run": true}),
            &[("x-csrf-token", &csrf)],
        )
        .await;
    assert_eq!(api.status, 403, "{}", api.body);
    let pause = viewer
        .post_form(
            "/destinations/pause",
            &[("csrf", &csrf), ("destination", "http://127.0.0.1:9")],
        )
        .await;
    assert_eq!(pause.status, 403);
    assert_eq!(db.count("state = 'dead'").await, 3, "nothing changed");
    let actions: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox.operator_actions")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(actions, 0);
}

#[tokio::test]
async fn a_post_without_the_csrf_token_or_from_another_site_is_refused() {
    let db = TestDb::new().await;
    let ids = dead(
        &db,
        "c",
        "http://127.0.0.1:9",
        2,
        "receiver answered HTTP 500",
    )
    .await;
    let console = ConsoleServer::start(&db, &[("ops", Role::Operator, "ops-password-1")]).await;
    let mut s = Session::new(&console);
    s.login("ops", "ops-password-1").await;
    let dry = s.get("/actions/new?action=cancel&state=dead").await;
    assert_eq!(dry.status, 200);
    assert!(dry.body.contains("id=\"count\">2<"), "{}", dry.body);
    let nonce = field_of(&dry.body, "nonce").unwrap();
    let up_to = field_of(&dry.body, "up_to").unwrap();
    let csrf = field_of(&dry.body, "csrf").unwrap();
    let form = |token: Option<&str>| -> Vec<(String, String)> {
        let mut f: Vec<(String, String)> = [
            ("action", "cancel"),
            ("state", "dead"),
            ("up_to", up_to.as_str()),
            ("expected", "2"),
            ("nonce", nonce.as_str()),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        if let Some(t) = token {
            f.push(("csrf".into(), t.into()));
        }
        f
    };
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let cookie = s.cookie();
    let send = |fields: Vec<(String, String)>, origin: Option<&str>, site: Option<&str>| {
        let mut req = http
            .post(console.url("/actions"))
            .header("cookie", &cookie)
            .form(&fields);
        if let Some(o) = origin {
            req = req.header("origin", o);
        }
        if let Some(site) = site {
            req = req.header("sec-fetch-site", site);
        }
        req.send()
    };
    // no token, a wrong token
    let a = send(form(None), None, None).await.unwrap();
    assert_eq!(a.status(), 403);
    assert!(a.text().await.unwrap().contains("no valid CSRF token"));
    let zeros = "0".repeat(64);
    assert_eq!(
        send(form(Some(&zeros)), None, None).await.unwrap().status(),
        403
    );
    // the API with the cookie but without the header
    let api = s
        .post_json(
            "/api/v1/actions",
            &json!({"action": "cancel", "filter": {"state": "dead"}, "dry_run": true}),
            &[],
        )
        .await;
    assert_eq!(api.status, 403, "{}", api.body);
    assert_eq!(db.count("state = 'dead'").await, 2, "nothing changed");

    // the right token from another site (as a browser labels it) is refused too
    let cross = send(
        form(Some(&csrf)),
        Some("http://evil.example"),
        Some("cross-site"),
    )
    .await
    .unwrap();
    assert_eq!(cross.status(), 403);
    assert!(cross.text().await.unwrap().contains("another site"));
    assert_eq!(db.count("state = 'dead'").await, 2);

    // and the same confirmation from this origin works, once, as the console user
    let ok = send(
        form(Some(&csrf)),
        Some(&console.url("")),
        Some("same-origin"),
    )
    .await
    .unwrap();
    assert_eq!(ok.status(), 303);
    let job = ok.headers()["location"].to_str().unwrap().to_string();
    assert!(
        wait_for(Duration::from_secs(10), || async {
            db.count("state = 'cancelled'").await == 2
        })
        .await
    );
    let again = send(form(Some(&csrf)), None, None).await.unwrap();
    assert_eq!(
        again.headers()["location"].to_str().unwrap(),
        job,
        "the same nonce is the same job"
    );
    let actors: Vec<(String, String)> = sqlx::query_as(
        "SELECT action, actor FROM outbox.operator_actions WHERE intent_id = ANY($1) ORDER BY id",
    )
    .bind(&ids)
    .fetch_all(db.pool())
    .await
    .unwrap();
    assert_eq!(actors, vec![("cancel".into(), "console:ops".into()); 2]);
}

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

async fn s_with_basic(console: &ConsoleServer, path: &str, basic: &str) -> String {
    let a = reqwest::Client::new()
        .get(console.url(path))
        .header("authorization", basic)
        .send()
        .await
        .unwrap();
    assert_eq!(a.status(), 200, "{path}");
    a.text().await.unwrap()
}

fn base64_of(text: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(text)
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

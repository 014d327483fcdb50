//! Who may use the console: open on loopback without users, password
//! hashes, logins and lockout, viewers, and requests from other sites.

use super::*;

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
    let mut console = crate::common::logged::LoggedRelay::spawn(
        crate::common::relay_command(&db.url)
            .args(["console", "--addr", "127.0.0.1:0"])
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::piped()),
    );
    use tokio::io::AsyncBufReadExt;
    let mut lines = tokio::io::BufReader::new(console.child.stdout.take().unwrap()).lines();
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
    let (_, err) = console.stop().await;
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

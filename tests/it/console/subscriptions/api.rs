//! The subscriptions' JSON API with Basic credentials, and the console
//! served under the `outbox_console` role.

use super::*;

/// A request to the API with Basic credentials.
async fn basic(
    console: &ConsoleServer,
    user: (&str, Role, &str),
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let http = reqwest::Client::new();
    let req = match body {
        Some(b) => http.post(console.url(path)).json(&b),
        None => http.get(console.url(path)),
    };
    let a = req.basic_auth(user.0, Some(user.2)).send().await.unwrap();
    let status = a.status().as_u16();
    let text = a.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}")),
    )
}

#[tokio::test]
async fn the_json_api_makes_shows_rotates_disables_and_enables() {
    let db = TestDb::new().await;
    let console = console(&db, &[OPS, VAL]).await;
    let (status, made) = basic(
        &console,
        OPS,
        "/api/v1/subscriptions",
        Some(json!({"url": "http://127.0.0.1:9/hooks", "tenant": "acme",
                    "event_types": ["order.*"], "headers": {"X-Token": "HEADERVALUE"},
                    "rate": "5/s", "description": "api"})),
    )
    .await;
    assert_eq!(status, 201, "{made}");
    let id = made["id"].as_str().unwrap().to_string();
    let secret = made["secret"].as_str().unwrap().to_string();
    assert!(secret.starts_with("whsec_"));
    assert_eq!(sealed_secret(&db, &id).await, secret);
    assert_eq!(made["subscription"]["header_names"], json!(["X-Token"]));

    // bad input: 400, the field named
    for (body, field) in [
        (
            json!({"url": "http://127.0.0.1:9/x", "rate": "fast"}),
            "rate",
        ),
        (json!({"url": "gopher://x"}), "url"),
        (
            json!({"url": "http://127.0.0.1:9/x", "event_types": ["*"]}),
            "event_types",
        ),
        (
            json!({"url": "http://127.0.0.1:9/x", "headers": {"webhook-signature": "x"}}),
            "headers",
        ),
    ] {
        let (status, err) = basic(&console, OPS, "/api/v1/subscriptions", Some(body)).await;
        assert_eq!(status, 400, "{err}");
        assert_eq!(err["field"], field, "{err}");
        assert!(err["error"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{field}: ")));
    }
    let (status, err) = basic(
        &console,
        OPS,
        "/api/v1/subscriptions",
        Some(json!({"tenant": "x"})),
    )
    .await;
    assert_eq!(status, 400);
    assert!(err["error"].as_str().unwrap().contains("url"), "{err}");

    let (status, list) = basic(&console, VAL, "/api/v1/subscriptions", None).await;
    assert_eq!(status, 200);
    assert_eq!(list.as_array().unwrap().len(), 1, "{list}");
    let text = list.to_string();
    assert!(!text.contains(&secret) && !text.contains("HEADERVALUE"));
    let one = format!("/api/v1/subscriptions/{id}");
    let (status, shown) = basic(&console, VAL, &one, None).await;
    assert_eq!(status, 200);
    assert_eq!(shown["subscription"]["state"], "enabled");
    assert_eq!(shown["subscription"]["tenant"], "acme");
    assert_eq!(shown["deliveries"], json!([]));
    assert!(!shown.to_string().contains(&secret));
    let (status, _) = basic(&console, VAL, "/api/v1/subscriptions/sub_nosuchone1", None).await;
    assert_eq!(status, 404);

    let (status, rotated) = basic(
        &console,
        OPS,
        &format!("{one}/rotate"),
        Some(json!({"grace": "0s"})),
    )
    .await;
    assert_eq!(status, 200, "{rotated}");
    let new = rotated["secret"].as_str().unwrap();
    assert!(new.starts_with("whsec_") && new != secret);
    assert_eq!(rotated["previous_secret_until"], Value::Null);
    assert_eq!(sealed_secret(&db, &id).await, new);
    let (status, err) = basic(
        &console,
        OPS,
        &format!("{one}/rotate"),
        Some(json!({"grace": "later"})),
    )
    .await;
    assert_eq!((status, err["field"].as_str()), (400, Some("grace")));

    let (status, off) = basic(
        &console,
        OPS,
        &format!("{one}/disable"),
        Some(json!({"reason": "api test"})),
    )
    .await;
    assert_eq!(status, 200, "{off}");
    assert_eq!(off["state"], "disabled");
    assert_eq!(off["disabled_reason"], "api test (console user ops)");
    let (status, err) = basic(
        &console,
        OPS,
        &format!("{one}/replay"),
        Some(json!({"since": "1h", "dry_run": true})),
    )
    .await;
    assert_eq!(status, 409, "{err}");
    assert!(err["error"].as_str().unwrap().contains("is disabled"));
    let (status, on) = basic(&console, OPS, &format!("{one}/enable"), Some(json!({}))).await;
    assert_eq!((status, on["state"].as_str()), (200, Some("enabled")));

    // a replay: the dry run, then exactly it
    let event = publish(&db, "api-e1", "order.paid", Some("acme")).await;
    let replay = format!("{one}/replay");
    let (status, dry) = basic(
        &console,
        OPS,
        &replay,
        Some(json!({"since": "1h", "dry_run": true})),
    )
    .await;
    assert_eq!(status, 200, "{dry}");
    assert_eq!(dry["plan"]["first_deliveries"], 1);
    let (status, err) = basic(&console, OPS, &replay, Some(json!({"since": "1h"}))).await;
    assert_eq!(status, 400, "{err}");
    let confirm =
        json!({"since": dry["since"], "until": dry["until"], "fingerprint": dry["fingerprint"]});
    let (status, done) = basic(&console, OPS, &replay, Some(confirm.clone())).await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["first_deliveries"], 1);
    assert!(delivery(&db, event, &id).await.is_some());
    let (status, again) = basic(&console, OPS, &replay, Some(confirm)).await;
    assert_eq!(status, 409, "{again}");
    assert_eq!(again["plan"]["first_deliveries"], 0);

    // without credentials: 401
    let anonymous = reqwest::get(console.url("/api/v1/subscriptions"))
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);
}

/// Served under `outbox_console` (deploy/sql/roles.sql), which may make,
/// disable, enable and rotate subscriptions but create no intent: a
/// disable works, and a replay's first delivery is refused as the role's,
/// not as a database failure.
#[tokio::test]
async fn under_the_console_role_it_manages_subscriptions_and_says_why_it_creates_no_delivery() {
    let db = TestDb::new().await;
    let (id, _) = subscribe(&db, to("http://127.0.0.1:9/hooks")).await;
    let roles =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/sql/roles.sql"))
            .unwrap();
    sqlx::raw_sql(&roles).execute(db.pool()).await.unwrap();
    // cluster-wide: another test may have made it first
    sqlx::raw_sql(
        "DO $$ BEGIN CREATE ROLE t_outbox_console LOGIN IN ROLE outbox_console;
         EXCEPTION WHEN duplicate_object THEN NULL; END $$;",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let mut url = reqwest::Url::parse(&db.url).unwrap();
    url.set_username("t_outbox_console").unwrap();
    url.set_password(None).unwrap();
    let store = outbox_relay::store::Store::connect(url.as_str(), 2)
        .await
        .unwrap();
    let console = ConsoleServer::start_on(store, &[OPS]).await;
    let mut s = Session::new(&console);
    s.login(OPS.0, OPS.2).await;
    assert!(s.get("/subscriptions").await.body.contains(&id));
    let path = format!("/subscriptions/{id}");
    let page = s.get(&path).await;
    assert_eq!(page.status, 200);
    let csrf = field_of(&page.body, "csrf").unwrap();
    let a = s
        .post_form(&format!("{path}/disable"), &[("csrf", &csrf)])
        .await;
    assert_eq!(a.status, 303, "{}", a.body);
    let state: Option<chrono::DateTime<chrono::Utc>> =
        sqlx::query_scalar("SELECT disabled_at FROM outbox.subscriptions WHERE id = $1")
            .bind(&id)
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert!(state.is_some(), "disabled under the console role");
    let a = s
        .post_form(&format!("{path}/enable"), &[("csrf", &csrf)])
        .await;
    assert_eq!(a.status, 303, "{}", a.body);

    // a replay's first delivery is an intent: the role may not make it
    publish(&db, "role-e1", "order.paid", None).await;
    let replay = format!("/api/v1/subscriptions/{id}/replay");
    let (status, dry) = basic(
        &console,
        OPS,
        &replay,
        Some(json!({"since": "1h", "dry_run": true})),
    )
    .await;
    assert_eq!(status, 200, "{dry}");
    assert_eq!(dry["plan"]["first_deliveries"], 1);
    let confirm =
        json!({"since": dry["since"], "until": dry["until"], "fingerprint": dry["fingerprint"]});
    let (status, err) = basic(&console, OPS, &replay, Some(confirm)).await;
    assert_eq!(status, 403, "{err}");
    assert!(
        err["error"].as_str().unwrap_or_default().contains("role"),
        "{err}"
    );
}

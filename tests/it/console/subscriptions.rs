//! Subscriptions in the console: the list and a subscription's page (never
//! its secret, nor a header's value, nor a URL's secrets), the forms that
//! make and change one (the secret shown once; CSRF, viewers), a replay
//! that acts on exactly what its dry run counted; the JSON API and the
//! console's database role in [`api`].

use outbox_providers::Secret;
use outbox_relay::config::SealingKey;
use outbox_relay::services::subscriptions::{self, Request};

use super::*;
use crate::common::console::Answer;
use crate::events::{events_config, KEY};

mod api;

const OPS: (&str, Role, &str) = ("ops", Role::Operator, "ops-password-1");
const VAL: (&str, Role, &str) = ("val", Role::Viewer, "viewer-password");

/// A console with the sealing key.
async fn console(db: &TestDb, users: &[(&str, Role, &str)]) -> ConsoleServer {
    ConsoleServer::start_with(db, users, |c| {
        c.subscriptions.secret_key = Some(Secret::new(KEY));
    })
    .await
}

/// A subscription made as the CLI makes it: its id and its secret.
async fn subscribe(db: &TestDb, req: Request) -> (String, String) {
    let (id, secret) = subscriptions::add(&db.store, &events_config(), &req)
        .await
        .expect("subscription");
    (id, secret.expose().to_string())
}

fn to(url: &str) -> Request {
    Request {
        url: url.into(),
        ..Request::default()
    }
}

/// Publish an event; its id.
async fn publish(db: &TestDb, key: &str, event_type: &str, tenant: Option<&str>) -> i64 {
    sqlx::query_scalar("SELECT id FROM outbox.publish($1, $2, $3, $4)")
        .bind(key)
        .bind(event_type)
        .bind(json!({"n": key}))
        .bind(tenant)
        .fetch_one(db.pool())
        .await
        .unwrap()
}

/// Expand an event as a relay would (its deliveries, pending).
async fn expand(db: &TestDb, event: i64) {
    sqlx::query("SELECT * FROM outbox.expand_event($1)")
        .bind(event)
        .execute(db.pool())
        .await
        .unwrap();
}

/// The delivery of `event` to `sub`, if any.
async fn delivery(db: &TestDb, event: i64, sub: &str) -> Option<i64> {
    sqlx::query_scalar(
        "SELECT intent_id FROM outbox.event_deliveries WHERE event_id = $1 AND subscription_id = $2",
    )
    .bind(event)
    .bind(sub)
    .fetch_optional(db.pool())
    .await
    .unwrap()
}

/// The secret sealed for `id`, opened with the test key.
async fn sealed_secret(db: &TestDb, id: &str) -> String {
    let sealed: Vec<u8> =
        sqlx::query_scalar("SELECT secret FROM outbox.subscriptions WHERE id = $1")
            .bind(id)
            .fetch_one(db.pool())
            .await
            .unwrap();
    let key = SealingKey::parse(&Secret::new(KEY)).unwrap();
    key.open(id, &sealed).unwrap().expose().to_string()
}

/// POST the create form.
async fn post(s: &mut Session, fields: &[(&str, String)]) -> Answer {
    let refs: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
    s.post_form("/subscriptions", &refs).await
}

/// The text between `id="NAME">` and the next `<`.
fn text_of(html: &str, id: &str) -> String {
    let needle = format!("id=\"{id}\">");
    let at = html
        .find(&needle)
        .unwrap_or_else(|| panic!("no #{id}: {html}"))
        + needle.len();
    html[at..].split('<').next().unwrap().to_string()
}

#[tokio::test]
async fn the_list_and_a_page_show_a_subscription_and_never_a_secret() {
    let db = TestDb::new().await;
    let (id, secret) = subscribe(
        &db,
        Request {
            tenant: Some("acme".into()),
            event_types: vec!["order.*".into()],
            headers: vec!["X-Token: HEADERVALUE".into(), "X-Team: billing".into()],
            description: Some("billing <b>service</b>".into()),
            ..to("http://127.0.0.1:9/hooks/T0001/SECRETPATH?token=SECRETQUERY")
        },
    )
    .await;
    let (other, _) = subscribe(
        &db,
        Request {
            tenant: Some("globex".into()),
            ..to("http://127.0.0.1:9/other")
        },
    )
    .await;
    let event = publish(&db, "order-1-paid", "order.paid", Some("acme")).await;
    expand(&db, event).await;
    let intent = delivery(&db, event, &id).await.expect("a delivery");
    let console = console(&db, &[]).await;
    let mut s = Session::new(&console);

    let never = |body: &str| {
        for hidden in [secret.as_str(), "HEADERVALUE", "SECRETPATH", "SECRETQUERY"] {
            assert!(!body.contains(hidden), "{hidden} shown: {body}");
        }
    };
    let list = s.get("/subscriptions").await;
    assert_eq!(list.status, 200);
    assert!(list.body.contains("href=\"/subscriptions\" class=\"on\""));
    for shown in [
        &id,
        &other,
        "acme",
        "order.*",
        "http://127.0.0.1:9/hooks/",
        "enabled",
    ] {
        assert!(list.body.contains(shown), "{shown}: {}", list.body);
    }
    never(&list.body);
    let acme = s.get("/subscriptions?tenant=acme").await;
    assert!(acme.body.contains(&id) && !acme.body.contains(&other));

    let page = s.get(&format!("/subscriptions/{id}")).await;
    assert_eq!(page.status, 200);
    never(&page.body);
    assert_eq!(text_of(&page.body, "headers"), "X-Team, X-Token");
    assert_eq!(text_of(&page.body, "state"), "enabled");
    assert!(
        page.body.contains("billing &#60;b&#62;service") || page.body.contains("billing &lt;b&gt;"),
        "escaped: {}",
        page.body
    );
    // its delivery, with its event's key and type, linking to the intent
    assert!(page.body.contains(&format!("href=\"/intents/{intent}\"")));
    assert!(page.body.contains("order-1-paid") && page.body.contains("order.paid"));
    assert!(page.body.contains("state pending"), "{}", page.body);
    assert_eq!(s.get("/subscriptions/sub_nosuchone1").await.status, 404);

    // the API, likewise
    let api = s.get("/api/v1/subscriptions?tenant=acme").await;
    never(&api.body);
    let list = json_of(&api).await;
    assert_eq!(list.as_array().unwrap().len(), 1);
    assert_eq!(list[0]["id"], id.as_str());
    assert_eq!(list[0]["state"], "enabled");
    let one = s.get(&format!("/api/v1/subscriptions/{id}")).await;
    never(&one.body);
    let one = json_of(&one).await;
    assert_eq!(
        one["subscription"]["header_names"],
        json!(["X-Team", "X-Token"])
    );
    assert_eq!(one["deliveries"][0]["intent_id"], intent);
    assert_eq!(one["deliveries"][0]["event_key"], "order-1-paid");

    // the database holds it sealed only
    let raw: Vec<u8> = sqlx::query_scalar("SELECT secret FROM outbox.subscriptions WHERE id = $1")
        .bind(&id)
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert!(!raw.windows(secret.len()).any(|w| w == secret.as_bytes()));
}

#[tokio::test]
async fn the_form_makes_one_shows_its_secret_once_and_refuses_a_field_by_name() {
    let db = TestDb::new().await;
    let console = console(&db, &[OPS]).await;
    let mut s = Session::new(&console);
    s.login(OPS.0, OPS.2).await;
    let form = s.get("/subscriptions/new").await;
    assert_eq!(form.status, 200);
    let csrf = field_of(&form.body, "csrf").unwrap();
    let nonce = field_of(&form.body, "nonce").unwrap();
    let send = |fields: Vec<(&'static str, String)>| {
        let mut all = vec![("csrf", csrf.clone()), ("nonce", nonce.clone())];
        all.extend(fields);
        all
    };
    // refused fields: the form again, the field named, the input kept
    for (field, value, named) in [
        ("url", "ftp://example.com/x", "url: "),
        ("url", "http://10.1.2.3/x", "url: "),
        ("event_types", "order.**", "event_types: "),
        ("headers", "no colon here", "headers: "),
        ("rate", "fast", "rate: "),
        ("tenant", &"t".repeat(201), "tenant: "),
    ] {
        let mut fields = vec![
            ("url", "http://127.0.0.1:9/hooks".to_string()),
            ("description", "kept <as typed>".to_string()),
        ];
        fields.retain(|(k, _)| *k != field);
        fields.push((field, value.to_string()));
        let a = post(&mut s, &send(fields)).await;
        assert_eq!(a.status, 400, "{field}: {}", a.body);
        assert!(
            text_of(&a.body, "form-error").starts_with(named),
            "{field}: {}",
            a.body
        );
        assert!(
            a.body.contains("kept &#60;as typed&#62;") || a.body.contains("kept &lt;as typed&gt;")
        );
        assert!(a.body.contains("class=\"bad\""), "the field is marked");
    }
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox.subscriptions")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(n, 0, "nothing made");

    let good = send(vec![
        ("url", "http://127.0.0.1:9/hooks".into()),
        ("tenant", "acme".into()),
        ("event_types", "order.*, invoice.paid".into()),
        (
            "headers",
            "X-Team: billing\r\nX-Token: HEADERVALUE\r\n".into(),
        ),
        ("rate", "50/s".into()),
        ("description", "billing".into()),
    ]);
    let made = post(&mut s, &good).await;
    assert_eq!(made.status, 200, "{}", made.body);
    let secret = text_of(&made.body, "secret");
    assert!(secret.starts_with("whsec_"), "{secret}");
    assert!(made.body.contains("shown this once"));
    let id = made
        .body
        .split("href=\"/subscriptions/")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .expect("a link to the subscription")
        .to_string();
    assert_eq!(sealed_secret(&db, &id).await, secret, "the secret sealed");
    let row: (Option<String>, Vec<String>, Option<f64>) =
        sqlx::query_as("SELECT tenant, event_types, rate FROM outbox.subscriptions WHERE id = $1")
            .bind(&id)
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(
        row,
        (
            Some("acme".into()),
            vec!["order.*".into(), "invoice.paid".into()],
            Some(50.0)
        )
    );
    // the headers: their names readable, their values only sealed
    let (whole, names, sealed): (String, Vec<String>, Vec<u8>) = sqlx::query_as(
        "SELECT s::text, header_names, headers_sealed FROM outbox.subscriptions s WHERE id = $1",
    )
    .bind(&id)
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert!(!whole.contains("HEADERVALUE"), "{whole}");
    assert!(!sealed.windows(11).any(|w| w == b"HEADERVALUE"));
    assert_eq!(names, ["X-Team", "X-Token"]);
    let key = SealingKey::parse(&Secret::new(KEY)).unwrap();
    let opened = key.open_headers(&id, &sealed).unwrap();
    assert_eq!(opened["X-Token"], "HEADERVALUE");
    assert_eq!(opened["X-Team"], "billing");

    // the same form again makes nothing more, and shows no secret
    let again = post(&mut s, &good).await;
    assert_eq!(again.status, 303);
    assert_eq!(
        again.location.as_deref(),
        Some(format!("/subscriptions/{id}").as_str())
    );
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox.subscriptions")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(n, 1);
    for path in [format!("/subscriptions/{id}"), "/subscriptions".into()] {
        let page = s.get(&path).await;
        assert_eq!(page.status, 200);
        assert!(!page.body.contains(&secret) && !page.body.contains("HEADERVALUE"));
    }

    // a console without the sealing key says so, and makes nothing
    let keyless = ConsoleServer::start(&db, &[OPS]).await;
    let mut k = Session::new(&keyless);
    k.login(OPS.0, OPS.2).await;
    let form = k.get("/subscriptions/new").await;
    assert!(text_of(&form.body, "key-problem").contains("secret_key"));
    let fields = [
        ("csrf", field_of(&form.body, "csrf").unwrap()),
        ("nonce", field_of(&form.body, "nonce").unwrap()),
        ("url", "http://127.0.0.1:9/hooks".into()),
    ];
    let refs: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let a = k.post_form("/subscriptions", &refs).await;
    assert_eq!(a.status, 503, "{}", a.body);
    assert!(text_of(&a.body, "form-error").starts_with("secret_key: "));
    let page = k.get(&format!("/subscriptions/{id}")).await;
    assert!(text_of(&page.body, "key-problem").contains("secret_key"));
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox.subscriptions")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(n, 1);
}

#[tokio::test]
async fn disable_enable_and_rotate_work_from_its_page() {
    let db = TestDb::new().await;
    let (id, first) = subscribe(&db, to("http://127.0.0.1:9/hooks")).await;
    let console = console(&db, &[OPS]).await;
    let mut s = Session::new(&console);
    s.login(OPS.0, OPS.2).await;
    let path = format!("/subscriptions/{id}");
    let page = s.get(&path).await;
    let csrf = field_of(&page.body, "csrf").unwrap();

    let a = s
        .post_form(
            &format!("{path}/disable"),
            &[("csrf", &csrf), ("reason", "maintenance")],
        )
        .await;
    assert_eq!(
        (a.status, a.location.as_deref()),
        (303, Some(path.as_str()))
    );
    let page = s.get(&path).await;
    assert_eq!(text_of(&page.body, "state"), "disabled");
    assert!(page.body.contains("maintenance (console user ops)"));
    assert!(page.body.contains("id=\"enable\"") && !page.body.contains("id=\"replay\""));
    let a = s
        .post_form(&format!("{path}/enable"), &[("csrf", &csrf)])
        .await;
    assert_eq!(a.status, 303);
    let page = s.get(&path).await;
    assert_eq!(text_of(&page.body, "state"), "enabled");

    // rotate: the new secret once, the old one signing for the grace
    let nonce = field_of(&page.body, "nonce").unwrap();
    let bad = s
        .post_form(
            &format!("{path}/rotate"),
            &[("csrf", &csrf), ("nonce", &nonce), ("grace", "soon")],
        )
        .await;
    assert_eq!(bad.status, 400);
    assert!(
        text_of(&bad.body, "refusal").starts_with("grace: "),
        "{}",
        bad.body
    );
    assert_eq!(sealed_secret(&db, &id).await, first);
    let rotated = s
        .post_form(
            &format!("{path}/rotate"),
            &[("csrf", &csrf), ("nonce", &nonce), ("grace", "1h")],
        )
        .await;
    assert_eq!(rotated.status, 200, "{}", rotated.body);
    let secret = text_of(&rotated.body, "secret");
    assert!(secret.starts_with("whsec_") && secret != first);
    assert!(rotated.body.contains("for 1h"));
    assert_eq!(sealed_secret(&db, &id).await, secret);
    let signs: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM previous_until - now())::float8 FROM outbox.subscriptions WHERE id = $1",
    )
    .bind(&id)
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert!((3500.0..=3601.0).contains(&signs), "{signs}");
    // sent twice, it rotates once
    let twice = s
        .post_form(
            &format!("{path}/rotate"),
            &[("csrf", &csrf), ("nonce", &nonce), ("grace", "1h")],
        )
        .await;
    assert_eq!(
        (twice.status, twice.location.as_deref()),
        (303, Some(path.as_str()))
    );
    assert_eq!(sealed_secret(&db, &id).await, secret);
    let page = s.get(&path).await;
    assert!(!page.body.contains(&secret) && !page.body.contains(&first));
    assert!(page.body.contains("id=\"previous-until\""));
}

#[tokio::test]
async fn a_viewer_and_a_post_without_the_csrf_token_change_nothing() {
    let db = TestDb::new().await;
    let (id, secret) = subscribe(&db, to("http://127.0.0.1:9/hooks")).await;
    let console = console(&db, &[OPS, VAL]).await;
    let mut viewer = Session::new(&console);
    viewer.login(VAL.0, VAL.2).await;
    let path = format!("/subscriptions/{id}");
    let page = viewer.get(&path).await;
    assert_eq!(page.status, 200);
    assert!(!page.body.contains("id=\"actions\"") && !page.body.contains("/rotate"));
    assert!(!viewer
        .get("/subscriptions")
        .await
        .body
        .contains("new-subscription"));
    let csrf = field_of(&page.body, "csrf").unwrap();
    let nonce = "0123456789abcdef0123";
    assert_eq!(viewer.get("/subscriptions/new").await.status, 403);
    assert_eq!(
        viewer.get(&format!("{path}/replay?since=1h")).await.status,
        403
    );
    let forms: Vec<(String, Vec<(&str, &str)>)> = vec![
        (
            "/subscriptions".into(),
            vec![
                ("csrf", csrf.as_str()),
                ("nonce", nonce),
                ("url", "http://127.0.0.1:9/x"),
            ],
        ),
        (format!("{path}/disable"), vec![("csrf", csrf.as_str())]),
        (format!("{path}/enable"), vec![("csrf", csrf.as_str())]),
        (
            format!("{path}/rotate"),
            vec![("csrf", csrf.as_str()), ("nonce", nonce), ("grace", "0s")],
        ),
        (
            format!("{path}/replay"),
            vec![
                ("csrf", csrf.as_str()),
                ("since", "1h"),
                ("until", "now"),
                ("fingerprint", "x"),
            ],
        ),
    ];
    for (to, fields) in &forms {
        let a = viewer.post_form(to, fields).await;
        assert_eq!(a.status, 403, "{to}: {}", a.body);
        assert!(a.body.contains("is a viewer"), "{to}");
    }
    for (to, body) in [
        (
            "/api/v1/subscriptions".to_string(),
            json!({"url": "http://127.0.0.1:9/x"}),
        ),
        (format!("/api/v1{path}/disable"), json!({})),
        (format!("/api/v1{path}/enable"), json!({})),
        (format!("/api/v1{path}/rotate"), json!({})),
        (
            format!("/api/v1{path}/replay"),
            json!({"since": "1h", "dry_run": true}),
        ),
    ] {
        let a = viewer
            .post_json(&to, &body, &[("x-csrf-token", &csrf)])
            .await;
        assert_eq!(a.status, 403, "{to}: {}", a.body);
    }

    // an operator's POST without the token: refused
    let mut ops = Session::new(&console);
    ops.login(OPS.0, OPS.2).await;
    for (to, fields) in &forms {
        let fields: Vec<(&str, &str)> = fields
            .iter()
            .filter(|(k, _)| *k != "csrf")
            .copied()
            .collect();
        let a = ops.post_form(to, &fields).await;
        assert_eq!(a.status, 403, "{to}: {}", a.body);
        assert!(a.body.contains("no valid CSRF token"), "{to}");
    }
    let api = ops
        .post_json(&format!("/api/v1{path}/disable"), &json!({}), &[])
        .await;
    assert_eq!(api.status, 403, "{}", api.body);

    let row: (i64, bool) = sqlx::query_as(
        "SELECT count(*), bool_or(disabled_at IS NOT NULL OR previous_secret IS NOT NULL)
           FROM outbox.subscriptions",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(row, (1, false), "nothing changed");
    assert_eq!(sealed_secret(&db, &id).await, secret);
}

/// The replay page's hidden fields, by name.
fn confirmation(page: &Answer) -> Vec<(String, String)> {
    ["csrf", "since", "until", "event_type", "fingerprint"]
        .iter()
        .map(|n| (n.to_string(), field_of(&page.body, n).unwrap_or_default()))
        .collect()
}

#[tokio::test]
async fn a_replay_acts_on_exactly_what_its_dry_run_counted() {
    let db = TestDb::new().await;
    let (id, _) = subscribe(&db, to("http://127.0.0.1:9/hooks")).await;
    // received and delivered: sent again; never expanded: a first delivery
    let e1 = publish(&db, "e1", "order.paid", None).await;
    expand(&db, e1).await;
    let d1 = delivery(&db, e1, &id).await.unwrap();
    sqlx::query(
        "UPDATE outbox.intents SET state = 'delivered', delivered_at = now() WHERE id = $1",
    )
    .bind(d1)
    .execute(db.pool())
    .await
    .unwrap();
    let e2 = publish(&db, "e2", "order.paid", None).await;
    // of another type than the replay's
    let e0 = publish(&db, "e0", "invoice.paid", None).await;

    let console = console(&db, &[OPS]).await;
    let mut s = Session::new(&console);
    s.login(OPS.0, OPS.2).await;
    let path = format!("/subscriptions/{id}/replay");
    let bad = s.get(&format!("{path}?since=1h&event_type=order.**")).await;
    assert_eq!(bad.status, 400);
    assert!(text_of(&bad.body, "refusal").starts_with("event_type: "));
    let dry = s.get(&format!("{path}?since=1h&event_type=order.*")).await;
    assert_eq!(dry.status, 200, "{}", dry.body);
    assert_eq!(
        (
            text_of(&dry.body, "events"),
            text_of(&dry.body, "first"),
            text_of(&dry.body, "again")
        ),
        ("2".into(), "1".into(), "1".into())
    );
    let form = confirmation(&dry);

    // published after the dry run: not part of the replay
    let e3 = publish(&db, "e3", "order.paid", None).await;
    let refs: Vec<(&str, &str)> = form.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let done = s.post_form(&path, &refs).await;
    assert_eq!(done.status, 200, "{}", done.body);
    assert_eq!(text_of(&done.body, "first-made"), "1");
    assert_eq!(text_of(&done.body, "sent-again"), "1");
    assert!(
        delivery(&db, e2, &id).await.is_some(),
        "e2's first delivery"
    );
    assert!(
        delivery(&db, e3, &id).await.is_none(),
        "e3 came after the count"
    );
    assert!(delivery(&db, e0, &id).await.is_none(), "another type");
    let state: String = sqlx::query_scalar("SELECT state FROM outbox.intents WHERE id = $1")
        .bind(d1)
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(state, "pending", "e1 sent again");
    let actor: String =
        sqlx::query_scalar("SELECT actor FROM outbox.operator_actions WHERE intent_id = $1")
            .bind(d1)
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(actor, "console:ops");

    // the same confirmation again: what it counted changed, so it shows
    // the new count and does nothing
    let again = s.post_form(&path, &refs).await;
    assert_eq!(again.status, 200);
    assert!(again.body.contains("id=\"replay-note\""), "{}", again.body);
    assert!(!again.body.contains("id=\"replayed\""));
    assert_eq!(text_of(&again.body, "first"), "0");
    let deliveries: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox.event_deliveries WHERE subscription_id = $1",
    )
    .bind(&id)
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(deliveries, 2);
    let retries: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox.operator_actions")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(retries, 1);
}

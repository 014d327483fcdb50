//! The bad-input corpus, tests/corpus/bad-payloads.json, through the real
//! path: every case is enqueued with `outbox.enqueue` into one database, one
//! engine with every provider delivers everything due, and each case
//! must end as its entry says.
//!
//! A case is `{"name", "kind", "payload" | "payload_text", "key"?,
//! "destination"?, "insert"?, "expect", "stage", "sqlstate"?,
//! "reason_contains"}`:
//!
//! - `payload` is any JSON, bound as jsonb; `payload_text` is text cast to
//!   jsonb by Postgres (`null`: SQL NULL), for input that is not JSON.
//! - `expect`: `enqueue_error` (the call fails with `sqlstate` and nothing
//!   is written), `rejected` (the intent ends `rejected` after one attempt,
//!   `last_error` containing `reason_contains`) or `delivered` (hostile
//!   content that is carried safely as data: nothing injected).
//! - `stage` says what refuses it: `enqueue` (outbox.enqueue), `parse` (the
//!   provider's payload parsing, also run by providers/tests/fuzz_payloads.rs),
//!   `provider` (the provider, before any connection), `relay` (the engine).
//! - `insert`: `direct` writes the row with a plain INSERT (a row from before
//!   a check existed); `via_table` passes the payload to outbox.enqueue from
//!   a table column, where Postgres keeps it compressed.
//! - Placeholders in strings: `{{receiver}}` (the HTTP receiver's base URL),
//!   and whole strings `{{repeat N S}}`, `{{nest N}}` (N nested arrays),
//!   `{{addresses N}}` (a list of N addresses).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use crate::common;
use crate::common::smtp::SmtpPeer;
use crate::common::stripe::{FakeStripe, API_KEY};
use crate::common::{config, engine, Receiver, TestDb};
use outbox_providers::Secret;
use outbox_relay::config::Dur;
use outbox_relay::store::{enqueue, EnqueueError, NewIntent};
use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    name: String,
    kind: String,
    #[serde(default, deserialize_with = "present")]
    payload: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    payload_text: Option<Option<String>>,
    key: Option<String>,
    destination: Option<String>,
    /// The enqueue's `p_source` (the enqueuing client's name).
    source: Option<String>,
    insert: Option<String>,
    expect: String,
    stage: String,
    sqlstate: Option<String>,
    reason_contains: String,
}

/// A field that is present, even as `null`, is `Some`.
fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

fn corpus() -> Vec<Case> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/corpus/bad-payloads.json"
    );
    let cases: Vec<Case> = serde_json::from_str(&std::fs::read_to_string(path).unwrap())
        .expect("tests/corpus/bad-payloads.json is a list of cases");
    let mut names = std::collections::HashSet::new();
    for c in &cases {
        assert!(names.insert(c.name.clone()), "duplicate case {}", c.name);
        assert!(
            matches!(
                c.expect.as_str(),
                "rejected" | "enqueue_error" | "delivered"
            ),
            "{}: expect {:?}",
            c.name,
            c.expect
        );
        assert!(
            matches!(c.stage.as_str(), "enqueue" | "parse" | "provider" | "relay"),
            "{}: stage {:?}",
            c.name,
            c.stage
        );
        assert_eq!(
            c.expect == "enqueue_error",
            c.stage == "enqueue",
            "{}: enqueue errors and only they are refused by outbox.enqueue",
            c.name
        );
        assert!(
            c.payload.is_some() != c.payload_text.is_some(),
            "{}: exactly one of payload and payload_text",
            c.name
        );
        assert!(
            c.expect == "delivered" || !c.reason_contains.is_empty(),
            "{}: a refusal needs reason_contains",
            c.name
        );
    }
    cases
}

/// Expand the corpus placeholders.
fn expand(v: &Value, receiver: &str) -> Value {
    match v {
        Value::String(s) => expand_str(s, receiver),
        Value::Array(items) => Value::Array(items.iter().map(|i| expand(i, receiver)).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), expand(v, receiver)))
                .collect(),
        ),
        other => other.clone(),
    }
}

fn expand_str(s: &str, receiver: &str) -> Value {
    if let Some(spec) = s.strip_prefix("{{").and_then(|r| r.strip_suffix("}}")) {
        let mut words = spec.splitn(3, ' ');
        let verb = words.next().unwrap();
        let n = words.next().and_then(|n| n.parse::<usize>().ok());
        match (verb, n) {
            ("repeat", Some(n)) => return Value::String(words.next().unwrap().repeat(n)),
            ("nest", Some(n)) => {
                let mut v = Value::from(1);
                for _ in 0..n {
                    v = Value::Array(vec![v]);
                }
                return v;
            }
            ("addresses", Some(n)) => {
                return Value::Array(
                    (0..n)
                        .map(|i| Value::String(format!("rcpt{i}@example.com")))
                        .collect(),
                )
            }
            _ => {}
        }
    }
    Value::String(s.replace("{{receiver}}", receiver))
}

struct Prepared<'a> {
    case: &'a Case,
    key: String,
    payload: Option<Value>,
}

impl Prepared<'_> {
    fn text(&self) -> Option<String> {
        self.case.payload_text.clone().flatten()
    }
}

/// Enqueue one case the way its entry says; the error, if any.
async fn write(db: &TestDb, p: &Prepared<'_>) -> Result<(), sqlx::Error> {
    let c = p.case;
    match c.insert.as_deref() {
        None => {
            // inside an application transaction with a business write
            let mut tx = db.pool().begin().await?;
            sqlx::query("INSERT INTO app_orders (note) VALUES ($1)")
                .bind(&c.name)
                .execute(&mut *tx)
                .await?;
            let r = match &p.payload {
                Some(payload) => {
                    sqlx::query("SELECT id FROM outbox.enqueue($1, $2, $3, $4, now(), NULL, $5)")
                        .bind(&p.key)
                        .bind(&c.kind)
                        .bind(payload)
                        .bind(&c.destination)
                        .bind(&c.source)
                        .execute(&mut *tx)
                        .await
                }
                None => sqlx::query(
                    "SELECT id FROM outbox.enqueue($1, $2, $3::text::jsonb, $4, now(), NULL, $5)",
                )
                .bind(&p.key)
                .bind(&c.kind)
                .bind(p.text())
                .bind(&c.destination)
                .bind(&c.source)
                .execute(&mut *tx)
                .await,
            };
            match r {
                Ok(_) => tx.commit().await,
                Err(e) => {
                    tx.rollback().await?;
                    Err(e)
                }
            }
        }
        Some("direct") => {
            let q = sqlx::query(
                "INSERT INTO outbox.intents (key, kind, destination, payload)
                 VALUES ($1, $2, $3, coalesce($4, $5::text::jsonb))",
            )
            .bind(&p.key)
            .bind(&c.kind)
            .bind(&c.destination)
            .bind(&p.payload)
            .bind(p.text());
            q.execute(db.pool()).await.map(drop)
        }
        Some("via_table") => {
            sqlx::query("INSERT INTO staging (key, payload) VALUES ($1, $2)")
                .bind(&p.key)
                .bind(&p.payload)
                .execute(db.pool())
                .await?;
            let stored: i32 =
                sqlx::query_scalar("SELECT pg_column_size(payload) FROM staging WHERE key = $1")
                    .bind(&p.key)
                    .fetch_one(db.pool())
                    .await?;
            assert!(
                stored < 1 << 20,
                "{}: the staged payload is stored compressed ({stored} bytes)",
                c.name
            );
            sqlx::query(
                "SELECT (outbox.enqueue(s.key, $2, s.payload, $3)).id FROM staging s WHERE s.key = $1",
            )
            .bind(&p.key)
            .bind(&c.kind)
            .bind(&c.destination)
            .execute(db.pool())
            .await
            .map(drop)
        }
        Some(other) => panic!("{}: unknown insert {other:?}", c.name),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_input_is_refused_with_its_reason_and_nothing_is_lost_or_sent() {
    let cases = corpus();
    let db = TestDb::new().await;
    sqlx::raw_sql(
        "CREATE TABLE app_orders (id serial PRIMARY KEY, note text);
         CREATE TABLE staging (key text PRIMARY KEY, payload jsonb);",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let rx = Receiver::ok().await;
    let peer = SmtpPeer::start().await;
    let stripe = FakeStripe::start().await;
    let base = rx.url("");

    let prepared: Vec<Prepared> = cases
        .iter()
        .map(|c| Prepared {
            case: c,
            key: match &c.key {
                Some(k) => expand_str(k, &base).as_str().unwrap().to_string(),
                None => format!("bad:{}", c.name),
            },
            payload: c.payload.as_ref().map(|p| expand(p, &base)),
        })
        .collect();

    let mut failures = Vec::new();
    let mut written = 0;
    for p in &prepared {
        let c = p.case;
        let result = write(&db, p).await;
        match (c.expect.as_str(), result) {
            ("enqueue_error", Ok(())) => {
                failures.push(format!("{}: enqueue succeeded, expected an error", c.name))
            }
            ("enqueue_error", Err(e)) => {
                let dbe = e.as_database_error();
                let code = dbe.and_then(|d| d.code()).map(|c| c.into_owned());
                let message = dbe.map(|d| d.message().to_string()).unwrap_or_default();
                if code != c.sqlstate {
                    failures.push(format!(
                        "{}: SQLSTATE {code:?}, expected {:?} ({message})",
                        c.name, c.sqlstate
                    ));
                }
                if !message.contains(&c.reason_contains) {
                    failures.push(format!(
                        "{}: {message:?} should contain {:?}",
                        c.name, c.reason_contains
                    ));
                }
            }
            (_, Ok(())) => written += 1,
            (_, Err(e)) => failures.push(format!("{}: enqueue failed: {e}", c.name)),
        }
    }
    // an enqueue error leaves nothing: no intent, and the application's
    // transaction (its business write included) rolled back
    let committed: Vec<String> = sqlx::query_scalar("SELECT note FROM app_orders")
        .fetch_all(db.pool())
        .await
        .unwrap();
    for p in prepared.iter().filter(|p| p.case.expect == "enqueue_error") {
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox.intents WHERE key = $1")
            .bind(&p.key)
            .fetch_one(db.pool())
            .await
            .unwrap();
        if rows != 0 || committed.contains(&p.case.name) {
            failures.push(format!(
                "{}: refused, but something was written",
                p.case.name
            ));
        }
    }

    // the Rust API maps every refusal of a JSON payload to a typed error
    for p in &prepared {
        let c = p.case;
        let (Some(payload), "enqueue_error", None) = (&p.payload, c.expect.as_str(), &c.insert)
        else {
            continue;
        };
        let intent = NewIntent {
            destination: c.destination.clone(),
            source: c.source.clone(),
            ..NewIntent::new(p.key.clone(), c.kind.clone(), payload.clone())
        };
        match enqueue(db.pool(), &intent).await {
            Err(e @ (EnqueueError::Invalid { .. } | EnqueueError::PayloadTooLarge { .. }))
                if e.to_string().contains(&c.reason_contains) =>
            {
                if c.sqlstate.as_deref() == Some("OB413")
                    && !matches!(e, EnqueueError::PayloadTooLarge { .. })
                {
                    failures.push(format!(
                        "{}: OB413 should be PayloadTooLarge: {e:?}",
                        c.name
                    ));
                }
            }
            other => failures.push(format!("{}: Rust enqueue gave {other:?}", c.name)),
        }
    }

    // one engine with every provider; nothing but the input can fail
    let mut cfg = config();
    cfg.webhook.endpoints = HashMap::from([("known".to_string(), rx.url("/known"))]);
    cfg.email.smtp_url = Some(Secret::new(peer.url()));
    cfg.email.from = Some("Shop <shop@example.com>".into());
    cfg.email.timeout = Dur(Duration::from_secs(3));
    cfg.charge.api_key = Some(Secret::new(API_KEY));
    cfg.charge.api_base = stripe.base.clone();
    // the broker kinds refuse their bad payloads before connecting: no
    // broker listens at these addresses, so a payload accepted by mistake
    // ends transient, not rejected, and fails its case
    cfg.nats.url = Some(format!("nats://127.0.0.1:{}", common::free_port()));
    cfg.amqp.url = Some(format!(
        "amqp://guest@127.0.0.1:{}/%2f",
        common::free_port()
    ));
    cfg.kafka.brokers = Some(format!("127.0.0.1:{}", common::free_port()));
    // within the test lease (a loaded config would refuse a longer one)
    cfg.nats.timeout = Dur(Duration::from_secs(2));
    cfg.amqp.timeout = Dur(Duration::from_secs(2));
    cfg.kafka.timeout = Dur(Duration::from_secs(2));
    tokio::time::timeout(
        Duration::from_secs(60),
        engine(db.store.clone(), &cfg).run_once(),
    )
    .await
    .expect("one pass over the corpus ends")
    .expect("the engine runs");

    // nothing lost: exactly the cases written, each in its final state
    let rows: Vec<(String, String, i32, Option<String>)> =
        sqlx::query_as("SELECT key, state, attempts, last_error FROM outbox.intents")
            .fetch_all(db.pool())
            .await
            .unwrap();
    if rows.len() != written {
        failures.push(format!(
            "{} intents for {written} cases written",
            rows.len()
        ));
    }
    let by_key: BTreeMap<_, _> = rows
        .into_iter()
        .map(|(k, s, a, e)| (k, (s, a, e.unwrap_or_default())))
        .collect();
    for p in prepared.iter().filter(|p| p.case.expect != "enqueue_error") {
        let c = p.case;
        let Some((state, attempts, error)) = by_key.get(&p.key) else {
            failures.push(format!("{}: its intent is missing", c.name));
            continue;
        };
        if *state != c.expect || *attempts != 1 {
            failures.push(format!(
                "{}: {state} after {attempts} attempts, expected {} after 1 ({error})",
                c.name, c.expect
            ));
        }
        if !error.contains(&c.reason_contains) {
            failures.push(format!(
                "{}: last_error {error:?} should contain {:?}",
                c.name, c.reason_contains
            ));
        }
        // a reason quotes the bad value, clipped: never a copy of the payload
        if error.chars().count() > outbox_providers::outcome::MAX_REASON_CHARS {
            failures.push(format!(
                "{}: last_error is {} characters long",
                c.name,
                error.chars().count()
            ));
        }
    }

    // an operator can still look at a row whose payload cannot be read
    for p in prepared
        .iter()
        .filter(|p| p.case.insert.as_deref() == Some("direct"))
    {
        for args in [vec!["show", p.key.as_str()], vec!["list", "--json"]] {
            let out = common::cli(&db, &args).await;
            let stdout = String::from_utf8_lossy(&out.stdout);
            if !out.status.success() || !stdout.contains("cannot be read as JSON") {
                failures.push(format!(
                    "{}: `outbox-relay {}` failed or hid the problem: {}{}",
                    p.case.name,
                    args.join(" "),
                    stdout,
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
        }
    }

    // nothing refused reached a peer: the receiver saw only the delivered
    // webhooks, the SMTP server only the delivered emails, Stripe nothing
    let delivered = |kind: &str| {
        prepared
            .iter()
            .filter(|p| p.case.kind == kind && p.case.expect == "delivered")
            .collect::<Vec<_>>()
    };
    let mut expected_paths: Vec<String> = delivered("webhook")
        .iter()
        .map(|p| {
            let url = p.payload.as_ref().unwrap()["url"].as_str().unwrap();
            reqwest::Url::parse(url).unwrap().path().to_string()
        })
        .collect();
    let mut paths: Vec<String> = rx.requests().iter().map(|r| r.path.clone()).collect();
    expected_paths.sort();
    paths.sort();
    if paths != expected_paths {
        failures.push(format!(
            "the receiver got {paths:?}, expected only {expected_paths:?}"
        ));
    }
    for r in rx.requests() {
        if r.headers.contains_key("x-injected") {
            failures.push(format!("{}: a header was injected", r.path));
        }
    }
    let messages = peer.messages();
    let mut expected_rcpts: Vec<Value> = delivered("email")
        .iter()
        .map(|p| p.payload.as_ref().unwrap()["to"].clone())
        .collect();
    let mut rcpts: Vec<Value> = messages.iter().map(|m| m["rcpt_tos"].clone()).collect();
    expected_rcpts.sort_by_key(|v| v.to_string());
    rcpts.sort_by_key(|v| v.to_string());
    if rcpts != expected_rcpts {
        failures.push(format!(
            "the SMTP server got messages for {rcpts:?}, expected only {expected_rcpts:?}"
        ));
    }
    for m in &messages {
        let data = m["data"].as_str().unwrap_or_default();
        let head = data.split("\r\n\r\n").next().unwrap_or_default();
        for line in head.split("\r\n") {
            let lower = line.to_ascii_lowercase();
            if lower.starts_with("bcc:") || lower.starts_with("x-injected:") {
                failures.push(format!("{}: injected header {line:?}", m["rcpt_tos"]));
            }
        }
        if m["mail_from"] != "shop@example.com" {
            failures.push(format!("a message from {}", m["mail_from"]));
        }
    }
    if !stripe.fake.requests().is_empty() || !stripe.fake.payments().is_empty() {
        failures.push(format!("Stripe was called: {:?}", stripe.fake.requests()));
    }

    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// A provider that panics on every delivery.
struct Panics;

#[async_trait::async_trait]
impl outbox_providers::Provider for Panics {
    fn kind(&self) -> &'static str {
        "webhook"
    }
    async fn deliver(&self, d: &outbox_providers::Delivery<'_>) -> outbox_providers::Outcome {
        panic!("cannot handle {}", d.key)
    }
    fn on_ambiguous(&self) -> outbox_providers::AmbiguityPolicy {
        outbox_providers::AmbiguityPolicy::Redeliver
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_that_panics_parks_the_intent_instead_of_looping_or_hanging() {
    let db = TestDb::new().await;
    db.enqueue(
        "boom",
        "webhook",
        serde_json::json!({"url": "http://127.0.0.1:9/", "body": 1}),
    )
    .await;
    let engine = outbox_relay::Engine::new(
        db.store.clone(),
        outbox_providers::ProviderSet::new().with(std::sync::Arc::new(Panics)),
        outbox_relay::EngineConfig::from_config(&config()),
    );
    tokio::time::timeout(Duration::from_secs(30), engine.run_once())
        .await
        .expect("run_once ends although the delivery task panicked")
        .unwrap();
    let i = db.store.find("boom").await.unwrap();
    assert_eq!((i.state.as_str(), i.attempts), ("ambiguous", 1));
    let err = i.last_error.unwrap_or_default();
    assert!(
        err.contains("the webhook provider panicked (cannot handle boom)"),
        "{err}"
    );
}

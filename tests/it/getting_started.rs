//! docs/getting-started.md, run as written, so that the tutorial cannot
//! drift from the product: its commands run in order in one shell (the
//! directives its first comment names say which run when), each output it
//! shows is compared with the real one, and then what it promises is
//! checked in the database and the console. `page` says how a page is
//! read and its output compared, `session` how its commands run.
//!
//! Skipped: the installation (the test puts the binaries it built on
//! `PATH` instead: `outbox-relay`, and `demo-receiver`, which it builds
//! with cargo). The database's creation runs, against the test server and
//! under a name of the test's own. Needs bash, psql, curl and openssl:
//! tests/run.sh installs Debian's `postgresql`, which brings psql.

pub mod page;
pub mod session;

use std::time::Duration;

use sqlx::PgPool;

use crate::common::wait_for;
use page::Run;
use session::{Page, Session, PAGE_CONSOLE_ADDR};

/// The page, from the repository root.
pub const PAGE: &str = "docs/getting-started.md";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_getting_started_page_runs_as_written() {
    let page = Page::read(PAGE);

    // what the page must hold for this test to mean anything
    let commands = page.commands();
    for needed in [
        "CREATE DATABASE outbox_tutorial",
        "export DATABASE_URL=",
        "outbox-relay migrate",
        "outbox.enqueue(",
        "demo-receiver --port 48080 &",
        "allowed_networks = [\"127.0.0.0/8\"]",
        "outbox-relay run --once --config relay.toml",
        "outbox-relay show order:42:confirmation",
        "outbox-relay retry order:43:confirmation",
        "[subscriptions]",
        "secret_key = \"$(openssl rand -base64 32)\"",
        "outbox-relay subscriptions add --config relay.toml",
        "--event-types 'order.*'",
        "outbox.publish(",
        "outbox-relay show order:44:placed",
        "outbox-relay console",
        PAGE_CONSOLE_ADDR,
    ] {
        assert!(
            commands.contains(needed),
            "{PAGE}: no command holds {needed:?}"
        );
    }
    let skipped: Vec<&page::Block> = page.blocks.iter().filter(|b| b.run == Run::Skip).collect();
    assert!(
        skipped.iter().any(|b| b.text.contains("cargo install")),
        "{PAGE}: the install step (cargo install) is not a skipped block"
    );
    assert!(
        skipped.iter().all(|b| !b
            .text
            .lines()
            .any(|l| l.trim_start().starts_with("outbox-relay") || l.contains("DATABASE"))),
        "{PAGE}: a skipped block runs outbox-relay or makes the database, which this test would then not check"
    );
    assert!(
        page.blocks
            .iter()
            .any(|b| b.run == Run::AtEnd && b.text.contains("DROP DATABASE outbox_tutorial")),
        "{PAGE}: the database is not dropped at the end"
    );
    assert!(
        page.blocks.iter().filter(|b| !b.shown.is_empty()).count() >= 8,
        "{PAGE} shows too little output for this test to compare"
    );

    let mut session = Session::new("getting-started").await;
    session.add(&page, |r| *r == Run::InOrder);
    session.checks_here();
    session.add(&page, |r| *r == Run::AfterChecks);
    session.add(&page, |r| *r == Run::AtEnd);
    let mut run = session.start();
    run.checks(Duration::from_secs(90)).await;

    let db = run.connect().await;
    // 3: migrate created the schema
    let out = run.transcript();
    assert!(
        out.contains("applied 0001 core") && out.contains("the schema is at version"),
        "migrate did not say what it applied:\n{out}"
    );
    // 4: the order and its intent committed together
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders WHERE id = 42")
        .fetch_one(&db)
        .await
        .expect("the page's orders table");
    assert_eq!(orders, 1);
    // 5, 6: the first webhook was delivered, at the first attempt
    assert_eq!(state(&db, "order:42:confirmation").await, "delivered");
    assert_eq!(outcomes(&db, "order:42:confirmation").await, ["delivered"]);
    // 7: three refused attempts made it dead, `show` said so, and the retry
    // delivered it under the same key generation, recorded as from dead
    assert_eq!(state(&db, "order:43:confirmation").await, "delivered");
    assert_eq!(
        outcomes(&db, "order:43:confirmation").await,
        ["transient", "transient", "transient", "delivered"]
    );
    let (action, detail): (String, serde_json::Value) = sqlx::query_as(
        "SELECT a.action, a.detail::jsonb FROM outbox.operator_actions a \
         JOIN outbox.intents i ON i.id = a.intent_id WHERE i.key = 'order:43:confirmation'",
    )
    .fetch_one(&db)
    .await
    .expect("one operator action on order:43");
    assert_eq!(action, "retry");
    assert_eq!(detail["from"], "dead", "{detail}");
    assert_eq!(detail["new_effect"], false, "{detail}");
    // 8: the event committed with its order, was expanded into one
    // delivery to the one subscription, and the receiver got that delivery
    // under its webhook-id; the subscription's secret is stored sealed
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders WHERE id = 44")
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(orders, 1);
    assert_eq!(state(&db, "order:44:placed").await, "delivered");
    assert_eq!(outcomes(&db, "order:44:placed").await, ["delivered"]);
    let (subscription, event_types, sealed): (String, Vec<String>, Vec<u8>) =
        sqlx::query_as("SELECT id, event_types, secret FROM outbox.subscriptions")
            .fetch_one(&db)
            .await
            .expect("the page's one subscription");
    assert_eq!(event_types, ["order.*"]);
    let (delivery, of): (String, String) = sqlx::query_as(
        "SELECT i.key, d.subscription_id FROM outbox.event_deliveries d \
         JOIN outbox.intents e ON e.id = d.event_id JOIN outbox.intents i ON i.id = d.intent_id \
         WHERE e.key = 'order:44:placed'",
    )
    .fetch_one(&db)
    .await
    .expect("one delivery of order:44:placed");
    assert_eq!(of, subscription);
    assert_eq!(state(&db, &delivery).await, "delivered");
    assert_eq!(outcomes(&db, &delivery).await, ["delivered"]);
    let webhook_id: String =
        sqlx::query_scalar("SELECT provider_ref FROM outbox.intents WHERE key = $1")
            .bind(&delivery)
            .fetch_one(&db)
            .await
            .unwrap();
    assert!(
        out.contains(&format!(
            "receiver: POST /events webhook-id={webhook_id} -> 200"
        )),
        "the receiver did not get the delivery {webhook_id}:\n{out}"
    );
    let secret = out
        .lines()
        .find(|l| l.starts_with("whsec_"))
        .unwrap_or_else(|| panic!("`subscriptions add` printed no secret:\n{out}"));
    assert!(
        !sealed.windows(secret.len()).any(|w| w == secret.as_bytes()),
        "the signing secret is stored in clear"
    );
    // 6, 7, 8: the states `show` printed
    let shown_states: Vec<&str> = out
        .lines()
        .filter_map(|l| l.strip_prefix("state "))
        .map(str::trim)
        .collect();
    assert_eq!(
        shown_states,
        ["delivered", "dead", "delivered", "delivered"],
        "what `show` printed:\n{out}"
    );
    // 9: the running relay delivers what is enqueued next, with no command
    let delivered = wait_for(Duration::from_secs(30), || async {
        state(&db, "order:44:confirmation").await == "delivered"
    })
    .await;
    assert!(
        delivered,
        "the running relay did not deliver order:44:\n{}",
        run.transcript()
    );
    let out = run.transcript();
    // a receiver's line may follow output that ends without a newline of
    // its own (curl's JSON), so it is found anywhere on a line
    let received = out
        .match_indices("receiver: POST /orders webhook-id=msg_")
        .filter(|(at, _)| {
            out[*at..]
                .lines()
                .next()
                .is_some_and(|l| l.ends_with("-> 200"))
        })
        .count();
    assert_eq!(received, 3, "the receiver's lines:\n{out}");
    // 9: the console answers, with the pages the page tells you to look at
    assert!(
        out.contains("\"verdict\":\"Yes: the effect happened.\""),
        "the console's lookup answer:\n{out}"
    );
    let console = format!("http://{}", run.session.console_addr);
    let id43: i64 = sqlx::query_scalar("SELECT id FROM outbox.intents WHERE key = $1")
        .bind("order:43:confirmation")
        .fetch_one(&db)
        .await
        .unwrap();
    for (path, expected) in [
        ("/".to_string(), "Overview"),
        (format!("/intents/{id43}"), "order:43:confirmation"),
        (format!("/intents/{id43}"), "gave up after 3 attempts"),
        ("/failures".to_string(), "Failures"),
        ("/subscriptions".to_string(), subscription.as_str()),
        ("/lookup".to_string(), "Did it happen?"),
    ] {
        let page = reqwest::get(format!("{console}{path}"))
            .await
            .unwrap_or_else(|e| panic!("GET {path} from the console: {e}\n{}", run.transcript()));
        assert_eq!(page.status(), 200, "GET {path}");
        let body = page.text().await.unwrap();
        assert!(
            body.contains(expected),
            "GET {path}: no {expected:?}:\n{body}"
        );
    }
    // the page drops the database at the end
    run.disconnect(db).await;

    // the page's clean-up stops everything it started, and every output
    // the page shows is the one printed
    let dropped_name = run.session.db_name.clone();
    let admin = crate::common::admin_url();
    let out = run.finish().await;
    assert!(
        out.contains("receiver: stopped") && out.contains("SIGTERM received"),
        "{out}"
    );
    let conn = PgPool::connect(&admin).await.unwrap();
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_database WHERE datname = $1")
        .bind(&dropped_name)
        .fetch_one(&conn)
        .await
        .unwrap();
    assert_eq!(left, 0, "the page's clean-up did not drop its database");
    conn.close().await;
}

/// An intent's state.
pub async fn state(db: &PgPool, key: &str) -> String {
    sqlx::query_scalar("SELECT state FROM outbox.intents WHERE key = $1")
        .bind(key)
        .fetch_one(db)
        .await
        .unwrap_or_else(|e| panic!("intent {key}: {e}"))
}

/// The outcomes of an intent's attempts, in order.
pub async fn outcomes(db: &PgPool, key: &str) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT a.outcome FROM outbox.attempt_history a JOIN outbox.intents i ON i.id = a.intent_id \
         WHERE i.key = $1 ORDER BY a.attempt",
    )
    .bind(key)
    .fetch_all(db)
    .await
    .unwrap()
}

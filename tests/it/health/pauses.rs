//! Pauses: an operator's pause and resume, held for every spelling of an
//! origin and for a claim recovered after a crash.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_pauses_and_resumes_a_destination_and_both_are_recorded() {
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    let alert_rx = Receiver::ok().await;
    let origin = format!("http://{}", rx.addr);
    let file = relay_config(&format!(
        "[alerts]\nurl = \"{}\"\n",
        alert_rx.url("/alerts")
    ));
    let run = |args: Vec<String>| {
        let file = file.clone();
        let url = db.url.clone();
        async move {
            tokio::process::Command::new(common::relay_bin())
                .args(&args)
                .env("DATABASE_URL", url)
                .env("OUTBOX_RELAY_CONFIG", &file)
                .output()
                .await
                .unwrap()
        }
    };
    let out = run(vec![
        "destinations".into(),
        "pause".into(),
        format!("{origin}/ignored/path"),
        "--reason".into(),
        "partner maintenance".into(),
    ])
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("paused {origin}")));
    for n in 0..5 {
        db.enqueue(
            &format!("held:{n}"),
            "webhook",
            json!({"url": rx.url("/hook"), "body": {"n": n}}),
        )
        .await;
    }
    let mut cfg = config();
    cfg.alerts.url = Some(alert_rx.url("/alerts"));
    // the relays' health loop raises the pause's alert, once whichever runs
    let settings = cfg.health().unwrap();
    for _ in 0..3 {
        outbox_relay::services::health::raise_pause_alerts(&db.store, &settings).await;
    }
    engine(db.store.clone(), &cfg).run_once().await.unwrap();
    assert!(
        rx.requests().is_empty(),
        "nothing is sent to a paused destination"
    );
    let i = db.store.find("held:0").await.unwrap();
    assert_eq!((i.state.as_str(), i.attempts), ("pending", 0), "{i:?}");
    assert!(
        i.last_error
            .as_deref()
            .unwrap_or_default()
            .contains("is paused by"),
        "{i:?}"
    );
    let out = run(vec!["destinations".into(), "--json".into()]).await;
    let list: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let row = list.iter().find(|d| d["name"] == origin.as_str()).unwrap();
    assert_eq!(row["state"], "paused");
    assert_eq!(row["pending"], 5);
    assert!(row["paused_by"].as_str().is_some_and(|a| !a.is_empty()));
    let table = run(vec!["destinations".into()]).await;
    assert!(String::from_utf8_lossy(&table.stdout).contains("paused by"));

    let out = run(vec!["destinations".into(), "resume".into(), origin.clone()]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // the deferral's wait is about a second
    common::run_until(
        engine(db.store.clone(), &cfg),
        Duration::from_secs(10),
        || async { db.count("key LIKE 'held:%' AND state = 'delivered'").await == 5 },
    )
    .await;
    let events: Vec<(String, String, Option<Value>)> = sqlx::query_as(
        "SELECT event, actor, detail FROM outbox.destination_events WHERE destination = $1 ORDER BY id",
    )
    .bind(&origin)
    .fetch_all(db.pool())
    .await
    .unwrap();
    let names: Vec<&str> = events.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(names, ["paused", "resumed"]);
    assert_eq!(
        events[0].2.as_ref().unwrap()["reason"],
        "partner maintenance"
    );
    assert!(events.iter().all(|e| !e.1.is_empty()), "each has its actor");
    let got = alerts(&alert_rx);
    assert_eq!(
        got.iter().filter(|a| a.0 == "destination.paused").count(),
        1,
        "{got:?}"
    );
    // an unknown name is refused with the forms it takes
    let out = run(vec![
        "destinations".into(),
        "pause".into(),
        "partner".into(),
    ])
    .await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a destination"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_holds_for_every_spelling_of_an_ipv4_origin() {
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    let port = rx.addr.port();
    let cfg = config();
    let settings = cfg.health().unwrap();
    let paused = outbox_relay::services::health::pause(
        &db.store,
        &settings,
        &format!("http://127.0.0.1:{port}"),
        Some("maintenance"),
    )
    .await
    .unwrap();
    assert_eq!(paused, format!("http://127.0.0.1:{port}"));
    let spellings = [
        format!("http://[::ffff:127.0.0.1]:{port}/hook"),
        format!("http://[::FFFF:7f00:1]:{port}/hook"),
        format!("http://0x7f.1:{port}/hook"),
        format!("http://127.0.0.1.:{port}/hook"),
    ];
    for (n, url) in spellings.iter().enumerate() {
        db.enqueue(
            &format!("spelled:{n}"),
            "webhook",
            json!({"url": url, "body": n}),
        )
        .await;
    }
    engine(db.store.clone(), &cfg).run_once().await.unwrap();
    assert!(
        rx.requests().is_empty(),
        "a paused origin receives nothing, however it is written: {:?}",
        rx.requests()
            .iter()
            .map(|r| r.path.clone())
            .collect::<Vec<_>>()
    );
    assert_eq!(
        db.count(
            "key LIKE 'spelled:%' AND state = 'pending' AND attempts = 0
             AND last_error LIKE '%is paused by%'"
        )
        .await,
        spellings.len() as i64
    );
    // the same URLs reach the receiver once it is resumed
    outbox_relay::services::health::resume(&db.store, &settings, &paused)
        .await
        .unwrap();
    common::run_until(
        engine(db.store.clone(), &cfg),
        Duration::from_secs(15),
        || async {
            db.count("key LIKE 'spelled:%' AND state = 'delivered'")
                .await
                == 4
        },
    )
    .await;
    assert_eq!(rx.requests().len(), spellings.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_holds_for_a_claim_recovered_after_a_crash() {
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    let parked_rx = Receiver::ok().await;
    db.enqueue("crashed", "webhook", json!({"url": rx.url("/"), "body": 1}))
        .await;
    db.enqueue(
        "crashed-parked",
        "webhook",
        json!({"url": parked_rx.url("/"), "body": 2}),
    )
    .await;
    // a relay claims both with a 100ms lease and dies mid-delivery
    let claims = db.store.claim("dead-relay", 10, 100, &[]).await.unwrap();
    assert_eq!(claims.len(), 2);
    let redeliver = config();
    let mut park = config();
    park.webhook.on_ambiguous = AmbiguityPolicy::Park;
    let settings = redeliver.health().unwrap();
    for r in [&rx, &parked_rx] {
        outbox_relay::services::health::pause(
            &db.store,
            &settings,
            &format!("http://{}", r.addr),
            None,
        )
        .await
        .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(150)).await;

    // the sweeper recovers both; the gate holds them like any other claim
    engine(db.store.clone(), &redeliver)
        .run_once()
        .await
        .unwrap();
    assert!(
        rx.requests().is_empty() && parked_rx.requests().is_empty(),
        "a paused destination receives nothing, recovered claims included"
    );
    for key in ["crashed", "crashed-parked"] {
        let i = db.store.find(key).await.unwrap();
        assert_eq!((i.state.as_str(), i.attempts), ("pending", 1), "{i:?}");
        assert!(
            i.last_error
                .as_deref()
                .unwrap_or_default()
                .contains("is paused by"),
            "{i:?}"
        );
        let outcomes: Vec<String> = db
            .store
            .attempts(i.id)
            .await
            .unwrap()
            .into_iter()
            .map(|a| a.outcome)
            .collect();
        assert_eq!(outcomes, ["lost"], "no attempt spent while paused");
    }

    // resumed: the recovery goes on where it stopped. Redelivered under the
    // same key, or, with the park policy, parked: the lost attempt is still
    // asked about, not forgotten by the deferral
    outbox_relay::services::health::resume(
        &db.store,
        &settings,
        &format!("http://{}", parked_rx.addr),
    )
    .await
    .unwrap();
    let parked = run_for(
        engine(db.store.clone(), &park),
        Duration::from_secs(15),
        || async { db.state("crashed-parked").await == "ambiguous" },
    )
    .await;
    assert!(
        parked,
        "the recovery was parked: {:?}",
        db.store.find("crashed-parked").await.unwrap()
    );
    assert!(parked_rx.requests().is_empty(), "parking never re-executes");
    let reason = db
        .store
        .find("crashed-parked")
        .await
        .unwrap()
        .last_error
        .unwrap();
    assert!(reason.contains("dead-relay"), "{reason}");
    outbox_relay::services::health::resume(&db.store, &settings, &format!("http://{}", rx.addr))
        .await
        .unwrap();
    common::run_until(
        engine(db.store.clone(), &redeliver),
        Duration::from_secs(15),
        || async { db.state("crashed").await == "delivered" },
    )
    .await;
    assert_eq!(rx.requests().len(), 1);
    let i = db.store.find("crashed").await.unwrap();
    let outcomes: Vec<String> = db
        .store
        .attempts(i.id)
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.outcome)
        .collect();
    assert_eq!(outcomes, ["lost", "delivered"]);
    assert_eq!(
        rows(&db, "outbox.intents WHERE recover_owner IS NOT NULL").await,
        0
    );
}

/// A pause of `http://localhost:P` holds `http://localhost.:P` and
/// `http://LocalHost.:P`: a name is matched without its trailing dot and
/// whatever its case.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_holds_a_dns_name_with_a_trailing_dot_in_any_case() {
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    let port = rx.addr.port();
    let cfg = config();
    let settings = cfg.health().unwrap();
    let paused = outbox_relay::services::health::pause(
        &db.store,
        &settings,
        &format!("http://localhost:{port}"),
        None,
    )
    .await
    .unwrap();
    for (n, host) in ["localhost.", "LocalHost.", "LOCALHOST"].iter().enumerate() {
        db.enqueue(
            &format!("dotted:{n}"),
            "webhook",
            json!({"url": format!("http://{host}:{port}/hook"), "body": n}),
        )
        .await;
    }
    engine(db.store.clone(), &cfg).run_once().await.unwrap();
    assert!(rx.requests().is_empty(), "{:?}", rx.requests().len());
    assert_eq!(
        db.count("key LIKE 'dotted:%' AND state = 'pending' AND attempts = 0 AND last_error LIKE '%is paused by%'")
            .await,
        3
    );
    let counted = db.store.destination_backlogs().await.unwrap();
    assert_eq!(counted, [(Some(paused), 3)]);
}

/// One table of spellings, and the name each comes to: the gate's
/// (`config::destinations::origin`, which pauses and breakers go by) and
/// the SQL's (`outbox.destination_of`, which `destinations`, the console's
/// host filter and a bulk change's dry run count by) give the same one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_spelling_of_an_origin_has_one_name_in_the_gate_and_in_the_sql() {
    use outbox_relay::config::destinations::origin;
    let db = TestDb::new().await;
    let local = Some("http://127.0.0.1:8080");
    let table: &[(&str, Option<&str>)] = &[
        ("http://127.0.0.1:8080/x", local),
        ("http://127.1:8080/", local),
        ("http://0x7f.1:8080", local),
        ("http://0x7F.0.0.1:8080", local),
        ("http://2130706433:8080/a", local),
        ("http://0177.0.0.1:8080", local),
        ("http://127.0.0.1.:8080", local),
        ("http://[::ffff:127.0.0.1]:8080", local),
        ("http://[::FFFF:7f00:1]:8080/x?y", local),
        ("http://%31%32%37.0.0.1:8080", local),
        ("http://127.0.0.1:08080", local),
        ("http://user:pw@127.0.0.1:8080/", local),
        ("  http://127.0.0.1:8080/  ", local),
        ("http:\\\\127.0.0.1:8080\\x", local),
        ("http:127.0.0.1:8080/x", local),
        ("http://localhost.:8080", Some("http://localhost:8080")),
        ("http://LocalHost.:8080/x", Some("http://localhost:8080")),
        ("HTTP://LOCALHOST:8080", Some("http://localhost:8080")),
        ("http://%6Cocalhost:8080", Some("http://localhost:8080")),
        ("http://example.com../", Some("http://example.com")),
        ("HTTPS://API.Example:443/a?b", Some("https://api.example")),
        ("https://api.example:0443/", Some("https://api.example")),
        ("http://api.example:80/", Some("http://api.example")),
        ("http://api.example:443/", Some("http://api.example:443")),
        ("http://h:/", Some("http://h")),
        ("http://h:0/", Some("http://h:0")),
        (
            "https://api-2.example:65535",
            Some("https://api-2.example:65535"),
        ),
        ("http://[::1]:8080", Some("http://[::1]:8080")),
        ("http://[0:0:0:0:0:0:0:1]/", Some("http://[::1]")),
        ("http://[::7f00:1]/", Some("http://[::7f00:1]")),
        (
            "http://[2001:DB8:0:0:1:0:0:1]/",
            Some("http://[2001:db8::1:0:0:1]"),
        ),
        (
            "http://Bücher.example./",
            Some("http://xn--bcher-kva.example"),
        ),
        (
            "http://b%C3%BCcher.example/",
            Some("http://xn--bcher-kva.example"),
        ),
        ("http://münchen.de", Some("http://xn--mnchen-3ya.de")),
        ("http://1.2.3.4.5/", None),
        ("http://256.0.0.1/", None),
        ("http://0x100000000/", None),
        ("http://h:65536/", None),
        ("http://a b/", None),
        ("http://[::1/", None),
        ("ftp://h/", None),
        ("not a url", None),
    ];
    let mut wrong = Vec::new();
    for (spelling, want) in table {
        let gate = origin(spelling);
        let sql: Option<String> = sqlx::query_scalar(
            "SELECT outbox.destination_of('webhook', NULL, jsonb_build_object('url', $1::text))",
        )
        .bind(spelling)
        .fetch_one(db.pool())
        .await
        .unwrap();
        if gate.as_deref() != *want || sql.as_deref() != *want {
            wrong.push(format!(
                "{spelling:?}: gate {gate:?}, SQL {sql:?}, want {want:?}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));

    // the backlog the operator views count is the one the pause holds
    for (n, (spelling, _)) in table.iter().enumerate().filter(|(_, (_, w))| *w == local) {
        db.enqueue(
            &format!("spelled:{n}"),
            "webhook",
            json!({"url": spelling, "body": n}),
        )
        .await;
    }
    let backlogs = db.store.destination_backlogs().await.unwrap();
    let spelled = table.iter().filter(|(_, w)| *w == local).count() as i64;
    assert_eq!(backlogs, [(local.map(str::to_string), spelled)]);
}

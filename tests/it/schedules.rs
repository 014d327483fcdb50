//! Relays that disagree about a schedule: a rolling deploy that changes its
//! cron and payload. Driven tick by tick with explicit times (the scheduler
//! takes `now`), against the real store: no waiting for the clock.

use chrono::{DateTime, TimeZone, Utc};
use outbox_relay::config::Schedule;
use outbox_relay::config::ScheduleEntry;
use outbox_relay::services::schedule::Scheduler;
use outbox_relay::store::schedules::Turn;
use serde_json::{json, Value};

use crate::common::TestDb;

fn at(s: i64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 1, 1, 10, 0, 0).unwrap() + chrono::Duration::seconds(s)
}

fn digest(cron: &str, version: &str) -> Schedule {
    Schedule::from_entry(&ScheduleEntry {
        name: "digest".into(),
        cron: cron.into(),
        kind: "webhook".into(),
        destination: None,
        payload: json!({"url": "http://127.0.0.1:9/digest", "body": {"version": version}}),
        catch_up: 1,
    })
    .unwrap()
}

/// The digest intents enqueued so far: (second of the tick, body version).
async fn enqueued(db: &TestDb) -> Vec<(i64, String)> {
    let rows: Vec<(String, Value)> = sqlx::query_as(
        "SELECT key, payload FROM outbox.intents WHERE key LIKE 'schedule:digest:%' ORDER BY key",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    rows.into_iter()
        .map(|(key, payload)| {
            let tick: DateTime<Utc> = key.trim_start_matches("schedule:digest:").parse().unwrap();
            let version = payload["body"]["version"].as_str().unwrap().to_string();
            ((tick - at(0)).num_seconds(), version)
        })
        .collect()
}

fn stood_aside_for(turn: &Option<Turn>) -> Option<String> {
    match turn {
        Some(Turn::StoodAside { live }) => Some(live[0].definition.clone()),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_with_two_crons_under_one_name_enqueue_every_tick_of_the_newest_and_only_those() {
    let db = TestDb::new().await;
    // relay A runs the old configuration, every 2 s; relay B, deployed
    // later, every 3 s with another payload
    let mut a = Scheduler::new(
        db.store.clone(),
        "relay-a",
        vec![digest("*/2 * * * * *", "old")],
    );
    let mut b = Scheduler::new(
        db.another_store().await,
        "relay-b",
        vec![digest("*/3 * * * * *", "new")],
    );
    // A alone: a new schedule starts from now, then each of its ticks
    a.tick(at(15)).await;
    for s in 16..=20 {
        a.tick(at(s)).await;
    }
    // B starts at :21; both evaluate every second, A first
    let mut a_turns = Vec::new();
    let mut b_turns = Vec::new();
    for s in 21..=40 {
        a_turns.push(a.tick(at(s)).await.1.remove(0));
        b_turns.push(b.tick(at(s)).await.1.remove(0));
    }
    let expected: Vec<(i64, String)> = [16, 18, 20]
        .into_iter()
        .map(|s| (s, "old".to_string()))
        .chain([21, 24, 27, 30, 33, 36, 39].map(|s| (s, "new".to_string())))
        .collect();
    assert_eq!(
        enqueued(&db).await,
        expected,
        "every tick of A until B appeared, then every tick of B, each with its own payload, and no other"
    );
    // A knows it stands aside and for what; B knows A disagrees
    let winner = stood_aside_for(&a_turns[5]).expect("A stands aside");
    assert!(winner.contains("\"*/3 * * * * *\""), "{winner}");
    match b_turns.last().unwrap() {
        Some(Turn::Fired { live, .. }) => {
            assert_eq!(live.len(), 2, "{live:?}");
            assert!(live[1].definition.contains("\"*/2 * * * * *\""), "{live:?}");
            assert_eq!(live[1].seen_by.as_deref(), Some("relay-a"));
        }
        other => panic!("B fires: {other:?}"),
    }

    // an old relay restarting while B runs does not take the schedule back
    let mut a2 = Scheduler::new(
        db.another_store().await,
        "relay-a2",
        vec![digest("*/2 * * * * *", "old")],
    );
    for s in 41..=45 {
        assert!(stood_aside_for(&a2.tick(at(s)).await.1[0]).is_some());
        b.tick(at(s)).await;
    }
    assert_eq!(enqueued(&db).await.last(), Some(&(45, "new".to_string())));

    // a rollback: B's relays are gone; once B's configuration has not been
    // evaluated for 15 s it is no longer live, and the old one wins
    for s in 46..=60 {
        assert!(
            stood_aside_for(&a2.tick(at(s)).await.1[0]).is_some(),
            "at :{s} B is still live"
        );
    }
    a2.tick(at(61)).await;
    a2.tick(at(62)).await;
    let last: Vec<(i64, String)> = enqueued(&db).await.into_iter().rev().take(2).collect();
    assert_eq!(
        last,
        [(62, "old".to_string()), (60, "old".to_string())],
        "the old configuration wins again, catching up its most recent missed tick"
    );
}

/// The relay that stands aside does not lock the schedule's row, and a
/// turn that finds the row held is tried again: the winning
/// configuration's ticks are not dropped while another relay holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standing_aside_takes_no_lock_and_a_busy_turn_is_tried_again() {
    let db = TestDb::new().await;
    let mut a = Scheduler::new(
        db.store.clone(),
        "relay-a",
        vec![digest("*/4 * * * * *", "old")],
    );
    let mut b = Scheduler::new(
        db.another_store().await,
        "relay-b",
        vec![digest("*/6 * * * * *", "new")],
    );
    a.tick(at(10)).await;
    b.tick(at(11)).await;
    assert!(stood_aside_for(&a.tick(at(11)).await.1[0]).is_some());

    // the row is held, as by a relay evaluating the schedule
    let mut holder = db.pool().begin().await.unwrap();
    sqlx::query("SELECT 1 FROM outbox.schedules WHERE name = 'digest' FOR UPDATE")
        .execute(&mut *holder)
        .await
        .unwrap();
    // A learns that it stands aside without reaching for the row
    let turn = a.tick(at(12)).await.1.remove(0);
    assert!(
        stood_aside_for(&turn).is_some(),
        "the relay standing aside tried to take the row: {turn:?}"
    );
    // B's turn at :12, while the row is held for 200 ms more
    let release = tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        holder.commit().await.unwrap();
    });
    let turn = b.tick(at(12)).await.1.remove(0);
    release.await.unwrap();
    assert!(
        matches!(turn, Some(Turn::Fired { enqueued: 1, .. })),
        "the winner's turn was dropped while the row was held: {turn:?}"
    );
    assert_eq!(enqueued(&db).await, [(12, "new".to_string())]);
    // A standing aside beside B, second by second: every tick of B
    for s in 13..=24 {
        a.tick(at(s)).await;
        b.tick(at(s)).await;
    }
    assert_eq!(
        enqueued(&db).await,
        [12, 18, 24].map(|s| (s, "new".to_string())),
        "every */6 tick, and no */4 one"
    );
}

/// The console's schedules page says when relays disagree about a
/// schedule: which configuration wins and which stand aside.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_a_disagreement_about_a_schedule() {
    use crate::common::console::{ConsoleServer, Session};
    let db = TestDb::new().await;
    let mut a = Scheduler::new(
        db.store.clone(),
        "relay-a",
        vec![digest("*/4 * * * * *", "old")],
    );
    let mut b = Scheduler::new(
        db.another_store().await,
        "relay-b",
        vec![digest("*/6 * * * * *", "new")],
    );
    let entry = |cron: &str, version: &str| ScheduleEntry {
        name: "digest".into(),
        cron: cron.into(),
        kind: "webhook".into(),
        destination: None,
        payload: json!({"url": "http://127.0.0.1:9/digest", "body": {"version": version}}),
        catch_up: 1,
    };
    // the console reads a configuration file with the old schedule
    let console = ConsoleServer::start_with(&db, &[], |c| {
        c.schedules = vec![entry("*/4 * * * * *", "old")];
    })
    .await;
    let mut s = Session::new(&console);
    // relays agree: nothing said
    let now = Utc::now();
    a.tick(now).await;
    let page = s.get("/schedules").await;
    assert_eq!(page.status, 200);
    assert!(!page.body.contains("disagreement-digest"), "{}", page.body);

    b.tick(now + chrono::Duration::seconds(1)).await;
    let page = s.get("/schedules").await;
    assert!(
        page.body.contains("id=\"disagreement-digest\""),
        "{}",
        page.body
    );
    assert!(
        page.body.contains("Relays disagree")
            && page.body.contains("*/6 * * * * *")
            && page.body.contains("relay relay-b")
            && page.body.contains("standing aside")
            && page.body.contains("relay relay-a"),
        "{}",
        page.body
    );
    let api = s.get("/api/v1/schedules").await;
    let rows: Value = serde_json::from_str(&api.body).unwrap();
    assert_eq!(rows[0]["relays_disagree"], true, "{rows}");
    assert_eq!(rows[0]["configurations"][0]["seen_by"], "relay-b", "{rows}");
    assert_eq!(rows[0]["configurations"][0]["wins"], true, "{rows}");
}

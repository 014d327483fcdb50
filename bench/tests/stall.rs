//! A drain whose completions the database refuses fails as soon as nothing
//! has been written for the stall time (`BENCH_STALL_SECONDS`), with the
//! reason, instead of waiting out the bench's 10-minute deadline.

use std::time::{Duration, Instant};

mod common;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_that_records_nothing_fails_at_the_stall_not_the_deadline() {
    let setup = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("refuse-outcomes.sql");
    std::fs::write(
        &setup,
        "CREATE FUNCTION outbox.refuse_outcome() RETURNS trigger LANGUAGE plpgsql
             AS $$ BEGIN RAISE EXCEPTION 'outcomes refused by the stall test'; END $$;
         CREATE TRIGGER refuse_outcome BEFORE INSERT ON outbox.log_outcomes
             FOR EACH ROW EXECUTE FUNCTION outbox.refuse_outcome();",
    )
    .unwrap();
    let started = Instant::now();
    let out = common::output_within(
        common::bench(&common::server())
            .args(["--intents", "50", "--drain-rounds", "1", "--in-flight", "8"])
            .arg("--setup-sql")
            .arg(&setup)
            .env("BENCH_STALL_SECONDS", "3"),
        Duration::from_secs(300),
    )
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("nothing written for 3s"),
        "the reason is given: {stderr}"
    );
    // the relay's start (2 s), the drain's requests, 3 s of nothing
    // written and the checks' 5 s spacing; the deadline would be 10 minutes
    assert!(
        started.elapsed() < Duration::from_secs(120),
        "failed after {:?}",
        started.elapsed()
    );
}

//! `outbox-relay-bench --tracing` through its binary, against the test
//! server: a round off and a round on, every attempt's span counted by the
//! bench's OTLP receiver (the plumbing and the checks, not the figures).

use serde_json::Value;

mod common;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tracing_on_exports_a_span_of_every_attempt_and_off_none() {
    let out = common::bench(&common::server())
        .args([
            "--intents",
            "40",
            "--relays",
            "0",
            "--latency-rate",
            "20",
            "--latency-seconds",
            "1",
            "--blocked-backlog",
            "0",
            "--json",
            "--tracing",
            "1",
        ])
        .env(
            "OUTBOX_RELAY__WEBHOOK__ALLOWED_NETWORKS",
            "[\"127.0.0.0/8\"]",
        )
        // the purge of the bench's 100k history rows without pauses
        .env("OUTBOX_RELAY__RETENTION__BATCH_PAUSE", "\"0s\"")
        .env("OUTBOX_RELAY__RETENTION__BATCH_SIZE", "20000")
        .output()
        .await
        .expect("run outbox-relay-bench");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}{stderr}");
    let report: Value =
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"));
    let t = &report["tracing"];
    assert_eq!(t["rounds_each"], 1, "{t}");
    let rounds = t["rounds"].as_array().unwrap();
    let on: Vec<bool> = rounds
        .iter()
        .map(|r| r["tracing"].as_bool().unwrap())
        .collect();
    assert_eq!(on, [false, true], "off first, then on: {t}");
    for r in rounds {
        assert_eq!(r["requests"], 40, "{r}");
        assert_eq!(r["duplicate_requests"], 0, "{r}");
        assert!(r["drain_per_s"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["relay_us_per_intent"].as_f64().unwrap() >= 0.0, "{r}");
    }
    assert!(rounds[0]["exported"].is_null(), "{t}");
    let exported = &rounds[1]["exported"];
    // one span per attempt: one attempt per intent against this receiver
    assert_eq!(exported["spans_received"], 40, "{t}");
    assert_eq!(exported["spans_dropped"], 0, "{t}");
    assert!(exported["export_requests"].as_u64().unwrap() >= 1, "{t}");
    assert_eq!(t["spans_received"], 40, "{t}");
    let ratio = t["drain_ratio"].as_f64().unwrap();
    let expected =
        t["on"]["drain_per_s"].as_f64().unwrap() / t["off"]["drain_per_s"].as_f64().unwrap();
    assert!((ratio - expected).abs() < 1e-9 * expected, "{t}");
}

//! `outbox-relay-bench --soak` through its binary, briefly, against the
//! test server: the relay, the console, the receivers and the sampler run,
//! and the CSV, the PNG and the verdict come out (the plumbing, not the
//! figures: an hour's run is in docs/performance.md).

use serde_json::Value;

mod common;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_soak_writes_its_samples_its_plot_and_its_verdict() {
    let out_dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("soak-{}", std::process::id()));
    let out = common::bench(&common::server())
        .args([
            "--soak",
            "12s",
            "--rate",
            "50",
            "--soak-sample",
            "2s",
            "--json",
        ])
        .arg("--soak-out")
        .arg(&out_dir)
        // a NATS server nobody runs: the soak says so and sends webhooks
        .args(["--nats-url", "nats://127.0.0.1:1"])
        .output()
        .await
        .expect("run outbox-relay-bench");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "the soak failed:\n{stderr}");
    let report: Value = serde_json::from_str(&stdout).expect("a JSON report");
    // 50 a second for as long as the soak ran: its last sample may end it
    // a second or two past the 12 s on a busy machine
    let enqueued = report["enqueued"].as_u64().unwrap() as f64;
    let ran = report["duration_s"].as_f64().unwrap();
    assert!(
        (12.0..20.0).contains(&ran),
        "a 12 s soak ran for {ran:.1} s"
    );
    assert!(
        (0.75 * 50.0 * ran..=50.0 * ran + 5.0).contains(&enqueued),
        "{ran:.1} s at 50/s enqueued {enqueued}"
    );
    assert_eq!(report["kinds"].as_array().unwrap().len(), 2, "{report}");
    assert_eq!(report["scrape_errors"], 0, "{report}");
    assert!(report["steady_requests"].as_u64().unwrap() > 0);
    assert!(report["flapping_requests"].as_u64().unwrap() > 0);
    assert_eq!(report["verdict"]["dead"], 0, "{report}");
    let csv = std::fs::read_to_string(out_dir.join("soak.csv")).unwrap();
    let rows: Vec<&str> = csv.lines().collect();
    assert!(rows[0].starts_with("t_s,relay_rss_mb,"), "{}", rows[0]);
    assert!(rows.len() >= 6, "a sample every 2 s for 12 s:\n{csv}");
    let last: Vec<f64> = rows[rows.len() - 1]
        .split(',')
        .map(|v| v.parse().unwrap())
        .collect();
    assert!(last[1] > 1.0, "the relay's RSS was not read: {csv}");
    let png = std::fs::read(out_dir.join("soak.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "soak.png is not a PNG");
}

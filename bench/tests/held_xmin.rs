//! `--held-xmin` end to end, briefly: both runs deliver what arrived, and
//! the tables it reports at the end include the log's partitions with the
//! dead versions still in their heaps (pgstattuple, which refuses a
//! partitioned table itself).

use std::time::Duration;

mod common;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_held_xmin_run_reports_every_outbox_table() {
    let out = common::output_within(
        common::bench(&common::server()).args([
            "--held-xmin",
            "3",
            "--held-xmin-rate",
            "50",
            "--json",
        ]),
        Duration::from_secs(240),
    )
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let report: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("the report is JSON");
    let runs = report["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 2, "a plain run and a held one: {report}");
    for run in runs {
        assert!(run["arrivals"].as_i64().unwrap() > 0, "{run}");
        assert_eq!(run["delivered"], run["arrivals"], "{run}");
        let tables = run["tables"].as_array().expect("tables");
        let table = |name: &str| {
            tables
                .iter()
                .find(|t| t["table"] == name)
                .unwrap_or_else(|| panic!("{name} is not reported: {run}"))
        };
        // the partitioned parent is listed, with no heap of its own
        assert!(table("intent_log")["dead_present"].is_null(), "{run}");
        // its first partition holds every intent of so short a run
        let segment = table("intent_log_0");
        assert!(segment["n_live_tup"].as_i64().unwrap() > 0, "{run}");
        assert_eq!(segment["dead_present"].as_i64(), Some(0), "{run}");
        assert!(table("log_batches")["dead_present"].is_i64(), "{run}");
    }
}

//! `outbox-relay-bench` through its binary, against the test server: the
//! plumbing and the integrity checks of the instrument, never its figures.
//! (The product's own suite is tests/it at the repository root; this test
//! needs the bench binary, which only this package's tests are given.)

use serde_json::Value;

mod common;

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Out {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.stdout))
    }
}

/// Run `outbox-relay-bench ARGS` against `server` with the test environment of the relay's
/// CLI tests (loopback webhooks allowed, metrics on a free port) and `env`.
async fn bench_env(server: &str, args: &[&str], env: &[(&str, &str)]) -> Out {
    let mut cmd = common::bench(server);
    cmd.args(args)
        .env(
            "OUTBOX_RELAY__WEBHOOK__ALLOWED_NETWORKS",
            "[\"127.0.0.0/8\"]",
        )
        .env("OUTBOX_RELAY__RELAY__METRICS_ADDR", "\"127.0.0.1:0\"");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().await.expect("run outbox-relay-bench");
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `--peers`: the harness reads a peer's sweep from its run-peer.sh, runs
/// its bulk enqueue and a drain at each setting with the workload in its
/// environment, reads the peer's result lines, believes a drain only when
/// the receiver saw every job's request, and takes the best; a sweep may
/// not change the workload. (Plumbing and integrity only: the figures are
/// the benchmark's business.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_peers_are_checked_against_the_receiver() {
    let dir = std::env::temp_dir().join(format!(
        "outbox-relay-test-peers-{}-{:08x}",
        std::process::id(),
        fastrand::u32(..)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let python = std::env::var("OUTBOX_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    // the sweep: three settings, the best in the middle; a greedy peer's
    // sweep would change the workload
    std::fs::write(
        dir.join("run-peer.sh"),
        format!(
            "if [ \"$1\" = --prepare ]; then\n\
             [ \"$2\" = broken ] && {{ echo 'broken peer: needs a frobnicator' >&2; exit 1; }}\n\
             exit 0\nfi\n\
             if [ \"$1\" = --sweep ]; then\n\
             [ \"$2\" = greedy ] && {{ echo '{{\"CONCURRENCY\": \"64\"}}'; exit 0; }}\n\
             printf '%s\\n' '{{\"SLOW\": \"3\"}}' '{{\"SLOW\": \"1\"}}' '{{\"SLOW\": \"2\"}}'; exit 0\nfi\n\
             exec '{python}' \"$(dirname \"$0\")/$1-peer.py\"\n"
        ),
    )
    .unwrap();
    // its bulk enqueue reports 1,000/s; a drain sends `share` of the jobs,
    // one request each, and reports 1,000/s over its SLOW knob
    let peer = |share: &str| {
        format!(
            r#"import json, os, urllib.request
jobs = int(os.environ["JOBS"])
assert int(os.environ["CONCURRENCY"]) > 0 and os.environ["DATABASE_URL"].startswith("postgres")
if os.environ.get("MODE") == "enqueue":
    assert os.environ["ENQUEUE_PER_CALL"] == "1000"
    print(json.dumps({{"peer": "fake", "version": "test", "api": "bulk", "enqueued": jobs, "enqueue_per_s": 1000.0}}))
    raise SystemExit
slow = int(os.environ["SLOW"])
import time
started = time.time()
for i in range(int(jobs * {share})):
    req = urllib.request.Request(os.environ["HOOK_URL"], data=b"{{}}", method="POST",
                                 headers={{"webhook-id": "job_%d" % i}})
    urllib.request.urlopen(req).read()
time.sleep(0.1)  # a window of several clock ticks: CPU time is counted in them
print("a line before the result")
window = {{"drain_started_unix": started, "drain_ended_unix": time.time()}} if slow != 3 else {{}}
print(json.dumps({{"peer": "fake", "version": "test", "knobs": {{"slow": slow}}, "drain_per_s": 1000.0 / slow, **window}}))
"#
        )
    };
    std::fs::write(dir.join("honest-peer.py"), peer("1")).unwrap();
    std::fs::write(dir.join("liar-peer.py"), peer("0.5")).unwrap();
    std::fs::write(dir.join("broken-peer.py"), peer("1")).unwrap();
    std::fs::write(dir.join("greedy-peer.py"), peer("1")).unwrap();
    let peers_dir = dir.to_str().unwrap();
    let server = common::server();
    let bench = |peers: &'static str| {
        let server = server.clone();
        async move {
            bench_env(
                &server,
                &[
                    "--intents",
                    "20",
                    "--relays",
                    "0",
                    "--latency-rate",
                    "20",
                    "--latency-seconds",
                    "1",
                    "--ceiling-batches",
                    "7,20",
                    "--small-claims",
                    "1,3",
                    "--blocked-backlog",
                    "2000",
                    "--relay-runs-between",
                    "2",
                    "--json",
                    "--peers",
                    peers,
                    "--peers-dir",
                    peers_dir,
                ],
                // the purge of the bench's 100k history rows without pauses
                &[
                    ("OUTBOX_RELAY__RETENTION__BATCH_PAUSE", "\"0s\""),
                    ("OUTBOX_RELAY__RETENTION__BATCH_SIZE", "20000"),
                ],
            )
            .await
        }
    };

    let out = bench("honest").await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let report = out.json();
    // the bulk API measured: every key new, one statement per 1,000
    assert!(
        report["enqueue_many_per_s"].as_f64().unwrap() > 0.0,
        "{report}"
    );
    let peer = &report["peers"][0];
    assert_eq!(peer["peer"], "honest");
    assert_eq!(peer["version"], "test");
    assert_eq!(peer["requests"], 20);
    assert_eq!(peer["duplicate_requests"], 0);
    // every setting of the sweep drained and checked; the figure is the best
    let sweep = peer["sweep"].as_array().unwrap();
    let slows: Vec<&str> = sweep
        .iter()
        .map(|s| s["env"]["SLOW"].as_str().unwrap())
        .collect();
    assert_eq!(slows, ["3", "1", "2"], "{peer}");
    for s in sweep {
        assert_eq!(s["requests"], 20, "{s}");
        assert_eq!(s["duplicate_requests"], 0, "{s}");
        // the machine's CPU over the window the peer reported; none
        // without one
        let cpu = &s["cpu"];
        if s["env"]["SLOW"] == "3" {
            assert!(cpu.is_null(), "{s}");
        } else {
            let busy = cpu["busy_share"].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&busy), "{s}");
            assert!(cpu["seconds"].as_f64().unwrap() > 0.0, "{s}");
            assert!(cpu["machine_us_per_job"].as_f64().unwrap() >= 0.0, "{s}");
            assert!(cpu["relay_us_per_job"].is_null(), "{s}");
        }
    }
    assert_eq!(
        peer["cpu"], sweep[1]["cpu"],
        "the best setting's CPU: {peer}"
    );
    // the relay's runs beside it: the machine's CPU and the relay process's
    for run in report["relay_runs"].as_array().unwrap() {
        let cpu = &run["cpu"];
        let machine = cpu["machine_us_per_job"].as_f64().unwrap();
        let relay = cpu["relay_us_per_job"].as_f64().unwrap();
        let bench = cpu["bench_us_per_job"].as_f64().unwrap();
        assert!(machine > 0.0 && relay >= 0.0 && bench >= 0.0, "{run}");
    }
    assert_eq!(peer["drain_per_s"].as_f64().unwrap(), 1000.0, "{peer}");
    assert_eq!(peer["knobs"]["slow"], 1, "{peer}");
    // its bulk enqueue beside the relay's enqueue_many
    assert_eq!(peer["enqueue_per_s"].as_f64().unwrap(), 1000.0, "{peer}");
    assert_eq!(peer["enqueue_api"], "bulk", "{peer}");
    // the drain's statements: every intent claimed once and completed once
    let batches = &report["drain_batches"];
    assert_eq!(batches["claimed"], 20, "{report}");
    assert_eq!(batches["written"], 20, "{report}");
    let claims = batches["claims"].as_f64().unwrap();
    assert!(claims >= 1.0, "{report}");
    assert_eq!(
        report["drain_intents_per_claim"].as_f64().unwrap(),
        20.0 / claims
    );
    // the ceiling again at each batch size asked for, every intent claimed and completed
    let by_batch = report["ceiling_by_batch"].as_array().unwrap();
    let batches: Vec<i64> = by_batch
        .iter()
        .map(|c| c["batch"].as_i64().unwrap())
        .collect();
    assert_eq!(batches, [7, 20], "{report}");
    for c in by_batch {
        let per_s = c["per_s"].as_f64().unwrap();
        let expected = c["batch"].as_f64().unwrap() / per_s * 1000.0;
        assert!(
            per_s > 0.0 && (c["round_ms"].as_f64().unwrap() - expected).abs() < 1e-9 * expected,
            "{c}"
        );
    }
    // claims of a few intents, both statement forms in both rounds
    let small = report["small_claims"].as_array().unwrap();
    let sizes: Vec<i64> = small.iter().map(|c| c["claim"].as_i64().unwrap()).collect();
    assert_eq!(sizes, [1, 3], "{report}");
    for c in small {
        let rates = |form: &str| -> Vec<f64> {
            let v = c[form].as_array().unwrap();
            v.iter().map(|x| x.as_f64().unwrap()).collect()
        };
        let (ladder, single) = (rates("ladder_per_s"), rates("single_per_s"));
        assert!(ladder.len() == 2 && single.len() == 2, "{c}");
        assert!(ladder.iter().chain(&single).all(|r| *r > 0.0), "{c}");
        let ratio = ladder.iter().sum::<f64>() / single.iter().sum::<f64>();
        assert!(
            (c["ratio"].as_f64().unwrap() - ratio).abs() < 1e-9 * ratio,
            "{c}"
        );
    }
    // the latency run's legs, each from every intent's first attempt
    let split = &report["latency_split"];
    for leg in ["to_attempt", "call", "to_record"] {
        let p50 = split[format!("{leg}_p50_ms")].as_f64().unwrap();
        let p99 = split[format!("{leg}_p99_ms")].as_f64().unwrap();
        assert!(0.0 <= p50 && p50 <= p99, "{leg}: {split}");
    }
    // a key blocked by a dead head: its backlog stays out of the claim
    let blocked = &report["blocked_backlog"];
    assert_eq!(blocked["behind"], 2000, "{report}");
    let alone = blocked["claim_buffers_alone"].as_u64().unwrap();
    let beside = blocked["claim_buffers_beside"].as_u64().unwrap();
    assert!(alone > 0 && beside < alone * 3 / 2, "{blocked}");
    assert!(blocked["ratio"].as_f64().unwrap() > 0.0, "{blocked}");
    // the relay drains the same workload twice before the peer and twice
    // after it, seen by the same receiver; the peer against their median
    let relay_runs = report["relay_runs"].as_array().unwrap();
    assert_eq!(relay_runs.len(), 4, "{report}");
    assert_eq!(report["relay_runs_between"], 2, "{report}");
    for run in relay_runs {
        assert_eq!(run["requests"], 20);
        assert_eq!(run["duplicate_requests"], 0);
    }
    let median_of = |field: &str| {
        let mut v: Vec<f64> = relay_runs
            .iter()
            .map(|r| r[field].as_f64().unwrap())
            .collect();
        v.sort_by(f64::total_cmp);
        (v[1] + v[2]) / 2.0
    };
    let relay = median_of("drain_per_s");
    let speedup = peer["relay_speedup"].as_f64().unwrap();
    let expected = relay / peer["drain_per_s"].as_f64().unwrap();
    assert!(
        (speedup - expected).abs() < 1e-9 * expected,
        "{speedup} vs {expected}"
    );
    let relay_enqueue = median_of("enqueue_many_per_s");
    assert!(relay_enqueue > 0.0, "{report}");
    let ratio = peer["relay_enqueue_ratio"].as_f64().unwrap();
    let expected = relay_enqueue / 1000.0;
    assert!(
        (ratio - expected).abs() < 1e-9 * expected,
        "{ratio} vs {expected}"
    );

    let out = bench("liar").await;
    assert_eq!(out.code, 1, "{}{}", out.stdout, out.stderr);
    assert!(
        out.stderr
            .contains("receiver saw 10 distinct requests for 20 jobs"),
        "{}",
        out.stderr
    );

    // a peer that cannot run here is refused before anything is measured, saying why
    let out = bench("broken").await;
    assert_eq!(out.code, 1, "{}{}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains("broken peer: needs a frobnicator"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("peer broken cannot run here"),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("bench: enqueue"), "{}", out.stderr);

    // a sweep that would change the workload is refused before anything is measured
    let out = bench("greedy").await;
    assert_eq!(out.code, 1, "{}{}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains("the sweep may not set \"CONCURRENCY\""),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("bench: enqueue"), "{}", out.stderr);

    // a peer that does not exist is refused before anything is measured
    let out = bench("nosuch").await;
    assert_ne!(out.code, 0);
    assert!(
        out.stderr.contains("unknown peer \"nosuch\""),
        "{}",
        out.stderr
    );

    // no relay drain to compare a peer with is refused as the arguments are read
    let out = bench_env(&server, &["--relay-runs-between", "0"], &[]).await;
    assert_eq!(out.code, 2, "{}{}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains("--relay-runs-between"),
        "{}",
        out.stderr
    );
    std::fs::remove_dir_all(&dir).ok();
}

//! Drains by separate processes against the bench's receiver: relay
//! processes (scale-out, and the relay runs beside the peers) and the peer
//! job queues (tests/peers/queue-bench/run-peer.sh).

use std::time::{Duration, Instant};

use outbox_relay::store::Store;

use crate::bench::BenchArgs;
use crate::receiver::{peak_rss_mb_of, Seen};
use crate::report::{PeerRun, RelayRun, ScaleOut};
use crate::sql::{run_sql, wait_delivered};

/// Start `relays` separate `outbox-relay run` processes on the bench
/// database, let them go idle, commit `n` intents in one transaction and
/// time until all are delivered. Counts the requests the receiver saw and
/// the distinct webhook-ids among them: a duplicate effect would show.
pub(crate) async fn scale_out_drain(
    store: &Store,
    args: &BenchArgs,
    db_url: &str,
    hook_url: &str,
    relays: usize,
    seen: &Seen,
) -> anyhow::Result<ScaleOut> {
    run_sql(store, "TRUNCATE outbox.intents CASCADE").await?;
    run_sql(store, "VACUUM ANALYZE outbox.intents").await?;
    seen.reset();
    // this binary, run as `outbox-relay` (see crate::RUN_AS_RELAY)
    let exe = std::env::current_exe()?;
    let mut children = Vec::new();
    for r in 0..relays {
        // A clean environment: nothing of the caller's configuration (its
        // schedules, provider credentials, tuning) reaches the bench relays.
        let mut cmd = tokio::process::Command::new(&exe);
        cmd.arg("run")
            .env_clear()
            .env(crate::RUN_AS_RELAY, "1")
            .env("DATABASE_URL", db_url)
            .env("OUTBOX_RELAY__RELAY__NAME", format!("\"bench-{r}\""))
            .env(
                "OUTBOX_RELAY__RELAY__CONCURRENCY",
                args.in_flight.to_string(),
            )
            .env(
                "OUTBOX_RELAY__WEBHOOK__MAX_IN_FLIGHT_PER_HOST",
                args.in_flight.to_string(),
            )
            .env(
                "OUTBOX_RELAY__WEBHOOK__ALLOWED_NETWORKS",
                "[\"127.0.0.1/32\"]",
            )
            .env("OUTBOX_RELAY__RELAY__METRICS_ADDR", "\"127.0.0.1:0\"")
            .env("OUTBOX_RELAY__RETENTION__INTENTS", "\"0s\"")
            .env("RUST_LOG", "error")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true);
        children.push(cmd.spawn()?);
    }
    // idle and listening before the work arrives
    tokio::time::sleep(Duration::from_secs(2)).await;
    for c in children.iter_mut() {
        if let Some(status) = c.try_wait()? {
            anyhow::bail!("a bench relay exited at start ({status}); run `outbox-relay run` by hand to see why");
        }
    }
    sqlx::query(
        "SELECT outbox.enqueue('scale-' || g, 'webhook',
                jsonb_build_object('url', $1::text, 'body', jsonb_build_object(
                    'event', 'order.created', 'order_id', g, 'customer', 'cus_0123456789',
                    'amount', 1999, 'currency', 'usd', 'items', jsonb_build_array(jsonb_build_object('sku', 'SKU-42', 'qty', 1)),
                    'note', 'bench payload padded to about three hundred bytes')))
           FROM generate_series(1, $2::int) g",
    )
    .bind(hook_url)
    .bind(args.intents as i32)
    .execute(store.pool())
    .await?;
    // from the commit: the relays see nothing before it
    let t = Instant::now();
    wait_delivered(store, "scale-", args.intents as i64).await?;
    let drain = args.intents as f64 / t.elapsed().as_secs_f64();
    let mut rss: f64 = 0.0;
    for c in children.iter_mut() {
        if let Some(pid) = c.id() {
            rss = rss.max(peak_rss_mb_of(&format!("/proc/{pid}/status")));
        }
        let _ = c.start_kill();
        let _ = c.wait().await;
    }
    let attempts: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox.attempts")
        .fetch_one(store.pool())
        .await?;
    let (requests, distinct) = seen.counts();
    Ok(ScaleOut {
        relays,
        drain_per_s: drain,
        speedup: 1.0,
        requests,
        duplicate_requests: requests - distinct,
        attempts,
        relay_peak_rss_mb: rss,
    })
}

/// One `outbox-relay run` process drains the peers' workload.
pub(crate) async fn relay_run(
    store: &Store,
    args: &BenchArgs,
    db_url: &str,
    hook_url: &str,
    seen: &Seen,
) -> anyhow::Result<RelayRun> {
    eprintln!(
        "bench: peers: drain {} webhooks with one relay process, {} in flight, receiver answering at once",
        args.intents, args.in_flight
    );
    let run = scale_out_drain(store, args, db_url, hook_url, 1, seen).await?;
    Ok(RelayRun {
        drain_per_s: run.drain_per_s,
        requests: run.requests,
        duplicate_requests: run.duplicate_requests,
    })
}

/// `bash run-peer.sh` with a clean environment, as the bench's relays get:
/// only what finding and installing programs needs (the search path, home
/// and locale, proxies, CA bundles and the package managers' own
/// settings), so none of the caller's credentials or tuning reach a peer.
pub(crate) fn peer_command(runner: &std::path::Path) -> tokio::process::Command {
    const KEEP: &[&str] = &[
        "PATH",
        "HOME",
        "XDG_CACHE_HOME",
        "LANG",
        "LC_ALL",
        "TMPDIR",
        "http_proxy",
        "https_proxy",
        "no_proxy",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "NODE_EXTRA_CA_CERTS",
    ];
    const KEEP_PREFIXES: &[&str] = &["PIP_", "npm_config_", "NPM_CONFIG_"];
    let mut cmd = tokio::process::Command::new("bash");
    cmd.arg(runner)
        .env_clear()
        .stdin(std::process::Stdio::null());
    for (key, value) in std::env::vars_os() {
        let Some(name) = key.to_str() else { continue };
        if KEEP.contains(&name) || KEEP_PREFIXES.iter().any(|p| name.starts_with(p)) {
            cmd.env(&key, value);
        }
    }
    cmd
}

/// Run one peer job queue (tests/peers/queue-bench/run-peer.sh PEER) on the
/// same workload in a scratch database of its own on the same server, and
/// check with the receiver that it really sent every request.
pub(crate) async fn peer_drain(
    store: &Store,
    args: &BenchArgs,
    server_url: &str,
    hook_url: &str,
    peer: &str,
    seen: &Seen,
) -> anyhow::Result<PeerRun> {
    let name = format!("outbox_bench_{}_peer", std::process::id());
    sqlx::query(&format!("DROP DATABASE IF EXISTS {name}"))
        .execute(store.pool())
        .await?;
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(store.pool())
        .await?;
    // The server URL as given, pointed at the peer's database: the peer's
    // driver reads it (sqlx's own rendering adds parameters it may not know).
    let mut peer_url = url::Url::parse(server_url)?;
    peer_url.set_path(&format!("/{name}"));
    seen.reset();
    let runner = args.peers_dir.join("run-peer.sh");
    let child = peer_command(&runner)
        .arg(peer)
        .env("DATABASE_URL", peer_url.as_str())
        .env("HOOK_URL", hook_url)
        .env("JOBS", args.intents.to_string())
        .env("CONCURRENCY", args.in_flight.to_string())
        .stdout(std::process::Stdio::piped())
        // its messages reach the terminal (tokio's output() would capture them)
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true)
        .spawn();
    // the peer scripts give up after 10 minutes of draining; this is the backstop
    let output = match child {
        Ok(child) => {
            match tokio::time::timeout(Duration::from_secs(900), child.wait_with_output()).await {
                Ok(out) => out.map_err(|e| anyhow::anyhow!("peer {peer}: {e}")),
                Err(_) => Err(anyhow::anyhow!(
                    "peer {peer} did not finish within 15 minutes"
                )),
            }
        }
        Err(e) => Err(anyhow::anyhow!("cannot run bash {}: {e}", runner.display())),
    };
    if let Err(e) = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .execute(store.pool())
        .await
    {
        eprintln!("bench: could not drop the peer's database {name}: {e}");
    }
    let output = output?;
    if !output.status.success() {
        anyhow::bail!(
            "peer {peer} failed ({}); its messages are above",
            output.status
        );
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("");
    let reported: serde_json::Value = serde_json::from_str(line)
        .map_err(|e| anyhow::anyhow!("peer {peer} printed no result line ({e}): {line:?}"))?;
    let drain = reported["drain_per_s"]
        .as_f64()
        .filter(|d| *d > 0.0)
        .ok_or_else(|| anyhow::anyhow!("peer {peer} reported no drain_per_s: {line}"))?;
    let (requests, distinct) = seen.counts();
    if distinct < args.intents as u64 {
        anyhow::bail!(
            "peer {peer} reported its drain done, but the receiver saw {distinct} distinct requests for {} jobs",
            args.intents
        );
    }
    Ok(PeerRun {
        peer: peer.to_string(),
        version: reported["version"].as_str().unwrap_or("?").to_string(),
        drain_per_s: drain,
        relay_speedup: 1.0,
        requests,
        duplicate_requests: requests - distinct,
        reported,
    })
}

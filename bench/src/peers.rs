//! The peer job queues (tests/peers/queue-bench/run-peer.sh): each one's
//! sweep of its batch knobs, its bulk enqueue and its drains, every run in
//! a scratch database of its own on the same server and against the same
//! receiver as the relay.
//!
//! The protocol with run-peer.sh: `--prepare PEER` installs what the peer
//! needs; `--sweep PEER` prints the settings to try, one JSON object of
//! environment variables per line; `PEER` runs it with the workload in its
//! environment (`MODE=enqueue` for the bulk enqueue, otherwise a drain) and
//! its last line of output is its JSON result. A peer's figure is its best
//! drain over its sweep; every drain is believed only when the receiver saw
//! a request for every job.

use std::time::Duration;

use outbox_relay::store::Store;
use serde_json::{Map, Value};

use crate::bench::BenchArgs;
use crate::cpu::{self, CpuUse};
use crate::receiver::Seen;
use crate::report::{PeerRun, PeerSetting};
use crate::server::{Server, WalSampler};

/// A peer's sweep is small: each setting is a drain of the whole workload.
const MAX_SETTINGS: usize = 16;

/// What a sweep may not set: the workload is the bench's, the same for all.
const WORKLOAD: &[&str] = &["DATABASE_URL", "HOOK_URL", "JOBS", "CONCURRENCY", "MODE"];

/// Rows per call of the peers' bulk enqueue, as `outbox.enqueue_many` is
/// measured.
pub(crate) const ENQUEUE_PER_CALL: usize = 1000;

/// One setting of a peer's knobs: environment variables for its script.
pub(crate) type Setting = Vec<(String, String)>;

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

/// Install what `peer` needs (or say what is missing), then read its sweep:
/// both before anything is measured.
pub(crate) async fn prepare(runner: &std::path::Path, peer: &str) -> anyhow::Result<Vec<Setting>> {
    let status = peer_command(runner)
        .arg("--prepare")
        .arg(peer)
        .stdout(std::process::Stdio::null())
        .status()
        .await
        .map_err(|e| anyhow::anyhow!("cannot run bash {}: {e}", runner.display()))?;
    if !status.success() {
        anyhow::bail!("peer {peer} cannot run here ({status}); its messages are above");
    }
    let out = peer_command(runner)
        .arg("--sweep")
        .arg(peer)
        .stderr(std::process::Stdio::inherit())
        .output()
        .await
        .map_err(|e| anyhow::anyhow!("cannot run bash {}: {e}", runner.display()))?;
    if !out.status.success() {
        anyhow::bail!(
            "peer {peer} did not list its sweep ({}); its messages are above",
            out.status
        );
    }
    parse_sweep(peer, &String::from_utf8_lossy(&out.stdout))
}

/// The settings of a `--sweep` listing; none listed is one run at the
/// peer's defaults.
fn parse_sweep(peer: &str, listing: &str) -> anyhow::Result<Vec<Setting>> {
    let mut settings = Vec::new();
    for line in listing.lines().filter(|l| !l.trim().is_empty()) {
        let object: Map<String, Value> = serde_json::from_str(line).map_err(|e| {
            anyhow::anyhow!("peer {peer}: a sweep line is not a JSON object ({e}): {line:?}")
        })?;
        let mut setting = Setting::new();
        for (name, value) in object {
            let ok_name = !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
            anyhow::ensure!(
                ok_name && !WORKLOAD.contains(&name.as_str()),
                "peer {peer}: the sweep may not set {name:?} (the workload is the bench's)"
            );
            let Value::String(value) = value else {
                anyhow::bail!("peer {peer}: sweep value of {name} is not a string: {line:?}");
            };
            setting.push((name, value));
        }
        settings.push(setting);
    }
    if settings.is_empty() {
        settings.push(Setting::new());
    }
    anyhow::ensure!(
        settings.len() <= MAX_SETTINGS,
        "peer {peer} lists {} settings; a sweep is at most {MAX_SETTINGS} (each is a whole drain)",
        settings.len()
    );
    Ok(settings)
}

/// The peer's bulk enqueue, then a drain at each setting of its sweep; its
/// figure is the best drain. (`relay_speedup` and `relay_enqueue_ratio` are
/// the caller's, who has the relay runs on either side.)
pub(crate) async fn peer_sweep(
    store: &Store,
    args: &BenchArgs,
    server_url: &str,
    hook_url: &str,
    peer: &str,
    settings: &[Setting],
    seen: &Seen,
) -> anyhow::Result<PeerRun> {
    let n = args.intents;
    eprintln!("bench: peers: {peer}: bulk enqueue of {n} jobs, {ENQUEUE_PER_CALL} per call");
    seen.reset();
    let enqueue_env = [
        ("MODE".to_string(), "enqueue".to_string()),
        ("ENQUEUE_PER_CALL".to_string(), ENQUEUE_PER_CALL.to_string()),
    ];
    let (enqueued, _) = peer_once(store, args, server_url, hook_url, peer, &enqueue_env).await?;
    let enqueue_per_s = positive(&enqueued, "enqueue_per_s", peer)?;
    let count = enqueued["enqueued"].as_u64().unwrap_or(0);
    anyhow::ensure!(
        count == n as u64,
        "peer {peer} reported its bulk enqueue done with {count} of {n} jobs in its queue"
    );

    let mut sweep = Vec::new();
    let mut lines = Vec::new();
    for (i, setting) in settings.iter().enumerate() {
        eprintln!(
            "bench: peers: {peer}: drain {n} webhooks, {} in flight, same receiver; setting {} of {}: {}",
            args.in_flight,
            i + 1,
            settings.len(),
            if setting.is_empty() {
                "its defaults".to_string()
            } else {
                setting
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            }
        );
        seen.reset();
        let (reported, cpu) = peer_once(store, args, server_url, hook_url, peer, setting).await?;
        let drain = positive(&reported, "drain_per_s", peer)?;
        let (requests, distinct) = seen.counts();
        if distinct < n as u64 {
            anyhow::bail!(
                "peer {peer} reported its drain done, but the receiver saw {distinct} distinct requests for {n} jobs"
            );
        }
        sweep.push(PeerSetting {
            env: setting.iter().cloned().collect(),
            knobs: reported["knobs"].clone(),
            drain_per_s: drain,
            requests,
            duplicate_requests: requests - distinct,
            cpu,
        });
        lines.push(reported);
    }
    let b = (0..sweep.len())
        .max_by(|i, j| sweep[*i].drain_per_s.total_cmp(&sweep[*j].drain_per_s))
        .expect("a sweep has at least one setting");
    let reported = lines.swap_remove(b);
    let top = &sweep[b];
    Ok(PeerRun {
        peer: peer.to_string(),
        version: reported["version"].as_str().unwrap_or("?").to_string(),
        drain_per_s: top.drain_per_s,
        knobs: top.knobs.clone(),
        relay_speedup: 1.0,
        requests: top.requests,
        cpu: top.cpu.clone(),
        duplicate_requests: top.duplicate_requests,
        enqueue_per_s,
        enqueue_api: enqueued["api"].as_str().unwrap_or("?").to_string(),
        relay_enqueue_ratio: 1.0,
        sweep,
        reported,
        enqueue_reported: enqueued,
    })
}

fn positive(reported: &Value, field: &str, peer: &str) -> anyhow::Result<f64> {
    reported[field]
        .as_f64()
        .filter(|d| *d > 0.0)
        .ok_or_else(|| anyhow::anyhow!("peer {peer} reported no {field}: {reported}"))
}

/// Run the peer once with `env` beside the workload, in a scratch database
/// of its own on the same server, and return its result line, and for a
/// drain the machine's CPU over the window the peer reported
/// (`drain_started_unix`, `drain_ended_unix`).
async fn peer_once(
    store: &Store,
    args: &BenchArgs,
    server_url: &str,
    hook_url: &str,
    peer: &str,
    env: &[(String, String)],
) -> anyhow::Result<(Value, Option<CpuUse>)> {
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
    let runner = args.peers_dir.join("run-peer.sh");
    // readings only around a drain: an enqueue run reports no window
    let drain = !env.iter().any(|(k, v)| k == "MODE" && v == "enqueue");
    let sampler = if drain {
        let server = Server::find(store).await;
        Some((cpu::Sampler::start(server), WalSampler::start(store)))
    } else {
        None
    };
    let child = peer_command(&runner)
        .arg(peer)
        .envs(env.iter().map(|(k, v)| (k, v)))
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
    let reported: Value = serde_json::from_str(line)
        .map_err(|e| anyhow::anyhow!("peer {peer} printed no result line ({e}): {line:?}"))?;
    let window = reported["drain_started_unix"]
        .as_f64()
        .zip(reported["drain_ended_unix"].as_f64());
    let cpu = window.zip(sampler).and_then(|((from, to), (cpu, wal))| {
        let wal = wal.window(from, to);
        cpu.window(from, to, args.intents)
            .map(|c| c.with_wal(wal, args.intents))
    });
    Ok((reported, cpu))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sweep_is_env_settings_and_never_the_workload() {
        let s = parse_sweep("p", "{\"A_1\":\"100\",\"B\":\"0\"}\n\n{\"A_1\":\"500\"}\n").unwrap();
        assert_eq!(
            s,
            [
                vec![("A_1".into(), "100".into()), ("B".into(), "0".into())],
                vec![("A_1".into(), "500".into())]
            ]
        );
        assert_eq!(parse_sweep("p", "").unwrap(), [Setting::new()]);
        for bad in [
            "{\"CONCURRENCY\":\"64\"}",
            "{\"JOBS\":\"10\"}",
            "{\"lower\":\"1\"}",
            "{\"A\":1}",
            "[1]",
            "A=1",
        ] {
            assert!(parse_sweep("p", bad).is_err(), "{bad}");
        }
        let huge = "{\"A\":\"1\"}\n".repeat(MAX_SETTINGS + 1);
        assert!(parse_sweep("p", &huge).is_err());
    }
}

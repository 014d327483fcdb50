//! What `outbox-relay-bench` measures: a reproducible benchmark of the real
//! engine.
//!
//! In a scratch database on the configured server it measures, in one run:
//! the enqueue rate through `outbox.enqueue` (one per transaction and in
//! batches) against a plain INSERT of the same rows into a table with a
//! unique key; the **ceiling** (the engine's own claim + fenced complete +
//! attempt-record SQL with no network call); the end-to-end drain rate of
//! webhook intents against a local HTTP receiver running on its own runtime
//! thread; enqueue→delivered latency at a steady offered load (LISTEN/NOTIFY
//! wake-ups); and the process's peak RSS. Optionally it scales out to
//! several relay processes (`--relays`), grows the delivered history
//! (`--history`), and drains the same workload with peer job queues
//! (`--peers`, tests/peers/queue-bench) against the same receiver. Ratios
//! measured in one run are the figures to compare: these machines are noisy.

use std::time::{Duration, Instant};

use chrono::Utc;
use serde_json::json;
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection, Executor};

use outbox_relay::config::Config;
use outbox_relay::engine::{Batches, Engine, EngineConfig};
use outbox_relay::state::{AttemptOutcome, IntentState};
use outbox_relay::store::{enqueue, ClaimQuery, Completion, NewIntent, Store};

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchArgs {
    pub intents: usize,
    pub in_flight: usize,
    pub latency_rate: u32,
    pub latency_seconds: u64,
    pub keep: bool,
    /// Relay process counts for the scale-out drain.
    pub relays: Vec<usize>,
    /// How long the receiver takes to answer during the scale-out drains.
    pub scale_receiver_delay: Duration,
    /// Delivered-history sizes at which to measure claim + complete cost.
    pub history: Vec<u64>,
    /// Claim batch sizes at which to measure the ceiling as well.
    pub ceiling_batches: Vec<i64>,
    /// Intents to queue behind one dead head of an ordering key, to measure
    /// what a blocked key costs the claim (0 skips).
    pub blocked_backlog: u64,
    /// Peer job queues to drain the same workload with (run-peer.sh names).
    pub peers: Vec<String>,
    /// Where run-peer.sh and the peer scripts are.
    pub peers_dir: std::path::PathBuf,
}

/// Claim + complete cost beside `history_rows` delivered intents.
#[derive(Debug, Clone, serde::Serialize)]
pub struct HistoryPoint {
    pub history_rows: u64,
    pub claim_complete_per_s: f64,
    /// Over the smallest history of this run.
    pub relative: f64,
    /// EXPLAIN (ANALYZE, BUFFERS) of one claim of 100.
    pub claim_plan: Vec<String>,
}

/// What a key blocked by a dead head costs the claim: the same claim +
/// complete rounds (batches of 100, no network) with and without
/// `behind` intents queued behind the dead head, and the blocked-keys
/// gauge query beside them.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BlockedBacklog {
    pub behind: u64,
    /// Milliseconds per claim + complete round of 100, empty backlog.
    pub round_ms_alone: f64,
    /// The same beside the blocked backlog.
    pub round_ms_beside: f64,
    pub ratio: f64,
    /// Shared buffers one claim of 100 reads with no backlog, and beside
    /// it (the rows claimed cost the same either way; a claim that walked
    /// the backlog would read it too).
    pub claim_buffers_alone: u64,
    pub claim_buffers_beside: u64,
    /// The gauge refresh (counts, oldest due, blocked keys) beside it:
    /// counting the pending backlog is its part that grows with it.
    pub gauges_ms: f64,
    /// The blocked-keys query of that refresh alone.
    pub blocked_keys_ms: f64,
}

/// One scale-out drain: `relays` processes on one database.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ScaleOut {
    pub relays: usize,
    pub drain_per_s: f64,
    /// Over the drain with the fewest relays in this run.
    pub speedup: f64,
    pub requests: u64,
    pub duplicate_requests: u64,
    pub attempts: i64,
    /// The largest peak RSS among the relay processes.
    pub relay_peak_rss_mb: f64,
}

/// One peer job queue's drain of the same workload, against the same
/// receiver and Postgres server, in the same run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PeerRun {
    pub peer: String,
    pub version: String,
    pub drain_per_s: f64,
    /// outbox-relay's drain (one `run` process, the mean of the runs just
    /// before and just after this peer's) over this peer's.
    pub relay_speedup: f64,
    pub requests: u64,
    pub duplicate_requests: u64,
    /// Everything the peer script reported (its tuning included).
    pub reported: serde_json::Value,
}

/// The ceiling at one claim batch size.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CeilingPoint {
    pub batch: i64,
    pub per_s: f64,
    /// Time per claim + complete round over the rows it carries, from the
    /// rate: `batch / per_s`.
    pub round_ms: f64,
}

/// One `outbox-relay run` process draining the workload the peers drain.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RelayRun {
    pub drain_per_s: f64,
    pub requests: u64,
    pub duplicate_requests: u64,
}

/// One run's figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    pub intents: usize,
    pub in_flight: usize,
    pub enqueue_single_per_s: f64,
    pub plain_insert_single_per_s: f64,
    pub enqueue_cost_ratio: f64,
    pub enqueue_batched_per_s: f64,
    /// 100 rows per statement: `outbox.enqueue` called once per row of an
    /// `unnest` of arrays, one round trip and one commit per 100.
    pub enqueue_statement_per_s: f64,
    pub ceiling_per_s: f64,
    /// The claim size of the ceiling: the relay's `batch_size`.
    pub ceiling_batch: i64,
    /// The ceiling again at each of `--ceiling-batches`.
    pub ceiling_by_batch: Vec<CeilingPoint>,
    pub drain_per_s: f64,
    pub drain_ceiling_ratio: f64,
    /// The drain's claim and completion statements and the intents they
    /// carried.
    pub drain_batches: Batches,
    pub drain_intents_per_claim: f64,
    pub drain_completions_per_write: f64,
    pub latency_offered_per_s: u32,
    pub latency_p50_ms: f64,
    pub latency_p99_ms: f64,
    /// Drain rate of the same workload while 100k delivered rows are purged
    /// in batches at the same time, over a drain of the same workload
    /// beside that history without purging (measured in this run).
    pub drain_beside_history_per_s: f64,
    pub drain_during_purge_per_s: f64,
    pub purge_impact_ratio: f64,
    pub purged_rows: u64,
    pub purge_rows_per_s: f64,
    pub peak_rss_mb: f64,
    pub scale_receiver_delay_ms: u64,
    pub scale_out: Vec<ScaleOut>,
    pub history: Vec<HistoryPoint>,
    pub blocked_backlog: Option<BlockedBacklog>,
    /// One `outbox-relay run` process draining the workload the peers
    /// drain, receiver answering at once: before the first peer, and after
    /// each (empty when no peer was asked for).
    pub relay_runs: Vec<RelayRun>,
    pub peers: Vec<PeerRun>,
}

pub async fn run(server_url: &str, config: &Config, args: &BenchArgs) -> anyhow::Result<Report> {
    // a mistyped peer fails now, not after minutes of measuring
    let runner = args.peers_dir.join("run-peer.sh");
    if !args.peers.is_empty() && !runner.is_file() {
        anyhow::bail!(
            "--peers needs {}: run the bench from the repository root or pass --peers-dir",
            runner.display()
        );
    }
    for peer in &args.peers {
        if !args.peers_dir.join(format!("{peer}.mjs")).is_file()
            && !args.peers_dir.join(format!("{peer}-peer.py")).is_file()
        {
            anyhow::bail!(
                "unknown peer {peer:?}: there is no {peer}.mjs or {peer}-peer.py in {}",
                args.peers_dir.display()
            );
        }
        // installs what the peer needs (or says what is missing) now
        let status = peer_command(&runner)
            .arg("--prepare")
            .arg(peer)
            .stdout(std::process::Stdio::null())
            .status()
            .await
            .map_err(|e| anyhow::anyhow!("cannot run bash {}: {e}", runner.display()))?;
        if !status.success() {
            anyhow::bail!("peer {peer} cannot run here ({status}); its messages are above");
        }
    }
    let admin: PgConnectOptions = server_url.parse()?;
    let name = format!("outbox_bench_{}", std::process::id());
    let mut conn = admin.connect().await?;
    conn.execute(format!("DROP DATABASE IF EXISTS {name}").as_str())
        .await?;
    conn.execute(format!("CREATE DATABASE {name}").as_str())
        .await?;
    let db_opts = admin.clone().database(&name);
    let url = db_opts.to_url_lossy().to_string();
    let store = Store::connect(&url, (args.in_flight as u32 / 4).max(4) + 4).await?;
    store.migrate().await?;
    let result = measure(&store, config, args, &url, server_url).await;
    store.pool().close().await;
    if !args.keep {
        conn.execute(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)").as_str())
            .await?;
    } else {
        eprintln!("bench: kept database {name}");
    }
    conn.close().await.ok();
    result
}

async fn measure(
    store: &Store,
    config: &Config,
    args: &BenchArgs,
    db_url: &str,
    server_url: &str,
) -> anyhow::Result<Report> {
    let (port, _receiver, seen) = receiver()?;
    let url = format!("http://127.0.0.1:{port}/hook");
    let payload = |n: usize| {
        json!({"url": url, "body": {"event": "order.created", "order_id": n, "customer": "cus_0123456789",
               "amount": 1999, "currency": "usd", "items": [{"sku": "SKU-42", "qty": 1}],
               "note": "bench payload padded to about three hundred bytes"}})
    };
    let n = args.intents;
    let single_n = n.min(5000);

    eprintln!("bench: enqueue, one per transaction ({single_n})");
    let t = Instant::now();
    for i in 0..single_n {
        enqueue(
            store.pool(),
            &NewIntent::new(format!("single-{i}"), "webhook", payload(i)),
        )
        .await?;
    }
    let enqueue_single = single_n as f64 / t.elapsed().as_secs_f64();

    eprintln!(
        "bench: plain INSERT into a table with a unique key, one per transaction ({single_n})"
    );
    sqlx::query(
        "CREATE TABLE bench_plain (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, key text UNIQUE NOT NULL,
                                   kind text NOT NULL, payload jsonb NOT NULL, created_at timestamptz DEFAULT now())",
    )
    .execute(store.pool())
    .await?;
    let t = Instant::now();
    for i in 0..single_n {
        sqlx::query("INSERT INTO bench_plain (key, kind, payload) VALUES ($1, $2, $3)")
            .bind(format!("single-{i}"))
            .bind("webhook")
            .bind(payload(i))
            .execute(store.pool())
            .await?;
    }
    let plain_single = single_n as f64 / t.elapsed().as_secs_f64();
    run_sql(store, "TRUNCATE outbox.intents CASCADE").await?;

    eprintln!("bench: enqueue in statements of 100 (unnest, one outbox.enqueue per row) ({n})");
    let t = Instant::now();
    enqueue_statements(store, n, "ceiling", &payload).await?;
    let enqueue_statement_rate = n as f64 / t.elapsed().as_secs_f64();

    // The engine's own SQL at the engine's own batch size.
    let ceiling_batch = i64::from(config.relay.batch_size);
    eprintln!(
        "bench: ceiling: claim + fenced complete + attempt rows in claims of {ceiling_batch}, no network ({n})"
    );
    let ceiling = claim_complete_rate(store, ceiling_batch).await?;
    run_sql(store, "TRUNCATE outbox.intents CASCADE").await?;
    let mut ceiling_by_batch = Vec::new();
    for &batch in &args.ceiling_batches {
        enqueue_statements(store, n, &format!("ceiling{batch}"), &payload).await?;
        run_sql(store, "VACUUM ANALYZE outbox.intents").await?;
        eprintln!("bench: ceiling in claims of {batch} ({n})");
        let per_s = claim_complete_rate(store, batch).await?;
        let left: i64 =
            sqlx::query_scalar("SELECT count(*) FROM outbox.intents WHERE state <> 'delivered'")
                .fetch_one(store.pool())
                .await?;
        anyhow::ensure!(
            left == 0,
            "ceiling in claims of {batch}: {left} intents were left undelivered"
        );
        ceiling_by_batch.push(CeilingPoint {
            batch,
            per_s,
            round_ms: batch as f64 / per_s * 1000.0,
        });
        run_sql(store, "TRUNCATE outbox.intents CASCADE").await?;
    }

    eprintln!("bench: enqueue in transactions of 100 ({n})");
    let t = Instant::now();
    enqueue_batched(store, n, "drain", &payload).await?;
    let enqueue_batched_rate = n as f64 / t.elapsed().as_secs_f64();
    run_sql(store, "VACUUM ANALYZE outbox.intents").await?;

    eprintln!("bench: drain {n} webhooks, {} in flight", args.in_flight);
    let mut cfg = config.clone();
    cfg.relay.concurrency = args.in_flight as u32;
    cfg.webhook.allowed_networks = vec!["127.0.0.1/32".into()];
    cfg.webhook.max_in_flight_per_host = args.in_flight;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let engine = Engine::new(
        store.clone(),
        outbox_relay::engine::providers(&cfg)?,
        EngineConfig::from_config(&cfg),
    );
    let batches = engine.batch_counts();
    let t = Instant::now();
    let running = tokio::spawn(engine.run(async {
        let _ = stopped.await;
    }));
    wait_delivered(store, "drain-", n as i64).await?;
    let drain = n as f64 / t.elapsed().as_secs_f64();
    let drain_batches = batches.read();

    eprintln!(
        "bench: latency at {}/s offered for {}s (relay idle, woken by NOTIFY)",
        args.latency_rate, args.latency_seconds
    );
    run_sql(store, "TRUNCATE outbox.intents CASCADE").await?;
    let total = args.latency_rate as u64 * args.latency_seconds;
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / args.latency_rate as f64));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    for i in 0..total {
        tick.tick().await;
        let store = store.clone();
        let p = payload(i as usize);
        tokio::spawn(async move {
            let _ = enqueue(
                store.pool(),
                &NewIntent::new(format!("latency-{i}"), "webhook", p),
            )
            .await;
        });
    }
    wait_delivered(store, "latency-", total as i64).await?;
    let (p50, p99): (f64, f64) = sqlx::query_as(
        "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms), percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)
           FROM (SELECT extract(epoch FROM delivered_at - created_at) * 1000 AS ms
                   FROM outbox.intents WHERE key LIKE 'latency-%') t",
    )
    .fetch_one(store.pool())
    .await?;

    eprintln!("bench: drain beside 100k rows of delivered history, then again while the daemon's paced purge removes them");
    run_sql(store, "TRUNCATE outbox.intents CASCADE").await?;
    sqlx::query(
        "INSERT INTO outbox.intents (key, kind, payload, state, delivered_at, updated_at)
         SELECT 'history-' || g, 'webhook', '{\"body\": 1}'::jsonb, 'delivered',
                now() - interval '30 days', now() - interval '30 days'
           FROM generate_series(1, 100000) g",
    )
    .execute(store.pool())
    .await?;
    run_sql(store, "VACUUM ANALYZE outbox.intents").await?;
    let t = Instant::now();
    enqueue_batched(store, n, "beside", &payload).await?;
    wait_delivered(store, "beside-", n as i64).await?;
    let beside = n as f64 / t.elapsed().as_secs_f64();
    let purger = store.clone();
    let retention = config.retention.clone();
    let t = Instant::now();
    let purge = tokio::spawn(async move {
        let t = Instant::now();
        let n = purger
            .purge_paced(
                Duration::from_secs(7 * 86_400),
                false,
                retention.batch_size as i64,
                retention.batch_pause.0,
            )
            .await;
        (n, t.elapsed())
    });
    enqueue_batched(store, n, "during", &payload).await?;
    wait_delivered(store, "during-", n as i64).await?;
    let during = n as f64 / t.elapsed().as_secs_f64();
    let (purged, purge_time) = purge.await?;
    let purged = purged?;

    let _ = stop.send(());
    running.await??;

    let mut scale_out = Vec::new();
    seen.set_delay(args.scale_receiver_delay);
    let mut counts = args.relays.clone();
    counts.sort_unstable();
    counts.dedup();
    for relays in counts {
        eprintln!(
            "bench: scale-out: drain {n} webhooks with {relays} relay process(es), {} in flight each, receiver answering in {:?}",
            args.in_flight, args.scale_receiver_delay
        );
        let mut run = scale_out_drain(store, args, db_url, &url, relays, &seen).await?;
        let base = scale_out
            .first()
            .map_or(run.drain_per_s, |b: &ScaleOut| b.drain_per_s);
        run.speedup = run.drain_per_s / base;
        scale_out.push(run);
    }

    // one relay process before the first peer and after each, so that
    // each peer is compared with the relay runs on either side of it
    let mut relay_runs = Vec::new();
    let mut peers = Vec::new();
    if !args.peers.is_empty() {
        seen.set_delay(Duration::ZERO);
        relay_runs.push(relay_run(store, args, db_url, &url, &seen).await?);
        for peer in &args.peers {
            eprintln!(
                "bench: peers: drain {n} webhooks with {peer}, {} in flight, same receiver",
                args.in_flight
            );
            let mut run = peer_drain(store, args, server_url, &url, peer, &seen).await?;
            relay_runs.push(relay_run(store, args, db_url, &url, &seen).await?);
            let around = &relay_runs[relay_runs.len() - 2..];
            let relay = around.iter().map(|r| r.drain_per_s).sum::<f64>() / 2.0;
            run.relay_speedup = relay / run.drain_per_s;
            peers.push(run);
        }
    }

    Ok(Report {
        intents: n,
        in_flight: args.in_flight,
        enqueue_single_per_s: enqueue_single,
        plain_insert_single_per_s: plain_single,
        enqueue_cost_ratio: plain_single / enqueue_single,
        enqueue_batched_per_s: enqueue_batched_rate,
        enqueue_statement_per_s: enqueue_statement_rate,
        ceiling_per_s: ceiling,
        ceiling_batch,
        ceiling_by_batch,
        drain_per_s: drain,
        drain_ceiling_ratio: drain / ceiling,
        drain_batches,
        drain_intents_per_claim: drain_batches.per_claim(),
        drain_completions_per_write: drain_batches.per_write(),
        latency_offered_per_s: args.latency_rate,
        latency_p50_ms: p50,
        latency_p99_ms: p99,
        drain_beside_history_per_s: beside,
        drain_during_purge_per_s: during,
        purge_impact_ratio: during / beside,
        purged_rows: purged,
        purge_rows_per_s: purged as f64 / purge_time.as_secs_f64(),
        peak_rss_mb: peak_rss_mb(),
        scale_receiver_delay_ms: args.scale_receiver_delay.as_millis() as u64,
        scale_out,
        relay_runs,
        peers,
        history: history_scale(store, &args.history, &payload).await?,
        blocked_backlog: blocked_backlog(store, args.blocked_backlog, &payload).await?,
    })
}

/// Claim + complete rounds of 100 over 5,000 fresh intents, in ms per
/// round; then the same beside `behind` intents queued behind one dead
/// ordering-key head (enqueued through `outbox.enqueue`, as an application
/// would). Before waiting intents were kept out of the claim index, every
/// claim walked that backlog.
async fn blocked_backlog(
    store: &Store,
    behind: u64,
    payload: &impl Fn(usize) -> serde_json::Value,
) -> anyhow::Result<Option<BlockedBacklog>> {
    if behind == 0 {
        return Ok(None);
    }
    let buffers = |plan: Vec<String>| {
        plan.iter()
            .find_map(|l| l.trim().strip_prefix("Buffers: shared hit="))
            .and_then(|v| v.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    run_sql(store, "TRUNCATE outbox.intents CASCADE").await?;
    enqueue_batched(store, 5_000, "unblocked", payload).await?;
    run_sql(store, "VACUUM ANALYZE outbox.intents").await?;
    let claim_buffers_alone = buffers(store.explain_claim(100).await?);
    let alone = 100.0 / claim_complete_rate(store, 100).await? * 1000.0;
    eprintln!("bench: blocked backlog: {behind} intents behind one dead ordering-key head");
    sqlx::query(
        "SELECT outbox.enqueue('blocked-head', 'webhook', '{\"url\": \"http://127.0.0.1:9/\", \"body\": 0}',
                               NULL, now(), 'blocked')",
    )
    .execute(store.pool())
    .await?;
    run_sql(
        store,
        "UPDATE outbox.intents SET state = 'dead' WHERE key = 'blocked-head'",
    )
    .await?;
    let mut queued = 0u64;
    while queued < behind {
        let chunk = (behind - queued).min(10_000);
        sqlx::query(
            "SELECT outbox.enqueue('blocked-' || g, 'webhook',
                                   jsonb_build_object('url', 'http://127.0.0.1:9/', 'body', g),
                                   NULL, now(), 'blocked')
               FROM generate_series($1::bigint + 1, $1::bigint + $2::bigint) g",
        )
        .bind(queued as i64)
        .bind(chunk as i64)
        .execute(store.pool())
        .await?;
        queued += chunk;
    }
    enqueue_batched(store, 5_000, "beside", payload).await?;
    run_sql(store, "VACUUM ANALYZE outbox.intents").await?;
    let claim_buffers_beside = buffers(store.explain_claim(100).await?);
    let t = Instant::now();
    store.stats_for_gauges().await?;
    let gauges_ms = t.elapsed().as_secs_f64() * 1000.0;
    let t = Instant::now();
    store.blocked_ordering_keys().await?;
    let blocked_keys_ms = t.elapsed().as_secs_f64() * 1000.0;
    let rate = claim_complete_rate(store, 100).await?;
    let beside = 100.0 / rate * 1000.0;
    Ok(Some(BlockedBacklog {
        behind,
        round_ms_alone: alone,
        round_ms_beside: beside,
        ratio: beside / alone,
        claim_buffers_alone,
        claim_buffers_beside,
        gauges_ms,
        blocked_keys_ms,
    }))
}

/// Grow the delivered history (intents and their attempt rows) to each size
/// in turn; at each, EXPLAIN one claim and measure claim + complete of
/// 5,000 fresh intents. Flat figures mean history costs the hot path nothing.
async fn history_scale(
    store: &Store,
    sizes: &[u64],
    payload: &impl Fn(usize) -> serde_json::Value,
) -> anyhow::Result<Vec<HistoryPoint>> {
    let mut points: Vec<HistoryPoint> = Vec::new();
    if sizes.is_empty() {
        return Ok(points);
    }
    run_sql(store, "TRUNCATE outbox.intents CASCADE").await?;
    let mut sizes = sizes.to_vec();
    sizes.sort_unstable();
    let mut have: u64 = 0;
    for (round, &size) in sizes.iter().enumerate() {
        eprintln!("bench: history: growing delivered history to {size} rows");
        while have < size {
            let chunk = (size - have).min(250_000);
            sqlx::query(
                "WITH h AS (
                     INSERT INTO outbox.intents (key, kind, payload, state, attempts, fence,
                                                 provider_ref, delivered_at, updated_at, created_at)
                     SELECT 'history-' || g, 'webhook',
                            jsonb_build_object('url', 'http://127.0.0.1:9/hook', 'body',
                                               jsonb_build_object('order_id', g, 'note', repeat('x', 200))),
                            'delivered', 1, 1, 'msg_' || g,
                            now() - interval '1 day', now() - interval '1 day', now() - interval '1 day'
                       FROM generate_series($1::bigint + 1, $1::bigint + $2::bigint) g
                     RETURNING id)
                 INSERT INTO outbox.attempts (intent_id, attempt, fence, owner, started_at,
                                              finished_at, outcome, status, provider_ref)
                 SELECT id, 1, 1, 'history', now() - interval '1 day', now() - interval '1 day',
                        'delivered', 200, 'msg_' || id FROM h",
            )
            .bind(have as i64)
            .bind(chunk as i64)
            .execute(store.pool())
            .await?;
            have += chunk;
        }
        run_sql(store, "VACUUM ANALYZE outbox.intents").await?;
        run_sql(store, "VACUUM ANALYZE outbox.attempts").await?;
        let prefix = format!("fresh{round}");
        enqueue_batched(store, 5_000, &prefix, payload).await?;
        let plan = store.explain_claim(100).await?;
        let rate = claim_complete_rate(store, 100).await?;
        let relative = points
            .first()
            .map_or(1.0, |p| rate / p.claim_complete_per_s);
        points.push(HistoryPoint {
            history_rows: size,
            claim_complete_per_s: rate,
            relative,
            claim_plan: plan,
        });
        // the fresh intents join the history
        have += 5_000;
    }
    Ok(points)
}

/// Start `relays` separate `outbox-relay run` processes on the bench
/// database, let them go idle, commit `n` intents in one transaction and
/// time until all are delivered. Counts the requests the receiver saw and
/// the distinct webhook-ids among them: a duplicate effect would show.
async fn scale_out_drain(
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
async fn relay_run(
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
fn peer_command(runner: &std::path::Path) -> tokio::process::Command {
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
async fn peer_drain(
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

/// Claim everything due in batches of `batch` and complete each batch as
/// delivered, as the engine does (its claim statement, one per relay), with
/// no network call: the rate at which this database runs the engine's own
/// SQL. Returns intents per second.
async fn claim_complete_rate(store: &Store, batch: i64) -> anyhow::Result<f64> {
    let query = ClaimQuery::new(batch, &[]);
    let t = Instant::now();
    let mut done = 0;
    loop {
        let claims = store
            .claim_with(&query, "bench-ceiling", batch, 60_000)
            .await?;
        if claims.is_empty() {
            break;
        }
        let now = Utc::now();
        let batch: Vec<Completion> = claims
            .iter()
            .map(|c| Completion {
                id: c.id,
                kind: c.kind.clone(),
                delivered_before: false,
                operator_replay: false,
                fence: c.fence,
                attempt: c.attempt,
                key_generation: c.key_generation,
                started_at: now,
                finished_at: now,
                outcome: AttemptOutcome::Delivered,
                status: Some(200),
                provider_ref: Some(format!("msg_{}", c.id)),
                error: None,
                replayed: false,
                uncounted: false,
                state: IntentState::Delivered,
                run_after: None,
                response: None,
            })
            .collect();
        done += store
            .complete("bench-ceiling", &batch)
            .await?
            .accepted
            .len();
    }
    Ok(done as f64 / t.elapsed().as_secs_f64())
}

async fn enqueue_batched(
    store: &Store,
    n: usize,
    prefix: &str,
    payload: &impl Fn(usize) -> serde_json::Value,
) -> anyhow::Result<()> {
    for rows in hundreds(n) {
        let mut tx = store.pool().begin().await?;
        for j in rows {
            enqueue(
                &mut *tx,
                &NewIntent::new(format!("{prefix}-{j}"), "webhook", payload(j)),
            )
            .await?;
        }
        tx.commit().await?;
    }
    Ok(())
}

/// Run one statement that returns nothing (the bench's TRUNCATEs and VACUUMs).
async fn run_sql(store: &Store, statement: &str) -> Result<(), sqlx::Error> {
    sqlx::query(statement)
        .execute(store.pool())
        .await
        .map(|_| ())
}

/// `0..n` in consecutive ranges of 100 (the last may be shorter).
fn hundreds(n: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    (0..n).step_by(100).map(move |i| i..(i + 100).min(n))
}

/// Enqueue `n` intents 100 per statement: the arrays go in one round trip
/// and `outbox.enqueue` runs once per row (what an application that has many
/// intents at once should do).
async fn enqueue_statements(
    store: &Store,
    n: usize,
    prefix: &str,
    payload: &impl Fn(usize) -> serde_json::Value,
) -> anyhow::Result<()> {
    for range in hundreds(n) {
        let keys: Vec<String> = range.clone().map(|j| format!("{prefix}-{j}")).collect();
        let payloads: Vec<serde_json::Value> = range.map(payload).collect();
        let ids: Vec<i64> = sqlx::query_scalar(
            "SELECT e.id FROM unnest($1::text[], $2::jsonb[]) AS u(key, payload)
                     CROSS JOIN LATERAL outbox.enqueue(u.key, 'webhook', u.payload) e",
        )
        .bind(&keys)
        .bind(&payloads)
        .fetch_all(store.pool())
        .await?;
        anyhow::ensure!(
            ids.len() == keys.len(),
            "enqueue returned {} ids for {} keys",
            ids.len(),
            keys.len()
        );
    }
    Ok(())
}

/// Wait until `n` intents whose key starts with `prefix` are delivered.
/// Polls for open (pending or claimed) intents, which reads only those rows
/// through the partial indexes, and counts the delivered ones only when
/// none is open: the watching must not load the database it measures.
async fn wait_delivered(store: &Store, prefix: &str, n: i64) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let open: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM outbox.intents
                             WHERE state = 'pending' AND key LIKE $1 || '%')
                 OR EXISTS (SELECT 1 FROM outbox.intents
                             WHERE state = 'claimed' AND key LIKE $1 || '%')",
        )
        .bind(prefix)
        .fetch_one(store.pool())
        .await?;
        if !open {
            let done: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM outbox.intents WHERE state = 'delivered' AND key LIKE $1 || '%'",
            )
            .bind(prefix)
            .fetch_one(store.pool())
            .await?;
            if done >= n {
                return Ok(());
            }
            if Instant::now() > deadline {
                anyhow::bail!("only {done} of {n} delivered after 10 minutes");
            }
        } else if Instant::now() > deadline {
            anyhow::bail!("intents still open after 10 minutes");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The webhook-ids the bench receiver has seen, and how many requests.
#[derive(Clone, Default)]
struct Seen {
    log: std::sync::Arc<std::sync::Mutex<(u64, std::collections::HashSet<String>)>>,
    /// How long the receiver takes to answer, in ms.
    delay_ms: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Seen {
    fn delay(&self) -> Duration {
        Duration::from_millis(self.delay_ms.load(std::sync::atomic::Ordering::Relaxed))
    }
    fn set_delay(&self, d: Duration) {
        self.delay_ms
            .store(d.as_millis() as u64, std::sync::atomic::Ordering::Relaxed);
    }
    fn record(&self, id: Option<&str>) {
        let mut s = self.log.lock().expect("receiver log");
        s.0 += 1;
        if let Some(id) = id {
            s.1.insert(id.to_string());
        }
    }
    fn reset(&self) {
        *self.log.lock().expect("receiver log") = Default::default();
    }
    /// (requests, distinct webhook-ids)
    fn counts(&self) -> (u64, u64) {
        let s = self.log.lock().expect("receiver log");
        (s.0, s.1.len() as u64)
    }
}

/// A webhook receiver on its own thread and runtime, so it does not share
/// the relay's executor. Answers 200 to every POST and notes its webhook-id.
fn receiver() -> anyhow::Result<(u16, std::thread::JoinHandle<()>, Seen)> {
    let seen = Seen::default();
    let log = seen.clone();
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    std_listener.set_nonblocking(true)?;
    let port = std_listener.local_addr()?.port();
    let handle = std::thread::Builder::new()
        .name("bench-receiver".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(std_listener).expect("listener");
                let app = axum::Router::new().fallback(move |headers: axum::http::HeaderMap| {
                    log.record(headers.get("webhook-id").and_then(|v| v.to_str().ok()));
                    let delay = log.delay();
                    async move {
                        if !delay.is_zero() {
                            tokio::time::sleep(delay).await;
                        }
                        ""
                    }
                });
                let _ = axum::serve(listener, app).await;
            });
        })?;
    Ok((port, handle, seen))
}

/// The process's peak resident set (VmHWM), in MB.
pub fn peak_rss_mb() -> f64 {
    peak_rss_mb_of("/proc/self/status")
}

/// VmHWM from a /proc/<pid>/status file, in MB.
fn peak_rss_mb_of(status: &str) -> f64 {
    std::fs::read_to_string(status)
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|kb| kb.parse::<f64>().ok())
            })
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

pub fn print(r: &Report) {
    println!(
        "outbox-relay bench: {} webhook intents, {} in flight, attempt history on",
        r.intents, r.in_flight
    );
    println!();
    let rows = [
        (
            "enqueue, 1 per transaction",
            format!("{:.0}/s", r.enqueue_single_per_s),
        ),
        (
            "plain INSERT, 1 per transaction",
            format!("{:.0}/s", r.plain_insert_single_per_s),
        ),
        (
            "  enqueue cost vs plain INSERT",
            format!("{:.2}x", r.enqueue_cost_ratio),
        ),
        (
            "enqueue, 100 per transaction",
            format!("{:.0}/s", r.enqueue_batched_per_s),
        ),
        (
            "enqueue, 100 per statement (unnest)",
            format!("{:.0}/s", r.enqueue_statement_per_s),
        ),
        (
            "ceiling (claim+complete SQL, no network)",
            format!("{:.0}/s in claims of {}", r.ceiling_per_s, r.ceiling_batch),
        ),
        ("drain, end to end", format!("{:.0}/s", r.drain_per_s)),
        (
            "  drain / ceiling",
            format!("{:.0}%", r.drain_ceiling_ratio * 100.0),
        ),
        (
            "  intents per claim / per completion write",
            format!(
                "{:.1} / {:.1} ({} claims, {} writes)",
                r.drain_intents_per_claim,
                r.drain_completions_per_write,
                r.drain_batches.claims,
                r.drain_batches.writes
            ),
        ),
        (
            "latency enqueue→delivered",
            format!(
                "p50 {:.1} ms, p99 {:.1} ms at {}/s offered",
                r.latency_p50_ms, r.latency_p99_ms, r.latency_offered_per_s
            ),
        ),
        (
            "enqueue+drain beside 100k history rows",
            format!("{:.0}/s", r.drain_beside_history_per_s),
        ),
        (
            "  same, while the paced purge runs",
            format!("{:.0}/s", r.drain_during_purge_per_s),
        ),
        (
            "  during purge / beside history",
            format!("{:.2}x", r.purge_impact_ratio),
        ),
        (
            "  purge",
            format!("{} rows at {:.0}/s", r.purged_rows, r.purge_rows_per_s),
        ),
        (
            "peak RSS (relay and receiver)",
            format!("{:.0} MB", r.peak_rss_mb),
        ),
    ];
    for (k, v) in rows {
        println!("{k:<42} {v}");
    }
    if !r.ceiling_by_batch.is_empty() {
        println!();
        println!("ceiling by claim batch size (claim + complete, no network)");
        println!("{:<8} {:>12} {:>16}", "batch", "intents/s", "ms per round");
        for c in &r.ceiling_by_batch {
            println!("{:<8} {:>12.0} {:>16.2}", c.batch, c.per_s, c.round_ms);
        }
    }
    if !r.history.is_empty() {
        println!();
        println!("history: claim + complete (batches of 100, no network) beside delivered history");
        println!(
            "{:<14} {:>16} {:>9}",
            "history rows", "claim+complete/s", "relative"
        );
        for h in &r.history {
            println!(
                "{:<14} {:>16.0} {:>8.2}x",
                h.history_rows, h.claim_complete_per_s, h.relative
            );
        }
        for h in [r.history.first(), r.history.last()].into_iter().flatten() {
            println!();
            println!("claim plan beside {} history rows:", h.history_rows);
            for line in &h.claim_plan {
                println!("  {line}");
            }
            if r.history.len() == 1 {
                break;
            }
        }
    }
    if let Some(b) = &r.blocked_backlog {
        println!();
        println!(
            "blocked key: claim + complete of 100 (no network) beside {} intents behind one dead head",
            b.behind
        );
        println!(
            "  {:.2} ms per round alone, {:.2} ms beside ({:.2}x); a claim reads {} buffers alone, {} beside",
            b.round_ms_alone,
            b.round_ms_beside,
            b.ratio,
            b.claim_buffers_alone,
            b.claim_buffers_beside,
        );
        println!(
            "  gauge refresh {:.1} ms (counting the backlog), of which the blocked-keys query {:.2} ms",
            b.gauges_ms, b.blocked_keys_ms
        );
    }
    if !r.scale_out.is_empty() {
        println!();
        println!(
            "scale-out: separate relay processes, {} in flight each, same database, receiver answering in {} ms",
            r.in_flight, r.scale_receiver_delay_ms
        );
        println!(
            "{:<8} {:>10} {:>9} {:>10} {:>11} {:>9} {:>14}",
            "relays", "drain/s", "speedup", "requests", "duplicates", "attempts", "relay RSS MB"
        );
        for s in &r.scale_out {
            println!(
                "{:<8} {:>10.0} {:>8.2}x {:>10} {:>11} {:>9} {:>14.0}",
                s.relays,
                s.drain_per_s,
                s.speedup,
                s.requests,
                s.duplicate_requests,
                s.attempts,
                s.relay_peak_rss_mb
            );
        }
    }
    if !r.peers.is_empty() {
        println!();
        println!(
            "peers: the same {} webhooks, {} in flight, same receiver answering at once, same Postgres server",
            r.intents, r.in_flight
        );
        println!(
            "{:<34} {:>10} {:>10} {:>11} {:>17}",
            "queue", "drain/s", "requests", "duplicates", "outbox-relay is"
        );
        let relay_row = |run: &RelayRun| {
            println!(
                "{:<34} {:>10.0} {:>10} {:>11}",
                "outbox-relay (one `run` process)",
                run.drain_per_s,
                run.requests,
                run.duplicate_requests
            );
        };
        for (i, p) in r.peers.iter().enumerate() {
            if let Some(run) = r.relay_runs.get(i) {
                relay_row(run);
            }
            println!(
                "{:<34} {:>10.0} {:>10} {:>11} {:>16.2}x",
                format!("{} {}", p.peer, p.version),
                p.drain_per_s,
                p.requests,
                p.duplicate_requests,
                p.relay_speedup
            );
        }
        if let Some(run) = r.relay_runs.last() {
            relay_row(run);
        }
        println!("(each peer against the mean of the relay runs just before and after it)");
    }
}

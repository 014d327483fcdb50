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
//! (`--history`), and compares peer job queues (`--peers`,
//! tests/peers/queue-bench, see [`crate::peers`]): each one's bulk enqueue
//! and its drain of the same workload against the same receiver, at the
//! best of a small sweep of its batch knobs, beside the relay's own bulk
//! enqueue and drain just before and after it; and it compares the drain
//! with tracing off and on (`--tracing`, see [`crate::traced`]). Ratios
//! measured in one run are the figures to compare: these machines are
//! noisy.

use std::time::{Duration, Instant};

use serde_json::json;
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection, Executor};

use outbox_relay::config::Config;
use outbox_relay::engine::{Engine, EngineConfig};
use outbox_relay::store::{enqueue, NewIntent, Store};

use crate::drains::{relay_run, scale_out_drain};
use crate::peers::{peer_sweep, prepare, Setting};
use crate::receiver::{peak_rss_mb, receiver};
pub use crate::report::print;
use crate::report::{CeilingPoint, LatencySplit, Report, ScaleOut};
use crate::sql::{
    all_delivered, blocked_backlog, claim_complete_rate, enqueue_batched, enqueue_many_statements,
    enqueue_statements, history_scale, run_sql, small_claims, wait_delivered, EMPTY_LOG,
};

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
    /// Claim sizes at which to compare the claim statements' two forms.
    pub small_claims: Vec<i64>,
    /// Intents to queue behind one dead head of an ordering key, to measure
    /// what a blocked key costs the claim (0 skips).
    pub blocked_backlog: u64,
    /// Peer job queues to drain the same workload with (run-peer.sh names).
    pub peers: Vec<String>,
    /// Where run-peer.sh and the peer scripts are.
    pub peers_dir: std::path::PathBuf,
    /// Relay drains before the first peer and after each one.
    pub relay_runs_between: usize,
    /// The broker kinds to drain, and where their brokers are.
    pub brokers: Option<crate::brokers::Brokers>,
    /// Rounds of the drain with tracing off and on, each (0 skips).
    pub tracing_rounds: usize,
    /// The `batch_size` of the bench's relay processes: the bench's own
    /// configuration's.
    pub relay_batch_size: u32,
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
    let mut sweeps = Vec::new();
    for peer in &args.peers {
        if !args.peers_dir.join(format!("{peer}.mjs")).is_file()
            && !args.peers_dir.join(format!("{peer}-peer.py")).is_file()
        {
            anyhow::bail!(
                "unknown peer {peer:?}: there is no {peer}.mjs or {peer}-peer.py in {}",
                args.peers_dir.display()
            );
        }
        // installs what the peer needs (or says what is missing) and reads its sweep now
        sweeps.push((peer.clone(), prepare(&runner, peer).await?));
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
    let result = measure(&store, config, args, &url, server_url, &sweeps).await;
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
    sweeps: &[(String, Vec<Setting>)],
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
    run_sql(store, EMPTY_LOG).await?;

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
    run_sql(store, EMPTY_LOG).await?;

    eprintln!("bench: enqueue with outbox.enqueue_many, 1000 per statement ({n})");
    let t = Instant::now();
    enqueue_many_statements(store, n, 1000, "many", &payload).await?;
    let enqueue_many_rate = n as f64 / t.elapsed().as_secs_f64();
    run_sql(store, EMPTY_LOG).await?;
    let mut ceiling_by_batch = Vec::new();
    for &batch in &args.ceiling_batches {
        enqueue_statements(store, n, &format!("ceiling{batch}"), &payload).await?;
        run_sql(
            store,
            "VACUUM ANALYZE outbox.intent_log, outbox.intent_rows",
        )
        .await?;
        eprintln!("bench: ceiling in claims of {batch} ({n})");
        let per_s = claim_complete_rate(store, batch).await?;
        all_delivered(store, &format!("ceiling in claims of {batch}")).await?;
        ceiling_by_batch.push(CeilingPoint {
            batch,
            per_s,
            round_ms: batch as f64 / per_s * 1000.0,
        });
        run_sql(store, EMPTY_LOG).await?;
    }
    let small_claims = small_claims(
        store,
        &args.small_claims,
        ceiling_batch,
        n.min(2000),
        &payload,
    )
    .await?;

    eprintln!("bench: enqueue in transactions of 100 ({n})");
    let t = Instant::now();
    enqueue_batched(store, n, "drain", &payload).await?;
    let enqueue_batched_rate = n as f64 / t.elapsed().as_secs_f64();
    run_sql(
        store,
        "VACUUM ANALYZE outbox.intent_log, outbox.intent_rows",
    )
    .await?;

    eprintln!("bench: drain {n} webhooks, {} in flight", args.in_flight);
    let mut cfg = config.clone();
    cfg.relay.concurrency = args.in_flight as u32;
    cfg.webhook.allowed_networks = vec!["127.0.0.1/32".into()];
    cfg.webhook.max_in_flight_per_host = args.in_flight;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let engine = Engine::new(
        store.clone(),
        outbox_relay::engine::providers(
            &cfg,
            &outbox_relay::services::subscriptions::context(store, &cfg)?,
        )?,
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
    run_sql(store, EMPTY_LOG).await?;
    // The application enqueues through a pool of its own, as it would in
    // its own process: sharing the relay's, a burst of enqueues after a
    // stall would hold every connection the claim and the completion need.
    let app = Store::connect(db_url, 8).await?;
    let total = args.latency_rate as u64 * args.latency_seconds;
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / args.latency_rate as f64));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    for i in 0..total {
        tick.tick().await;
        let app = app.clone();
        let p = payload(i as usize);
        tokio::spawn(async move {
            // (the wait for delivery below then says how many never arrived)
            if let Err(e) = enqueue(
                app.pool(),
                &NewIntent::new(format!("latency-{i}"), "webhook", p),
            )
            .await
            {
                eprintln!("bench: latency run: enqueue {i} failed: {e}");
            }
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
    let latency_split = latency_split(store).await?;
    app.pool().close().await;

    eprintln!("bench: drain beside 100k rows of delivered history, then again while the daemon's paced purge removes them");
    run_sql(store, EMPTY_LOG).await?;
    sqlx::query(
        "INSERT INTO outbox.intents (key, kind, payload, state, delivered_at, updated_at)
         SELECT 'history-' || g, 'webhook', '{\"body\": 1}'::jsonb, 'delivered',
                now() - interval '30 days', now() - interval '30 days'
           FROM generate_series(1, 100000) g",
    )
    .execute(store.pool())
    .await?;
    run_sql(
        store,
        "VACUUM ANALYZE outbox.intent_log, outbox.intent_rows",
    )
    .await?;
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
        let mut run = scale_out_drain(store, args, db_url, &url, relays, &seen, None).await?;
        let base = scale_out
            .first()
            .map_or(run.drain_per_s, |b: &ScaleOut| b.drain_per_s);
        run.speedup = run.drain_per_s / base;
        scale_out.push(run);
    }

    // relay drains before the first peer and after each, so that each peer
    // is compared with the median of the relay drains on either side of it
    let mut relay_runs = Vec::new();
    let mut peers = Vec::new();
    if !sweeps.is_empty() {
        seen.set_delay(Duration::ZERO);
        let between = args.relay_runs_between;
        for _ in 0..between {
            relay_runs.push(relay_run(store, args, db_url, &url, &seen, &payload).await?);
        }
        for (peer, settings) in sweeps {
            let mut run = peer_sweep(store, args, server_url, &url, peer, settings, &seen).await?;
            for _ in 0..between {
                relay_runs.push(relay_run(store, args, db_url, &url, &seen, &payload).await?);
            }
            let around = &relay_runs[relay_runs.len() - 2 * between..];
            let relay = median(around.iter().map(|r| r.drain_per_s));
            run.relay_speedup = relay / run.drain_per_s;
            let relay_enqueue = median(around.iter().map(|r| r.enqueue_many_per_s));
            run.relay_enqueue_ratio = relay_enqueue / run.enqueue_per_s;
            peers.push(run);
        }
    }

    let tracing = match args.tracing_rounds {
        0 => None,
        rounds => Some(crate::traced::compare(store, args, db_url, &url, &seen, rounds).await?),
    };

    Ok(Report {
        intents: n,
        in_flight: args.in_flight,
        enqueue_single_per_s: enqueue_single,
        plain_insert_single_per_s: plain_single,
        enqueue_cost_ratio: plain_single / enqueue_single,
        enqueue_batched_per_s: enqueue_batched_rate,
        enqueue_statement_per_s: enqueue_statement_rate,
        enqueue_many_per_s: enqueue_many_rate,
        ceiling_per_s: ceiling,
        ceiling_batch,
        ceiling_by_batch,
        small_claims,
        drain_per_s: drain,
        drain_ceiling_ratio: drain / ceiling,
        drain_batches,
        drain_intents_per_claim: drain_batches.per_claim(),
        drain_completions_per_write: drain_batches.per_write(),
        latency_offered_per_s: args.latency_rate,
        latency_p50_ms: p50,
        latency_p99_ms: p99,
        latency_split,
        drain_beside_history_per_s: beside,
        drain_during_purge_per_s: during,
        purge_impact_ratio: during / beside,
        purged_rows: purged,
        purge_rows_per_s: purged as f64 / purge_time.as_secs_f64(),
        peak_rss_mb: peak_rss_mb(),
        scale_receiver_delay_ms: args.scale_receiver_delay.as_millis() as u64,
        scale_out,
        relay_runs_between: args.relay_runs_between,
        relay_runs,
        peers,
        tracing,
        brokers: match &args.brokers {
            Some(b) => crate::brokers::drains(store, config, b, args.in_flight).await?,
            None => Vec::new(),
        },
        history: history_scale(store, &args.history, &payload).await?,
        blocked_backlog: blocked_backlog(store, args.blocked_backlog, &payload).await?,
    })
}

/// The legs of the latency run's enqueue→delivered time, from each
/// intent's row and its first attempt's (the relay's clock and the
/// database's are this machine's).
async fn latency_split(store: &Store) -> anyhow::Result<LatencySplit> {
    let row: (f64, f64, f64, f64, f64, f64) = sqlx::query_as(
        "WITH legs AS (
             SELECT extract(epoch FROM a.started_at - i.created_at) * 1000 AS to_attempt,
                    extract(epoch FROM a.finished_at - a.started_at) * 1000 AS call,
                    extract(epoch FROM i.delivered_at - a.finished_at) * 1000 AS to_record
               FROM outbox.intents i JOIN outbox.attempt_history a ON a.intent_id = i.id AND a.attempt = 1
              WHERE i.key LIKE 'latency-%')
         SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY to_attempt),
                percentile_cont(0.99) WITHIN GROUP (ORDER BY to_attempt),
                percentile_cont(0.5) WITHIN GROUP (ORDER BY call),
                percentile_cont(0.99) WITHIN GROUP (ORDER BY call),
                percentile_cont(0.5) WITHIN GROUP (ORDER BY to_record),
                percentile_cont(0.99) WITHIN GROUP (ORDER BY to_record)
           FROM legs",
    )
    .fetch_one(store.pool())
    .await?;
    Ok(LatencySplit {
        to_attempt_p50_ms: row.0,
        to_attempt_p99_ms: row.1,
        call_p50_ms: row.2,
        call_p99_ms: row.3,
        to_record_p50_ms: row.4,
        to_record_p99_ms: row.5,
    })
}

/// The median of some figures (the mean of the middle two when they are
/// even in number).
fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = values.collect();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

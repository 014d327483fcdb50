//! Drains by separate relay processes against the bench's receiver: the
//! scale-out, and the relay runs beside the peers (crate::peers).

use std::time::{Duration, Instant};

use outbox_relay::store::Store;

use crate::bench::BenchArgs;
use crate::cpu;
use crate::otlp::Traces;
use crate::peers::ENQUEUE_PER_CALL;
use crate::receiver::{peak_rss_mb_of, Seen};
use crate::relay_process::relay_process;
use crate::report::{RelayRun, ScaleOut};
use crate::server::{self, Server};
use crate::sql::{enqueue_many_statements, run_sql, wait_delivered_marking, EMPTY_LOG};

/// Start `relays` separate `outbox-relay run` processes on the bench
/// database, let them go idle, commit `n` intents in one transaction and
/// time until all are delivered. Counts the requests the receiver saw and
/// the distinct webhook-ids among them: a duplicate effect would show.
///
/// `traced`: the relays export a span of every attempt to that OTLP
/// receiver, and their CPU is counted until every span has arrived (see
/// [`crate::traced`]); the drain rate and the machine's CPU stay commit to
/// last delivery.
pub(crate) async fn scale_out_drain(
    store: &Store,
    args: &BenchArgs,
    db_url: &str,
    hook_url: &str,
    relays: usize,
    seen: &Seen,
    traced: Option<&Traces>,
) -> anyhow::Result<ScaleOut> {
    run_sql(store, EMPTY_LOG).await?;
    run_sql(
        store,
        "VACUUM ANALYZE outbox.intent_log, outbox.intent_rows",
    )
    .await?;
    seen.reset();
    let server = Server::find(store).await;
    if let Some(traces) = traced {
        traces.reset();
    }
    // a traced relay's /metrics is scraped for the spans it dropped
    let mut metrics_ports = Vec::new();
    // this binary, run as `outbox-relay` (see crate::RUN_AS_RELAY)
    let exe = std::env::current_exe()?;
    let mut children = Vec::new();
    for r in 0..relays {
        let mut cmd = relay_process(&exe, "run", db_url);
        cmd.env("OUTBOX_RELAY__RELAY__NAME", format!("\"bench-{r}\""))
            .env(
                "OUTBOX_RELAY__RELAY__CONCURRENCY",
                args.in_flight.to_string(),
            )
            .env(
                "OUTBOX_RELAY__RELAY__BATCH_SIZE",
                args.relay_batch_size.to_string(),
            )
            .env(
                "OUTBOX_RELAY__WEBHOOK__MAX_IN_FLIGHT_PER_HOST",
                args.in_flight.to_string(),
            )
            .env("OUTBOX_RELAY__RETENTION__INTENTS", "\"0s\"")
            // BENCH_RELAY_LOG: the relay's RUST_LOG, to see what it does
            .env(
                "RUST_LOG",
                std::env::var("BENCH_RELAY_LOG").unwrap_or_else(|_| "error".into()),
            );
        match traced {
            Some(traces) => {
                let port = std::net::TcpListener::bind("127.0.0.1:0")?
                    .local_addr()?
                    .port();
                metrics_ports.push(port);
                cmd.env(
                    "OUTBOX_RELAY__RELAY__METRICS_ADDR",
                    format!("\"127.0.0.1:{port}\""),
                )
                .env(
                    "OUTBOX_RELAY__TELEMETRY__OTLP_ENDPOINT",
                    format!("\"{}\"", traces.endpoint()),
                );
            }
            None => {
                cmd.env("OUTBOX_RELAY__RELAY__METRICS_ADDR", "\"127.0.0.1:0\"");
            }
        }
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
    let relay_ticks = || -> Option<u64> {
        children
            .iter()
            .map(|c| c.id().and_then(cpu::ticks_of))
            .sum()
    };
    let (cpu_from, relay_from) = (cpu::read(server.as_ref()), relay_ticks());
    let wal_from = server::wal_position(store).await;
    // the receiver's count first (no query), then the database's
    seen.wait_distinct(args.intents as u64, Duration::from_secs(600))
        .await;
    // the window ends just before the check that found every intent
    // recorded: that check and the count that verifies the drain are the
    // bench's reads of the view, not the relay's work
    let mut end = None;
    wait_delivered_marking(store, "scale-", args.intents as i64, || {
        end = Some((t.elapsed(), cpu::read(server.as_ref()), relay_ticks()));
    })
    .await?;
    let (elapsed, cpu_to, mut relay_to) =
        end.expect("a reading is taken before every check of the drain");
    let drain = args.intents as f64 / elapsed.as_secs_f64();
    let wal_to = server::wal_position(store).await;
    // the relays' export work runs on after the last delivery: their CPU
    // is read again once the last span has arrived (the machine's window
    // stays the drain, as others may use the CPUs while the export lingers)
    let lag = match traced {
        Some(traces) => {
            let lag = crate::traced::wait_for_spans(traces, args.intents).await;
            relay_to = relay_ticks();
            Some(lag)
        }
        None => None,
    };
    let relay_used = relay_to
        .zip(relay_from)
        .and_then(|(to, from)| to.checked_sub(from));
    let wal = wal_to.zip(wal_from).map(|(to, from)| to - from);
    let cpu = cpu_from
        .zip(cpu_to)
        .and_then(|(from, to)| cpu::between(&from, &to, args.intents, relay_used))
        .map(|c| c.with_wal(wal, args.intents));
    let exported = match (traced, lag) {
        (Some(traces), Some(lag)) => {
            Some(crate::traced::exported(traces, &metrics_ports, args.intents, lag).await?)
        }
        _ => None,
    };
    let mut rss: f64 = 0.0;
    for c in children.iter_mut() {
        if let Some(pid) = c.id() {
            rss = rss.max(peak_rss_mb_of(&format!("/proc/{pid}/status")));
        }
        let _ = c.start_kill();
        let _ = c.wait().await;
    }
    // every attempt, wherever the schema keeps it: a schema before 0018
    // has no attempt_history, so that this bench also measures one
    // (bench/compare-builds.sh)
    let history: bool =
        sqlx::query_scalar("SELECT to_regclass('outbox.attempt_history') IS NOT NULL")
            .fetch_one(store.pool())
            .await?;
    let attempts: i64 = sqlx::query_scalar(if history {
        "SELECT count(*) FROM outbox.attempt_history"
    } else {
        "SELECT count(*) FROM outbox.attempts"
    })
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
        cpu,
        exported,
    })
}

/// Beside the peers: the relay's bulk enqueue (`outbox.enqueue_many`, as
/// many per statement as the peers add per call, into an empty table), then
/// one `outbox-relay run` process drains the peers' workload.
pub(crate) async fn relay_run(
    store: &Store,
    args: &BenchArgs,
    db_url: &str,
    hook_url: &str,
    seen: &Seen,
    payload: &impl Fn(usize) -> serde_json::Value,
) -> anyhow::Result<RelayRun> {
    let n = args.intents;
    eprintln!("bench: peers: enqueue_many of {n} intents, {ENQUEUE_PER_CALL} per statement");
    run_sql(store, EMPTY_LOG).await?;
    let t = Instant::now();
    enqueue_many_statements(store, n, ENQUEUE_PER_CALL, "peers-bulk", payload).await?;
    let enqueue_many_per_s = n as f64 / t.elapsed().as_secs_f64();
    eprintln!(
        "bench: peers: drain {n} webhooks with one relay process, {} in flight, receiver answering at once",
        args.in_flight
    );
    let run = scale_out_drain(store, args, db_url, hook_url, 1, seen, None).await?;
    Ok(RelayRun {
        enqueue_many_per_s,
        drain_per_s: run.drain_per_s,
        requests: run.requests,
        duplicate_requests: run.duplicate_requests,
        cpu: run.cpu,
    })
}

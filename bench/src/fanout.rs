//! `--fanout 1x1000,10000x10`: events published to subscriptions, expanded
//! and delivered, against the plain webhook drain of as many deliveries in
//! the same run. For each shape (events × matching subscriptions), in
//! alternating rounds in a scratch database: `plain` enqueues
//! events × subscriptions webhook intents and times their drain by one
//! in-process engine; `fanout` makes the subscriptions (signing secrets
//! sealed as the product seals them), publishes the events with
//! `outbox.publish_many`, and times the same engine from its start until
//! every delivery is delivered: the expansions, the per-delivery secret
//! lookups and signatures included. The ratio fanout/plain is the figure.

use std::time::{Duration, Instant};

use outbox_providers::Secret;
use outbox_relay::config::Config;
use outbox_relay::services::subscriptions::{self, Request};
use outbox_relay::store::Store;
use outbox_relay::{Engine, EngineConfig};
use serde::Serialize;

use crate::receiver::{receiver, Seen};
use crate::sql::{enqueue_batched, run_sql};

/// The sealing key of the bench's subscriptions (32 bytes in base64).
const KEY: &str = "YmVuY2gtc3Vic2NyaXB0aW9ucy1zZWFsaW5nLWtleSE=";

#[derive(Debug, Clone)]
pub struct FanoutArgs {
    /// (events, subscriptions) per shape.
    pub shapes: Vec<(usize, usize)>,
    pub in_flight: usize,
    pub rounds: usize,
    pub keep: bool,
}

#[derive(Debug, Serialize)]
pub struct FanoutReport {
    pub in_flight: usize,
    pub shapes: Vec<Shape>,
}

#[derive(Debug, Serialize)]
pub struct Shape {
    pub events: usize,
    pub subscriptions: usize,
    pub deliveries: usize,
    /// Deliveries per second, each round: (plain, fanout).
    pub rounds: Vec<(f64, f64)>,
    /// fanout / plain, the median over the rounds.
    pub ratio: f64,
}

/// Parse `EVENTSxSUBSCRIPTIONS`.
pub fn parse_shape(text: &str) -> Result<(usize, usize), String> {
    let bad = || format!("--fanout {text:?}: write EVENTSxSUBSCRIPTIONS, e.g. 1x1000");
    let (e, s) = text.split_once('x').ok_or_else(bad)?;
    let e: usize = e.trim().parse().map_err(|_| bad())?;
    let s: usize = s.trim().parse().map_err(|_| bad())?;
    if e == 0 || s == 0 || e.saturating_mul(s) > 1_000_000 {
        return Err(format!(
            "--fanout {text:?}: both at least 1, at most 1,000,000 deliveries"
        ));
    }
    Ok((e, s))
}

fn config(in_flight: usize) -> anyhow::Result<Config> {
    let mut cfg = Config::load(None, Vec::new())?;
    cfg.relay.concurrency = in_flight as u32;
    cfg.relay.metrics_addr = None;
    cfg.webhook.allowed_networks = vec!["127.0.0.1/32".into()];
    cfg.webhook.max_in_flight_per_host = in_flight;
    cfg.subscriptions.secret_key = Some(Secret::new(KEY));
    Ok(cfg)
}

const RESET: &str =
    "TRUNCATE outbox.intent_log, outbox.intent_keys, outbox.log_batches, outbox.log_outcomes,
              outbox.intent_rows, outbox.attempts, outbox.operator_actions, outbox.event_deliveries,
              outbox.subscriptions, outbox.destinations CASCADE";

/// Run the engine until the receiver has seen `n` distinct webhook-ids and
/// the database counts `n` delivered webhooks; deliveries per second from
/// the engine's start.
async fn drain(store: &Store, cfg: &Config, seen: &Seen, n: usize) -> anyhow::Result<f64> {
    seen.reset();
    let engine = Engine::new(
        store.clone(),
        outbox_relay::engine::providers(cfg, &subscriptions::context(store, cfg)?)?,
        EngineConfig::from_config(cfg),
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let t = Instant::now();
    let running = tokio::spawn(engine.run(async {
        let _ = stopped.await;
    }));
    seen.wait_distinct(n as u64, Duration::from_secs(600)).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let done: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM outbox.intents WHERE kind = 'webhook' AND state = 'delivered'",
        )
        .fetch_one(store.pool())
        .await?;
        if done as usize >= n {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{done} of {n} deliveries were delivered"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let rate = n as f64 / t.elapsed().as_secs_f64();
    let _ = stop.send(());
    running.await??;
    Ok(rate)
}

fn data(i: usize) -> serde_json::Value {
    serde_json::json!({
        "order_id": i, "customer": "cus_0123456789", "amount": 1999, "currency": "usd",
        "items": [{"sku": "SKU-42", "qty": 1}],
        "note": "bench payload padded to about three hundred bytes, as the drain's",
    })
}

async fn plain_round(
    store: &Store,
    cfg: &Config,
    seen: &Seen,
    port: u16,
    n: usize,
) -> anyhow::Result<f64> {
    run_sql(store, RESET).await?;
    let url = format!("http://127.0.0.1:{port}/plain");
    enqueue_batched(
        store,
        n,
        "plain",
        &|i| serde_json::json!({"url": url, "body": {"type": "order.paid", "data": data(i)}}),
    )
    .await?;
    run_sql(
        store,
        "VACUUM ANALYZE outbox.intent_log, outbox.intent_rows",
    )
    .await?;
    drain(store, cfg, seen, n).await
}

async fn fanout_round(
    store: &Store,
    cfg: &Config,
    seen: &Seen,
    port: u16,
    (events, subs): (usize, usize),
) -> anyhow::Result<f64> {
    run_sql(store, RESET).await?;
    for s in 0..subs {
        let req = Request {
            url: format!("http://127.0.0.1:{port}/s{s}"),
            ..Request::default()
        };
        subscriptions::add(store, cfg, &req).await?;
    }
    for rows in crate::sql::hundreds(events) {
        let keys: Vec<String> = rows.clone().map(|i| format!("ev-{i}")).collect();
        let types: Vec<&str> = rows.clone().map(|_| "order.paid").collect();
        let payloads: Vec<serde_json::Value> = rows.map(data).collect();
        let mut tx = store.pool().begin().await?;
        sqlx::query("SELECT count(*) FROM outbox.publish_many($1, $2, $3)")
            .bind(&keys)
            .bind(&types)
            .bind(&payloads)
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
    }
    run_sql(
        store,
        "VACUUM ANALYZE outbox.intent_log, outbox.intent_rows",
    )
    .await?;
    drain(store, cfg, seen, events * subs).await
}

async fn measure(store: &Store, args: &FanoutArgs) -> anyhow::Result<FanoutReport> {
    let (port, _thread, seen) = receiver()?;
    let cfg = config(args.in_flight)?;
    let mut shapes = Vec::new();
    for &(events, subs) in &args.shapes {
        let n = events * subs;
        let mut rounds = Vec::new();
        for round in 1..=args.rounds {
            eprintln!("bench: fanout {events}x{subs}, round {round}: plain drain of {n}");
            let plain = plain_round(store, &cfg, &seen, port, n).await?;
            eprintln!("bench: fanout {events}x{subs}, round {round}: {events} events to {subs} subscriptions");
            let fanout = fanout_round(store, &cfg, &seen, port, (events, subs)).await?;
            rounds.push((plain, fanout));
        }
        let mut ratios: Vec<f64> = rounds.iter().map(|(p, f)| f / p).collect();
        ratios.sort_by(f64::total_cmp);
        shapes.push(Shape {
            events,
            subscriptions: subs,
            deliveries: n,
            ratio: ratios[ratios.len() / 2],
            rounds,
        });
    }
    Ok(FanoutReport {
        in_flight: args.in_flight,
        shapes,
    })
}

pub async fn run(server_url: &str, args: FanoutArgs) -> anyhow::Result<FanoutReport> {
    crate::scratch::with_database(server_url, "fanout", 16, args.keep, |store| async move {
        measure(&store, &args).await
    })
    .await
}

pub fn print(r: &FanoutReport) {
    println!(
        "fanout: deliveries per second, {} in flight (plain: as many webhook intents enqueued; fanout: events published to subscriptions, expanded and delivered)",
        r.in_flight
    );
    for s in &r.shapes {
        let rounds: Vec<String> = s
            .rounds
            .iter()
            .map(|(p, f)| format!("{p:.0} / {f:.0}"))
            .collect();
        println!(
            "  {:>6} events x {:>5} subscriptions = {:>7} deliveries: plain / fanout {}; fanout/plain {:.2}",
            s.events,
            s.subscriptions,
            s.deliveries,
            rounds.join(", "),
            s.ratio
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_parse_with_bounds() {
        assert_eq!(parse_shape("1x1000"), Ok((1, 1000)));
        assert_eq!(parse_shape("10000x10"), Ok((10000, 10)));
        for bad in ["1000", "0x5", "5x0", "axb", "2000x1000"] {
            assert!(parse_shape(bad).is_err(), "{bad}");
        }
    }
}

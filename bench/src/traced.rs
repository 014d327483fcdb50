//! `--tracing`: what exporting a span of every attempt costs. One
//! `outbox-relay run` process drains the same webhooks against the same
//! receiver (answering at once) with tracing off and with it on, in
//! alternating rounds; "on" exports every attempt's span over OTLP
//! HTTP/protobuf to the bench's own receiver ([`crate::otlp`]), which
//! decodes and counts them. A round "on" is believed only when the spans
//! received and the spans the relay dropped (`outbox_spans_dropped_total`
//! on its /metrics) account for every intent drained; a round "off" only
//! when no span arrived.

use std::time::{Duration, Instant};

use outbox_relay::store::Store;

use crate::bench::BenchArgs;
use crate::drains::scale_out_drain;
use crate::otlp::{dropped_in, Traces};
use crate::receiver::Seen;
use crate::report::ScaleOut;

/// How long the export may go quiet before the spans still missing are
/// taken as lost (the relay's exporter sends a partial batch after 500 ms).
const QUIET: Duration = Duration::from_secs(3);
/// The longest wait for the spans after the last delivery.
const MOST: Duration = Duration::from_secs(60);

/// A traced drain's spans.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Exported {
    /// Spans the receiver decoded during the round.
    pub spans_received: u64,
    /// `outbox_spans_dropped_total` of the relays at the end of the round.
    pub spans_dropped: u64,
    /// Export requests (batches) the receiver answered.
    pub export_requests: u64,
    /// From the last delivery to the last span received.
    pub lag_ms: f64,
}

/// Wait until `intents` spans have arrived, or none has for [`QUIET`];
/// the time it took.
pub(crate) async fn wait_for_spans(traces: &Traces, intents: usize) -> Duration {
    let start = Instant::now();
    let (mut last, mut last_change) = (traces.received().spans, start);
    loop {
        let now = traces.received().spans;
        if now >= intents as u64 {
            return start.elapsed();
        }
        if now != last {
            (last, last_change) = (now, Instant::now());
        }
        if last_change.elapsed() >= QUIET || start.elapsed() >= MOST {
            return last_change - start;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The spans of a traced round, read from the receiver and from each
/// relay's /metrics; an error unless they account for every intent.
pub(crate) async fn exported(
    traces: &Traces,
    metrics_ports: &[u16],
    intents: usize,
    lag: Duration,
) -> anyhow::Result<Exported> {
    let mut dropped = 0;
    for port in metrics_ports {
        let url = format!("http://127.0.0.1:{port}/metrics");
        let text = reqwest::get(&url).await?.error_for_status()?.text().await?;
        // a relay that has dropped nothing may not list the counter yet
        // (`run` sets up the export before its metrics recorder): absent
        // is 0, and the count below still has to add up
        dropped += dropped_in(&text).unwrap_or(0);
    }
    let received = traces.received();
    anyhow::ensure!(
        received.refused == 0,
        "the OTLP receiver refused {} export request(s) it could not decode",
        received.refused
    );
    anyhow::ensure!(
        received.spans + dropped >= intents as u64,
        "tracing on: {intents} intents drained, but only {} spans received and {dropped} dropped: {} spans unaccounted for",
        received.spans,
        intents as u64 - received.spans - dropped
    );
    Ok(Exported {
        spans_received: received.spans,
        spans_dropped: dropped,
        export_requests: received.requests,
        lag_ms: lag.as_secs_f64() * 1000.0,
    })
}

/// One drain of the comparison.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TracingRound {
    pub tracing: bool,
    /// From the commit of the intents to the last delivery.
    pub drain_per_s: f64,
    /// The relay process's CPU per intent (µs), from /proc/PID/stat: from
    /// the commit to the last delivery, or with tracing on to the last span
    /// received (the export of the last batch included).
    pub relay_us_per_intent: Option<f64>,
    /// Every process's on the machine, from /proc/stat, over the drain.
    pub machine_us_per_intent: Option<f64>,
    /// The bench process's: the webhook and OTLP receivers, mostly.
    pub bench_us_per_intent: Option<f64>,
    pub busy_share: Option<f64>,
    pub requests: u64,
    pub duplicate_requests: u64,
    pub exported: Option<Exported>,
}

/// Medians of one side's rounds.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct TracingSide {
    pub drain_per_s: f64,
    pub relay_us_per_intent: Option<f64>,
    pub machine_us_per_intent: Option<f64>,
}

/// Tracing off against on, in one run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TracingComparison {
    pub intents: usize,
    pub in_flight: usize,
    pub rounds_each: usize,
    pub off: TracingSide,
    pub on: TracingSide,
    /// On over off, of the medians.
    pub drain_ratio: f64,
    pub relay_cpu_ratio: Option<f64>,
    pub machine_cpu_ratio: Option<f64>,
    /// Over the rounds on.
    pub spans_received: u64,
    pub spans_dropped: u64,
    /// Every round, in the order run.
    pub rounds: Vec<TracingRound>,
}

/// `rounds` drains off and `rounds` on, alternating, off first.
pub(crate) async fn compare(
    store: &Store,
    args: &BenchArgs,
    db_url: &str,
    hook_url: &str,
    seen: &Seen,
    rounds: usize,
) -> anyhow::Result<TracingComparison> {
    let (_thread, traces) = crate::otlp::collector()?;
    seen.set_delay(Duration::ZERO);
    let mut all = Vec::new();
    for i in 0..rounds * 2 {
        let on = i % 2 == 1;
        eprintln!(
            "bench: tracing {}: drain {} webhooks with one relay process, {} in flight (round {} of {rounds})",
            if on { "on" } else { "off" },
            args.intents,
            args.in_flight,
            i / 2 + 1
        );
        traces.reset();
        let run = scale_out_drain(
            store,
            args,
            db_url,
            hook_url,
            1,
            seen,
            on.then_some(&traces),
        )
        .await?;
        if !on {
            let stray = traces.received().spans;
            anyhow::ensure!(stray == 0, "tracing off, yet {stray} spans arrived");
        }
        all.push(round(on, &run));
    }
    let side = |on: bool| {
        let of = |f: fn(&TracingRound) -> Option<f64>| {
            median(all.iter().filter(|r| r.tracing == on).filter_map(f))
        };
        TracingSide {
            drain_per_s: of(|r| Some(r.drain_per_s)).unwrap_or(f64::NAN),
            relay_us_per_intent: of(|r| r.relay_us_per_intent),
            machine_us_per_intent: of(|r| r.machine_us_per_intent),
        }
    };
    let (off, on) = (side(false), side(true));
    let ratio = |on: Option<f64>, off: Option<f64>| Some(on? / off?);
    let spans = |f: fn(&Exported) -> u64| {
        all.iter()
            .filter_map(|r| r.exported.as_ref())
            .map(f)
            .sum::<u64>()
    };
    Ok(TracingComparison {
        intents: args.intents,
        in_flight: args.in_flight,
        rounds_each: rounds,
        drain_ratio: on.drain_per_s / off.drain_per_s,
        relay_cpu_ratio: ratio(on.relay_us_per_intent, off.relay_us_per_intent),
        machine_cpu_ratio: ratio(on.machine_us_per_intent, off.machine_us_per_intent),
        spans_received: spans(|e| e.spans_received),
        spans_dropped: spans(|e| e.spans_dropped),
        off,
        on,
        rounds: all,
    })
}

fn round(on: bool, run: &ScaleOut) -> TracingRound {
    let cpu = run.cpu.as_ref();
    TracingRound {
        tracing: on,
        drain_per_s: run.drain_per_s,
        relay_us_per_intent: cpu.and_then(|c| c.relay_us_per_job),
        machine_us_per_intent: cpu.map(|c| c.machine_us_per_job),
        bench_us_per_intent: cpu.map(|c| c.bench_us_per_job),
        busy_share: cpu.map(|c| c.busy_share),
        requests: run.requests,
        duplicate_requests: run.duplicate_requests,
        exported: run.exported,
    }
}

fn median(values: impl Iterator<Item = f64>) -> Option<f64> {
    let mut v: Vec<f64> = values.collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    })
}

pub fn print(t: &TracingComparison) {
    println!();
    println!(
        "tracing: one relay process, {} webhooks, {} in flight, receiver answering at once; {} rounds each, alternating",
        t.intents, t.in_flight, t.rounds_each
    );
    println!("(on: every attempt's span exported over OTLP HTTP/protobuf to the bench's receiver)");
    let us = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1} µs"));
    let x = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.2}x"));
    println!(
        "{:<14} {:>10} {:>17} {:>19}",
        "tracing", "drain/s", "relay CPU/intent", "machine CPU/intent"
    );
    for (name, s) in [("off (median)", &t.off), ("on (median)", &t.on)] {
        println!(
            "{:<14} {:>10.0} {:>17} {:>19}",
            name,
            s.drain_per_s,
            us(s.relay_us_per_intent),
            us(s.machine_us_per_intent)
        );
    }
    println!(
        "{:<14} {:>9.2}x {:>17} {:>19}",
        "on / off",
        t.drain_ratio,
        x(t.relay_cpu_ratio),
        x(t.machine_cpu_ratio)
    );
    println!(
        "spans: {} received, {} dropped over the rounds on ({} intents each)",
        t.spans_received, t.spans_dropped, t.intents
    );
    println!("rounds, in order:");
    for r in &t.rounds {
        let spans = r.exported.map_or(String::new(), |e| {
            format!(
                ", {} spans in {} requests, {} dropped, last {:.0} ms after the last delivery",
                e.spans_received, e.export_requests, e.spans_dropped, e.lag_ms
            )
        });
        println!(
            "  {:<3} {:>7.0}/s  relay {:>9}  machine {:>9}  busy {:>4}{spans}",
            if r.tracing { "on" } else { "off" },
            r.drain_per_s,
            us(r.relay_us_per_intent),
            us(r.machine_us_per_intent),
            r.busy_share
                .map_or("-".into(), |b| format!("{:.0}%", b * 100.0)),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn medians() {
        assert_eq!(median([3.0, 1.0, 2.0].into_iter()), Some(2.0));
        assert_eq!(median([4.0, 1.0, 2.0, 3.0].into_iter()), Some(2.5));
        assert_eq!(median(std::iter::empty()), None);
    }
}

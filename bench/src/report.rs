//! The figures of one run ([`Report`]), as `--json` prints them, and the
//! text tables ([`print`]).

use outbox_relay::engine::Batches;

use crate::cpu::CpuUse;

/// Claim + complete cost beside `history_rows` delivered intents.
#[derive(Debug, Clone, serde::Serialize)]
pub struct HistoryPoint {
    pub history_rows: u64,
    /// The median of `rounds`.
    pub claim_complete_per_s: f64,
    /// Claim + complete of 5,000 fresh intents, three times in a row at
    /// this history size (a round is a fraction of a second, so one alone
    /// is at the mercy of the machine's noise).
    pub rounds: Vec<f64>,
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
    /// The machine's CPU over the drain (Linux).
    pub cpu: Option<CpuUse>,
    /// A traced drain's spans (`--tracing`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exported: Option<crate::traced::Exported>,
}

/// One peer job queue against the same workload, receiver and Postgres
/// server, in the same run: its bulk enqueue, and its drain at the best of
/// its sweep.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PeerRun {
    pub peer: String,
    pub version: String,
    /// The best drain of the sweep.
    pub drain_per_s: f64,
    /// The peer's settings at that drain, named as its own API names them.
    pub knobs: serde_json::Value,
    /// outbox-relay's drain (one `run` process, the median of the runs
    /// just before and just after this peer's) over this peer's best.
    pub relay_speedup: f64,
    /// Requests the receiver saw during the best drain.
    pub requests: u64,
    /// The machine's CPU over the best drain.
    pub cpu: Option<CpuUse>,
    pub duplicate_requests: u64,
    /// The peer's bulk API over the same number of jobs, 1,000 per call,
    /// one call after another, no worker running.
    pub enqueue_per_s: f64,
    /// The bulk API it used (e.g. `addJobs`, `insert`).
    pub enqueue_api: String,
    /// outbox-relay's `enqueue_many` (the median of its runs either side of
    /// this peer's, 1,000 per statement) over this peer's bulk enqueue.
    pub relay_enqueue_ratio: f64,
    /// Every setting tried, in order.
    pub sweep: Vec<PeerSetting>,
    /// Everything the peer reported for its best drain.
    pub reported: serde_json::Value,
    /// Everything it reported for its bulk enqueue.
    pub enqueue_reported: serde_json::Value,
}

/// One drain of a peer's sweep.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PeerSetting {
    /// What the bench set in the peer's environment.
    pub env: std::collections::BTreeMap<String, String>,
    /// What the peer reported it ran with.
    pub knobs: serde_json::Value,
    pub drain_per_s: f64,
    pub requests: u64,
    pub duplicate_requests: u64,
    /// The machine's CPU over the drain, in the window the peer reported.
    pub cpu: Option<CpuUse>,
}

/// Where the enqueue→delivered time of the latency run goes, per intent
/// (its first attempt): percentiles of each leg, in milliseconds.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct LatencySplit {
    /// From the enqueue's transaction start to the attempt's start: the
    /// enqueue's commit, the NOTIFY, the claim and its commit.
    pub to_attempt_p50_ms: f64,
    pub to_attempt_p99_ms: f64,
    /// The attempt itself: the HTTP request and its answer.
    pub call_p50_ms: f64,
    pub call_p99_ms: f64,
    /// From the answer to the completion statement's start.
    pub to_record_p50_ms: f64,
    pub to_record_p99_ms: f64,
}

/// Claim + complete in claims of a few intents, by a relay of the default
/// `batch_size`: from the claim statement sized for the claim (the
/// engine's) and from a single statement limited to `batch_size`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SmallClaims {
    /// Intents per claim.
    pub claim: i64,
    /// Intents per second, one per round.
    pub ladder_per_s: Vec<f64>,
    pub single_per_s: Vec<f64>,
    /// The means' ratio, ladder over single.
    pub ratio: f64,
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

/// The relay beside the peers: its bulk enqueue, then one `outbox-relay
/// run` process draining the workload the peers drain.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RelayRun {
    /// `outbox.enqueue_many`, 1,000 per statement, into an empty table.
    pub enqueue_many_per_s: f64,
    pub drain_per_s: f64,
    pub requests: u64,
    pub duplicate_requests: u64,
    /// The machine's CPU over the drain (Linux).
    pub cpu: Option<CpuUse>,
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
    /// 1,000 rows per statement through `outbox.enqueue_many` (the bulk
    /// API), one commit per statement.
    pub enqueue_many_per_s: f64,
    pub ceiling_per_s: f64,
    /// The claim size of the ceiling: the relay's `batch_size`.
    pub ceiling_batch: i64,
    /// The ceiling again at each of `--ceiling-batches`.
    pub ceiling_by_batch: Vec<CeilingPoint>,
    /// Claims of few intents, the engine's statements against the one
    /// statement before them (`--small-claims`).
    pub small_claims: Vec<SmallClaims>,
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
    pub latency_split: LatencySplit,
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
    /// How many relay drains run before the first peer and after each.
    pub relay_runs_between: usize,
    /// One `outbox-relay run` process draining the workload the peers
    /// drain, receiver answering at once: `relay_runs_between` before the
    /// first peer, and as many after each (empty when no peer was asked
    /// for).
    pub relay_runs: Vec<RelayRun>,
    pub peers: Vec<PeerRun>,
    /// `--tracing`: the drain with tracing off and on.
    pub tracing: Option<crate::traced::TracingComparison>,
    /// `--brokers`: each broker kind drained against its real broker.
    pub brokers: Vec<crate::brokers::BrokerDrain>,
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
            "enqueue_many, 1000 per statement",
            format!("{:.0}/s", r.enqueue_many_per_s),
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
        ("  to attempt / call / to record, p50 (p99)", {
            let l = &r.latency_split;
            format!(
                "{:.1} ({:.1}) / {:.1} ({:.1}) / {:.1} ({:.1}) ms",
                l.to_attempt_p50_ms,
                l.to_attempt_p99_ms,
                l.call_p50_ms,
                l.call_p99_ms,
                l.to_record_p50_ms,
                l.to_record_p99_ms
            )
        }),
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
    if !r.small_claims.is_empty() {
        println!();
        println!(
            "claims of a few intents (claim + complete, no network), batch_size {}: the claim's own rung against the statement limited to the batch",
            r.ceiling_batch
        );
        println!(
            "{:<8} {:>22} {:>22} {:>7}",
            "claim", "rung, intents/s", "single, intents/s", "ratio"
        );
        for p in &r.small_claims {
            println!(
                "{:<8} {:>22} {:>22} {:>6.2}x",
                p.claim,
                per_round(&p.ladder_per_s),
                per_round(&p.single_per_s),
                p.ratio
            );
        }
    }
    if !r.history.is_empty() {
        println!();
        println!("history: claim + complete (batches of 100, no network) beside delivered history");
        println!(
            "{:<14} {:>16} {:>9}  rounds",
            "history rows", "claim+complete/s", "relative"
        );
        for h in &r.history {
            println!(
                "{:<14} {:>16.0} {:>8.2}x  {}",
                h.history_rows,
                h.claim_complete_per_s,
                h.relative,
                per_round(&h.rounds)
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
        print_peers(r);
    }
    if let Some(t) = &r.tracing {
        crate::traced::print(t);
    }
    for b in &r.brokers {
        println!(
            "  {} drain: {} publishes, {} in flight: {:.0}/s (the broker holds {})",
            b.kind, b.intents, b.in_flight, b.drain_per_s, b.stored
        );
    }
}

/// `k=v k=v` of a peer's reported knobs.
fn knobs(k: &serde_json::Value) -> String {
    match k.as_object() {
        Some(m) if !m.is_empty() => m
            .iter()
            .map(|(k, v)| match v.as_str() {
                Some(s) => format!("{k}={s}"),
                None => format!("{k}={v}"),
            })
            .collect::<Vec<_>>()
            .join(" "),
        _ => "(its defaults)".into(),
    }
}

/// Rates of several rounds, as "12345 / 12346".
fn per_round(rates: &[f64]) -> String {
    rates
        .iter()
        .map(|x| format!("{x:.0}"))
        .collect::<Vec<_>>()
        .join(" / ")
}

/// CPU per job, the Postgres server's part of it, WAL bytes per job and
/// the busy share, for a table; blank when not measured.
fn cpu_cells(cpu: Option<&CpuUse>) -> [String; 4] {
    let us = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.0} µs"));
    match cpu {
        Some(c) => [
            us(Some(c.machine_us_per_job)),
            us(c.postgres_us_per_job),
            c.wal_bytes_per_job
                .map_or("-".into(), |b| format!("{b:.0} B")),
            format!("{:.0}%", c.busy_share * 100.0),
        ],
        None => ["-".into(), "-".into(), "-".into(), "-".into()],
    }
}

fn print_peers(r: &Report) {
    println!();
    println!(
        "peers: the same {} webhooks, {} in flight, same receiver answering at once, same Postgres server;",
        r.intents, r.in_flight
    );
    println!("each peer's drain is the best of its sweep; bulk enqueue 1,000 per call");
    println!(
        "{:<34} {:>10} {:>10} {:>11} {:>10} {:>11} {:>10} {:>11} {:>11} {:>9} {:>6}",
        "queue",
        "drain/s",
        "requests",
        "duplicates",
        "relay is",
        "enqueue/s",
        "relay is",
        "CPU/job",
        "Postgres",
        "WAL/job",
        "busy"
    );
    let relay_row = |run: &RelayRun| {
        let [per_job, postgres, wal, busy] = cpu_cells(run.cpu.as_ref());
        println!(
            "{:<34} {:>10.0} {:>10} {:>11} {:>10} {:>11.0} {:>10} {:>11} {:>11} {:>9} {:>6}",
            "outbox-relay (one `run` process)",
            run.drain_per_s,
            run.requests,
            run.duplicate_requests,
            "",
            run.enqueue_many_per_s,
            "",
            per_job,
            postgres,
            wal,
            busy,
        );
    };
    let between = r.relay_runs_between.max(1);
    let mut runs = r.relay_runs.chunks(between);
    for p in &r.peers {
        runs.next().into_iter().flatten().for_each(&relay_row);
        let [per_job, postgres, wal, busy] = cpu_cells(p.cpu.as_ref());
        println!(
            "{:<34} {:>10.0} {:>10} {:>11} {:>9.2}x {:>11.0} {:>9.2}x {:>11} {:>11} {:>9} {:>6}",
            format!("{} {}", p.peer, p.version),
            p.drain_per_s,
            p.requests,
            p.duplicate_requests,
            p.relay_speedup,
            p.enqueue_per_s,
            p.relay_enqueue_ratio,
            per_job,
            postgres,
            wal,
            busy,
        );
    }
    runs.next().into_iter().flatten().for_each(&relay_row);
    println!(
        "(each peer against the median of the {} relay runs just before and after it; relay enqueue is outbox.enqueue_many)",
        2 * between
    );
    println!("(CPU/job: the CPU time of every process on the machine during the drain over its jobs; Postgres: of that, the server's");
    println!(" processes'; WAL/job: the WAL the server wrote during the drain over its jobs; busy: of all CPUs)");
    let parts: Vec<String> = r
        .relay_runs
        .iter()
        .filter_map(|run| run.cpu.as_ref())
        .filter_map(|c| {
            let relay = c.relay_us_per_job?;
            let postgres = c.postgres_us_per_job.unwrap_or(0.0);
            Some(format!(
                "relay process {relay:.0} µs, bench receiver {:.0} µs, Postgres {postgres:.0} µs, the rest (kernel, others) {:.0} µs",
                c.bench_us_per_job,
                (c.machine_us_per_job - relay - c.bench_us_per_job - postgres).max(0.0)
            ))
        })
        .collect();
    if !parts.is_empty() {
        println!("outbox-relay's CPU per intent, run by run:");
        for p in parts {
            println!("  {p}");
        }
    }
    for p in &r.peers {
        println!();
        println!(
            "{} {}: best {}; bulk enqueue through {}",
            p.peer,
            p.version,
            knobs(&p.knobs),
            p.enqueue_api
        );
        for s in &p.sweep {
            let [per_job, postgres, wal, busy] = cpu_cells(s.cpu.as_ref());
            println!(
                "  {:>8.0}/s  {:>6} requests {:>4} duplicates  {:>9}/job (Postgres {:>7}, WAL {:>7}) {:>4} busy  {}",
                s.drain_per_s,
                s.requests,
                s.duplicate_requests,
                per_job,
                postgres,
                wal,
                busy,
                knobs(&s.knobs)
            );
        }
    }
}

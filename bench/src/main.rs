//! `outbox-relay-bench`: the reproducible benchmark of the relay, a command
//! of its own beside the product (the product's library and binary carry
//! no benchmark). It drives the real engine through the `outbox-relay`
//! library's public API, in a scratch database on the configured server;
//! see [`bench`] for what it measures and docs/performance.md for the
//! figures.
//!
//! The scale-out and peer parts start separate relay processes: this binary
//! runs itself again as the relay (the environment variable
//! [`RUN_AS_RELAY`] set), and then is exactly `outbox-relay`: its `main`
//! is the product's entry point, `outbox_relay::cli::main`. So the bench
//! needs no other binary next to it.
//!
//! Exit codes are the `outbox-relay` command's: 0 success, 1 unexpected
//! error (a peer that failed or lied included), 2 bad usage or invalid
//! configuration, 5 the database is unreachable.

/// The relay's allocator (relay/main.rs): this binary runs as the relay in
/// the drains it measures.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod batching;
mod bench;
mod brokers;
mod console;
mod cpu;
mod drains;
mod fanout;
mod held_xmin;
mod ordering;
mod otlp;
mod peers;
mod plot;
mod receiver;
mod relay_process;
mod report;
mod rounds;
mod scratch;
mod server;
mod soak;
mod sql;
mod traced;

use std::path::PathBuf;

use std::process::ExitCode;

use clap::Parser;
use outbox_relay::cli::Failure;
use outbox_relay::config::Config;
use outbox_relay::observe::logs::LogFormat;
use outbox_relay::store::Store;

/// Set (to anything) in the environment of the relay processes the bench
/// starts: the binary then runs as `outbox-relay` with its arguments.
pub const RUN_AS_RELAY: &str = "OUTBOX_RELAY_BENCH_RUN_AS_RELAY";

#[derive(Debug, Parser)]
#[command(
    name = "outbox-relay-bench",
    version,
    about = "Benchmark the engine in a scratch database on this server",
    long_about = None
)]
struct Cli {
    /// Postgres URL; overrides `database_url` in the config file.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: Option<String>,
    /// TOML configuration file.
    #[arg(long, env = "OUTBOX_RELAY_CONFIG", hide_env_values = true)]
    config: Option<PathBuf>,
    /// Log format for the daemon's logs (stderr).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(flatten)]
    bench: BenchArgs,
}

#[derive(Debug, clap::Args)]
struct BenchArgs {
    /// Webhook intents to drain.
    #[arg(long, default_value_t = 20_000)]
    intents: usize,
    /// HTTP requests in flight (relay.concurrency).
    #[arg(long, default_value_t = 16)]
    in_flight: usize,
    /// Offered load for the latency measurement, intents per second.
    #[arg(long, default_value_t = 1000)]
    latency_rate: u32,
    #[arg(long, default_value_t = 5)]
    latency_seconds: u64,
    /// Relay process counts for the scale-out drain (separate `outbox-relay
    /// run` processes on the same database); 0 to skip.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    relays: Vec<usize>,
    /// How long the receiver takes to answer during the scale-out drains
    /// (a real endpoint is not instant; with 0 one relay already saturates
    /// a small machine).
    #[arg(long, default_value = "10ms", value_parser = humantime::parse_duration)]
    scale_receiver_delay: std::time::Duration,
    /// Delivered-history sizes at which to EXPLAIN the claim and measure
    /// claim + complete, e.g. 10000,100000,1000000,5000000 (slow: the rows
    /// are inserted); empty to skip.
    #[arg(long, value_delimiter = ',')]
    history: Vec<u64>,
    /// Claim batch sizes at which to measure the ceiling as well, e.g.
    /// 8,16,32,64,100,200: what one claim + complete round costs beyond its
    /// rows; empty to skip.
    #[arg(long, value_delimiter = ',')]
    ceiling_batches: Vec<u32>,
    /// Claim sizes, e.g. 1,4,16, at which to compare claim + complete through
    /// the claim statement sized for the claim (the engine's) with the one
    /// statement limited to batch_size that a relay ran before: claims of
    /// fewer than a tenth of batch_size were planned on every call; empty
    /// to skip.
    #[arg(long, value_delimiter = ',')]
    small_claims: Vec<u32>,
    /// Intents to queue behind one dead ordering-key head, to measure what
    /// a blocked key costs the claim and the gauges; 0 to skip.
    #[arg(long, default_value_t = 100_000)]
    blocked_backlog: u64,
    /// Peer job queues to compare with, in this run and against the same
    /// receiver, each at the best of a small sweep of its batch knobs, its
    /// bulk enqueue too: graphile-worker, pg-boss (Node.js 18+, 20+ for
    /// pg-boss), pgqueuer (Python 3.10+); see tests/peers/queue-bench.
    /// Empty to skip.
    #[arg(long, value_delimiter = ',')]
    peers: Vec<String>,
    /// Relay drains run before the first peer and after each: every peer
    /// is compared with the median of the runs just before and just after
    /// it, so that one slow or fast stretch of a shared machine does not
    /// set the ratio.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=20))]
    relay_runs_between: u16,
    /// Where the peer scripts are (run-peer.sh).
    #[arg(long, default_value = "tests/peers/queue-bench")]
    peers_dir: std::path::PathBuf,
    /// Rounds of the webhook drain (one relay process, receiver answering at
    /// once) with tracing off and with every attempt's span exported to a
    /// local OTLP receiver, alternating, each; `--tracing` alone is 3; 0
    /// skips.
    #[arg(long, default_value_t = 0, num_args = 0..=1, default_missing_value = "3")]
    tracing: usize,
    /// Broker kinds to drain against real brokers, e.g. nats,amqp,kafka (a
    /// stream, a queue and a topic of the bench's own; the broker's count
    /// is checked); empty to skip.
    #[arg(long, value_delimiter = ',')]
    brokers: Vec<String>,
    /// Publishes per broker kind.
    #[arg(long, default_value_t = 10_000)]
    broker_intents: usize,
    /// A NATS server with JetStream on.
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    nats_url: String,
    /// A RabbitMQ broker: amqp://user@host:port/vhost (the password in
    /// OUTBOX_BENCH_AMQP_PASSWORD, default guest).
    #[arg(long, default_value = "amqp://guest@127.0.0.1:5672/%2f")]
    amqp_url: String,
    /// Kafka bootstrap brokers (host:port): Apache Kafka or any broker
    /// that speaks its API, e.g. Tansu (deploy/lib/tansu.sh).
    #[arg(long, default_value = "127.0.0.1:9092")]
    kafka_brokers: String,
    /// Measure the console's pages beside this many delivered history rows
    /// instead of the engine (e.g. 1000000); 0 skips it.
    #[arg(long, default_value_t = 0)]
    console_history: u64,
    /// Measure the sweeper's ordering pass beside this many ordering keys,
    /// each with a follower waiting behind a live head (e.g. 100000),
    /// instead of the engine; 0 skips it.
    #[arg(long, default_value_t = 0)]
    ordering_keys: u64,
    /// Measure, instead of the engine, events published to subscriptions,
    /// expanded and delivered, against the plain webhook drain of as many
    /// deliveries, for each shape EVENTSxSUBSCRIPTIONS (e.g.
    /// 1x1000,10000x10); empty skips it.
    #[arg(long, value_delimiter = ',', value_parser = fanout::parse_shape)]
    fanout: Vec<(usize, usize)>,
    /// Alternating rounds of each --fanout shape.
    #[arg(long, default_value_t = 2)]
    fanout_rounds: usize,
    /// New followers enqueued before the timed pass of --ordering-keys.
    #[arg(long, default_value_t = 1_000)]
    ordering_burst: u64,
    /// Measure, instead of the engine, how long intents wait for their
    /// first attempt and their delivery when the application commits them
    /// this many to a transaction, one level each (e.g. 1,10,50), against
    /// one relay at the product's defaults; empty skips it.
    #[arg(long, value_delimiter = ',')]
    batching_latency: Vec<usize>,
    /// Intents committed per second at each --batching-latency level.
    #[arg(long, default_value_t = 1000)]
    batching_rate: u32,
    /// How long each --batching-latency level runs, in seconds.
    #[arg(long, default_value_t = 10)]
    batching_seconds: u64,
    /// With --batching-latency: another relay build to measure in the same
    /// run after this one (an `outbox-relay` or `outbox-relay-bench`
    /// binary).
    #[arg(long, requires = "batching_latency")]
    batching_compare: Option<PathBuf>,
    /// Measure, instead of the engine, commit to delivered and the
    /// `outbox` tables' dead tuples over this many seconds of steady
    /// arrivals (`--held-xmin` alone: 90), twice in a fresh database each:
    /// plainly, and beside a REPEATABLE READ transaction that took its
    /// snapshot before the load and stays open for the whole run; one
    /// relay at the product's defaults.
    #[arg(long, num_args = 0..=1, default_missing_value = "90")]
    held_xmin: Option<u64>,
    /// Intents committed per second, one to a transaction, in --held-xmin.
    #[arg(long, default_value_t = 800)]
    held_xmin_rate: u32,
    /// Pending intents loaded before each --held-xmin run.
    #[arg(long, default_value_t = 0)]
    held_xmin_backlog: u64,
    /// Run the soak instead of the engine's measurements: one relay
    /// under a steady mixed load this long (e.g. 1h), against receivers
    /// that flap, with retention purging and the console and /metrics
    /// polled; samples to a CSV and a PNG under --soak-out.
    #[arg(long, value_parser = humantime::parse_duration)]
    soak: Option<std::time::Duration>,
    /// The soak's offered load, intents per second.
    #[arg(long, default_value_t = 500)]
    rate: u32,
    /// How often the soak samples.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    soak_sample: std::time::Duration,
    /// Where the soak writes soak.csv and soak.png.
    #[arg(long)]
    soak_out: Option<PathBuf>,
    /// Only the relay's webhook drain by one `outbox-relay run` process,
    /// this many times, with what each round cost per intent (the
    /// machine's, the relay's and Postgres's CPU, WAL bytes); 0 skips.
    #[arg(long, default_value_t = 0)]
    drain_rounds: usize,
    /// With --drain-rounds: SQL to run in the scratch database after it is
    /// migrated (a change of the storage measured before it is written as
    /// a migration: an index dropped, a trigger added).
    #[arg(long, requires = "drain_rounds")]
    setup_sql: Option<PathBuf>,
    /// Keep the scratch database afterwards.
    #[arg(long)]
    keep: bool,
    /// Print the SQL of the relay's statement NAME (the name of its
    /// constant in lower case: tally_backlog, oldest_due, next_due,
    /// purge_log, log_complete, ...; log_claim for the claim of the log)
    /// as the relay runs it, and exit: what `bench/pgbench/` measures.
    #[arg(long, value_name = "NAME")]
    print_statement: Option<String>,
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    if std::env::var_os(RUN_AS_RELAY).is_some() {
        return outbox_relay::cli::main();
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            let code = match e.kind() {
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => 0,
                _ => 2,
            };
            return ExitCode::from(code);
        }
    };
    if let Some(name) = &cli.bench.print_statement {
        let claim = (name == "log_claim").then(|| {
            outbox_relay::store::ClaimQuery::new(100, &[])
                .log_plain_sql()
                .to_string()
        });
        return match claim.as_deref().or(outbox_relay::store::statement(name)) {
            Some(sql) => {
                println!("{sql}");
                ExitCode::SUCCESS
            }
            None => {
                let names: Vec<&str> = outbox_relay::store::STATEMENTS
                    .iter()
                    .map(|(n, _)| *n)
                    .chain(["log_claim"])
                    .collect();
                eprintln!(
                    "outbox-relay-bench: no statement named {name} (one of: {})",
                    names.join(", ")
                );
                ExitCode::from(2)
            }
        };
    }
    outbox_relay::observe::logs::init(cli.log_format);
    outbox_relay::cli::run_to_exit(execute(cli))
}

async fn execute(cli: Cli) -> Result<(), Failure> {
    let config = Config::load(cli.config.as_deref(), std::env::vars())
        .map_err(|e| Failure::usage(format!("{e:#}")))?;
    let url = plaintext_unless_asked(&outbox_relay::cli::database_url(
        cli.database_url.clone(),
        &config,
    )?)?;
    // the server answers (and the URL is one) before anything is measured
    let connections = config
        .relay
        .max_connections
        .unwrap_or(config.relay.concurrency / 8 + 4);
    let store = Store::connect(&url, connections).await?;
    let a = cli.bench;
    if a.console_history > 0 {
        drop(store);
        let report = console::run(&url, &config, a.console_history, a.keep).await?;
        emit(&report, a.json, console::print);
        return Ok(());
    }
    if let Some(seconds) = a.held_xmin {
        drop(store);
        let args = held_xmin::HeldXminArgs {
            seconds: seconds.clamp(1, 3_600),
            rate: a.held_xmin_rate.clamp(1, 100_000),
            backlog: a.held_xmin_backlog.min(10_000_000),
            keep: a.keep,
        };
        let report = held_xmin::run(&url, args).await?;
        emit(&report, a.json, held_xmin::print);
        return Ok(());
    }
    let levels: Vec<usize> = a
        .batching_latency
        .iter()
        .filter(|l| **l > 0)
        .map(|l| (*l).min(10_000))
        .collect();
    if !levels.is_empty() {
        drop(store);
        let args = batching::BatchingArgs {
            levels,
            rate: a.batching_rate.clamp(1, 100_000),
            seconds: a.batching_seconds.clamp(1, 3_600),
            keep: a.keep,
            compare: a.batching_compare.clone(),
        };
        let report = batching::run(&url, args).await?;
        emit(&report, a.json, batching::print);
        return Ok(());
    }
    if let Some(duration) = a.soak {
        drop(store);
        let args = soak::SoakArgs {
            duration,
            rate: a.rate.clamp(1, 100_000),
            sample: a.soak_sample.max(std::time::Duration::from_secs(1)),
            out_dir: a.soak_out.clone().unwrap_or_else(soak::default_out),
            nats_url: a.nats_url.clone(),
            in_flight: a.in_flight.clamp(1, 10_000),
            keep: a.keep,
        };
        let report = soak::run(&url, args).await?;
        emit(&report, a.json, soak::print);
        return Ok(());
    }
    if !a.fanout.is_empty() {
        drop(store);
        let args = fanout::FanoutArgs {
            shapes: a.fanout.clone(),
            in_flight: a.in_flight.clamp(1, 10_000),
            rounds: a.fanout_rounds.clamp(1, 20),
            keep: a.keep,
        };
        let report = fanout::run(&url, args).await?;
        emit(&report, a.json, fanout::print);
        return Ok(());
    }
    if a.ordering_keys > 0 {
        drop(store);
        let report = ordering::run(&url, a.ordering_keys, a.ordering_burst, a.keep).await?;
        emit(&report, a.json, ordering::print);
        return Ok(());
    }
    let args = bench::BenchArgs {
        intents: a.intents.max(1),
        in_flight: a.in_flight.clamp(1, 10_000),
        latency_rate: a.latency_rate.max(1),
        latency_seconds: a.latency_seconds.max(1),
        keep: a.keep,
        relays: a
            .relays
            .iter()
            .filter(|r| **r > 0)
            .map(|r| (*r).min(64))
            .collect(),
        scale_receiver_delay: a.scale_receiver_delay,
        history: a.history.clone(),
        blocked_backlog: a.blocked_backlog,
        ceiling_batches: a
            .ceiling_batches
            .iter()
            .filter(|b| **b > 0)
            .map(|b| (*b).min(10_000) as i64)
            .collect(),
        small_claims: a
            .small_claims
            .iter()
            .filter(|c| **c > 0)
            .map(|c| i64::from(*c))
            .collect(),
        peers: a.peers.iter().filter(|p| !p.is_empty()).cloned().collect(),
        peers_dir: a.peers_dir.clone(),
        relay_runs_between: usize::from(a.relay_runs_between),
        brokers: (!a.brokers.is_empty()).then(|| brokers::Brokers {
            kinds: a
                .brokers
                .iter()
                .filter(|k| !k.is_empty())
                .cloned()
                .collect(),
            nats_url: a.nats_url.clone(),
            amqp_url: a.amqp_url.clone(),
            amqp_password: std::env::var("OUTBOX_BENCH_AMQP_PASSWORD")
                .unwrap_or_else(|_| "guest".into()),
            kafka_brokers: a.kafka_brokers.clone(),
            intents: a.broker_intents.max(1),
        }),
        tracing_rounds: a.tracing.min(100),
        relay_batch_size: config.relay.batch_size,
    };
    if a.drain_rounds > 0 {
        drop(store);
        let setup = match &a.setup_sql {
            Some(path) => Some(std::fs::read_to_string(path).map_err(|e| {
                Failure::usage(format!("cannot read --setup-sql {}: {e}", path.display()))
            })?),
            None => None,
        };
        let report = rounds::run(&url, &args, a.drain_rounds.min(100), setup.as_deref()).await?;
        emit(&report, a.json, rounds::print);
        return Ok(());
    }
    let report = bench::run(&url, &config, &args).await?;
    drop(store);
    emit(&report, a.json, bench::print);
    Ok(())
}

/// A report as JSON (`--json`) or as its text tables.
fn emit<T: serde::Serialize>(report: &T, json: bool, print: fn(&T)) {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(report).expect("serializable")
        );
    } else {
        print(report);
    }
}

/// The server URL with `sslmode=disable` unless it names an `sslmode`:
/// every system the bench runs (its relays, the peers) then talks to
/// Postgres the same way. The peers' drivers connect without TLS unless
/// told to, while the relay's would negotiate TLS with a server that
/// offers it, which costs that server about a tenth more CPU per intent
/// (docs/performance.md). The bench only talks to loopback.
fn plaintext_unless_asked(url: &str) -> Result<String, Failure> {
    let mut parsed = url::Url::parse(url)
        .map_err(|e| Failure::usage(format!("the database URL is not a URL: {e}")))?;
    if !parsed.query_pairs().any(|(k, _)| k == "sslmode") {
        parsed.query_pairs_mut().append_pair("sslmode", "disable");
    }
    Ok(parsed.to_string())
}

#[cfg(test)]
mod tests {
    use super::plaintext_unless_asked;

    #[test]
    fn the_bench_talks_plaintext_unless_the_url_asks_for_tls() {
        assert_eq!(
            plaintext_unless_asked("postgres://postgres@127.0.0.1:5432/postgres").unwrap(),
            "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
        );
        assert_eq!(
            plaintext_unless_asked("postgres://u@127.0.0.1/db?application_name=x").unwrap(),
            "postgres://u@127.0.0.1/db?application_name=x&sslmode=disable"
        );
        let tls = "postgres://u@127.0.0.1/db?sslmode=require";
        assert_eq!(plaintext_unless_asked(tls).unwrap(), tls);
        assert!(plaintext_unless_asked("not a url").is_err());
    }
}

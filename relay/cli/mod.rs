//! The `outbox-relay` command: one file per group of verbs.
//!
//! Exit codes (stable, for scripts):
//!
//! | code | meaning |
//! |------|---------|
//! | 0 | success |
//! | 1 | unexpected error |
//! | 2 | bad usage or invalid input (arguments, JSON payload, configuration, a reference naming two intents) |
//! | 3 | not found (no intent has that id or key) |
//! | 4 | conflict: OB409 on enqueue, or the intent's state does not allow the operation |
//! | 5 | the database is unreachable |

mod console;
pub(crate) mod destinations;
mod fleet;
mod intents;
mod operate;
mod output;
mod replay;
mod run;
mod subscriptions;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::config::{Checks, Config};
use crate::observe::logs::LogFormat;
use crate::store::{EnqueueError, Store, StoreError};

#[derive(Debug, Parser)]
#[command(name = "outbox-relay", version, about = "Transactional-outbox relay for Postgres", long_about = None)]
pub struct Cli {
    /// Postgres URL; overrides `database_url` in the config file.
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    database_url: Option<String>,
    /// TOML configuration file.
    #[arg(
        long,
        env = "OUTBOX_RELAY_CONFIG",
        global = true,
        hide_env_values = true
    )]
    config: Option<PathBuf>,
    /// Log format for the daemon's logs (stderr).
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Apply the schema migrations (idempotent; safe while relays run).
    Migrate,
    /// Run the relay daemon.
    Run {
        /// Deliver everything due now, wait for it, and exit.
        #[arg(long)]
        once: bool,
    },
    /// Enqueue an intent (what applications do with outbox.enqueue()).
    Enqueue(intents::EnqueueArgs),
    /// List intents, newest first.
    List(intents::ListArgs),
    /// Show one intent: state, attempts, provider reference.
    Show(intents::ShowArgs),
    /// Retry intents now, under the same idempotency key unless --new-effect.
    Retry(operate::RetryArgs),
    /// Cancel pending, claimed, ambiguous or dead intents.
    Cancel(operate::CancelArgs),
    /// Settle an ambiguous intent by hand.
    Resolve(operate::ResolveArgs),
    /// Counts by state and kind, and the age of the oldest due intent.
    Stats(JsonFlag),
    /// Delete terminal intents older than a duration (their keys stay in the ledger).
    Purge(operate::PurgeArgs),
    /// The fleet: each relay's owner, version, served kinds and last heartbeat.
    Relays(JsonFlag),
    /// List the configured schedules with their next fire times.
    Schedules(intents::SchedulesArgs),
    /// Ask a running relay whether it is ready (for container health checks).
    Health(HealthArgs),
    /// Destination health: breaker state, failures, next probe, backlog and
    /// rate limit of each destination; `pause` and `resume` override it.
    Destinations(destinations::DestinationsArgs),
    /// Subscriptions: the webhook endpoints that receive the events
    /// applications publish (outbox.publish), each signed with its own secret.
    Subscriptions(subscriptions::SubscriptionsArgs),
    /// Send a subscription the events of a time window again: those it
    /// received under the same webhook-id, the others for the first time.
    Replay(replay::ReplayArgs),
    /// Serve the operator console: a web UI and a JSON API (/api/v1/) for
    /// intents, failures, destinations and schedules, with bulk actions.
    Console(console::ConsoleArgs),
}

impl Command {
    /// Whether the verb reads the delivery settings (providers, health,
    /// schedules, the console), and so validates all of the configuration.
    fn uses_delivery_settings(&self) -> bool {
        match self {
            Command::Run { .. }
            | Command::Schedules(_)
            | Command::Health(_)
            | Command::Destinations(_)
            | Command::Subscriptions(_)
            | Command::Console(_) => true,
            Command::Migrate
            | Command::Enqueue(_)
            | Command::List(_)
            | Command::Show(_)
            | Command::Retry(_)
            | Command::Cancel(_)
            | Command::Resolve(_)
            | Command::Stats(_)
            | Command::Purge(_)
            | Command::Relays(_)
            | Command::Replay(_) => false,
        }
    }
}

#[derive(Debug, Args)]
pub struct HealthArgs {
    /// The relay's listener; default relay.metrics_addr (0.0.0.0 and :: mean this host).
    #[arg(long)]
    addr: Option<String>,
    /// Liveness (/healthz) instead of readiness (/readyz).
    #[arg(long)]
    live: bool,
}

#[derive(Debug, Args)]
pub struct JsonFlag {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// An error with the exit code it maps to.
#[derive(Debug)]
pub struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    pub fn new(code: u8, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: message.into(),
        }
    }

    pub fn usage(message: impl Into<String>) -> Self {
        Failure {
            code: 2,
            message: message.into(),
        }
    }

    /// The process exit code (see the table above).
    pub fn code(&self) -> u8 {
        self.code
    }

    /// What to print after `error: `.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl From<anyhow::Error> for Failure {
    fn from(err: anyhow::Error) -> Self {
        if let Some(e) = err.downcast_ref::<StoreError>() {
            let mut f = Failure::from_store(e);
            f.message = format!("{err:#}");
            return f;
        }
        if err
            .chain()
            .any(|c| c.downcast_ref::<crate::store::InvalidUrl>().is_some())
        {
            return Failure::usage(format!("{err:#}"));
        }
        let unreachable = err.chain().any(|c| {
            c.downcast_ref::<sqlx::Error>().is_some_and(is_unreachable)
                || c.to_string().starts_with("cannot connect to Postgres")
        });
        Failure {
            code: if unreachable { 5 } else { 1 },
            message: format!("{err:#}"),
        }
    }
}

impl From<StoreError> for Failure {
    fn from(err: StoreError) -> Self {
        Failure::from_store(&err)
    }
}

impl Failure {
    fn from_store(err: &StoreError) -> Self {
        let code = match err {
            StoreError::NotFound(_) => 3,
            StoreError::Ambiguous { .. } => 2,
            StoreError::InvalidState { .. } => 4,
            StoreError::Enqueue(EnqueueError::Conflict { .. }) => 4,
            StoreError::Enqueue(EnqueueError::Invalid { .. })
            | StoreError::Enqueue(EnqueueError::PayloadTooLarge { .. }) => 2,
            StoreError::Enqueue(EnqueueError::Database(e)) | StoreError::Database(e) => {
                if is_unreachable(e) {
                    5
                } else {
                    1
                }
            }
        };
        let mut message = err.to_string();
        if let StoreError::Enqueue(EnqueueError::Database(e)) | StoreError::Database(e) = err {
            if matches!(
                crate::store::sqlstate(e).as_deref(),
                Some("42P01" | "3F000" | "42883")
            ) {
                message.push_str(
                    " (the outbox schema is missing or out of date: run `outbox-relay migrate`)",
                );
            }
        }
        Failure { code, message }
    }
}

fn is_unreachable(e: &sqlx::Error) -> bool {
    matches!(
        e,
        sqlx::Error::Io(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Tls(_)
    )
}

pub type Outcome = Result<(), Failure>;

/// Entry point of the binary.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            // help and version are not failures; a health check exits 0 or
            // 1 only (Docker reserves 2)
            let code = match e.kind() {
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => 0,
                _ if std::env::args().any(|a| a == "health") => 1,
                _ => 2,
            };
            return ExitCode::from(code);
        }
    };
    crate::observe::logs::init(cli.log_format);
    run_to_exit(execute(cli))
}

/// Run `work` on a multi-threaded runtime and turn its outcome into the
/// process's exit code (the table above), printing a failure's message.
/// Shared with `outbox-relay-bench`.
pub fn run_to_exit(work: impl std::future::Future<Output = Outcome>) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(work);
    // Whatever is still running now (a pool connection closing, a DNS
    // lookup on a blocking thread) has nothing left to do for anyone: do
    // not let it hold the exit, which the supervisor of the process waits
    // for.
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("error: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

async fn execute(cli: Cli) -> Outcome {
    // a health check exits 0 or 1 (Docker reserves 2), whatever went wrong
    let is_health = matches!(cli.command, Command::Health(_));
    let checks = if cli.command.uses_delivery_settings() {
        Checks::All
    } else {
        Checks::Operator
    };
    let config = Config::load_checked(cli.config.as_deref(), std::env::vars(), checks)
        .map_err(|e| Failure::new(if is_health { 1 } else { 2 }, format!("{e:#}")))?;
    if let Command::Health(args) = &cli.command {
        return health(&config, args).await;
    }
    if let Command::Console(console::ConsoleArgs {
        hash_password: true,
        ..
    }) = &cli.command
    {
        return console::hash_password();
    }
    let url = database_url(cli.database_url.clone(), &config)?;
    let connections = config
        .relay
        .max_connections
        .unwrap_or(config.relay.concurrency / 8 + 4);
    // The daemon's signal handlers come before its first connection: a
    // SIGTERM while it connects and starts is then a clean stop.
    let shutdown = matches!(cli.command, Command::Run { once: false }).then(run::shutdown_signal);
    let store = Store::connect(&url, connections).await?;
    match cli.command {
        Command::Migrate => {
            let done = store.migrate().await?;
            if done.applied.is_empty() {
                println!("the schema is current (version {})", done.version);
            } else {
                for (version, description) in &done.applied {
                    println!("applied {version:04} {description}");
                }
                println!(
                    "applied {} migration(s); the schema is at version {}",
                    done.applied.len(),
                    done.version
                );
            }
            Ok(())
        }
        Command::Run { once } => run::run(store, &config, once, shutdown).await,
        Command::Enqueue(args) => intents::enqueue(&store, args).await,
        Command::List(args) => intents::list(&store, args).await,
        Command::Show(args) => intents::show(&store, args).await,
        Command::Retry(args) => operate::retry(&store, args).await,
        Command::Cancel(args) => operate::cancel(&store, args).await,
        Command::Resolve(args) => operate::resolve(&store, args).await,
        Command::Stats(flag) => operate::stats(&store, flag.json).await,
        Command::Relays(flag) => fleet::relays(&store, flag.json).await,
        Command::Purge(args) => operate::purge(&store, args).await,
        Command::Schedules(args) => intents::schedules(&store, &config, args).await,
        Command::Destinations(args) => destinations::destinations(&store, &config, args).await,
        Command::Subscriptions(args) => subscriptions::subscriptions(&store, &config, args).await,
        Command::Replay(args) => replay::replay(&store, args).await,
        Command::Console(args) => console::console(store, config, args).await,
        Command::Health(_) => unreachable!("answered before connecting"),
    }
}

/// The database URL a command uses: `flag` (`--database-url`, or
/// `DATABASE_URL` through clap), else the file `DATABASE_URL_FILE` names,
/// else `database_url` from the configuration; both variables set, or
/// none of the three, is bad usage. Public for `outbox-relay-bench`, which
/// takes the database the way every verb does.
pub fn database_url(flag: Option<String>, config: &Config) -> Result<String, Failure> {
    if std::env::var_os("DATABASE_URL").is_some() && std::env::var_os("DATABASE_URL_FILE").is_some()
    {
        return Err(Failure::usage(
            "both DATABASE_URL and DATABASE_URL_FILE are set; set one",
        ));
    }
    let url_file = match std::env::var("DATABASE_URL_FILE") {
        Ok(path) if flag.is_none() => Some(
            crate::config::read_secret_file("DATABASE_URL_FILE", &path)
                .map_err(|e| Failure::usage(format!("{e:#}")))?,
        ),
        _ => None,
    };
    flag.or(url_file)
        .or_else(|| config.database_url.as_ref().map(|s| s.expose().to_string()))
        .ok_or_else(|| Failure::usage("no database: pass --database-url, set DATABASE_URL (or DATABASE_URL_FILE), or set database_url in the config file"))
}

/// GET /readyz (or /healthz) from a running relay; exit 0 on 200, 1 otherwise.
async fn health(config: &Config, args: &HealthArgs) -> Outcome {
    let configured = args
        .addr
        .clone()
        .or_else(|| config.relay.metrics_addr.clone())
        .ok_or_else(|| Failure::new(1, "no address: pass --addr or set relay.metrics_addr"))?;
    let mut addr: std::net::SocketAddr = configured.parse().map_err(|_| {
        Failure::new(
            1,
            format!("{configured:?} is not an address like 127.0.0.1:9187"),
        )
    })?;
    if addr.ip().is_unspecified() {
        addr.set_ip(if addr.is_ipv4() {
            std::net::Ipv4Addr::LOCALHOST.into()
        } else {
            std::net::Ipv6Addr::LOCALHOST.into()
        });
    }
    let path = if args.live { "/healthz" } else { "/readyz" };
    let url = format!("http://{addr}{path}");
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(5))
        .no_proxy()
        .build()
        .map_err(|e| Failure::new(1, format!("{url}: {e}")))?;
    let answer = client.get(&url).send().await.map_err(|e| {
        let why = if e.is_timeout() {
            "no answer within 5s".to_string()
        } else {
            e.to_string()
        };
        Failure::new(1, format!("{url}: {why}"))
    })?;
    let status = answer.status();
    let body = answer
        .text()
        .await
        .map_err(|e| Failure::new(1, format!("{url}: {e}")))?;
    let body = body.trim();
    if status == reqwest::StatusCode::OK {
        println!("{path}: {body}");
        Ok(())
    } else {
        Err(Failure::new(1, format!("{url}: {status} {body}")))
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    /// `--help` explains every flag and argument of every verb.
    #[test]
    fn every_flag_of_every_verb_has_help() {
        let cli = Cli::command();
        let mut bare = Vec::new();
        let mut check = |verb: &str, cmd: &clap::Command| {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if !matches!(id, "help" | "version") && arg.get_help().is_none() {
                    bare.push(format!("{verb} {id}"));
                }
            }
        };
        check("outbox-relay", &cli);
        for verb in cli.get_subcommands() {
            check(verb.get_name(), verb);
            for sub in verb.get_subcommands() {
                check(&format!("{} {}", verb.get_name(), sub.get_name()), sub);
            }
        }
        assert!(bare.is_empty(), "flags without help: {bare:?}");
    }
}

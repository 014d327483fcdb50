//! All SQL lives here. Nothing outside `store` builds a query.
//!
//! - [`claims`]: the hot path: claim, complete (fenced), release, sweep;
//!   [`claim_query`]: the claim statement itself; `log`: the intent log,
//!   where an intent is written once and a first-attempt delivery adds one
//!   narrow row.
//! - [`operator`]: what the CLI reads and changes.
//! - [`enqueue`]: the application-side helper around `outbox.enqueue`.
//! - [`console`]: the console's searches, failure groups, charts and bulk changes.

/// The test that a log intent (`$alias.id`) has no outcome and no batch, as
/// SQL text: only a claim gives an intent either, so one above the highest
/// id any outcome or batch holds (schema 0034) is not probed for them. The
/// claim of the log and the gauge of the oldest due intent read the log by
/// it (and the view `outbox.intents`, schema 0035).
macro_rules! log_untaken {
    ($alias:literal) => {
        concat!(
            "(",
            $alias,
            ".id > (SELECT greatest(
                     coalesce((SELECT max(o.intent_id) FROM outbox.log_outcomes_open o), 0),
                     coalesce((SELECT max(b.max_id) FROM outbox.log_batches b), 0)))
              OR (NOT EXISTS (SELECT 1 FROM outbox.log_outcomes_open o
                               WHERE o.intent_id = ",
            $alias,
            ".id OFFSET 0)
                  AND NOT EXISTS (SELECT 1 FROM outbox.log_batches b
                                   WHERE b.ids @> ARRAY[",
            $alias,
            ".id] OFFSET 0)))"
        )
    };
}

pub mod claim_query;
mod claimed;
mod claimed_payload;
pub mod claims;
pub mod console;
pub mod destinations;
pub mod enqueue;
mod expansion;
pub mod fleet;
pub mod listener;
mod log;
pub mod migrations;
pub mod operator;
pub mod recovery;
pub mod replay;
mod retention;
mod reworded;
pub mod schedules;
pub mod segments;
pub mod standbys;
pub mod stats;
pub mod storable;
pub mod subscription_pages;
pub mod subscriptions;
pub mod tallies;

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgPool};

/// The periodic and retention statements, and the completion of
/// deliveries at the first attempt, by the name of their constant in lower
/// case, as the relay runs them (macros expanded): the benches under
/// `bench/pgbench/` measure them (`outbox-relay-bench --print-statement
/// NAME`; `log_claim` gives the claim of the log of 100 that sets nothing
/// aside).
pub const STATEMENTS: &[(&str, &str)] = &[
    ("tally_backlog", tallies::TALLY_BACKLOG),
    ("tally_counts", tallies::TALLY_COUNTS),
    ("oldest_due", tallies::OLDEST_DUE),
    ("next_due", claims::NEXT_DUE),
    ("stranded", fleet::STRANDED),
    ("stranded_noted", fleet::STRANDED_NOTED),
    ("purge_rows", retention::PURGE_ROWS),
    ("purge_log", retention::PURGE_LOG),
    ("log_complete", log::LOG_COMPLETE_SQL),
    ("log_complete_contended", log::LOG_COMPLETE_CONTENDED_SQL),
];

/// The statement of [`STATEMENTS`] named `name`.
pub fn statement(name: &str) -> Option<&'static str> {
    STATEMENTS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, sql)| *sql)
}

pub use claim_query::{ClaimQuery, GENERIC_PLAN_SETTINGS};
pub use claimed::{Claimed, WalMark};
pub use claims::{Aside, Claims};
pub use claims::{Completion, Written};
pub use enqueue::{enqueue, enqueue_many, EnqueueError, Enqueued, NewIntent};

/// The migrations in `schema/`, embedded in the binary.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./schema");

pub use crate::state::{AttemptOutcome, IntentState, STATES};

/// Failures the CLI and the engine branch on.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No intent has this id or key.
    #[error("no intent has id or key {0:?}")]
    NotFound(String),
    /// The reference names more than one intent: a number that is one
    /// intent's id and another's key (live or in the ledger).
    #[error(
        "{reference:?} names {} intents: {}; say which with id:N or key:K",
        candidates.len(),
        candidates.join(", and ")
    )]
    Ambiguous {
        reference: String,
        candidates: Vec<String>,
    },
    /// The operation does not apply to the intent's current state.
    #[error("intent {id} is {state}: {why}")]
    InvalidState {
        id: i64,
        state: IntentState,
        why: &'static str,
    },
    #[error(transparent)]
    Enqueue(#[from] EnqueueError),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}

/// The database URL cannot be used as it is: not a URL, not a Postgres one,
/// or a parameter the driver refuses (`sslmode`, a missing `sslrootcert`
/// file). Invalid configuration (the CLI exits 2); the message never holds
/// the URL's password.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct InvalidUrl(String);

/// Parse a Postgres URL (`postgres://` or `postgresql://`) the way the
/// driver will, with errors that say what is wrong without echoing it.
pub fn parse_url(url: &str) -> Result<PgConnectOptions, InvalidUrl> {
    let parsed = url::Url::parse(url).map_err(|e| {
        InvalidUrl(format!(
            "the database URL is not a URL ({e}); write postgres://USER:PASSWORD@HOST:5432/DATABASE"
        ))
    })?;
    if !matches!(parsed.scheme(), "postgres" | "postgresql") {
        return Err(InvalidUrl(format!(
            "the database URL is a {scheme}:// URL; the relay needs PostgreSQL: postgres:// or postgresql://",
            scheme = parsed.scheme()
        )));
    }
    let options: PgConnectOptions = url.parse().map_err(|e: sqlx::Error| {
        // sqlx nests its configuration errors, each saying "error with
        // configuration: "; one "not a valid Postgres URL" says it
        let mut text = e.to_string();
        while let Some(rest) = text.strip_prefix("error with configuration: ") {
            text = rest.to_string();
        }
        InvalidUrl(redact(
            &format!("the database URL is not a valid Postgres URL: {text}"),
            &parsed,
        ))
    })?;
    if let Some(ca) = url_param(url, "sslrootcert") {
        std::fs::metadata(&ca).map_err(|e| {
            InvalidUrl(redact(
                &format!("sslrootcert {ca} in the database URL: {e}"),
                &parsed,
            ))
        })?;
    }
    Ok(options)
}

/// `text` without the URL's password (as written and percent-decoded, in
/// the userinfo or a `password` parameter).
fn redact(text: &str, url: &url::Url) -> String {
    let mut secrets: Vec<String> = url
        .query_pairs()
        .filter(|(k, _)| k == "password")
        .map(|(_, v)| v.into_owned())
        .collect();
    if let Some(p) = url.password() {
        secrets.push(p.to_string());
        if let Ok(decoded) = percent_decode(p) {
            secrets.push(decoded);
        }
    }
    let mut out = text.to_string();
    for secret in secrets.iter().filter(|s| !s.is_empty()) {
        out = out.replace(secret.as_str(), "<redacted>");
    }
    out
}

fn percent_decode(text: &str) -> Result<String, std::string::FromUtf8Error> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push((hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0)) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out)
}

/// A handle on the outbox tables, shared by every task of a relay.
#[derive(Clone, Debug)]
pub struct Store {
    pool: PgPool,
    /// Who operator actions are recorded as (`outbox.operator_actions.actor`);
    /// `None` records the database role (`current_user`), as the CLI does.
    /// The console sets it to its logged-in user.
    actor: Option<std::sync::Arc<str>>,
}

impl Store {
    pub fn new(pool: PgPool) -> Self {
        Store { pool, actor: None }
    }

    /// The same store, recording operator actions as `actor`.
    pub fn acting_as(&self, actor: &str) -> Store {
        Store {
            pool: self.pool.clone(),
            actor: Some(actor.into()),
        }
    }

    /// The actor operator actions are recorded as, if not the database role.
    pub fn actor(&self) -> Option<&str> {
        self.actor.as_deref()
    }

    /// Connect with a pool sized for `connections` and a bounded connect wait.
    /// The error names the problem without echoing the URL (it may carry a
    /// password); a URL that cannot be used is an [`InvalidUrl`].
    pub async fn connect(url: &str, connections: u32) -> anyhow::Result<Self> {
        let options = parse_url(url)?.application_name("outbox-relay");
        // One direct attempt first, so an unreachable server fails at once
        // with its own error instead of after the pool's acquire timeout.
        let probe = options.connect().await.map_err(|e| {
            anyhow::anyhow!(
                "cannot connect to Postgres at {}:{} (database {:?}): {e}",
                options.get_host(),
                options.get_port(),
                options.get_database().unwrap_or("<default>")
            )
        })?;
        probe.close().await.ok();
        let pool = PgPoolOptions::new()
            .max_connections(connections.max(2))
            .min_connections(0)
            .acquire_timeout(Duration::from_secs(10))
            .connect_lazy_with(options);
        Ok(Store { pool, actor: None })
    }

    /// The connection pool, for the bench and the tests that read the
    /// database directly. The relay itself reaches the database only
    /// through the store's methods (`tests/it/layout/` checks that no
    /// module outside `store` calls this).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// `pg_notify(channel, payload)`, committed at once.
    pub async fn notify(&self, channel: &str, payload: &str) -> Result<(), sqlx::Error> {
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(channel)
            .bind(payload)
            .execute(&self.pool)
            .await
            .map(|_| ())
    }

    /// Apply pending migrations; safe to run concurrently and repeatedly.
    /// A schema that already has every migration this binary knows is left
    /// alone, also when it has newer ones (an older binary after an upgrade
    /// was rolled back): migrations are forward-only and additive. Between
    /// schema 0037 and 0038 it copies the keys of the intents enqueued
    /// before, in short transactions, while the enqueues go on. A migration
    /// that gave up on its locks is run again for up to ten minutes.
    pub async fn migrate(&self) -> anyhow::Result<Migrated> {
        let before = self.applied_migrations().await.unwrap_or_default();
        let pending: Vec<(i64, String)> = up_migrations()
            .filter(|m| !before.contains(&m.version))
            .map(|m| (m.version, m.description.to_string()))
            .collect();
        if !pending.is_empty() {
            if !before.is_empty() {
                reworded::accept(&self.pool)
                    .await
                    .map_err(|e| anyhow::anyhow!("applying migrations failed: {e}"))?;
            }
            // the steps some migrations need done before them, outside
            // any migration's transaction
            for (version, step) in [
                (KEYS_COPIED_BEFORE, Step::CopyKeys),
                (RUNNING_ENDED_BEFORE, Step::AwaitRunningStatements),
            ] {
                if before.contains(&version) || !MIGRATOR.version_exists(version) {
                    continue;
                }
                let mut earlier = sqlx::migrate::Migrator::new(Before(version))
                    .await
                    .map_err(|e| anyhow::anyhow!("applying migrations failed: {e}"))?;
                // another migrate may have applied this one and more since
                earlier.set_ignore_missing(true);
                migrations::apply(&self.pool, &earlier, LOCK_PATIENCE).await?;
                match step {
                    Step::CopyKeys => self
                        .copy_intent_keys()
                        .await
                        .map_err(|e| anyhow::anyhow!("copying the intents' keys failed: {e}"))?,
                    Step::AwaitRunningStatements => self.await_running_statements().await?,
                }
            }
            migrations::apply(&self.pool, &MIGRATOR, LOCK_PATIENCE).await?;
        }
        Ok(Migrated {
            applied: pending,
            version: up_migrations().map(|m| m.version).max().unwrap_or(0),
        })
    }

    /// Copy the keys of the intents enqueued before schema 0037 into
    /// `outbox.intent_keys`, one short transaction at a time
    /// (`outbox.fill_intent_keys`), so that the enqueues never wait for the
    /// copy; safe beside another migrate doing the same.
    async fn copy_intent_keys(&self) -> Result<(), sqlx::Error> {
        let started = std::time::Instant::now();
        let mut calls: u64 = 0;
        loop {
            calls += 1;
            let done: bool = match sqlx::query_scalar("SELECT outbox.fill_intent_keys($1)")
                .bind(KEYS_PER_COPY)
                .fetch_one(&self.pool)
                .await
            {
                Ok(done) => done,
                // another migrate finished the copy and applied 0039,
                // which drops the function
                Err(e) if sqlstate(&e).as_deref() == Some("42883") => true,
                // a step that met a purge or an enqueue of the same key:
                // it changed nothing, and the next call takes it again
                Err(e) if matches!(sqlstate(&e).as_deref(), Some("40001" | "40P01")) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    false
                }
                Err(e) => return Err(e),
            };
            if done {
                // an empty log and ledger take two calls
                if calls > 2 {
                    tracing::info!(
                        transactions = calls,
                        seconds = started.elapsed().as_secs(),
                        "copied the earlier intents' keys into outbox.intent_keys"
                    );
                }
                return Ok(());
            }
            if calls.is_multiple_of(100) {
                tracing::info!(
                    transactions = calls,
                    "copying the earlier intents' keys into outbox.intent_keys"
                );
            }
        }
    }

    /// Wait until every statement that client sessions of this database
    /// are running now has ended (as `CREATE INDEX CONCURRENTLY` waits for
    /// transactions), at most [`RUNNING_WAIT`]: a call of a function a
    /// migration replaced runs its earlier text to its end, and the next
    /// migration must not remove what that text names.
    async fn await_running_statements(&self) -> anyhow::Result<()> {
        // the client sessions of this database in a transaction, but for
        // one idle in it: it finished the statement it was running (a
        // statement it begins now calls the new text); a session whose
        // state this role may not read is waited for
        const IN_TRANSACTION: &str = "SELECT l.virtualxid, l.pid
               FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
              WHERE l.locktype = 'virtualxid' AND l.granted
                AND a.datname = current_database() AND l.pid <> pg_backend_pid()
                AND a.backend_type = 'client backend'
                AND a.state IS DISTINCT FROM 'idle in transaction'
                AND a.state IS DISTINCT FROM 'idle in transaction (aborted)'";
        let running: Vec<String> =
            sqlx::query_scalar(&format!("SELECT virtualxid FROM ({IN_TRANSACTION}) t"))
                .fetch_all(&self.pool)
                .await?;
        let deadline = std::time::Instant::now() + RUNNING_WAIT;
        loop {
            let left: Vec<(String, i32)> = sqlx::query_as(&format!(
                "SELECT virtualxid, pid FROM ({IN_TRANSACTION}) t WHERE virtualxid = ANY($1)"
            ))
            .bind(&running)
            .fetch_all(&self.pool)
            .await?;
            let Some((_, pid)) = left.first() else {
                return Ok(());
            };
            if std::time::Instant::now() >= deadline {
                anyhow::bail!(
                    "a statement that began before the last migration is still running \
                     (server process {pid}, and {} more); end it, or wait for it, and run \
                     outbox-relay migrate again",
                    left.len() - 1
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// True when every embedded migration has been applied.
    pub async fn migrations_current(&self) -> Result<bool, sqlx::Error> {
        let applied = self.applied_migrations().await?;
        Ok(up_migrations().all(|m| applied.contains(&m.version)))
    }

    /// The versions of the migrations applied to this database.
    async fn applied_migrations(&self) -> Result<Vec<i64>, sqlx::Error> {
        match sqlx::query_scalar(
            "SELECT version FROM _sqlx_migrations WHERE success ORDER BY version",
        )
        .fetch_all(&self.pool)
        .await
        {
            Ok(v) => Ok(v),
            // never migrated
            Err(e) if sqlstate(&e).as_deref() == Some("42P01") => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }
}

/// The migration that `outbox.fill_intent_keys()` must have finished
/// before: schema 0037 adds the function, 0038 needs every key copied.
const KEYS_COPIED_BEFORE: i64 = 38;

/// The migration that may run only once every statement that was running
/// when the one before it committed has ended: schema 0038 replaces the
/// enqueue functions, 0039 drops what their earlier text names.
const RUNNING_ENDED_BEFORE: i64 = 39;

/// How long `migrate` waits for those statements.
const RUNNING_WAIT: Duration = Duration::from_secs(600);

/// What `migrate` does before a migration, outside any transaction.
enum Step {
    CopyKeys,
    AwaitRunningStatements,
}

/// How long `migrate` keeps trying a migration that gave up on its locks
/// ([`migrations::apply`]).
const LOCK_PATIENCE: Duration = Duration::from_secs(600);

/// Keys copied per transaction (a few milliseconds each).
const KEYS_PER_COPY: i32 = 10_000;

/// The embedded migrations before a version, as a source of their own:
/// `migrate` applies them, copies the keys, then applies the rest.
#[derive(Debug)]
struct Before(i64);

impl<'s> sqlx::migrate::MigrationSource<'s> for Before {
    fn resolve(
        self,
    ) -> futures_util::future::BoxFuture<
        's,
        Result<Vec<sqlx::migrate::Migration>, sqlx::error::BoxDynError>,
    > {
        Box::pin(async move {
            Ok(MIGRATOR
                .iter()
                .filter(|m| m.version < self.0)
                .cloned()
                .collect())
        })
    }
}

/// What `migrate` did: the migrations it applied (version, description),
/// none when the schema was current, and the schema's version after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migrated {
    pub applied: Vec<(i64, String)>,
    pub version: i64,
}

fn up_migrations() -> impl Iterator<Item = &'static sqlx::migrate::Migration> {
    MIGRATOR
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
}

/// A query parameter of a postgres:// URL, percent-decoded; the last one
/// wins, as in the driver.
fn url_param(url: &str, name: &str) -> Option<String> {
    url::Url::parse(url)
        .ok()?
        .query_pairs()
        .filter(|(k, _)| k == name)
        .last()
        .map(|(_, v)| v.into_owned())
}

/// The SQLSTATE of a database error, when there is one.
pub fn sqlstate(err: &sqlx::Error) -> Option<String> {
    err.as_database_error()
        .and_then(|e| e.code())
        .map(|c| c.into_owned())
}

#[cfg(test)]
mod tests {
    use super::{parse_url, statement, url_param, STATEMENTS};

    #[test]
    fn the_named_statements_are_sql_as_run() {
        for (name, _) in STATEMENTS {
            let sql = statement(name).unwrap_or_else(|| panic!("{name} is not named"));
            let first = sql.split_whitespace().next();
            assert!(matches!(first, Some("SELECT" | "WITH")), "{name}: {sql}");
            assert!(!sql.contains("log_untaken"), "{name} is expanded");
        }
        assert_eq!(statement("next-due"), None);
    }

    #[test]
    fn only_usable_postgres_urls_parse() {
        for url in [
            "postgres://u:p@h:5432/db",
            "postgresql://u@h/db?sslmode=require",
            "postgres:///db?host=/var/run/postgresql",
        ] {
            assert!(parse_url(url).is_ok(), "{url}");
        }
        for (url, needle) in [
            (
                "mysql://root:s3cret@db.example.com/app",
                "the database URL is a mysql:// URL; the relay needs PostgreSQL: postgres:// or postgresql://",
            ),
            ("s3cret", "the database URL is not a URL (relative URL without a base)"),
            ("postgres://u:s3cret@h:port/db", "the database URL is not a URL (invalid port number)"),
            (
                "postgres://u:s3cret@h/db?sslmode=bogus",
                "the database URL is not a valid Postgres URL: unknown value \"bogus\" for `ssl_mode`",
            ),
            (
                "postgres://u:s3cret@h/db?sslmode=s3cret",
                "the database URL is not a valid Postgres URL: unknown value \"<redacted>\" for `ssl_mode`",
            ),
            (
                "postgres://u:s3%63ret@h/db?sslmode=s3cret",
                "unknown value \"<redacted>\"",
            ),
            (
                "postgres://u@h/db?password=s3cret&sslmode=s3cret",
                "unknown value \"<redacted>\"",
            ),
            (
                "postgres://u:s3cret@h/db?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
                "sslrootcert /nonexistent/ca.pem in the database URL: No such file",
            ),
        ] {
            let err = parse_url(url).unwrap_err().to_string();
            assert!(err.contains(needle), "{url}: {err}");
            assert!(!err.contains("s3cret"), "{url}: {err}");
            assert_eq!(err.matches("error with configuration").count(), 0, "{err}");
        }
    }

    #[test]
    fn url_params_are_found_and_decoded() {
        let url = "postgres://u:p@h/db?sslmode=verify-full&sslrootcert=%2Fetc%2Fca%20dir%2Fca.pem";
        assert_eq!(url_param(url, "sslrootcert").unwrap(), "/etc/ca dir/ca.pem");
        assert_eq!(url_param(url, "sslmode").unwrap(), "verify-full");
        assert_eq!(url_param(url, "sslcert"), None);
        assert_eq!(url_param("postgres://h/db", "sslrootcert"), None);
        assert_eq!(
            url_param(
                "postgres://h/db?sslrootcert=/a&sslrootcert=/b",
                "sslrootcert"
            )
            .unwrap(),
            "/b"
        );
        assert_eq!(
            url_param("postgres://h/db?sslrootcert=/a/b%zz", "sslrootcert").unwrap(),
            "/a/b%zz"
        );
    }
}

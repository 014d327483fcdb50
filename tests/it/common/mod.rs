//! Shared test harness: a fresh database per test, a real HTTP receiver on
//! loopback, relay configurations, and condition waits with deadlines.
#![allow(dead_code)]

pub mod amqp;
pub mod cluster;
pub mod console;
pub mod failover;
pub mod kafka;
pub mod logged;
pub mod nats;
pub mod otlp;
pub mod plans;
pub mod proxy;
pub mod schema_at;
pub mod smtp;
pub mod stripe;

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use outbox_relay::config::Config;
use outbox_relay::store::Store;
use outbox_relay::{Engine, EngineConfig};
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection};

/// The server the tests create their databases on.
pub fn admin_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// A freshly created, migrated database of its own for one test, dropped
/// when the value goes out of scope: at the end of the test, and also when
/// the test panics.
pub struct TestDb {
    pub name: String,
    pub url: String,
    pub store: Store,
    /// Declared last, so it drops after `store`: the database goes with it.
    _dropped_with: DropDatabase,
}

impl TestDb {
    pub async fn new() -> TestDb {
        TestDb::create(true).await
    }

    /// A fresh database without the outbox schema, for a test in which
    /// `outbox-relay migrate` creates it.
    pub async fn unmigrated() -> TestDb {
        TestDb::create(false).await
    }

    async fn create(migrate: bool) -> TestDb {
        sweep_leftovers_once();
        let admin: PgConnectOptions = admin_url().parse().expect("DATABASE_URL");
        let name = format!(
            "outbox_test_{}_{:08x}",
            std::process::id(),
            fastrand::u32(..)
        );
        let mut conn = admin
            .connect()
            .await
            .expect("connect to the test server (DATABASE_URL)");
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut conn)
            .await
            .expect("create test database");
        conn.close().await.ok();
        // from here on a panic (a failed migration) drops it too
        let guard = DropDatabase(name.clone());
        let url = db_url(&name);
        let store = Store::connect(&url, 8)
            .await
            .expect("connect to test database");
        if migrate {
            store.migrate().await.expect("migrate");
        }
        TestDb {
            name,
            url,
            store,
            _dropped_with: guard,
        }
    }

    /// A second, independent pool on the same database (another "relay").
    pub async fn another_store(&self) -> Store {
        Store::connect(&self.url, 8).await.expect("connect")
    }

    pub fn pool(&self) -> &sqlx::PgPool {
        self.store.pool()
    }

    pub async fn state(&self, key: &str) -> String {
        sqlx::query_scalar("SELECT state FROM outbox.intents WHERE key = $1")
            .bind(key)
            .fetch_one(self.pool())
            .await
            .expect("intent exists")
    }

    pub async fn count(&self, sql_where: &str) -> i64 {
        sqlx::query_scalar(&format!(
            "SELECT count(*) FROM outbox.intents WHERE {sql_where}"
        ))
        .fetch_one(self.pool())
        .await
        .unwrap()
    }

    pub async fn enqueue(&self, key: &str, kind: &str, payload: serde_json::Value) -> i64 {
        let r: (i64, bool) = sqlx::query_as("SELECT id, duplicate FROM outbox.enqueue($1, $2, $3)")
            .bind(key)
            .bind(kind)
            .bind(payload)
            .fetch_one(self.pool())
            .await
            .expect("enqueue");
        r.0
    }
}

fn db_url(name: &str) -> String {
    let mut url = reqwest::Url::parse(&admin_url()).expect("DATABASE_URL is a URL");
    url.set_path(&format!("/{name}"));
    url.to_string()
}

/// Drops the named test database on drop (`WITH (FORCE)`: the test's pools
/// and relay processes may still hold connections). `Drop` cannot await and
/// may run on the test's own runtime, even a current-thread one, so the
/// statement runs on a short-lived thread with a runtime of its own, and a
/// connection of its own; a failure is reported, never a panic (this may run
/// while a failed test unwinds).
struct DropDatabase(String);

impl Drop for DropDatabase {
    fn drop(&mut self) {
        let name = self.0.clone();
        let dropped = on_own_runtime(async move {
            let admin: PgConnectOptions = admin_url().parse()?;
            let mut conn = admin.connect().await?;
            sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                .execute(&mut conn)
                .await?;
            conn.close().await.ok();
            Ok::<_, sqlx::Error>(())
        });
        match dropped {
            Some(Ok(())) => {}
            Some(Err(e)) => eprintln!("test database {} not dropped: {e}", self.0),
            None => eprintln!("test database {} not dropped: no answer within 30s", self.0),
        }
    }
}

/// Run `work` to completion on a new thread with its own current-thread
/// runtime, and wait for it (at most 30 s; `None` past that or if it panics).
fn on_own_runtime<F>(work: F) -> Option<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .ok()?;
        runtime
            .block_on(async { tokio::time::timeout(Duration::from_secs(30), work).await })
            .ok()
    })
    .join()
    .ok()
    .flatten()
}

/// Once per test process, before its first database: drop the test databases
/// (`outbox_test_<pid>_<random>`) whose creating process no longer runs, left
/// by a run that was killed (a test that hit its timeout, an interrupted
/// run). A database whose process is alive is never touched, and the drop
/// is not forced: one that still has connections (a concurrent run on
/// another host, an orphaned relay) refuses it and stays. tests/run.sh
/// sweeps too; this makes a plain `cargo nextest run` clean up as well.
fn sweep_leftovers_once() {
    static SWEEP: std::sync::Once = std::sync::Once::new();
    SWEEP.call_once(|| {
        // without /proc the creator's liveness is unknown: sweep nothing
        if !std::path::Path::new("/proc/self").exists() {
            return;
        }
        let swept = on_own_runtime(async {
            let admin: PgConnectOptions = admin_url().parse()?;
            let mut conn = admin.connect().await?;
            let names: Vec<String> = sqlx::query_scalar(
                r"SELECT datname FROM pg_database WHERE datname LIKE 'outbox\_test\_%'",
            )
            .fetch_all(&mut conn)
            .await?;
            let mut dropped = 0;
            for name in names.iter().filter(|n| creator_is_gone(n)) {
                let statement = format!("DROP DATABASE IF EXISTS \"{name}\"");
                if sqlx::query(&statement).execute(&mut conn).await.is_ok() {
                    dropped += 1;
                }
            }
            conn.close().await.ok();
            Ok::<_, sqlx::Error>(dropped)
        });
        if let Some(Ok(n @ 1..)) = swept {
            eprintln!("dropped {n} leftover test database(s)");
        }
    });
}

/// Whether `name` is `outbox_test_<pid>_<random>` and no process `pid` runs.
fn creator_is_gone(name: &str) -> bool {
    let Some(pid) = name
        .strip_prefix("outbox_test_")
        .and_then(|rest| rest.split_once('_'))
        .and_then(|(pid, _)| pid.parse::<u32>().ok())
    else {
        return false;
    };
    pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// A test configuration: loopback allowed, fast polling, short retries.
pub fn config() -> Config {
    let mut c = Config::load(
        None,
        [
            (
                "OUTBOX_RELAY__WEBHOOK__ALLOWED_NETWORKS",
                "[\"127.0.0.0/8\"]",
            ),
            ("OUTBOX_RELAY__WEBHOOK__TIMEOUT", "2s"),
            ("OUTBOX_RELAY__EMAIL__TIMEOUT", "3s"),
            ("OUTBOX_RELAY__CHARGE__TIMEOUT", "3s"),
            ("OUTBOX_RELAY__RELAY__LEASE", "5s"),
            ("OUTBOX_RELAY__RELAY__POLL_INTERVAL", "50ms"),
            ("OUTBOX_RELAY__RELAY__SWEEP_INTERVAL", "100ms"),
            ("OUTBOX_RELAY__RELAY__SHUTDOWN_TIMEOUT", "5s"),
            ("OUTBOX_RELAY__RELAY__CONCURRENCY", "16"),
            ("OUTBOX_RELAY__RETRY__SCHEDULE", "[\"50ms\"]"),
            ("OUTBOX_RELAY__RETRY__JITTER", "0.0"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string())),
    )
    .expect("test config");
    c.relay.metrics_addr = None;
    c
}

/// What the providers of `config` read of the database `store` holds
/// (events' expansion, subscriptions' secrets).
pub fn context(store: &Store, config: &Config) -> outbox_relay::kinds::Context {
    outbox_relay::services::subscriptions::context(store, config).expect("providers' context")
}

pub fn engine(store: Store, config: &Config) -> Engine {
    Engine::new(
        store.clone(),
        outbox_relay::engine::providers(config, &context(&store, config)).expect("providers"),
        EngineConfig::from_config(config),
    )
}

/// Run `engine` until `done` holds (checked every 25ms) or `limit` passes,
/// then shut it down gracefully. Panics on timeout.
pub async fn run_until<F, Fut>(engine: Engine, limit: Duration, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let handle = tokio::spawn(engine.run(async {
        let _ = rx.await;
    }));
    let ok = wait_for(limit, &mut done).await;
    let _ = tx.send(());
    handle.await.expect("engine task").expect("engine run");
    assert!(ok, "condition not reached within {limit:?}");
}

/// Run `engine` until the intent `key` is in `state` (or `limit` passes).
pub async fn run_until_state(
    engine: Engine,
    store: &Store,
    key: &str,
    state: &str,
    limit: Duration,
) {
    run_until(engine, limit, || async move {
        store
            .find(key)
            .await
            .map(|i| i.state == state)
            .unwrap_or(false)
    })
    .await
}

/// Poll `cond` every 25ms until it holds or `limit` passes.
pub async fn wait_for<F, Fut>(limit: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    loop {
        if cond().await {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// One request as the receiver saw it.
#[derive(Debug, Clone)]
pub struct Received {
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub at: Instant,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    }
    pub fn webhook_id(&self) -> String {
        self.header("webhook-id").unwrap_or_default()
    }

    /// A string field of the JSON body ("" when there is none).
    pub fn body_str(&self, field: &str) -> String {
        serde_json::from_slice::<serde_json::Value>(&self.body)
            .ok()
            .and_then(|b| b[field].as_str().map(str::to_string))
            .unwrap_or_default()
    }
}

/// What the receiver answers.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub delay: Duration,
    pub body: String,
}

impl Reply {
    pub fn status(status: u16) -> Reply {
        Reply {
            status,
            headers: vec![],
            delay: Duration::ZERO,
            body: String::new(),
        }
    }
    pub fn header(mut self, name: &'static str, value: impl Into<String>) -> Reply {
        self.headers.push((name, value.into()));
        self
    }
    pub fn after(mut self, delay: Duration) -> Reply {
        self.delay = delay;
        self
    }
    pub fn body(mut self, body: impl Into<String>) -> Reply {
        self.body = body.into();
        self
    }
}

/// Decides the reply from the request and how many times (1-based) this
/// webhook-id has been seen, this request included.
pub type Script = Arc<dyn Fn(&Received, usize) -> Reply + Send + Sync>;

struct ReceiverState {
    in_flight: std::sync::atomic::AtomicUsize,
    max_in_flight: std::sync::atomic::AtomicUsize,
    log: Mutex<Vec<Received>>,
    seen: Mutex<HashMap<String, usize>>,
    script: Script,
}

/// A real HTTP server on 127.0.0.1 that records every request.
pub struct Receiver {
    pub addr: SocketAddr,
    state: Arc<ReceiverState>,
    server: tokio::task::JoinHandle<()>,
}

impl Receiver {
    pub async fn start(
        script: impl Fn(&Received, usize) -> Reply + Send + Sync + 'static,
    ) -> Receiver {
        let state = Arc::new(ReceiverState {
            in_flight: Default::default(),
            max_in_flight: Default::default(),
            log: Mutex::new(Vec::new()),
            seen: Mutex::new(HashMap::new()),
            script: Arc::new(script),
        });
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Receiver {
            addr,
            state,
            server,
        }
    }

    /// Always 200.
    pub async fn ok() -> Receiver {
        Receiver::start(|_, _| Reply::status(200)).await
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn requests(&self) -> Vec<Received> {
        self.state.log.lock().unwrap().clone()
    }

    /// The most requests that were in flight at once.
    pub fn max_in_flight(&self) -> usize {
        self.state
            .max_in_flight
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// How many requests carried each webhook-id.
    pub fn counts_by_id(&self) -> HashMap<String, usize> {
        self.state.seen.lock().unwrap().clone()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn handle(
    State(state): State<Arc<ReceiverState>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let received = Received {
        path: uri.path().to_string(),
        headers,
        body,
        at: Instant::now(),
    };
    let nth = {
        let mut seen = state.seen.lock().unwrap();
        let n = seen.entry(received.webhook_id()).or_insert(0);
        *n += 1;
        *n
    };
    state.log.lock().unwrap().push(received.clone());
    let reply = (state.script)(&received, nth);
    let _ = method;
    use std::sync::atomic::Ordering::SeqCst;
    let now = state.in_flight.fetch_add(1, SeqCst) + 1;
    state.max_in_flight.fetch_max(now, SeqCst);
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    state.in_flight.fetch_sub(1, SeqCst);
    let mut resp = (StatusCode::from_u16(reply.status).unwrap(), reply.body).into_response();
    for (name, value) in reply.headers {
        resp.headers_mut().insert(name, value.parse().unwrap());
    }
    resp
}

/// A port that was free a moment ago, for a listener the test starts later.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Run `outbox-relay ARGS` against the test database and wait for it.
pub async fn cli(db: &TestDb, args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(relay_bin())
        .args(args)
        .env("DATABASE_URL", &db.url)
        .env_remove("OUTBOX_RELAY_CONFIG")
        .output()
        .await
        .expect("run outbox-relay")
}

/// The relay binary built for these tests.
pub fn relay_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_outbox-relay"))
}

/// Write `text` to a temporary config file.
pub fn config_file(text: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!(
        "outbox-relay-test-{}-{:08x}.toml",
        std::process::id(),
        fastrand::u32(..)
    ));
    std::fs::write(&path, text).unwrap();
    path
}

/// A relay configuration file for subprocess relays.
pub const SUBPROCESS_CONFIG: &str = r#"
[relay]
concurrency = 16
lease = "4s"
poll_interval = "50ms"
sweep_interval = "100ms"
shutdown_timeout = "5s"

[retry]
schedule = ["50ms"]
jitter = 0.0

[webhook]
timeout = "2s"
allowed_networks = ["127.0.0.0/8"]
"#;

/// The relay binary against `url`, as the tests run it: webhooks to
/// loopback allowed, the metrics listener on a free port, killed with the
/// test. Callers add the subcommand and their own settings (a later `env`
/// of the same name wins).
pub fn relay_command(url: &str) -> tokio::process::Command {
    relay_command_of(&relay_bin(), url)
}

/// [`relay_command`] for another build of the relay (an older version).
pub fn relay_command_of(bin: &std::path::Path, url: &str) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(bin);
    cmd.env("DATABASE_URL", url)
        .env(
            "OUTBOX_RELAY__WEBHOOK__ALLOWED_NETWORKS",
            "[\"127.0.0.0/8\"]",
        )
        .env("OUTBOX_RELAY__RELAY__METRICS_ADDR", "\"127.0.0.1:0\"")
        .kill_on_drop(true);
    cmd
}

/// Start `outbox-relay run` as a separate process.
pub fn spawn_relay(db: &TestDb, config: &std::path::Path, name: &str) -> tokio::process::Child {
    relay_command(&db.url)
        .arg("run")
        .env("OUTBOX_RELAY_CONFIG", config)
        .env("OUTBOX_RELAY__RELAY__NAME", format!("\"{name}\""))
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .expect("spawn relay")
}

/// SIGTERM a child and wait for it.
pub async fn terminate(child: &mut tokio::process::Child) -> std::process::ExitStatus {
    if let Some(pid) = child.id() {
        let _ = std::process::Command::new("kill")
            .arg("-TERM")
            .arg(pid.to_string())
            .status();
    }
    tokio::time::timeout(Duration::from_secs(15), child.wait())
        .await
        .expect("relay exits after SIGTERM")
        .expect("wait")
}

/// Files under `dir` with extension `ext` ("" for none), skipping build
/// output, virtual environments and dependencies.
pub fn files_under(dir: &std::path::Path, ext: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if path.is_dir() {
                if !["target", "node_modules", ".venv", "__pycache__"].contains(&name.as_ref()) {
                    todo.push(path);
                }
            } else if match path.extension() {
                Some(e) => e == ext,
                None => ext.is_empty(),
            } {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// `run --once` must return: a wedged completer never lets it.
pub async fn run_once_within(db: &TestDb, cfg: &outbox_relay::config::Config, limit: Duration) {
    tokio::time::timeout(limit, engine(db.store.clone(), cfg).run_once())
        .await
        .expect("run --once returned (the completer is not wedged)")
        .expect("run --once");
}

/// Tuples of `outbox.intent_log` read so far by the transaction on `conn`
/// (index fetches and sequential reads of its segments,
/// `pg_stat_xact_user_tables`): what a read of the log cost, whatever the
/// plan.
pub async fn log_tuples_fetched(conn: &mut sqlx::PgConnection) -> i64 {
    sqlx::query_scalar(
        "SELECT coalesce(sum(coalesce(idx_tup_fetch, 0) + coalesce(seq_tup_read, 0)), 0)::bigint
           FROM pg_stat_xact_user_tables
          WHERE relid IN (SELECT inhrelid FROM pg_inherits
                           WHERE inhparent = 'outbox.intent_log'::regclass)",
    )
    .fetch_one(conn)
    .await
    .unwrap()
}

//! The engine: wires the claim loop, the delivery tasks, the completer, the
//! listener and the sweeper together, runs them under one supervisor, and
//! shuts them down in order.
//!
//! Dependencies run one way: `transition` ← `dispatch` (the [`Deliverer`],
//! handed the [`ClaimBudget`] and the completion [`Sink`]) ← `claim` and
//! `sweeper` ← `engine`. Each part owns what it needs; the engine builds
//! them and hands each the rest.

pub mod budget;
pub mod claim;
pub mod complete;
pub mod dispatch;
pub mod due;
pub mod reconcile;
pub mod room;
pub mod settle;
pub mod standbys;
pub mod supervisor;
pub mod sweeper;
pub mod transition;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use outbox_providers::ProviderSet;
use tokio::sync::{watch, Notify};

use crate::config::{Config, RetrySection};
use crate::kinds::Kind;
use crate::observe::readiness::Health;
use crate::store::{ClaimQuery, Store};
use budget::ClaimBudget;
use claim::{Claimer, Mode};
use complete::{Gauges, Sink};
use dispatch::Deliverer;
use standbys::Standbys;
use supervisor::{Service, Supervisor};
use sweeper::Sweeper;

pub use complete::{BatchCounts, Batches};

/// The providers of the kinds `config` serves (webhook and event always;
/// each other kind when its section says where to deliver), each built by
/// its kind's module with what `cx` gives it of the database
/// (`services::subscriptions::context`). An
/// [`outbox_providers::Error::Config`] in the error chain means the
/// configuration is at fault.
pub fn providers(config: &Config, cx: &crate::kinds::Context) -> anyhow::Result<ProviderSet> {
    let mut set = ProviderSet::new();
    for kind in Kind::ALL {
        if let Some(provider) = config.section(kind).provider(cx)? {
            set = set.with(provider);
        }
    }
    Ok(set)
}

/// The engine's settings, taken from [`Config`].
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Written on every claim; appears in `outbox.attempts.owner`.
    owner: String,
    concurrency: usize,
    batch_size: usize,
    lease: Duration,
    poll_interval: Duration,
    /// LISTEN for enqueue notifications (else poll only).
    listen: bool,
    sweep_interval: Duration,
    shutdown_timeout: Duration,
    /// How often the daemon logs its summary line (zero: never).
    summary_interval: Duration,
    /// The longest one attempt may take (the providers' timeouts): a claim
    /// with less lease than this left is handed back rather than started.
    max_attempt_time: Duration,
    /// Each kind's attempt budget (its provider timeout; reconcile
    /// searches run within it).
    attempt_times: HashMap<String, Duration>,
    retry: RetrySection,
    /// Rate limits, breakers and alerts per destination.
    health: crate::config::HealthSettings,
    /// Spans of attempts (off unless the daemon starts an export).
    tracer: crate::observe::trace::Tracer,
    /// Standbys that must have flushed an intent's commit before its
    /// effect (0: off).
    wait_for_standbys: usize,
    /// The standbys that count, by application_name (`relay.standby_names`;
    /// None: every walsender but an archiver's or a base backup's).
    standby_names: Option<Vec<String>>,
}

impl EngineConfig {
    pub fn from_config(config: &Config) -> Self {
        let r = &config.relay;
        EngineConfig {
            owner: r.name.clone().unwrap_or_else(default_owner),
            concurrency: r.concurrency as usize,
            batch_size: r.batch_size as usize,
            lease: r.lease.0,
            poll_interval: r.poll_interval.0,
            listen: r.listen,
            sweep_interval: r.sweep_interval.0,
            shutdown_timeout: r.shutdown_timeout.0,
            summary_interval: r.summary_interval.0,
            max_attempt_time: config.longest_attempt(),
            // every provider call of an attempt (a charge may search,
            // reconcile, before and after its POST) runs within its kind's
            attempt_times: Kind::ALL
                .into_iter()
                .map(|k| (k.name().to_string(), config.section(k).attempt_time()))
                .collect(),
            retry: config.retry.clone(),
            // checked when the configuration was loaded
            health: config.health().unwrap_or_else(|e| {
                tracing::error!(error = %format!("{e:#}"), "destination health is misconfigured; limits and breakers are off");
                crate::config::HealthSettings::default()
            }),
            tracer: crate::observe::trace::Tracer::off(),
            wait_for_standbys: r.wait_for_standbys as usize,
            standby_names: r.standby_names.clone(),
        }
    }

    /// With a span of every attempt exported through `tracer` (the
    /// daemon's `[telemetry]`); without, no spans.
    pub fn with_tracer(mut self, tracer: crate::observe::trace::Tracer) -> Self {
        self.tracer = tracer;
        self
    }

    /// With this bound on one attempt instead of the providers' longest
    /// timeout: a claim with less lease left is handed back, not started.
    pub fn with_max_attempt_time(mut self, max: Duration) -> Self {
        self.max_attempt_time = max;
        self
    }

    /// The name this relay writes on its claims.
    pub fn owner(&self) -> &str {
        &self.owner
    }
}

/// `host:pid:random`, unique per process.
pub fn default_owner() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "relay".into());
    format!("{host}:{}:{:04x}", std::process::id(), fastrand::u16(..))
}

/// One relay's delivery engine.
pub struct Engine {
    cfg: EngineConfig,
    /// The wait for standbys before each effect (`relay.wait_for_standbys`).
    standbys: Arc<Standbys>,
    store: Store,
    claimer: Arc<Claimer>,
    sweeper: Arc<Sweeper>,
    budget: Arc<ClaimBudget>,
    /// The kinds this relay delivers.
    kinds: Vec<&'static str>,
    completer: Option<tokio::task::JoinHandle<()>>,
    /// The completer's statement in progress, tally and statement counts.
    gauges: Gauges,
    stop_tx: watch::Sender<bool>,
    stop_rx: watch::Receiver<bool>,
}

impl Engine {
    pub fn new(store: Store, providers: ProviderSet, cfg: EngineConfig) -> Engine {
        let kinds = providers.kinds();
        let unserved: Vec<String> = Kind::names()
            .into_iter()
            .filter(|k| !kinds.contains(k))
            .map(|k| k.to_string())
            .collect();
        let (stop_tx, stop_rx) = watch::channel(false);
        let budget = Arc::new(ClaimBudget::new(cfg.concurrency, cfg.batch_size));
        let gauges = Gauges::default();
        let (sink, completer): (Sink, _) = complete::start(
            store.clone(),
            cfg.owner.clone(),
            cfg.batch_size.max(cfg.concurrency),
            gauges.clone(),
        );
        let settings = dispatch::Settings {
            lease: cfg.lease,
            max_attempt_time: cfg.max_attempt_time,
            attempt_times: cfg.attempt_times.clone(),
            policies: Kind::names()
                .into_iter()
                .map(|k| (k.to_string(), cfg.retry.policy(k)))
                .collect::<HashMap<_, _>>(),
            default_policy: cfg.retry.policy("*"),
        };
        let gate = Arc::new(crate::services::health::Gate::new(
            cfg.health.clone(),
            store.clone(),
            cfg.owner.clone(),
            cfg.max_attempt_time,
        ));
        let standbys = Standbys::new(
            cfg.wait_for_standbys,
            cfg.standby_names.clone(),
            store.clone(),
            cfg.owner.clone(),
        );
        let deliverer = Arc::new(
            Deliverer::new(
                providers,
                settings,
                cfg.concurrency,
                budget.clone(),
                sink,
                store.clone(),
                stop_rx.clone(),
            )
            .with_gate(gate)
            .with_tracer(cfg.tracer.clone())
            .with_standbys(standbys.clone()),
        );
        let claimer = Arc::new(Claimer {
            store: store.clone(),
            query: ClaimQuery::new(cfg.batch_size as i64, &unserved)
                .with_wal_mark(cfg.wait_for_standbys > 0),
            owner: cfg.owner.clone(),
            lease: cfg.lease,
            poll_interval: cfg.poll_interval,
            unserved: unserved.clone(),
            budget: budget.clone(),
            deliverer: deliverer.clone(),
            batches: gauges.batches.clone(),
            standbys: standbys.clone(),
        });
        let sweeper = Arc::new(Sweeper {
            store: store.clone(),
            owner: cfg.owner.clone(),
            lease: cfg.lease,
            unserved,
            interval: cfg.sweep_interval,
            budget: budget.clone(),
            deliverer,
        });
        Engine {
            cfg,
            standbys,
            store,
            claimer,
            sweeper,
            budget,
            kinds,
            completer: Some(completer),
            gauges,
            stop_tx,
            stop_rx,
        }
    }

    pub fn owner(&self) -> &str {
        &self.cfg.owner
    }

    /// The claim and completion statement counts, live (they keep counting
    /// while the engine runs).
    pub fn batch_counts(&self) -> Arc<BatchCounts> {
        self.gauges.batches.clone()
    }

    /// The stop signal the engine's tasks watch: services handed to
    /// [`Engine::run_with`] stop on it too.
    pub fn stop_signal(&self) -> watch::Receiver<bool> {
        self.stop_rx.clone()
    }

    /// [`Engine::run_with`] without side services or a health endpoint.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
        self.run_with(shutdown, Vec::new(), Arc::new(Health::default()))
            .await
    }

    /// Run until `shutdown` resolves, or until one of the relay's tasks dies
    /// or gets stuck. The engine's own tasks (claim loop, completer,
    /// sweeper, listener, heartbeat, summary) and `services` run under one
    /// [`Supervisor`]. Then: stop claiming, let deliveries in flight finish
    /// within `shutdown_timeout`, write their completions, and return —
    /// an error naming the task when the stop was a failure (the process
    /// exits non-zero). Deliveries still running at the deadline are
    /// abandoned: their leases expire and the sweeper reconciles them.
    pub async fn run_with(
        mut self,
        shutdown: impl Future<Output = ()>,
        services: Vec<Service>,
        health: Arc<Health>,
    ) -> anyhow::Result<()> {
        if self.register().await {
            health.registered.store(true, Ordering::SeqCst);
        }
        let mut sup = Supervisor::new(self.stop_rx.clone());
        self.start_tasks(&mut sup, &health);
        for service in services {
            sup.start(service);
        }
        tracing::info!(
            owner = %self.cfg.owner,
            kinds = %self.kinds.join(","),
            concurrency = self.cfg.concurrency,
            tasks = %sup.names().join(","),
            "relay running"
        );
        let failure = tokio::select! {
            _ = shutdown => None,
            why = sup.failure() => Some(why),
        };
        match &failure {
            Some(why) => {
                health.fail(why);
                tracing::error!(problem = %why, "the relay is broken: stopping (handing back what it can) and exiting non-zero");
            }
            None => {
                tracing::info!("shutting down: no new claims; waiting for deliveries in flight")
            }
        }
        health.shutting_down.store(true, Ordering::SeqCst);
        let _ = self.stop_tx.send(true);
        let deadline = self.cfg.shutdown_timeout;
        let store = self.store.clone();
        let owner = self.cfg.owner.clone();
        self.finish().await;
        let late = sup.join(deadline).await;
        if !late.is_empty() {
            tracing::warn!(tasks = %late.join(","), "tasks still running at the shutdown deadline were stopped");
        }
        if let Err(err) = store.deregister_relay(&owner).await {
            tracing::debug!(error = %err, "could not mark this relay stopped in outbox.relays");
        }
        match failure {
            Some(why) => Err(anyhow::anyhow!("the relay stopped because {why}")),
            None => {
                tracing::info!("stopped");
                Ok(())
            }
        }
    }

    /// Start the relay's own tasks under `sup`: the listener, the sweeper,
    /// the claim loop, the standby watcher, the heartbeat, the summary, and
    /// the completer with its check.
    fn start_tasks(&mut self, sup: &mut Supervisor, health: &Arc<Health>) {
        let stop = self.stop_rx.clone();
        let wake = Arc::new(Notify::new());
        sup.start(Service::new(
            "listener",
            claim::listen(
                self.store.clone(),
                self.cfg.owner.clone(),
                self.cfg.listen,
                self.cfg.poll_interval,
                wake.clone(),
                stop.clone(),
            ),
        ));
        let sweeper = self.sweeper.clone();
        let sweeper_stop = stop.clone();
        sup.start(Service::new("sweeper", async move {
            sweeper.run(sweeper_stop).await
        }));
        let claimer = self.claimer.clone();
        let claim_stop = stop.clone();
        sup.start(Service::new("claim loop", async move {
            // in Mode::Serve claim errors are retried, never returned
            let _ = claimer.run(wake, claim_stop, Mode::Serve).await;
        }));
        let standbys = self.standbys.clone();
        let standbys_stop = stop.clone();
        sup.start(Service::new("standby watcher", async move {
            standbys.run(standbys_stop).await
        }));
        sup.start(Service::new(
            "heartbeat",
            heartbeat(
                self.store.clone(),
                self.cfg.owner.clone(),
                self.kinds.clone(),
                health.clone(),
                stop.clone(),
            ),
        ));
        if !self.cfg.summary_interval.is_zero() {
            sup.start(Service::new(
                "summary",
                summary(
                    self.store.clone(),
                    self.gauges.tally.clone(),
                    self.cfg.summary_interval,
                    stop.clone(),
                ),
            ));
        }
        if let Some(completer) = self.completer.take() {
            sup.adopt("completer", completer);
        }
        let progress = self.gauges.progress.clone();
        let lease = self.cfg.lease;
        sup.check(
            "completer",
            Box::new(move || {
                progress
                    .statement_age()
                    .filter(|age| *age > lease)
                    .map(|age| {
                        format!(
                            "one completion statement has been running for {age:.0?}, longer than \
                         the lease ({lease:?}); a lock held elsewhere?"
                        )
                    })
            }),
        );
    }

    /// Put this relay in `outbox.relays` (kinds it serves and knows).
    async fn register(&self) -> bool {
        match self
            .store
            .register_relay(&self.cfg.owner, VERSION, &self.kinds, &Kind::names())
            .await
        {
            Ok(()) => true,
            Err(err) => {
                tracing::warn!(error = %err, "could not register in outbox.relays; will retry with the heartbeat");
                false
            }
        }
    }

    /// Deliver everything due now (including expired leases, and retries
    /// whose delay has already passed when they are written), wait for every
    /// completion, return. Retries scheduled for later stay pending. The
    /// claim loop of the daemon, in [`Mode::Drain`].
    pub async fn run_once(self) -> anyhow::Result<()> {
        let (watcher_stop, stop) = watch::channel(false);
        let watcher = tokio::spawn(self.standbys.clone().run(stop.clone()));
        let drained = async {
            self.sweeper.tick().await?;
            self.claimer
                .run(Arc::new(Notify::new()), stop, Mode::Drain)
                .await
        }
        .await;
        if let Err(err) = drained {
            let _ = watcher_stop.send(true);
            return Err(err.into());
        }
        self.finish().await;
        let _ = watcher_stop.send(true);
        let _ = watcher.await;
        Ok(())
    }

    /// Wait (within `shutdown_timeout`) for every claim to come back, then
    /// for the completer to write what it holds.
    async fn finish(mut self) {
        let deadline = self.cfg.shutdown_timeout;
        if tokio::time::timeout(deadline, self.budget.all_back())
            .await
            .is_err()
        {
            let left = self.budget.held();
            tracing::warn!(left, "deliveries still running at the shutdown deadline are abandoned; their leases will expire and the sweeper will reconcile them");
        }
        let completer = self.completer.take();
        // The completer ends once every sink is dropped: the claim loop's
        // and the sweeper's deliverer (here, and in their tasks, which end
        // on the stop) and the delivery tasks'.
        drop(self);
        // Under `run_with` the supervisor holds the completer and waits for
        // it; bound the wait in case the database stays unreachable.
        if let Some(completer) = completer {
            if tokio::time::timeout(deadline, completer).await.is_err() {
                tracing::warn!("completions could not be written before the deadline; the sweeper will reconcile those intents");
            }
        }
    }
}

/// Log one line every `every`: what was written since the last line and
/// the backlog (the intents pending, due or scheduled), so that a daemon
/// at the default level says what it does. Quiet while nothing happens
/// and nothing waits.
async fn summary(
    store: Store,
    tally: Arc<complete::Tally>,
    every: Duration,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let c = tally.take();
        let backlog = store.pending_count().await.ok();
        if c == complete::Counts::default() && backlog.unwrap_or(0) == 0 {
            continue;
        }
        tracing::info!(
            delivered = c.delivered,
            failed = c.rejected + c.dead,
            rejected = c.rejected,
            dead = c.dead,
            ambiguous = c.ambiguous,
            retried = c.retried,
            replays = c.replays,
            fenced = c.fenced,
            backlog = %backlog.map_or_else(|| "?".to_string(), |n| n.to_string()),
            "summary of the last {every:?}"
        );
    }
}

/// This binary's version, as `relays` shows it.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// How often a relay beats its heartbeat in `outbox.relays`.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(10);

/// Beat the heartbeat until the stop (an upsert: a row that went, or a
/// registration that failed at start, comes back), and forget relays
/// silent for a day.
async fn heartbeat(
    store: Store,
    owner: String,
    kinds: Vec<&'static str>,
    health: Arc<Health>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        // a relay whose registration failed at start retries it soon
        let every = if health.registered.load(Ordering::SeqCst) {
            HEARTBEAT_EVERY
        } else {
            Duration::from_secs(1)
        };
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let beat = async {
            store
                .register_relay(&owner, VERSION, &kinds, &Kind::names())
                .await?;
            health.registered.store(true, Ordering::SeqCst);
            store.forget_silent_relays().await
        };
        if let Err(err) = beat.await {
            tracing::debug!(error = %err, "heartbeat failed; will try again");
        }
    }
}

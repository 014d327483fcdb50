//! The engine: wires the claim loop, the delivery tasks, the completer, the
//! listener and the sweeper together, and shuts them down in order.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use outbox_providers::{ProviderSet, KNOWN_KINDS};
use tokio::sync::{mpsc, watch, Notify, Semaphore};

use crate::config::{Config, RetrySection};
use crate::metrics::Health;
use crate::store::{ClaimQuery, Claimed, Store};
use crate::supervisor::{Service, Supervisor};
use crate::transition::RetryPolicy;
use crate::{claim, complete, dispatch, sweeper};

/// The engine's settings, taken from [`Config`].
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Written on every claim; appears in `outbox.attempts.owner`.
    pub owner: String,
    pub concurrency: usize,
    pub batch_size: usize,
    pub lease: Duration,
    pub poll_interval: Duration,
    /// LISTEN for enqueue notifications (else poll only).
    pub listen: bool,
    pub sweep_interval: Duration,
    pub shutdown_timeout: Duration,
    /// How often the daemon logs its summary line (zero: never).
    pub summary_interval: Duration,
    /// The longest one attempt may take (the providers' timeouts): a claim
    /// with less lease than this left is handed back rather than started.
    pub max_attempt_time: Duration,
    /// Each kind's attempt budget (its provider timeout; reconcile
    /// searches run within it).
    pub attempt_times: HashMap<String, Duration>,
    pub retry: RetrySection,
}

impl EngineConfig {
    /// The budget dispatch holds one attempt of `kind` to (reconcile
    /// searches included).
    pub fn attempt_budget(&self, kind: &str) -> Duration {
        self.attempt_times.get(kind).copied().unwrap_or(self.lease)
    }

    /// The longest one attempt of `kind` may take.
    pub fn attempt_time(&self, kind: &str) -> Duration {
        self.attempt_times
            .get(kind)
            .copied()
            .unwrap_or(self.max_attempt_time)
            .min(self.max_attempt_time)
    }

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
            attempt_times: KNOWN_KINDS
                .iter()
                .map(|k| (k.to_string(), config.attempt_time(k)))
                .collect(),
            retry: config.retry.clone(),
        }
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

/// How many statements the engine's claims and completions took and how
/// many intents they carried: intents per statement is what the database's
/// cost per intent depends on most (the README's ceiling by batch size).
/// Also exported as the histograms `outbox_claim_batch_size` and
/// `outbox_completion_batch_size`.
#[derive(Debug, Default)]
pub struct BatchCounts {
    claims: AtomicU64,
    claimed: AtomicU64,
    writes: AtomicU64,
    written: AtomicU64,
}

/// A reading of [`BatchCounts`].
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Batches {
    /// Claim statements that claimed at least one intent, and those intents.
    pub claims: u64,
    pub claimed: u64,
    /// Completion statements, and the completions they wrote.
    pub writes: u64,
    pub written: u64,
}

impl Batches {
    /// Mean intents per claim statement (0 when none claimed anything).
    pub fn per_claim(&self) -> f64 {
        self.claimed as f64 / self.claims.max(1) as f64
    }

    /// Mean completions per completion statement (0 when none was written).
    pub fn per_write(&self) -> f64 {
        self.written as f64 / self.writes.max(1) as f64
    }
}

impl BatchCounts {
    /// A claim statement returned `n` intents (an empty claim is not counted).
    pub fn claimed(&self, n: usize) {
        if n > 0 {
            self.claims.fetch_add(1, Ordering::Relaxed);
            self.claimed.fetch_add(n as u64, Ordering::Relaxed);
            metrics::histogram!("outbox_claim_batch_size").record(n as f64);
        }
    }

    /// A completion statement wrote `n` completions.
    pub fn written(&self, n: usize) {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.written.fetch_add(n as u64, Ordering::Relaxed);
        metrics::histogram!("outbox_completion_batch_size").record(n as f64);
    }

    /// The counts so far.
    pub fn read(&self) -> Batches {
        Batches {
            claims: self.claims.load(Ordering::Relaxed),
            claimed: self.claimed.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            written: self.written.load(Ordering::Relaxed),
        }
    }
}

/// What every task of one engine shares.
pub struct Ctx {
    pub store: Store,
    pub providers: ProviderSet,
    pub cfg: EngineConfig,
    /// Known kinds this relay has no provider for: left for other relays.
    pub unserved: Vec<String>,
    /// The claim statement, built once: a claim takes at most `batch_size`.
    pub claim_query: ClaimQuery,
    /// Statements and rows of claims and completions.
    pub batches: Arc<BatchCounts>,
    /// One permit per intent this relay holds a claim on, from the claim
    /// until its completion is written: the claim budget
    /// (`concurrency + 3 × batch_size`: the effects in flight, one claim's
    /// worth queued for a slot, one waiting for the completer and one being
    /// written), so claiming, delivering and completing overlap while the
    /// number of claims held stays bounded. With only one `batch_size` of
    /// room, completions waiting to be written held the permits the next
    /// claim needed: claims shrank to about 40 intents and completions to
    /// about 27, and the drain ran at 12.4–13.0k/s against 16.5–16.6k/s
    /// with three (alternating bench runs, 16 in flight, batch_size 100).
    pub claims: Arc<Semaphore>,
    pub claim_budget: usize,
    /// Permits only the sweeper takes (`batch_size / 4`, at least 1): under a
    /// steady backlog the claim loop takes every freed claim permit first,
    /// and the leases of a relay that died must not wait for the backlog.
    pub recovery: Arc<Semaphore>,
    pub recovery_budget: usize,
    /// Claims waiting for a delivery slot.
    pub queued: AtomicUsize,
    /// Signalled when `queued` falls below `concurrency`: deliveries are
    /// about to run out of work, claim now.
    pub queue_low: Notify,
    /// One permit per effect in progress (`relay.concurrency`).
    pub in_flight: Arc<Semaphore>,
    /// Turns true when shutdown begins: claims not yet started are handed back.
    pub stopping: watch::Receiver<bool>,
    pub completions: mpsc::UnboundedSender<complete::Pending>,
    policies: HashMap<String, RetryPolicy>,
    default_policy: RetryPolicy,
    /// Signalled whenever a delivery task finishes.
    pub task_done: Notify,
}

impl Ctx {
    pub fn retry_policy(&self, kind: &str) -> &RetryPolicy {
        self.policies.get(kind).unwrap_or(&self.default_policy)
    }

    /// At least `concurrency` claims wait for a delivery slot: claim no more
    /// until the queue runs low, so at most `concurrency + batch_size` wait
    /// with their lease running.
    pub fn queue_full(&self) -> bool {
        self.queued.load(Ordering::SeqCst) >= self.cfg.concurrency
    }

    pub fn lease_ms(&self) -> i64 {
        self.cfg.lease.as_millis() as i64
    }

    pub async fn claim(&self, n: usize) -> Result<Vec<Claimed>, sqlx::Error> {
        let claims = self
            .store
            .claim_with(
                &self.claim_query,
                &self.cfg.owner,
                n as i64,
                self.lease_ms(),
            )
            .await?;
        self.batches.claimed(claims.len());
        Ok(claims)
    }

    /// Hand back claims that will not be worked on (shutdown).
    pub async fn release(&self, claims: &[Claimed]) {
        let ids: Vec<(i64, i64)> = claims.iter().map(|c| (c.id, c.fence)).collect();
        match self.store.release(&ids).await {
            Ok(n) => tracing::info!(n, "handed back claims not yet started"),
            Err(err) => {
                tracing::warn!(error = %err, "could not hand back claims; their leases will expire")
            }
        }
    }

    /// How long to sleep when caught up: the poll interval, or less when a
    /// scheduled retry is due sooner.
    pub async fn idle_wait(&self) -> Duration {
        let poll = self.cfg.poll_interval;
        match self.store.next_due_in(&self.unserved).await {
            Ok(Some(secs)) if secs.is_finite() => {
                Duration::from_secs_f64(secs.max(0.0)).clamp(Duration::from_millis(5), poll)
            }
            _ => poll,
        }
    }

    fn idle(&self) -> bool {
        self.claims.available_permits() == self.claim_budget
            && self.recovery.available_permits() == self.recovery_budget
    }
}

/// One relay's delivery engine.
pub struct Engine {
    ctx: Arc<Ctx>,
    completer: Option<tokio::task::JoinHandle<()>>,
    /// The completer's statement in progress, for the supervisor.
    progress: Arc<complete::Progress>,
    /// What the completer wrote since the last summary line.
    tally: Arc<complete::Tally>,
    stop_tx: watch::Sender<bool>,
}

impl Engine {
    pub fn new(store: Store, providers: ProviderSet, cfg: EngineConfig) -> Engine {
        let served = providers.kinds();
        let unserved: Vec<String> = KNOWN_KINDS
            .iter()
            .filter(|k| !served.contains(k))
            .map(|k| k.to_string())
            .collect();
        let claim_query = ClaimQuery::new(cfg.batch_size as i64, &unserved);
        let policies = KNOWN_KINDS
            .iter()
            .map(|k| (k.to_string(), cfg.retry.policy(k)))
            .collect();
        let (tx, rx) = mpsc::unbounded_channel();
        let (stop_tx, stop_rx) = watch::channel(false);
        let claim_budget = cfg.concurrency + 3 * cfg.batch_size;
        let recovery_budget = (cfg.batch_size / 4).max(1);
        let batches = Arc::new(BatchCounts::default());
        let progress = Arc::new(complete::Progress::default());
        let tally = Arc::new(complete::Tally::default());
        let completer = tokio::spawn(complete::run(
            store.clone(),
            cfg.owner.clone(),
            rx,
            cfg.batch_size.max(cfg.concurrency),
            batches.clone(),
            progress.clone(),
            tally.clone(),
        ));
        let ctx = Arc::new(Ctx {
            claims: Arc::new(Semaphore::new(claim_budget)),
            claim_budget,
            recovery: Arc::new(Semaphore::new(recovery_budget)),
            recovery_budget,
            queued: AtomicUsize::new(0),
            queue_low: Notify::new(),
            in_flight: Arc::new(Semaphore::new(cfg.concurrency)),
            stopping: stop_rx,
            default_policy: cfg.retry.policy("*"),
            policies,
            unserved,
            claim_query,
            batches,
            store,
            providers,
            cfg,
            completions: tx,
            task_done: Notify::new(),
        });
        Engine {
            ctx,
            completer: Some(completer),
            progress,
            tally,
            stop_tx,
        }
    }

    pub fn owner(&self) -> &str {
        &self.ctx.cfg.owner
    }

    /// The claim and completion statement counts, live (they keep counting
    /// while the engine runs).
    pub fn batch_counts(&self) -> Arc<BatchCounts> {
        self.ctx.batches.clone()
    }

    /// The stop signal the engine's tasks watch: services handed to
    /// [`Engine::run_with`] stop on it too.
    pub fn stop_signal(&self) -> watch::Receiver<bool> {
        self.ctx.stopping.clone()
    }

    /// [`Engine::run_with`] without side services or a health endpoint.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
        self.run_with(shutdown, Vec::new(), Arc::new(Health::default()))
            .await
    }

    /// Run until `shutdown` resolves, or until one of the relay's tasks dies
    /// or gets stuck. The engine's own tasks (claim loop, completer,
    /// sweeper, listener, heartbeat) and `services` run under one
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
        let ctx = self.ctx.clone();
        let stop_rx = ctx.stopping.clone();
        let wake = Arc::new(Notify::new());
        self.register().await;
        let mut sup = Supervisor::new(stop_rx.clone());
        sup.start(Service::new(
            "listener",
            claim::listen(ctx.clone(), wake.clone(), stop_rx.clone()),
        ));
        sup.start(Service::new(
            "sweeper",
            sweeper::run(ctx.clone(), stop_rx.clone()),
        ));
        sup.start(Service::new(
            "claim loop",
            claim::run(ctx.clone(), wake, stop_rx.clone()),
        ));
        sup.start(Service::new(
            "heartbeat",
            heartbeat(
                ctx.store.clone(),
                ctx.cfg.owner.clone(),
                ctx.providers.kinds(),
                stop_rx.clone(),
            ),
        ));
        if let Some(completer) = self.completer.take() {
            sup.adopt("completer", completer);
        }
        let progress = self.progress.clone();
        let lease = ctx.cfg.lease;
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
        if !ctx.cfg.summary_interval.is_zero() {
            sup.start(Service::new(
                "summary",
                summary(
                    ctx.store.clone(),
                    self.tally.clone(),
                    ctx.cfg.summary_interval,
                    stop_rx.clone(),
                ),
            ));
        }
        for service in services {
            sup.start(service);
        }
        tracing::info!(
            owner = %ctx.cfg.owner,
            kinds = ?ctx.providers.kinds(),
            concurrency = ctx.cfg.concurrency,
            tasks = ?sup.names(),
            "relay running"
        );
        drop(ctx);
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
        let deadline = self.ctx.cfg.shutdown_timeout;
        let store = self.ctx.store.clone();
        let owner = self.ctx.cfg.owner.clone();
        self.finish().await?;
        let late = sup.join(deadline).await;
        if !late.is_empty() {
            tracing::warn!(tasks = ?late, "tasks still running at the shutdown deadline were stopped");
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

    /// Put this relay in `outbox.relays` (kinds it serves and knows).
    async fn register(&self) {
        let kinds = self.ctx.providers.kinds();
        if let Err(err) = self
            .ctx
            .store
            .register_relay(&self.ctx.cfg.owner, VERSION, &kinds, KNOWN_KINDS)
            .await
        {
            tracing::warn!(error = %err, "could not register in outbox.relays; will retry with the heartbeat");
        }
    }

    /// Deliver everything due now (including expired leases, and retries
    /// whose delay has already passed when they are written), wait for every
    /// completion, return. Retries scheduled for later stay pending.
    pub async fn run_once(self) -> anyhow::Result<()> {
        let ctx = &self.ctx;
        sweeper::tick(ctx).await?;
        let (_never, mut stop) = watch::channel(false);
        loop {
            // as the claim loop does
            while ctx.queue_full() {
                ctx.queue_low.notified().await;
            }
            let idle_before = ctx.idle();
            let mut permits = claim::take_permits(&ctx.claims, ctx.cfg.batch_size, &mut stop)
                .await
                .expect("not stopped");
            let claims = ctx.claim(permits.len()).await?;
            if claims.is_empty() {
                drop(permits);
                if idle_before {
                    break;
                }
                ctx.task_done.notified().await;
                continue;
            }
            for claim in claims {
                let permit = permits.pop().expect("one permit per claim");
                dispatch::spawn(ctx, claim, permit);
            }
        }
        self.finish().await
    }

    async fn finish(mut self) -> anyhow::Result<()> {
        let deadline = self.ctx.cfg.shutdown_timeout;
        let all_back = async {
            let _ = self
                .ctx
                .claims
                .acquire_many(self.ctx.claim_budget as u32)
                .await;
            let _ = self
                .ctx
                .recovery
                .acquire_many(self.ctx.recovery_budget as u32)
                .await;
        };
        if tokio::time::timeout(deadline, all_back).await.is_err() {
            let left = (self.ctx.claim_budget - self.ctx.claims.available_permits())
                + (self.ctx.recovery_budget - self.ctx.recovery.available_permits());
            tracing::warn!(left, "deliveries still running at the shutdown deadline are abandoned; their leases will expire and the sweeper will reconcile them");
        }
        drop(self.ctx);
        // The completer ends once every task has dropped its sender; bound the
        // wait in case the database stays unreachable. (Under `run_with` the
        // supervisor holds it and waits for it.)
        if let Some(completer) = self.completer.take() {
            if tokio::time::timeout(deadline, completer).await.is_err() {
                tracing::warn!("completions could not be written before the deadline; the sweeper will reconcile those intents");
            }
        }
        Ok(())
    }
}

/// Log one line every `every`: what was written since the last line and
/// the backlog, so that a daemon at the default level says what it does.
/// Quiet while nothing happens and nothing waits.
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
        let backlog = store.due_count().await.ok();
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
    mut stop: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(HEARTBEAT_EVERY) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let beat = async {
            store
                .register_relay(&owner, VERSION, &kinds, KNOWN_KINDS)
                .await?;
            store.forget_silent_relays().await
        };
        if let Err(err) = beat.await {
            tracing::debug!(error = %err, "heartbeat failed; will try again");
        }
    }
}

//! `relay.wait_for_standbys`: an intent's effect is performed only after
//! its commit is flushed on that many streaming standbys, so that a
//! failover to one of them cannot lose an intent whose effect happened.
//! Only the walsenders a failover may promote count: those named in
//! `relay.standby_names`, or, when it is unset, every physical walsender
//! but a WAL archiver's (`pg_receivewal`, `barman_receive_wal`) or a base
//! backup's (`pg_basebackup`), told by their application_name.
//!
//! The claim statement returns the server's WAL insert position and
//! timeline with each intent: the intent's commit lies behind it (the claim
//! saw the intent). A delivery waits until the standbys' flushed positions
//! on that timeline reach it; on another timeline (a standby was promoted)
//! the claim is handed back. One watcher per relay reads the positions every few milliseconds
//! while deliveries wait and once a second otherwise, and publishes the
//! N-th highest. Waiting takes no delivery slot; a claim whose lease runs
//! short while it waits is handed back unattempted. When deliveries have
//! waited past [`HELD_UP_AFTER`], the relay says so (a log line, the
//! `outbox_standby_waits` gauge, its row in `outbox.relays` that `stats`
//! and the console read) and claims nothing more until the standbys catch
//! up.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{watch, Notify};

use crate::store::standbys::StandbyPositions;
use crate::store::{Store, WalMark};

/// How long deliveries may wait before the relay calls the standbys held up.
pub const HELD_UP_AFTER: Duration = Duration::from_secs(1);

/// How often the watcher reads the positions while deliveries wait.
const READ_EVERY_WAITING: Duration = Duration::from_millis(5);

/// How often it reads them while deliveries are held up.
const READ_EVERY_HELD_UP: Duration = Duration::from_millis(100);

/// How often it reads them otherwise (for the gauges and the log).
const READ_EVERY_IDLE: Duration = Duration::from_secs(1);

/// What the watcher last read.
#[derive(Debug, Clone, Copy, Default)]
struct Reading {
    /// The server's timeline (None until read).
    timeline: Option<i32>,
    /// The N-th highest flushed position; -1 while fewer than N stream.
    reached: i64,
    streaming: usize,
}

/// One relay's wait for its standbys.
pub struct Standbys {
    /// `relay.wait_for_standbys` (0: off).
    need: usize,
    /// `relay.standby_names` (None: every walsender but an archiver's or a
    /// base backup's).
    names: Option<Vec<String>>,
    store: Store,
    owner: String,
    reading: watch::Sender<Reading>,
    /// True while deliveries are held up: the claim loop waits.
    held_up: watch::Sender<bool>,
    waiting: AtomicUsize,
    /// Wakes the watcher when a delivery starts waiting.
    wake: Notify,
    /// When a wait last ended with the standbys in step, or deliveries
    /// began to wait after none did: held up when that is long ago and
    /// deliveries wait.
    moved_at: Mutex<Instant>,
    /// The furthest mark of a wait that gave up (its claim was handed
    /// back): the relay stays held up until the standbys reach it.
    unmet: Mutex<Option<WalMark>>,
    /// When the wait was last written to `outbox.relays`.
    reported_at: Mutex<Option<Instant>>,
}

impl Standbys {
    pub fn new(
        need: usize,
        names: Option<Vec<String>>,
        store: Store,
        owner: String,
    ) -> Arc<Standbys> {
        Arc::new(Standbys {
            need,
            names,
            store,
            owner,
            reading: watch::channel(Reading {
                timeline: None,
                reached: -1,
                streaming: 0,
            })
            .0,
            held_up: watch::channel(false).0,
            waiting: AtomicUsize::new(0),
            wake: Notify::new(),
            moved_at: Mutex::new(Instant::now()),
            unmet: Mutex::new(None),
            reported_at: Mutex::new(None),
        })
    }

    /// No waiting: `relay.wait_for_standbys = 0`.
    pub fn off(store: Store) -> Arc<Standbys> {
        Standbys::new(0, None, store, String::new())
    }

    /// `relay.wait_for_standbys` (0: deliveries do not wait).
    pub fn needed(&self) -> usize {
        self.need
    }

    /// Wait until `need` standbys have flushed `target`, the claim's mark.
    /// False when `give_up` resolves first, or when the server now on the
    /// other end is on another timeline (a standby was promoted: what the
    /// old primary had may be lost): the caller hands the claim back, and
    /// the intent, if the new primary has it, is claimed again there.
    pub async fn wait(
        &self,
        target: Option<WalMark>,
        give_up: impl std::future::Future<Output = ()>,
    ) -> bool {
        if self.need == 0 {
            return true;
        }
        let Some(target) = target else {
            tracing::warn!(
                "a claim without a WAL position cannot wait for standbys; handing it back"
            );
            return false;
        };
        let mut reading = self.reading.subscribe();
        let settled = |r: &Reading| {
            r.timeline.is_some_and(|t| t != target.timeline)
                || (r.timeline == Some(target.timeline) && r.reached >= target.position)
        };
        if !settled(&reading.borrow()) {
            if self.waiting.fetch_add(1, Ordering::SeqCst) == 0 {
                self.moved();
            }
            self.wake.notify_one();
            let done = tokio::select! {
                r = reading.wait_for(settled) => r.is_ok(),
                _ = give_up => false,
            };
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            if !done {
                let mut unmet = self.unmet.lock().unwrap_or_else(|e| e.into_inner());
                match *unmet {
                    Some(m) if m.timeline == target.timeline && m.position >= target.position => {}
                    _ => *unmet = Some(target),
                }
                return false;
            }
            self.moved();
        }
        let r = *reading.borrow();
        if r.timeline != Some(target.timeline) {
            // the watcher says so once per timeline
            tracing::debug!(
                claimed_on_timeline = target.timeline,
                "claimed on another timeline: handing the claim back unattempted"
            );
            return false;
        }
        true
    }

    fn moved(&self) {
        *self.moved_at.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    /// Wait while deliveries are held up (the claim loop calls this before
    /// it claims); false when `stop` turned true.
    pub async fn until_in_step(&self, stop: &mut watch::Receiver<bool>) -> bool {
        let mut held = self.held_up.subscribe();
        tokio::select! {
            r = held.wait_for(|h| !*h) => r.is_ok(),
            _ = stop.wait_for(|s| *s) => false,
        }
    }

    /// The watcher: reads the standbys' positions until `stop`.
    pub async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        // a wait reported by an earlier process under the same name is over
        self.report(Reading::default(), 0, None).await;
        if self.need == 0 {
            // a deployment with a standby to fail over to is told once
            if let Ok(p) = self.store.standby_positions(self.names.as_deref()).await {
                if p.streaming > 0 {
                    tracing::warn!(
                        streaming = p.streaming,
                        "this database has streaming standbys and relay.wait_for_standbys is 0: \
                         an effect can be performed for an intent that a failover to a standby \
                         then loses; set relay.wait_for_standbys = 1 to wait for one"
                    );
                }
            }
            let _ = stop.wait_for(|s| *s).await;
            return;
        }
        let mut hidden_said = false;
        let mut failing_said = false;
        let mut ignored_said: Vec<String> = Vec::new();
        loop {
            match self.store.standby_positions(self.names.as_deref()).await {
                Ok(p) => {
                    failing_said = false;
                    if p.ignored != ignored_said {
                        if !p.ignored.is_empty() {
                            tracing::info!(
                                ignored = ?p.ignored,
                                "walsenders streaming WAL that relay.wait_for_standbys does not \
                                 count (application_name not in relay.standby_names, or, with it \
                                 unset, a WAL archiver's or a base backup's): a failover cannot \
                                 promote them"
                            );
                        }
                        ignored_said = p.ignored.clone();
                    }
                    if p.hidden > 0 && p.streaming == 0 && !hidden_said {
                        hidden_said = true;
                        tracing::error!(
                            walsenders = p.hidden,
                            "relay.wait_for_standbys: this server has walsenders whose state \
                             outbox.standby_flush_positions() may not read: its owner (the role \
                             that ran migrate) needs superuser or pg_read_all_stats"
                        );
                    }
                    self.publish(&p);
                }
                Err(err) => {
                    if !failing_said {
                        failing_said = true;
                        tracing::warn!(error = %err, "cannot read the standbys' positions; deliveries wait");
                    }
                }
            }
            self.check_held_up().await;
            let every = if *self.held_up.borrow() {
                READ_EVERY_HELD_UP
            } else if self.waiting.load(Ordering::SeqCst) > 0 {
                READ_EVERY_WAITING
            } else {
                READ_EVERY_IDLE
            };
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = self.wake.notified() => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }

    fn publish(&self, p: &StandbyPositions) {
        let before = self.reading.borrow().timeline;
        if before.is_some_and(|t| t != p.timeline) {
            tracing::warn!(
                from = before.unwrap_or_default(),
                to = p.timeline,
                "the database is on a new timeline (a standby was promoted): claims made on the \
                 old one are handed back unattempted, since the old primary's last commits may \
                 be lost"
            );
        }
        let reached = p.flushed.get(self.need - 1).copied().unwrap_or(-1);
        let streaming = p.streaming.max(0) as usize;
        metrics::gauge!("outbox_standbys_streaming").set(streaming as f64);
        self.reading.send_replace(Reading {
            timeline: Some(p.timeline),
            reached,
            streaming,
        });
    }

    /// Note when deliveries began to wait, say when they are held up and
    /// when they resume, and report it.
    async fn check_held_up(&self) {
        let waiting = self.waiting.load(Ordering::SeqCst);
        let reading = *self.reading.borrow();
        metrics::gauge!("outbox_standby_waits").set(waiting as f64);
        let unmet = {
            let mut unmet = self.unmet.lock().unwrap_or_else(|e| e.into_inner());
            let reached = unmet.is_some_and(|m| {
                reading.timeline.is_some_and(|t| t != m.timeline) || reading.reached >= m.position
            });
            if reached {
                *unmet = None;
                self.moved();
            }
            unmet.is_some()
        };
        let moved_at = *self.moved_at.lock().unwrap_or_else(|e| e.into_inner());
        let held = (waiting > 0 || unmet) && moved_at.elapsed() >= HELD_UP_AFTER;
        let since = held.then_some(moved_at);
        let was = *self.held_up.borrow();
        if held == was {
            // while it lasts, the count of waiting deliveries moves
            if held && self.report_due() {
                self.report(reading, waiting, since).await;
            }
            return;
        }
        self.held_up.send_replace(held);
        metrics::gauge!("outbox_standbys_held_up").set(if held { 1.0 } else { 0.0 });
        if held {
            tracing::warn!(
                wait_for_standbys = self.need,
                streaming = reading.streaming,
                waiting,
                "deliveries wait: fewer than relay.wait_for_standbys standbys have flushed their \
                 intents' commits; nothing more is claimed until they catch up (an effect \
                 performed now could be lost by a failover)"
            );
        } else {
            tracing::info!(
                streaming = reading.streaming,
                "deliveries are no longer held up by the standbys"
            );
        }
        self.report(reading, waiting, since).await;
    }

    /// At most one report a second while deliveries are held up.
    fn report_due(&self) -> bool {
        let last = self.reported_at.lock().unwrap_or_else(|e| e.into_inner());
        last.is_none_or(|t| t.elapsed() >= READ_EVERY_IDLE)
    }

    async fn report(&self, reading: Reading, waiting: usize, since: Option<Instant>) {
        *self.reported_at.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        let held_for = since.map(|s| s.elapsed().as_secs_f64());
        if let Err(err) = self
            .store
            .report_standby_wait(
                &self.owner,
                self.need as i32,
                reading.timeline.map(|_| reading.streaming as i32),
                waiting as i32,
                held_for,
            )
            .await
        {
            tracing::debug!(error = %err, "could not record the standby wait in outbox.relays");
        }
    }
}

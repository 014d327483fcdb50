//! The webhook provider's view of subscriptions: a delivery's URL, and its
//! headers and signing secrets, opened with the relay's sealing key.
//!
//! A subscription's target is kept for [`KEEP`] after it is read, and
//! forgotten as soon as any subscription changes: the table's trigger
//! notifies `outbox_subscriptions`, which a connection of the directory's
//! own listens on. A rotation, a disable or a removal thus applies to the
//! deliveries that start after its commit is heard (milliseconds), and at
//! the latest [`KEEP`] after it. Where the relay does not LISTEN
//! (`relay.listen = false`, a transaction pooler) or its listening
//! connection is down, every delivery reads the row.
//!
//! The rows read at once are read together: a task takes every read
//! waiting, reads their rows in one statement and answers each. While
//! there are at most [`ALL_AT_ONCE`] subscriptions, that statement reads
//! them all and keeps every target, so the first deliveries of an event
//! to a thousand subscriptions make one statement, not a thousand.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use outbox_providers::webhook::subscription::{self, Refusal, Target};

use tokio::sync::{mpsc, oneshot};

use crate::config::SealingKey;
use crate::store::subscriptions::TargetRow;
use crate::store::Store;

/// The most rows one read of the directory reads by id.
const READ_AT_ONCE: usize = 500;

/// The most subscriptions a read reads whole.
const ALL_AT_ONCE: i64 = 10_000;

/// How long after a whole read found more than [`ALL_AT_ONCE`] the next
/// tries again.
const ALL_AGAIN: Duration = Duration::from_secs(60);

type Read = (String, oneshot::Sender<Result<Option<TargetRow>, String>>);

/// How long a target read is used at most.
pub const KEEP: Duration = Duration::from_secs(2);

/// The channel the subscriptions' trigger notifies.
pub const CHANNEL: &str = "outbox_subscriptions";

#[derive(Default)]
struct Cache {
    targets: Mutex<HashMap<String, (Instant, Target)>>,
    /// The listening connection is up: a change would be heard.
    listening: AtomicBool,
}

impl Cache {
    fn forget(&self) {
        self.targets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }
}

pub struct Directory {
    store: Store,
    key: SealingKey,
    cache: Arc<Cache>,
    /// Ends the listening task when the directory is dropped.
    closed: Arc<tokio::sync::Notify>,
    /// Keep targets (and start the listening task on first use).
    caching: bool,
    started: AtomicBool,
    /// The reading task's queue, made on the first read (the task needs
    /// the runtime); the task ends with the directory.
    reads: std::sync::OnceLock<mpsc::UnboundedSender<Read>>,
}

impl Directory {
    /// `listen`: whether the relay may LISTEN (`relay.listen`); without it
    /// nothing is kept.
    pub fn new(store: Store, key: SealingKey, listen: bool) -> Directory {
        Directory {
            store,
            key,
            cache: Arc::default(),
            closed: Arc::default(),
            caching: listen,
            started: AtomicBool::new(false),
            reads: std::sync::OnceLock::new(),
        }
    }

    /// The row of subscription `id`, read with the others asked for at
    /// once.
    async fn row(&self, id: &str) -> Result<Option<TargetRow>, String> {
        let reads = self.reads.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            let cache = self.caching.then(|| self.cache.clone());
            tokio::spawn(read_rows(self.store.clone(), self.key.clone(), cache, rx));
            tx
        });
        let (answer, answered) = oneshot::channel();
        reads
            .send((id.to_string(), answer))
            .map_err(|_| "the directory's reading task has ended".to_string())?;
        answered
            .await
            .map_err(|_| "the directory's reading task ended".to_string())?
    }

    fn kept(&self, id: &str) -> Option<Target> {
        if !self.caching || !self.cache.listening.load(Ordering::Acquire) {
            return None;
        }
        let targets = self.cache.targets.lock().unwrap_or_else(|p| p.into_inner());
        targets
            .get(id)
            .filter(|(at, _)| at.elapsed() < KEEP)
            .map(|(_, t)| t.clone())
    }

    async fn read(&self, id: &str) -> Result<Target, Refusal> {
        let row = self
            .row(id)
            .await
            .map_err(|e| Refusal::Unavailable(format!("subscription {id}: {e}")))?
            .ok_or_else(|| Refusal::Gone(format!("subscription {id} was removed")))?;
        open(&self.key, id, row)
    }
}

/// A subscription's target from its row, opened with `key`; the refusal
/// of a delivery to it otherwise.
fn open(key: &SealingKey, id: &str, row: TargetRow) -> Result<Target, Refusal> {
    if row.disabled_at.is_some() {
        return Err(Refusal::Gone(format!(
            "subscription {id} is disabled{}: a replay sends its events once it is enabled",
            row.disabled_reason
                .map(|r| format!(" ({r})"))
                .unwrap_or_default()
        )));
    }
    let mut secrets = vec![key.open(id, &row.secret).map_err(Refusal::Unsigned)?];
    if let Some(previous) = &row.previous_secret {
        secrets.push(key.open(id, previous).map_err(Refusal::Unsigned)?);
    }
    // headers that do not open refuse the delivery, as a secret does: it
    // is never sent without them
    let headers = match &row.headers_sealed {
        Some(sealed) => key.open_headers(id, sealed).map_err(Refusal::Unsigned)?,
        None if row.headers_in_clear => {
            return Err(Refusal::Unavailable(format!(
                "subscription {id}'s headers are not sealed yet: a relay started with \
                 subscriptions.secret_key seals them"
            )))
        }
        None => Default::default(),
    };
    Ok(Target {
        url: row.url,
        headers,
        secrets,
    })
}

/// Answer the reads waiting, up to [`READ_AT_ONCE`] a statement, until the
/// directory is dropped. While the subscriptions are few (at most
/// [`ALL_AT_ONCE`]), a read reads them all and keeps every target it
/// opens (where `cache` is kept at all): the first deliveries of an event
/// to a thousand subscriptions then make one statement.
async fn read_rows(
    store: Store,
    key: SealingKey,
    cache: Option<Arc<Cache>>,
    mut reads: mpsc::UnboundedReceiver<Read>,
) {
    // when the last read of every subscription found too many (none yet)
    let mut too_many: Option<Instant> = None;
    while let Some(first) = reads.recv().await {
        let mut batch = vec![first];
        while batch.len() < READ_AT_ONCE {
            match reads.try_recv() {
                Ok(read) => batch.push(read),
                Err(_) => break,
            }
        }
        // (only while a change would be heard: what it reads is kept)
        let listening = cache
            .as_ref()
            .is_some_and(|c| c.listening.load(Ordering::Acquire));
        let all = listening && too_many.is_none_or(|at| at.elapsed() >= ALL_AGAIN);
        let read = if all {
            store.every_subscription_target(ALL_AT_ONCE + 1).await
        } else {
            store.subscription_targets(&ids_of(&batch)).await
        };
        let rows = match read {
            Ok(rows) => rows,
            Err(err) => {
                answer_all(batch, Err(err.to_string()));
                continue;
            }
        };
        if all && rows.len() > ALL_AT_ONCE as usize {
            // too many to read whole: these reads by id, and the next
            // whole read a while later
            too_many = Some(Instant::now());
            let rows = store.subscription_targets(&ids_of(&batch)).await;
            answer_all(batch, rows.map_err(|e| e.to_string()));
            continue;
        }
        if all {
            too_many = None;
            if let Some(cache) = &cache {
                let now = Instant::now();
                let opened: Vec<(String, Target)> = rows
                    .iter()
                    .filter_map(|(id, row)| {
                        open(&key, id, row.clone()).ok().map(|t| (id.clone(), t))
                    })
                    .collect();
                let mut targets = cache.targets.lock().unwrap_or_else(|p| p.into_inner());
                for (id, target) in opened {
                    targets.insert(id, (now, target));
                }
            }
        }
        answer_all(batch, Ok(rows));
    }
}

/// The subscriptions these reads ask for, each once.
fn ids_of(batch: &[Read]) -> Vec<String> {
    let mut ids: Vec<String> = batch.iter().map(|(id, _)| id.clone()).collect();
    ids.sort();
    ids.dedup();
    ids
}

/// Answer each read from `rows` (a subscription missing was removed).
fn answer_all(batch: Vec<Read>, rows: Result<Vec<(String, TargetRow)>, String>) {
    match rows {
        Ok(rows) => {
            let rows: HashMap<String, TargetRow> = rows.into_iter().collect();
            for (id, answer) in batch {
                let _ = answer.send(Ok(rows.get(&id).cloned()));
            }
        }
        Err(err) => {
            for (_, answer) in batch {
                let _ = answer.send(Err(err.clone()));
            }
        }
    }
}

impl Drop for Directory {
    fn drop(&mut self) {
        // (a permit, should the task not be waiting yet)
        self.closed.notify_one();
    }
}

/// Forget every kept target whenever a subscription changes, and while
/// the listening connection is down; ends when the directory is dropped.
async fn watch(store: Store, cache: Weak<Cache>, closed: Arc<tokio::sync::Notify>) {
    tokio::select! {
        _ = closed.notified() => {}
        _ = listen(store, cache) => {}
    }
}

async fn listen(store: Store, cache: Weak<Cache>) {
    loop {
        let listener = store.listen(CHANNEL).await;
        let Some(c) = cache.upgrade() else { return };
        let mut listener = match listener {
            Ok(l) => l,
            Err(e) => {
                c.listening.store(false, Ordering::Release);
                tracing::warn!(error = %e, "cannot LISTEN for subscription changes; reading each delivery's subscription");
                drop(c);
                tokio::time::sleep(Duration::from_secs(5)).await;
                continue;
            }
        };
        c.forget();
        c.listening.store(true, Ordering::Release);
        drop(c);
        loop {
            let heard = listener.recv().await;
            let Some(c) = cache.upgrade() else { return };
            c.forget();
            match heard {
                Ok(Some(_)) => {}
                // reconnected: what was missed meanwhile is forgotten above
                Ok(None) => {}
                Err(_) => {
                    c.listening.store(false, Ordering::Release);
                    break;
                }
            }
        }
    }
}

#[async_trait::async_trait]
impl subscription::Directory for Directory {
    async fn target(&self, id: &str) -> Result<Target, Refusal> {
        if self.caching && !self.started.swap(true, Ordering::AcqRel) {
            tokio::spawn(watch(
                self.store.clone(),
                Arc::downgrade(&self.cache),
                self.closed.clone(),
            ));
        }
        if let Some(target) = self.kept(id) {
            return Ok(target);
        }
        let target = self.read(id).await?;
        if self.caching {
            self.cache
                .targets
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id.to_string(), (Instant::now(), target.clone()));
        }
        Ok(target)
    }
}

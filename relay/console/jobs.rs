//! Bulk actions: a change applied to everything a filter matched at its
//! dry run, in batches, in the background, with progress to look at.
//!
//! A job is fixed to the intents its dry run counted and walks them in id
//! order, one short statement per batch, so it never holds a lock for long
//! and never touches an intent twice. An intent of the set that left the
//! filter since is skipped (and counted as skipped); one that joined the
//! filter after the dry run is not in the set.
//! Reloading its page only reads its progress; submitting the same
//! confirmation twice finds the job the first started (each confirmation
//! carries a one-time nonce). If the console stops mid-way, the job stops
//! between two batches: every batch done is committed and recorded, and
//! the same filter's dry run counts what is left.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::store::console::Search;
use crate::store::operator::Change;
use crate::store::Store;

/// Jobs remembered (finished ones are forgotten, oldest first, past it).
const KEPT: usize = 200;

/// A bulk action's progress.
#[derive(Debug, Clone, Serialize)]
pub struct Job {
    pub id: u64,
    /// "retry", "retry as a new effect", "cancel", "resolve as delivered", ...
    pub action: String,
    /// The filter, in words.
    pub filter: String,
    /// The filter as a query string, to link back to the intents.
    pub query: String,
    /// The dry run's count.
    pub expected: i64,
    /// Intents changed so far.
    pub changed: u64,
    /// Intents of the dry run's set left alone because they left the filter
    /// (or its states) since the dry run.
    pub skipped: u64,
    pub batches: u64,
    /// running | finished | failed
    pub state: &'static str,
    pub error: Option<String>,
    pub actor: String,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

impl Job {
    /// Percent done, for the progress bar.
    pub fn percent(&self) -> u64 {
        if self.expected <= 0 || self.state != "running" {
            return 100;
        }
        ((self.changed + self.skipped) * 100 / self.expected as u64).min(100)
    }
}

#[derive(Debug, Default)]
struct State {
    jobs: Vec<Job>,
    nonces: HashMap<String, u64>,
    next: u64,
}

/// The console's jobs.
#[derive(Debug, Clone, Default)]
pub struct Jobs {
    state: Arc<Mutex<State>>,
}

/// What a job does.
pub struct Plan {
    pub search: Search,
    pub change: Change,
    /// The intents the dry run counted, in id order.
    pub ids: Arc<Vec<i64>>,
    pub expected: i64,
    pub action: String,
    pub filter: String,
    pub query: String,
    pub batch: usize,
}

impl Jobs {
    fn lock(&self) -> MutexGuard<'_, State> {
        // its holders only touch plain fields: nothing is left half-changed
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Start `plan` as `store`'s actor, unless `nonce` started one already:
    /// the job's id either way.
    pub fn start(&self, store: Store, plan: Plan, nonce: &str) -> u64 {
        let mut state = self.lock();
        if let Some(&id) = state.nonces.get(nonce) {
            return id;
        }
        state.next += 1;
        let id = state.next;
        state.nonces.insert(nonce.to_string(), id);
        state.jobs.push(Job {
            id,
            action: plan.action.clone(),
            filter: plan.filter.clone(),
            query: plan.query.clone(),
            expected: plan.expected,
            changed: 0,
            skipped: 0,
            batches: 0,
            state: "running",
            error: None,
            actor: store.actor().unwrap_or("").to_string(),
            started_at: Utc::now(),
            finished_at: None,
        });
        while state.jobs.len() > KEPT {
            let Some(pos) = state.jobs.iter().position(|j| j.state != "running") else {
                break;
            };
            let gone = state.jobs.remove(pos).id;
            state.nonces.retain(|_, v| *v != gone);
        }
        drop(state);
        let jobs = self.clone();
        tokio::spawn(async move { jobs.run(id, store, plan).await });
        id
    }

    async fn run(&self, id: u64, store: Store, plan: Plan) {
        let mut batches = plan.ids.chunks(plan.batch.max(1));
        loop {
            let chunk = batches.next();
            let step = match chunk {
                Some(ids) => store
                    .change_selected(&plan.search, &plan.change, ids)
                    .await
                    .map(Some),
                None => Ok(None),
            };
            let mut state = self.lock();
            let Some(job) = state.jobs.iter_mut().find(|j| j.id == id) else {
                return;
            };
            match step {
                Ok(Some(changed)) => {
                    job.changed += changed;
                    job.skipped += chunk.map_or(0, |c| c.len() as u64).saturating_sub(changed);
                    job.batches += 1;
                }
                Ok(None) => {
                    job.state = "finished";
                    job.finished_at = Some(Utc::now());
                    tracing::info!(
                        job = id,
                        action = %job.action,
                        changed = job.changed,
                        skipped = job.skipped,
                        actor = %job.actor,
                        "console bulk action finished"
                    );
                    return;
                }
                Err(e) => {
                    job.state = "failed";
                    job.error = Some(format!(
                        "{e}; {} changed before it stopped: run the same filter's dry run to see what is left",
                        job.changed
                    ));
                    job.finished_at = Some(Utc::now());
                    tracing::warn!(job = id, error = %e, "console bulk action failed");
                    return;
                }
            }
        }
    }

    /// The job a confirmation's nonce started, if one did.
    pub fn by_nonce(&self, nonce: &str) -> Option<u64> {
        self.lock().nonces.get(nonce).copied()
    }

    pub fn get(&self, id: u64) -> Option<Job> {
        self.lock().jobs.iter().find(|j| j.id == id).cloned()
    }

    /// The newest first.
    pub fn recent(&self, n: usize) -> Vec<Job> {
        self.lock().jobs.iter().rev().take(n).cloned().collect()
    }
}

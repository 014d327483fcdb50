//! The overview's attempt charts, without rereading the past: a bucket
//! that ended more than [`SETTLED`] ago cannot change any more (an attempt
//! row is written when its attempt ends, and no attempt outlives the
//! longest timeout), so its counts are kept, and each refresh reads only
//! the attempts since the oldest bucket not yet kept. The first view of a
//! day with a million attempts reads them once; every later one reads the
//! last few minutes. A lost attempt may still be written long after it
//! started (the sweeper writes it when the lease has expired, later still
//! after a relay outage), so everything kept is forgotten every
//! [`REREAD`] and read again.

use std::collections::BTreeMap;
use std::sync::Mutex;

use chrono::{DateTime, Utc};

use crate::store::console::Bucket;
use crate::store::{Store, StoreError};

/// How long after its end a bucket may still gain attempts.
pub const SETTLED: i64 = 15 * 60;

/// How often the kept buckets are read again from the attempts.
pub const REREAD: std::time::Duration = std::time::Duration::from_secs(300);

/// Settled buckets: (step, start) → (delivered, failed), and when the
/// first of them was kept.
#[derive(Debug, Default)]
pub struct ChartCache {
    kept: Mutex<(Kept, Option<std::time::Instant>)>,
}

/// (step, bucket start) → (delivered, failed).
type Kept = BTreeMap<(i64, i64), (i64, i64)>;

impl ChartCache {
    /// Every bucket of `step` seconds over the last `span` seconds, oldest
    /// first, the current (partial) one last.
    pub async fn buckets(
        &self,
        store: &Store,
        span: i64,
        step: i64,
    ) -> Result<Vec<Bucket>, StoreError> {
        let now = Utc::now().timestamp();
        let last = now.div_euclid(step) * step;
        let first = last - span + step;
        let settled = |start: i64| start + step + SETTLED <= now;
        let from = {
            let mut guard = self.kept.lock().unwrap_or_else(|p| p.into_inner());
            if guard.1.is_some_and(|t| t.elapsed() >= REREAD) {
                *guard = (BTreeMap::new(), None);
            }
            let kept = &guard.0;
            let mut from = first;
            while from <= last && settled(from) && kept.contains_key(&(step, from)) {
                from += step;
            }
            from
        };
        let fresh = store.attempt_counts(from, step).await?;
        let mut guard = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        guard.1.get_or_insert_with(std::time::Instant::now);
        let kept = &mut guard.0;
        let mut at = from;
        let mut fresh_at: BTreeMap<i64, (i64, i64)> = BTreeMap::new();
        for (start, delivered, failed) in fresh {
            fresh_at.insert(start, (delivered, failed));
        }
        while at <= last {
            if settled(at) {
                kept.insert((step, at), fresh_at.get(&at).copied().unwrap_or((0, 0)));
            }
            at += step;
        }
        // forget what no chart shows any more
        kept.retain(|(s, start), _| *s != step || *start >= first);
        let out = (0..)
            .map(|i| first + i * step)
            .take_while(|t| *t <= last)
            .map(|t| {
                let (delivered, failed) = kept
                    .get(&(step, t))
                    .or_else(|| fresh_at.get(&t))
                    .copied()
                    .unwrap_or((0, 0));
                Bucket {
                    at: DateTime::from_timestamp(t, 0).unwrap_or_default(),
                    delivered,
                    failed,
                }
            })
            .collect();
        Ok(out)
    }
}

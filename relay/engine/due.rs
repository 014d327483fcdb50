//! When the retries and deferrals this relay wrote itself come due, so that
//! the claim loop, caught up, sleeps until the first of them rather than
//! the whole poll interval: no NOTIFY announces a retry, and a deferral of
//! half a second must not wait a second for the next poll.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// The most due times remembered; past it the latest are forgotten (the
/// poll interval and the database's next-due answer still find them).
const KEEP: usize = 10_000;

/// A little after the due time, so that the claim finds the row due.
const MARGIN: Duration = Duration::from_millis(2);

#[derive(Debug, Default)]
pub struct Due {
    times: Mutex<BTreeSet<Instant>>,
    /// Signalled when a due time earlier than every other arrives.
    sooner: Notify,
}

impl Due {
    /// A retry or deferral of this relay comes due at `at`.
    pub fn at(&self, at: Instant) {
        let at = at + MARGIN;
        let mut times = self.lock();
        let first = times.first().is_none_or(|t| at < *t);
        times.insert(at);
        if times.len() > KEEP {
            times.pop_last();
        }
        drop(times);
        if first {
            self.sooner.notify_one();
        }
    }

    /// The first due time still ahead, forgetting those already past (the
    /// claim about to be made, or just made, covers them); `now` when some
    /// came due since the last look.
    pub fn next(&self) -> Option<Instant> {
        let now = Instant::now();
        let mut times = self.lock();
        let mut passed = false;
        while times.first().is_some_and(|t| *t <= now) {
            times.pop_first();
            passed = true;
        }
        if passed {
            Some(now)
        } else {
            times.first().copied()
        }
    }

    /// Resolves when a due time earlier than every other arrives.
    pub async fn sooner(&self) {
        self.sooner.notified().await
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeSet<Instant>> {
        self.times.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_first_due_time_ahead_then_now_once_it_passed() {
        let due = Due::default();
        assert_eq!(due.next(), None);
        let t0 = Instant::now();
        due.at(t0 + Duration::from_millis(500));
        due.at(t0 + Duration::from_millis(200));
        assert_eq!(due.next(), Some(t0 + Duration::from_millis(200) + MARGIN));
        tokio::time::advance(Duration::from_millis(300)).await;
        // the 200 ms one passed: claim now, and it is forgotten
        assert_eq!(due.next(), Some(Instant::now()));
        assert_eq!(due.next(), Some(t0 + Duration::from_millis(500) + MARGIN));
    }

    #[tokio::test(start_paused = true)]
    async fn an_earlier_due_time_wakes_the_sleeper_a_later_one_does_not() {
        let due = std::sync::Arc::new(Due::default());
        let t0 = Instant::now();
        due.at(t0 + Duration::from_secs(1));
        // the first one signalled; take that signal
        tokio::time::timeout(Duration::from_millis(1), due.sooner())
            .await
            .unwrap();
        due.at(t0 + Duration::from_secs(2));
        assert!(tokio::time::timeout(Duration::from_millis(1), due.sooner())
            .await
            .is_err());
        due.at(t0 + Duration::from_millis(100));
        assert!(tokio::time::timeout(Duration::from_millis(1), due.sooner())
            .await
            .is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn it_remembers_a_bounded_number() {
        let due = Due::default();
        let t0 = Instant::now() + Duration::from_secs(60);
        for n in 0..(KEEP as u64 + 50) {
            due.at(t0 + Duration::from_millis(n));
        }
        assert_eq!(due.lock().len(), KEEP);
        assert_eq!(due.next(), Some(t0 + MARGIN), "the earliest are kept");
    }
}

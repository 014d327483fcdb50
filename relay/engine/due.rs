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

/// Due times are woken for on a grid this fine: retries spread by jitter
/// over a second wake the claim loop at most 40 times in it, each claim
/// taking all that came due, rather than once per retry.
const GRID: Duration = Duration::from_millis(25);

#[derive(Debug)]
pub struct Due {
    times: Mutex<BTreeSet<Instant>>,
    /// Signalled when a due time earlier than every other arrives.
    sooner: Notify,
    /// Where the grid starts.
    base: Instant,
}

impl Default for Due {
    fn default() -> Self {
        Due {
            times: Mutex::default(),
            sooner: Notify::new(),
            base: Instant::now(),
        }
    }
}

impl Due {
    /// The wake-up for a due time: past it by at least the margin, on the
    /// grid.
    fn on_grid(&self, at: Instant) -> Instant {
        let since = (at + MARGIN).saturating_duration_since(self.base);
        let steps = since.as_nanos().div_ceil(GRID.as_nanos());
        self.base + GRID * u32::try_from(steps).unwrap_or(u32::MAX)
    }

    /// A retry or deferral of this relay comes due at `at`.
    pub fn at(&self, at: Instant) {
        let at = self.on_grid(at);
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
        let first = due.next().unwrap();
        assert!(
            first >= t0 + Duration::from_millis(200) + MARGIN
                && first <= t0 + Duration::from_millis(200) + MARGIN + GRID,
            "a little after the due time"
        );
        tokio::time::advance(Duration::from_millis(300)).await;
        // the 200 ms one passed: claim now, and it is forgotten
        assert_eq!(due.next(), Some(Instant::now()));
        assert_eq!(
            due.next(),
            Some(due.on_grid(t0 + Duration::from_millis(500)))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn due_times_close_together_wake_the_loop_once() {
        let due = Due::default();
        let t0 = Instant::now() + Duration::from_secs(1);
        for n in 0..1000u64 {
            due.at(t0 + Duration::from_micros(n * 1000));
        }
        // a second of due times: one wake-up per step of the grid
        let wakes = due.lock().len();
        assert!(wakes <= 41, "{wakes} wake-ups");
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
            due.at(t0 + GRID * n as u32);
        }
        assert_eq!(due.lock().len(), KEEP);
        assert_eq!(due.next(), Some(due.on_grid(t0)), "the earliest are kept");
    }
}

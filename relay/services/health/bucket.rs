//! The token bucket of a rate-limited destination, shared by every relay
//! in the database (`outbox.take_tokens`); each relay takes tokens in
//! batches of about 50 ms worth and spends them locally.

use std::time::{Duration, Instant};

use super::gate::Gate;
use super::{MAX_WAIT, MIN_WAIT};
use crate::config::health::Rate;

impl Gate {
    /// One token of `dest`'s bucket: a local one, else a batch from the
    /// database.
    pub(super) async fn take_token(&self, dest: &str, rate: &Rate) -> bool {
        {
            let mut local = self.local();
            let t = local.tokens.entry(dest.to_string()).or_default();
            if *t >= 1.0 {
                *t -= 1.0;
                return true;
            }
        }
        let granted = self
            .store
            .take_tokens(dest, rate.per_second, rate.burst, rate.batch())
            .await;
        match granted {
            Ok(n) if n >= 1 => {
                let mut local = self.local();
                *local.tokens.entry(dest.to_string()).or_default() += f64::from(n - 1);
                true
            }
            Ok(_) => false,
            Err(e) => {
                tracing::warn!(error = %e, destination = dest, "cannot take rate-limit tokens; deferring");
                false
            }
        }
    }

    /// When a deferred intent of a limited destination should come back:
    /// the next free slot at the rate (with 3 relays, each spreads its own).
    pub(super) fn slot(&self, dest: &str, rate: &Rate) -> Duration {
        let mut local = self.local();
        let now = Instant::now();
        let step = Duration::from_secs_f64(1.0 / rate.per_second);
        let next = (local
            .next_slot
            .get(dest)
            .copied()
            .filter(|t| *t > now)
            .unwrap_or(now)
            + step)
            .min(now + MAX_WAIT);
        local.next_slot.insert(dest.to_string(), next);
        (next - now).clamp(MIN_WAIT.min(step), MAX_WAIT)
    }
}

//! `[retry]`: attempts per round and the delays between them, per kind.

use std::time::Duration;

use serde::Deserialize;

use crate::kinds::Kind;
use crate::units::Dur;

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryOverride {
    pub max_attempts: Option<u32>,
    pub schedule: Option<Vec<Dur>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetrySection {
    pub max_attempts: u32,
    pub schedule: Vec<Dur>,
    /// Random stretch of each delay, 0.0 to 1.0.
    pub jitter: f64,
    pub webhook: RetryOverride,
    pub email: RetryOverride,
    pub charge: RetryOverride,
}

impl Default for RetrySection {
    fn default() -> Self {
        let d = RetryPolicy::default();
        RetrySection {
            max_attempts: d.max_attempts,
            schedule: d.schedule.into_iter().map(Dur).collect(),
            jitter: d.jitter,
            webhook: RetryOverride::default(),
            email: RetryOverride::default(),
            charge: RetryOverride::default(),
        }
    }
}

impl RetrySection {
    /// The retry policy for one kind: the kind's overrides over the defaults.
    pub fn policy(&self, kind: &str) -> RetryPolicy {
        let none = RetryOverride {
            max_attempts: None,
            schedule: None,
        };
        let o = match Kind::parse(kind) {
            Some(Kind::Webhook) => &self.webhook,
            Some(Kind::Email) => &self.email,
            Some(Kind::Charge) => &self.charge,
            Some(Kind::Nats | Kind::Amqp | Kind::Kafka | Kind::Event) | None => &none,
        };
        RetryPolicy {
            max_attempts: o.max_attempts.unwrap_or(self.max_attempts),
            schedule: o
                .schedule
                .as_ref()
                .unwrap_or(&self.schedule)
                .iter()
                .map(|d| d.0)
                .collect(),
            jitter: self.jitter,
        }
    }
}

/// How often and how patiently one kind is retried.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Attempts per round (an operator retry starts a new round).
    pub max_attempts: u32,
    /// Delay after the 1st, 2nd, ... failed attempt; the last step repeats.
    pub schedule: Vec<Duration>,
    /// Each delay is stretched by a random factor in `[1, 1 + jitter)` so that
    /// a burst of failures does not come back as a burst.
    pub jitter: f64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 10,
            schedule: ["5s", "5m", "30m", "2h", "5h", "10h"]
                .iter()
                .map(|s| humantime::parse_duration(s).expect("valid default"))
                .collect(),
            jitter: 0.2,
        }
    }
}

impl RetryPolicy {
    /// The delay after failed attempt number `attempt` (1-based), before
    /// jitter. An empty schedule retries immediately.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let i = (attempt.max(1) - 1) as usize;
        self.schedule
            .get(i)
            .or(self.schedule.last())
            .copied()
            .unwrap_or(Duration::ZERO)
    }

    /// `base` stretched by `1 + jitter * unit`, with `unit` in `[0, 1)`.
    pub fn jittered(&self, base: Duration, unit: f64) -> Duration {
        base.mul_f64(1.0 + self.jitter * unit.clamp(0.0, 1.0))
    }
}

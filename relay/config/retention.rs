//! `[retention]`.

use serde::Deserialize;

use crate::units::{dur, Dur};

/// `[retention]`: how long terminal intents and their keys are kept. The
/// ledger retention is the client's retry deadline.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionSection {
    /// Delivered, rejected and cancelled intents are purged this long after
    /// their last change ("0s" disables the daemon's purge).
    pub intents: Dur,
    /// Purge dead intents too.
    pub include_dead: bool,
    /// Purged keys are remembered (duplicate / OB409 / show) this long.
    pub ledger: Dur,
    /// How long a segment of the log takes new intents before the next one
    /// does. An intent delivered at its first attempt leaves with its whole
    /// segment, `intents` after the segment closes: it is kept at least
    /// `intents`, and at most about `intents` plus `segment`.
    pub segment: Dur,
    /// How often the daemon purges.
    pub interval: Dur,
    /// Rows per purge statement.
    pub batch_size: u32,
    /// Pause between purge batches, leaving the database room for deliveries.
    pub batch_pause: Dur,
}

impl Default for RetentionSection {
    fn default() -> Self {
        RetentionSection {
            intents: dur("7d"),
            include_dead: false,
            ledger: dur("90d"),
            segment: dur("1d"),
            interval: dur("1m"),
            batch_size: 500,
            batch_pause: dur("100ms"),
        }
    }
}

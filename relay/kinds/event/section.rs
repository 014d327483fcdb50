//! `[event]`: the expansion of events into deliveries.

use serde::Deserialize;

use crate::units::{dur, Dur};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EventSection {
    /// The budget of one expansion (one statement): past it, its outcome
    /// is unknown and the event is expanded again, which makes no
    /// delivery twice.
    pub timeout: Dur,
}

impl Default for EventSection {
    fn default() -> Self {
        EventSection { timeout: dur("1s") }
    }
}

impl crate::kinds::Section for EventSection {
    /// Every relay expands the events it claims.
    fn serves(&self) -> bool {
        true
    }

    fn attempt_time(&self) -> std::time::Duration {
        self.timeout.0
    }

    fn provider(
        &self,
        cx: &crate::kinds::Context,
    ) -> anyhow::Result<Option<std::sync::Arc<dyn outbox_providers::Provider>>> {
        Ok(cx.events.clone().map(|expander| {
            std::sync::Arc::new(super::EventProvider::new(expander, self.timeout.0))
                as std::sync::Arc<dyn outbox_providers::Provider>
        }))
    }
}

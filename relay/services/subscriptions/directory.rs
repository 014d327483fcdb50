//! The webhook provider's view of subscriptions: a delivery's URL, headers
//! and signing secrets, opened with the relay's sealing key.

use outbox_providers::webhook::subscription::{self, Refusal, Target};

use crate::config::SealingKey;
use crate::store::Store;

/// Reads a subscription's row at each delivery, so a rotation, a disable
/// or a removal applies to the next delivery after it.
pub struct Directory {
    store: Store,
    key: SealingKey,
}

impl Directory {
    pub fn new(store: Store, key: SealingKey) -> Directory {
        Directory { store, key }
    }
}

#[async_trait::async_trait]
impl subscription::Directory for Directory {
    async fn target(&self, id: &str) -> Result<Target, Refusal> {
        let row = self
            .store
            .subscription_target(id)
            .await
            .map_err(|e| Refusal::Unavailable(format!("subscription {id}: {e}")))?
            .ok_or_else(|| Refusal::Gone(format!("subscription {id} was removed")))?;
        if row.disabled_at.is_some() {
            return Err(Refusal::Gone(format!(
                "subscription {id} is disabled{}: a replay sends its events once it is enabled",
                row.disabled_reason
                    .map(|r| format!(" ({r})"))
                    .unwrap_or_default()
            )));
        }
        let mut secrets = vec![self.key.open(id, &row.secret).map_err(Refusal::Unsigned)?];
        if let Some(previous) = &row.previous_secret {
            secrets.push(self.key.open(id, previous).map_err(Refusal::Unsigned)?);
        }
        Ok(Target {
            url: row.url,
            headers: row.headers.0,
            secrets,
        })
    }
}

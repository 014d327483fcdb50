//! The expansion of events into their deliveries
//! (`outbox.expand_events`, schema/0031_expand_events_in_batches.sql).

use std::time::Duration;

use super::Store;
use crate::kinds::event::{Expand, ExpandError, Expanded};

#[async_trait::async_trait]
impl Expand for Store {
    /// One statement, a transaction of its own: one round trip of one
    /// pooled connection for the whole batch.
    async fn expand(
        &self,
        events: &[i64],
        budget: Duration,
    ) -> Result<Vec<(i64, Option<Expanded>)>, ExpandError> {
        let expanded = sqlx::query_as::<_, (i64, bool, i32, i32)>(
            "SELECT event_id, is_event, matched, created FROM outbox.expand_events($1)",
        )
        .bind(events)
        .fetch_all(&self.pool);
        let rows = match tokio::time::timeout(budget, expanded).await {
            Ok(Ok(rows)) => rows,
            // the server refused it: rolled back
            Ok(Err(e @ sqlx::Error::Database(_))) | Ok(Err(e @ sqlx::Error::PoolTimedOut)) => {
                return Err(ExpandError::NotDone(format!("expansion: {e}")))
            }
            // sent, and no answer: it may have committed
            Ok(Err(e)) => return Err(ExpandError::Unknown(format!("expansion: {e}"))),
            Err(_) => {
                return Err(ExpandError::Unknown(format!(
                    "the expansion took longer than its budget ({budget:?}, event.timeout) and may still commit"
                )))
            }
        };
        Ok(rows
            .into_iter()
            .map(|(id, is_event, matched, created)| {
                let expanded = is_event.then_some(Expanded {
                    matched: matched.max(0) as u32,
                    created: created.max(0) as u32,
                });
                (id, expanded)
            })
            .collect())
    }
}

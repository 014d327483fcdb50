//! Replay: send a subscription the events of a time window again. One it
//! received goes again under the same `webhook-id` (a replay the receiver
//! dedupes); one it never received (it was disabled, or made later) gets
//! its first delivery. A replay acts on exactly the events it counted.

use anyhow::bail;
use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::store::replay::{Window, SENT_AGAIN};
use crate::store::{Store, StoreError};

/// What a replay of a window does, counted before anything changes.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub subscription: String,
    pub since: DateTime<Utc>,
    pub until: DateTime<Utc>,
    pub event_type: Option<String>,
    /// Events in the window that match the subscription.
    pub events: usize,
    /// Events it never received: each gets its first delivery.
    #[serde(skip)]
    pub first: Vec<i64>,
    pub first_deliveries: usize,
    /// Deliveries it had, sent again under the same key.
    #[serde(skip)]
    pub again: Vec<i64>,
    pub sent_again: usize,
    /// Deliveries pending or in flight: left as they are.
    pub on_their_way: usize,
}

/// Count what replaying `window` would do. The subscription must exist and
/// be enabled: a disabled one's deliveries would be refused.
pub async fn plan(store: &Store, window: Window) -> anyhow::Result<Plan> {
    if window.since >= window.until {
        bail!("--since must be before --until");
    }
    if let Some(p) = &window.event_type {
        super::check_pattern(p).map_err(|e| anyhow::anyhow!("--event-type: {e}"))?;
    }
    let Some(sub) = store
        .subscription(&window.subscription)
        .await
        .map_err(StoreError::from)?
    else {
        return Err(StoreError::NotFound(window.subscription.clone()).into());
    };
    if sub.disabled_at.is_some() {
        bail!(
            "subscription {} is disabled: enable it first (`outbox-relay subscriptions enable {}`), or its deliveries would be refused",
            sub.id,
            sub.id
        );
    }
    let items = store.replay_selection(&window).await?;
    let again_states: Vec<&str> = SENT_AGAIN.iter().map(|s| s.as_str()).collect();
    let mut plan = Plan {
        subscription: window.subscription.clone(),
        since: window.since,
        until: window.until,
        event_type: window.event_type.clone(),
        events: items.len(),
        first: Vec::new(),
        first_deliveries: 0,
        again: Vec::new(),
        sent_again: 0,
        on_their_way: 0,
    };
    for item in items {
        match (item.delivery_id, item.delivery_state.as_deref()) {
            (None, _) => plan.first.push(item.event_id),
            (Some(id), Some(state)) if again_states.contains(&state) => plan.again.push(id),
            (Some(_), _) => plan.on_their_way += 1,
        }
    }
    plan.first_deliveries = plan.first.len();
    plan.sent_again = plan.again.len();
    Ok(plan)
}

/// Do what `plan` counted, and nothing else: (first deliveries made,
/// deliveries sent again). Fewer than counted when some changed meanwhile
/// (a delivery claimed, the subscription disabled).
pub async fn apply(store: &Store, plan: &Plan) -> Result<(u64, u64), StoreError> {
    let made = store
        .replay_first_deliveries(&plan.subscription, &plan.first)
        .await?;
    let again = store.replay_again(&plan.again).await?;
    Ok((made, again))
}

//! The circuit breaker of each destination, shared by every relay: what
//! an attempt's outcome tells about its destination (a failure counts
//! towards opening it, an answer resets it, a 429 slows the destination
//! down), and the one probe an open breaker lets through after its
//! cooldown.

use std::time::{Duration, Instant};

use outbox_providers::Outcome;

use super::gate::{shown, Admit, Gate};
use super::{MAX_WAIT, VIEW_MAX};

impl Gate {
    pub(super) async fn take_probe(&self, dest: &str) -> bool {
        let taken = self
            .store
            .take_probe(dest, &self.owner, self.probe_for + Duration::from_secs(1))
            .await;
        let taken = taken.unwrap_or(false);
        if taken {
            tracing::info!(destination = dest, "probing an open circuit breaker");
            self.forget(dest);
        }
        taken
    }

    /// What the destination did with the attempt the gate let through.
    pub async fn record(&self, admitted: &Admit, outcome: &Outcome) {
        let Admit::Go {
            destination: Some(dest),
            probe,
        } = admitted
        else {
            return;
        };
        let probe = *probe;
        // a 429 or an explicit Retry-After slows the whole destination
        if let Outcome::Transient {
            status,
            retry_after,
            ..
        } = outcome
        {
            if *status == Some(429) || retry_after.is_some() {
                let wait = retry_after.unwrap_or(Duration::from_secs(1)).min(MAX_WAIT);
                if let Err(e) = self.store.slow_destination(dest, wait).await {
                    tracing::warn!(error = %e, destination = %dest, "cannot record a slow-down");
                }
                self.forget(dest);
                if *status == Some(429) && !probe {
                    // alive, only busy: not a failure of the endpoint
                    return;
                }
            }
        }
        let settings = match self.settings.breaker_for(dest) {
            Some(b) => Some(b),
            None if probe => self.settings.probe_settings,
            None => None,
        };
        let Some(breaker) = settings else {
            return;
        };
        let (failed, answered) = shown(outcome);
        let alerts = &self.settings.alerts;
        let result: Result<Option<String>, sqlx::Error> = if failed {
            let reason = outcome.reason().map(|r| clip(r, 500));
            self.store
                .destination_failed(dest, reason.as_deref(), probe, &self.owner, breaker, alerts)
                .await
                .map(Some)
        } else if answered && (probe || self.unhealthy(dest)) {
            self.local().failing.remove(dest);
            self.store
                .destination_succeeded(dest, probe, &self.owner, alerts)
                .await
                .map(Some)
        } else if probe {
            // nothing learned: let the next intent probe
            self.store
                .release_probe(dest, &self.owner)
                .await
                .map(|()| Some("open".to_string()))
        } else {
            Ok(None)
        };
        if failed {
            let mut local = self.local();
            if local.failing.len() < VIEW_MAX as usize || local.failing.contains_key(dest) {
                local.failing.insert(dest.clone(), Instant::now());
            }
        }
        match result {
            Ok(Some(state)) => {
                if probe || state != "closed" {
                    tracing::info!(destination = %dest, state = %state, probe, "destination health changed");
                }
                self.forget(dest);
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(error = %e, destination = %dest, "cannot record destination health")
            }
        }
    }
}

fn clip(text: &str, max: usize) -> String {
    text.chars().take(max).collect()
}

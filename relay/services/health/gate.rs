//! The gate asked before each attempt: may it go now, or wait (paused,
//! breaker open, slowed down, out of tokens)? It keeps a view of the few
//! unhealthy destinations, reread every half second.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use outbox_providers::Outcome;
use serde_json::Value;

use super::{MAX_WAIT, MIN_WAIT, VIEW_MAX};
use crate::config::destinations::destination_of;
use crate::config::health::Rate;
use crate::config::HealthSettings;
use crate::store::destinations::DestinationRow;
use crate::store::Store;

/// How often the gate rereads the unhealthy destinations.
const REFRESH: Duration = Duration::from_millis(500);

/// How often the subscriptions' rates are reread.
const RATES_REFRESH: Duration = Duration::from_secs(5);

/// What the gate says about one attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum Admit {
    /// Go; `probe` when this attempt is the breaker's one probe.
    Go {
        destination: Option<String>,
        probe: bool,
    },
    /// Not now: defer, saying why (`class`: paused, breaker, slow, limit).
    Wait {
        class: &'static str,
        reason: String,
        after: Duration,
    },
}

#[derive(Default)]
pub(super) struct Local {
    /// The unhealthy destinations, by name.
    pub(super) view: HashMap<String, DestinationRow>,
    pub(super) read_at: Option<Instant>,
    /// Rate-limit tokens this relay took and has not spent.
    pub(super) tokens: HashMap<String, f64>,
    /// When the next deferred intent of a limited destination is due back,
    /// so that deferrals come back spread at the rate, not all at once.
    pub(super) next_slot: HashMap<String, Instant>,
    /// Destinations this relay saw fail since their last recorded success,
    /// and when: the next answer resets their count even before the view
    /// shows them. Kept for the failure window, at most [`VIEW_MAX`].
    pub(super) failing: HashMap<String, Instant>,
    /// The subscriptions' own rates (`subscriptions add --rate`), by id.
    pub(super) rates: HashMap<String, Rate>,
    pub(super) rates_read_at: Option<Instant>,
}

/// The relay's view of its destinations' health; see the module docs.
pub struct Gate {
    pub(super) settings: HealthSettings,
    pub(super) store: Store,
    pub(super) owner: String,
    /// The longest attempt: how long a probe may hold the half-open state.
    pub(super) probe_for: Duration,
    local: Mutex<Local>,
    refreshing: tokio::sync::Mutex<()>,
}

impl Gate {
    pub fn new(settings: HealthSettings, store: Store, owner: String, probe_for: Duration) -> Gate {
        Gate {
            settings,
            store,
            owner,
            probe_for,
            local: Mutex::new(Local::default()),
            refreshing: tokio::sync::Mutex::new(()),
        }
    }

    /// The local state. Its holders only touch maps and clocks; a panic
    /// among them would poison it, and the view is only a cache: go on.
    pub(super) fn local(&self) -> std::sync::MutexGuard<'_, Local> {
        self.local.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn settings(&self) -> &HealthSettings {
        &self.settings
    }

    /// The destination of a claim.
    pub fn destination(
        &self,
        kind: &str,
        destination: Option<&str>,
        payload: &Value,
    ) -> Option<String> {
        destination_of(kind, destination, payload, &self.settings.endpoints)
    }

    /// Reread the unhealthy destinations if the view is older than
    /// [`REFRESH`] (one relay task at a time). A database error keeps the
    /// old view.
    async fn refresh(&self) {
        let stale = |l: &Local| l.read_at.is_none_or(|t| t.elapsed() >= REFRESH);
        let unread = {
            let local = self.local();
            if !stale(&local) {
                return;
            }
            local.read_at.is_none()
        };
        // with no view yet (or one just dropped) everyone waits for the read;
        // with a stale one, one task rereads and the others use it
        let _guard = if unread {
            self.refreshing.lock().await
        } else {
            match self.refreshing.try_lock() {
                Ok(guard) => guard,
                Err(_) => return,
            }
        };
        if !stale(&self.local()) {
            return;
        }
        let window = self.settings.failure_window();
        let rows = self.store.read_unhealthy(window, VIEW_MAX).await;
        let rates_due = {
            let mut local = self.local();
            match rows {
                Ok(rows) => {
                    local.failing.retain(|_, at| at.elapsed() < window);
                    local.view = rows.into_iter().map(|r| (r.name.clone(), r)).collect();
                    local.read_at = Some(Instant::now());
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read destination health; keeping the last view");
                    local.read_at = Some(Instant::now());
                }
            }
            local
                .rates_read_at
                .is_none_or(|t| t.elapsed() >= RATES_REFRESH)
        };
        if rates_due {
            let rates = self.store.subscription_rates().await;
            let mut local = self.local();
            local.rates_read_at = Some(Instant::now());
            match rates {
                Ok(rates) => {
                    local.rates = rates
                        .into_iter()
                        .map(|(id, r)| (id, Rate::per_second(r)))
                        .collect();
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read subscriptions' rates; keeping the last")
                }
            }
        }
    }

    /// May an attempt of this intent go now?
    pub async fn admit(&self, kind: &str, destination: Option<&str>, payload: &Value) -> Admit {
        let Some(dest) = self.destination(kind, destination, payload) else {
            return Admit::Go {
                destination: None,
                probe: false,
            };
        };
        self.refresh().await;
        let row = self.local().view.get(&dest).cloned();
        let now = Utc::now();
        let until = |t: Option<DateTime<Utc>>| {
            t.and_then(|t| (t - now).to_std().ok())
                .unwrap_or(Duration::ZERO)
                .clamp(MIN_WAIT, MAX_WAIT)
        };
        let mut probe = false;
        if let Some(row) = &row {
            match row.state.as_str() {
                "paused" => {
                    return Admit::Wait {
                        class: "paused",
                        reason: format!(
                            "destination {dest} is paused by {} since {}; `outbox-relay destinations resume {dest}` resumes it",
                            row.paused_by.as_deref().unwrap_or("an operator"),
                            row.paused_at.map(|t| t.to_rfc3339()).unwrap_or_default()
                        ),
                        // a pause lasts minutes: no need to churn the backlog
                        after: Duration::from_secs(5),
                    };
                }
                "open" | "half_open" => {
                    let due = match row.state.as_str() {
                        "open" => row.next_probe_at.is_none_or(|t| t <= now),
                        _ => row.probe_until.is_none_or(|t| t < now),
                    };
                    if due && self.take_probe(&dest).await {
                        probe = true;
                    } else {
                        let after = match row.state.as_str() {
                            "open" => until(row.next_probe_at),
                            _ => Duration::from_millis(500),
                        };
                        return Admit::Wait {
                            class: "breaker",
                            reason: format!(
                                "the circuit breaker for {dest} is open since {} after {} consecutive failures (last: {}); next probe at {}",
                                row.opened_at.map(|t| t.to_rfc3339()).unwrap_or_default(),
                                row.failures,
                                row.last_error.as_deref().unwrap_or("unknown"),
                                row.next_probe_at.map(|t| t.to_rfc3339()).unwrap_or_default()
                            ),
                            after,
                        };
                    }
                }
                _ => {}
            }
            if let Some(slow) = row.slow_until.filter(|t| *t > now) {
                if !probe {
                    return Admit::Wait {
                        class: "slow",
                        reason: format!(
                            "{dest} asked to slow down (429 or Retry-After) until {}",
                            slow.to_rfc3339()
                        ),
                        after: until(Some(slow)),
                    };
                }
            }
        }
        // (a probe holds the half-open state: it goes, one request past the
        // limit at most, rather than hold the probe while it waits)
        let rate = match self.settings.limits.get(&dest) {
            Some(rate) => Some(rate.clone()),
            None => self.local().rates.get(&dest).cloned(),
        };
        if let Some(rate) = rate.filter(|_| !probe) {
            if !self.take_token(&dest, &rate).await {
                return Admit::Wait {
                    class: "limit",
                    reason: format!("rate limit {} for {dest}", rate.text),
                    after: self.slot(&dest, &rate),
                };
            }
        }
        Admit::Go {
            destination: Some(dest),
            probe,
        }
    }

    /// Drop the cached row, so that the next admit rereads it.
    pub(super) fn forget(&self, dest: &str) {
        let mut local = self.local();
        local.view.remove(dest);
        local.read_at = None;
    }

    /// Has the attempt anything to tell [`Gate::record`]? (Cheap, no I/O:
    /// a healthy destination's delivery has not, and is not recorded.)
    pub fn has_news(&self, admitted: &Admit, outcome: &Outcome) -> bool {
        let Admit::Go {
            destination: Some(dest),
            probe,
        } = admitted
        else {
            return false;
        };
        let (failed, answered) = shown(outcome);
        *probe || failed || (answered && self.unhealthy(dest))
    }

    /// Has `dest` failed lately (so that a success must reset its count)?
    pub(super) fn unhealthy(&self, dest: &str) -> bool {
        let local = self.local();
        local.view.contains_key(dest) || local.failing.contains_key(dest)
    }
}

/// What an outcome shows of its destination: (it failed, it answered). A
/// failure is transient or ambiguous; an answer is a delivery, a refusal it
/// gave (with its status), our credentials refused, or a broker's answer
/// about the one exchange, queue or subject a message goes to (that one is
/// missing or full: the broker is up, and the other messages go on). A
/// rejection without a status may be the relay's own refusal of the
/// payload: it shows nothing.
pub(super) fn shown(outcome: &Outcome) -> (bool, bool) {
    let failed = matches!(
        outcome,
        Outcome::Transient { .. } | Outcome::Ambiguous { .. }
    );
    let answered = matches!(
        outcome,
        Outcome::Delivered { .. }
            | Outcome::Misconfigured { .. }
            | Outcome::TargetUnavailable { .. }
            | Outcome::Rejected {
                status: Some(_),
                ..
            }
    );
    (failed, answered)
}

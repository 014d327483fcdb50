//! Destination health: rate limits held across relays, circuit breakers
//! that recover by themselves, manual pauses, and the operator alerts they
//! raise (schema 0007).
//!
//! A *destination* is where a kind's effects go: a webhook's origin
//! (`scheme://host[:port]`, also for a named endpoint), `smtp`, `charge`,
//! `nats`, `amqp`. Before an attempt the relay asks the [`Gate`]:
//!
//! - paused by an operator, breaker open (no probe due), a 429 still in
//!   force, no token of its rate limit: the intent is *deferred* (pending
//!   again, no attempt spent, `last_error` saying why) until it may go;
//! - an open breaker whose cooldown has passed lets exactly one attempt
//!   through, the probe, claimed in the database by one relay.
//!
//! After the attempt the gate records what the destination did: a
//! transient failure or an ambiguous outcome counts towards opening the
//! breaker; an answer (delivered, or refused on purpose) resets the count
//! and, for the probe, closes it; a 429 or `Retry-After` slows the whole
//! destination. The healthy path costs no database work: the gate reads
//! the few unhealthy destinations every half second and writes only when
//! one fails or recovers, and rate-limited destinations take tokens from
//! their shared bucket in batches of about 50 ms worth.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use chrono::{DateTime, Utc};
use outbox_providers::Outcome;
use serde_json::Value;

use crate::config::Config;
use crate::store::Store;

/// How often the gate rereads the unhealthy destinations.
const REFRESH: Duration = Duration::from_millis(500);
/// The most unhealthy destinations the gate reads and keeps: the paused
/// ones first, then open breakers and slowed destinations, then those that
/// failed lately, the latest first. (Past it, a closed destination's count
/// may miss a reset by a success: it starts anew after the failure window.)
pub const VIEW_MAX: i64 = 10_000;
/// How long a deferred intent waits at least, at most.
const MIN_WAIT: Duration = Duration::from_millis(100);
const MAX_WAIT: Duration = Duration::from_secs(60);

/// A rate: `per_second` tokens a second, holding at most `burst`.
#[derive(Debug, Clone, PartialEq)]
pub struct Rate {
    pub per_second: f64,
    pub burst: f64,
    /// What the operator wrote, for messages.
    pub text: String,
}

impl Rate {
    /// `"50/s"`, `"600/min"`, `"1000/h"` (also `/sec`, `/second`, `/m`,
    /// `/minute`, `/hour`).
    pub fn parse(text: &str) -> Result<Rate, String> {
        let bad = || {
            format!("invalid rate {text:?}: write a count per unit, e.g. \"50/s\", \"600/min\", \"1000/h\"")
        };
        let (n, unit) = text.trim().split_once('/').ok_or_else(bad)?;
        let n: f64 = n.trim().parse().map_err(|_| bad())?;
        let secs = match unit.trim() {
            "s" | "sec" | "second" => 1.0,
            "m" | "min" | "minute" => 60.0,
            "h" | "hour" => 3600.0,
            _ => return Err(bad()),
        };
        if !(n.is_finite() && n > 0.0) {
            return Err(format!("rate {text:?} must be more than zero"));
        }
        let per_second = n / secs;
        if per_second < 1.0 / 86400.0 {
            return Err(format!("rate {text:?} is below one a day"));
        }
        if per_second > 1_000_000.0 {
            return Err(format!("rate {text:?} is above a million per second"));
        }
        Ok(Rate {
            per_second,
            // a tenth of a second's worth, at least one: any 5 s window
            // sees at most 2% more than the rate from the bucket itself
            burst: (per_second / 10.0).max(1.0),
            text: text.trim().to_string(),
        })
    }

    /// Tokens a relay takes from the bucket at once: about 50 ms worth.
    fn batch(&self) -> i32 {
        (self.per_second / 20.0).clamp(1.0, 1000.0) as i32
    }
}

/// When a breaker opens and how it probes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BreakerSettings {
    pub failures: u32,
    pub cooldown: Duration,
    pub max_cooldown: Duration,
}

/// Where operator alerts go.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AlertTarget {
    pub url: Option<String>,
    pub endpoint: Option<String>,
}

/// Destination health as configured: limits, breakers, alerts.
#[derive(Debug, Clone, Default)]
pub struct HealthSettings {
    pub limits: HashMap<String, Rate>,
    /// None: breakers off.
    pub breaker: Option<BreakerSettings>,
    /// The breaker settings a probe is recorded with even where breakers
    /// are off (another relay's breaker opened: its probe must be settled).
    pub probe_settings: Option<BreakerSettings>,
    pub overrides: HashMap<String, BreakerSettings>,
    /// Webhook endpoint names and their origins.
    pub endpoints: HashMap<String, String>,
    pub alerts: AlertTarget,
    pub dead_threshold: Option<u64>,
}

/// The destinations that are not a URL's origin.
pub const NAMED: &[&str] = &["smtp", "charge", "nats", "amqp"];

/// `scheme://host[:port]` of a URL, lowercase, without a default port, an
/// IPv4 address in its dotted form however it was written (`0x7f.1`,
/// `[::ffff:127.0.0.1]`): one destination has one name.
pub fn origin(url: &str) -> Option<String> {
    let mut url = url::Url::parse(url).ok()?;
    if let Some(url::Host::Ipv6(v6)) = url.host() {
        if let Some(v4) = v6.to_ipv4_mapped() {
            url.set_ip_host(std::net::IpAddr::V4(v4)).ok()?;
        }
    }
    let origin = url.origin();
    origin.is_tuple().then(|| origin.ascii_serialization())
}

/// Where an intent's effect goes, or None when the payload does not say
/// (the provider will refuse it).
pub fn destination_of(
    kind: &str,
    destination: Option<&str>,
    payload: &Value,
    endpoints: &HashMap<String, String>,
) -> Option<String> {
    match kind {
        "webhook" => match destination {
            Some(name) => endpoints.get(name).cloned(),
            None => payload.get("url").and_then(Value::as_str).and_then(origin),
        },
        "email" => Some("smtp".into()),
        "charge" | "nats" | "amqp" => Some(kind.into()),
        _ => None,
    }
}

/// A destination as an operator names it (an origin, an endpoint name,
/// `smtp`, ...), as the relay names it.
pub fn canonical(name: &str, endpoints: &HashMap<String, String>) -> Result<String, String> {
    if NAMED.contains(&name) {
        return Ok(name.to_string());
    }
    if let Some(o) = endpoints.get(name) {
        return Ok(o.clone());
    }
    match origin(name) {
        Some(o) if name.contains("://") => Ok(o),
        _ => Err(format!(
            "{name:?} is not a destination: give an origin (https://host[:port]), a webhook endpoint name, or one of {}",
            NAMED.join(", ")
        )),
    }
}

impl HealthSettings {
    pub fn from_config(config: &Config) -> anyhow::Result<HealthSettings> {
        let endpoints: HashMap<String, String> = config
            .webhook
            .endpoints
            .iter()
            .filter_map(|(name, url)| origin(url).map(|o| (name.clone(), o)))
            .collect();
        let mut limits = HashMap::new();
        for (name, rate) in &config.limits {
            let dest = canonical(name, &endpoints).map_err(|e| anyhow::anyhow!("limits: {e}"))?;
            let rate = Rate::parse(rate).map_err(|e| anyhow::anyhow!("limits.{name:?}: {e}"))?;
            if limits.insert(dest.clone(), rate).is_some() {
                bail!("limits: {dest} is limited twice");
            }
        }
        let b = &config.breaker;
        let settings = |o: &crate::config::BreakerOverride| BreakerSettings {
            failures: o.failures.unwrap_or(b.failures),
            cooldown: o.cooldown.map_or(b.cooldown.0, |d| d.0),
            max_cooldown: o.max_cooldown.map_or(b.max_cooldown.0, |d| d.0),
        };
        let check = |what: &str, s: &BreakerSettings| -> anyhow::Result<()> {
            if s.failures == 0 {
                bail!("{what}.failures must be at least 1");
            }
            if s.cooldown < Duration::from_millis(100) {
                bail!("{what}.cooldown must be at least 100ms");
            }
            if s.max_cooldown < s.cooldown {
                bail!("{what}.max_cooldown must be at least its cooldown");
            }
            Ok(())
        };
        let default = settings(&Default::default());
        check("breaker", &default)?;
        let mut overrides = HashMap::new();
        for (name, o) in &b.overrides {
            let dest = canonical(name, &endpoints)
                .map_err(|e| anyhow::anyhow!("breaker.overrides: {e}"))?;
            let s = settings(o);
            check(&format!("breaker.overrides.{name:?}"), &s)?;
            overrides.insert(dest, s);
        }
        let a = &config.alerts;
        if a.url.is_some() && a.endpoint.is_some() {
            bail!("alerts: give url or endpoint, not both");
        }
        if let Some(url) = &a.url {
            outbox_providers::webhook::request::parse_url(url)
                .map_err(|e| anyhow::anyhow!("alerts.url: {e}"))?;
        }
        if let Some(name) = &a.endpoint {
            if !config.webhook.endpoints.contains_key(name) {
                bail!("alerts.endpoint {name:?} is not one of [webhook.endpoints]");
            }
        }
        if a.dead_threshold == Some(0) {
            bail!("alerts.dead_threshold must be at least 1");
        }
        Ok(HealthSettings {
            limits,
            breaker: b.enabled.then_some(default),
            probe_settings: Some(default),
            overrides,
            endpoints,
            alerts: AlertTarget {
                url: a.url.clone(),
                endpoint: a.endpoint.clone(),
            },
            dead_threshold: a.dead_threshold,
        })
    }

    /// How long failures count as consecutive: the longest `max_cooldown`
    /// configured. An older count starts anew (`outbox.destination_failed`)
    /// and is pruned (`outbox.forget_stale_failures`).
    pub fn failure_window(&self) -> Duration {
        self.breaker
            .iter()
            .chain(self.probe_settings.iter())
            .chain(self.overrides.values())
            .map(|b| b.max_cooldown)
            .max()
            .unwrap_or(Duration::from_secs(600))
    }

    fn breaker_for(&self, dest: &str) -> Option<BreakerSettings> {
        self.breaker
            .map(|default| self.overrides.get(dest).copied().unwrap_or(default))
    }
}

/// A destination's row in `outbox.destinations`.
#[derive(Debug, Clone, sqlx::FromRow, serde::Serialize)]
pub struct DestinationRow {
    pub name: String,
    pub state: String,
    pub failures: i32,
    pub last_error: Option<String>,
    pub opened_at: Option<DateTime<Utc>>,
    pub next_probe_at: Option<DateTime<Utc>>,
    #[serde(skip)]
    pub probe_until: Option<DateTime<Utc>>,
    pub paused_by: Option<String>,
    pub paused_at: Option<DateTime<Utc>>,
    pub slow_until: Option<DateTime<Utc>>,
}

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
struct Local {
    /// The unhealthy destinations, by name.
    view: HashMap<String, DestinationRow>,
    read_at: Option<Instant>,
    /// Rate-limit tokens this relay took and has not spent.
    tokens: HashMap<String, f64>,
    /// When the next deferred intent of a limited destination is due back,
    /// so that deferrals come back spread at the rate, not all at once.
    next_slot: HashMap<String, Instant>,
    /// Destinations this relay saw fail since their last recorded success,
    /// and when: the next answer resets their count even before the view
    /// shows them. Kept for the failure window, at most [`VIEW_MAX`].
    failing: HashMap<String, Instant>,
}

/// The relay's view of its destinations' health; see the module docs.
pub struct Gate {
    settings: HealthSettings,
    store: Store,
    owner: String,
    /// The longest attempt: how long a probe may hold the half-open state.
    probe_for: Duration,
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
    fn local(&self) -> std::sync::MutexGuard<'_, Local> {
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
        let rows = read_unhealthy(&self.store, window, VIEW_MAX).await;
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
        if let Some(rate) = self.settings.limits.get(&dest).filter(|_| !probe) {
            if !self.take_token(&dest, rate).await {
                return Admit::Wait {
                    class: "limit",
                    reason: format!("rate limit {} for {dest}", rate.text),
                    after: self.slot(&dest, rate),
                };
            }
        }
        Admit::Go {
            destination: Some(dest),
            probe,
        }
    }

    /// One token of `dest`'s bucket: a local one, else a batch from the
    /// database.
    async fn take_token(&self, dest: &str, rate: &Rate) -> bool {
        {
            let mut local = self.local();
            let t = local.tokens.entry(dest.to_string()).or_default();
            if *t >= 1.0 {
                *t -= 1.0;
                return true;
            }
        }
        let granted: Result<i32, _> =
            sqlx::query_scalar("SELECT outbox.take_tokens($1, $2, $3, $4)")
                .bind(dest)
                .bind(rate.per_second)
                .bind(rate.burst)
                .bind(rate.batch())
                .fetch_one(self.store.pool())
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
    fn slot(&self, dest: &str, rate: &Rate) -> Duration {
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

    async fn take_probe(&self, dest: &str) -> bool {
        let taken: Result<bool, _> = sqlx::query_scalar("SELECT outbox.take_probe($1, $2, $3)")
            .bind(dest)
            .bind(&self.owner)
            .bind(interval(self.probe_for + Duration::from_secs(1)))
            .fetch_one(self.store.pool())
            .await;
        let taken = taken.unwrap_or(false);
        if taken {
            tracing::info!(destination = dest, "probing an open circuit breaker");
            self.forget(dest);
        }
        taken
    }

    /// Drop the cached row, so that the next admit rereads it.
    fn forget(&self, dest: &str) {
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
                if let Err(e) = sqlx::query("SELECT outbox.slow_destination($1, $2)")
                    .bind(dest)
                    .bind(interval(wait))
                    .execute(self.store.pool())
                    .await
                {
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
            sqlx::query_scalar(
                "SELECT outbox.destination_failed($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            )
            .bind(dest)
            .bind(outcome.reason().map(|r| clip(r, 500)))
            .bind(probe)
            .bind(&self.owner)
            .bind(breaker.failures as i32)
            .bind(interval(breaker.cooldown))
            .bind(interval(breaker.max_cooldown))
            .bind(&alerts.url)
            .bind(&alerts.endpoint)
            .fetch_one(self.store.pool())
            .await
            .map(Some)
        } else if answered && (probe || self.unhealthy(dest)) {
            self.local().failing.remove(dest);
            sqlx::query_scalar("SELECT outbox.destination_succeeded($1, $2, $3, $4, $5)")
                .bind(dest)
                .bind(probe)
                .bind(&self.owner)
                .bind(&alerts.url)
                .bind(&alerts.endpoint)
                .fetch_one(self.store.pool())
                .await
                .map(Some)
        } else if probe {
            // nothing learned: let the next intent probe
            sqlx::query("SELECT outbox.release_probe($1, $2)")
                .bind(dest)
                .bind(&self.owner)
                .execute(self.store.pool())
                .await
                .map(|_| Some("open".to_string()))
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

    /// Has `dest` failed lately (so that a success must reset its count)?
    fn unhealthy(&self, dest: &str) -> bool {
        let local = self.local();
        local.view.contains_key(dest) || local.failing.contains_key(dest)
    }
}

/// The destinations the gate keeps in view: paused, breaker not closed,
/// slowed down, or failed within `window`; at most `max`, the paused first,
/// then the others not closed, then the latest failures. Read through the
/// partial index `destinations_unhealthy` (schema 0015): the healthy rows
/// (every destination ever limited or failed) are not read.
pub async fn read_unhealthy(
    store: &Store,
    window: Duration,
    max: i64,
) -> Result<Vec<DestinationRow>, sqlx::Error> {
    sqlx::query_as(UNHEALTHY_SQL)
        .bind(interval(window))
        .bind(max)
        .fetch_all(store.pool())
        .await
}

/// The gate's reread ($1 the failure window, $2 the most rows).
pub const UNHEALTHY_SQL: &str =
    "SELECT name, state, failures, last_error, opened_at, next_probe_at,
        probe_until, paused_by, paused_at, slow_until
   FROM outbox.destinations
  WHERE (state <> 'closed' OR failures > 0 OR slow_until IS NOT NULL)
    AND (state <> 'closed' OR slow_until > now()
         OR (failures > 0 AND updated_at > now() - $1::interval))
  ORDER BY state = 'paused' DESC, state = 'closed', updated_at DESC
  LIMIT $2";

/// The alerts of destinations paused by hand (each raised by one relay).
pub async fn raise_pause_alerts(store: &Store, settings: &HealthSettings) {
    let alerts = &settings.alerts;
    if alerts.url.is_none() && alerts.endpoint.is_none() {
        return;
    }
    if let Err(e) = sqlx::query("SELECT outbox.raise_pause_alerts($1, $2)")
        .bind(&alerts.url)
        .bind(&alerts.endpoint)
        .execute(store.pool())
        .await
    {
        tracing::warn!(error = %e, "cannot raise the pause alerts");
    }
}

/// The summaries of alert windows that held alerts back (schema 0015:
/// of each kind of destination event, 3 are raised one by one per five
/// minutes, the rest summed up in one `alerts.suppressed` after it).
pub async fn raise_alert_summaries(store: &Store, settings: &HealthSettings) {
    let alerts = &settings.alerts;
    if let Err(e) = sqlx::query("SELECT outbox.raise_alert_summaries($1, $2)")
        .bind(&alerts.url)
        .bind(&alerts.endpoint)
        .execute(store.pool())
        .await
    {
        tracing::warn!(error = %e, "cannot raise the alert summaries");
    }
}

/// How long destination events and idle closed destinations are kept.
const HISTORY: Duration = Duration::from_secs(30 * 24 * 3600);

/// The dead-count alert, when configured: raised once per crossing of
/// `alerts.dead_threshold`.
pub async fn check_dead_alert(store: &Store, settings: &HealthSettings) {
    let Some(threshold) = settings.dead_threshold else {
        return;
    };
    let alerts = &settings.alerts;
    if alerts.url.is_none() && alerts.endpoint.is_none() {
        return;
    }
    if let Err(e) = sqlx::query("SELECT outbox.check_dead_alert($1, $2, $3)")
        .bind(threshold as i64)
        .bind(&alerts.url)
        .bind(&alerts.endpoint)
        .execute(store.pool())
        .await
    {
        tracing::warn!(error = %e, "cannot check the dead-intent alert");
    }
}

/// The most destinations reported by name in `outbox_destination_state`
/// besides the configured ones; the rest are summed under `other`.
const GAUGED_DESTINATIONS: usize = 20;

/// `outbox_destination_state{destination}` (0 closed, 1 open, 2 half
/// open, 3 paused) for the configured destinations and the unhealthy ones
/// (at most [`GAUGED_DESTINATIONS`] by name, the rest as `other`: the
/// number of them not closed), and no other series: one that leaves the
/// set leaves the exposition. `reported` becomes the names reported.
pub async fn refresh_gauges(
    store: &Store,
    settings: &HealthSettings,
    reported: &mut std::collections::HashSet<String>,
) -> Result<(), sqlx::Error> {
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT name, state FROM outbox.destinations WHERE state <> 'closed'
          ORDER BY opened_at NULLS LAST, name",
    )
    .fetch_all(store.pool())
    .await?;
    let code = |state: &str| match state {
        "open" => 1.0,
        "half_open" => 2.0,
        "paused" => 3.0,
        _ => 0.0,
    };
    let mut now: HashMap<String, f64> = settings
        .limits
        .keys()
        .chain(settings.overrides.keys())
        .map(|k| (k.clone(), 0.0))
        .collect();
    let mut other = 0.0;
    let mut named = 0;
    for (name, state) in rows {
        match now.entry(name) {
            std::collections::hash_map::Entry::Occupied(mut e) => {
                e.insert(code(&state));
            }
            std::collections::hash_map::Entry::Vacant(e) if named < GAUGED_DESTINATIONS => {
                named += 1;
                e.insert(code(&state));
            }
            std::collections::hash_map::Entry::Vacant(_) => other += 1.0,
        }
    }
    // a destination that left the set leaves the exposition with it
    *reported = now.keys().cloned().collect();
    now.insert("other".into(), other);
    crate::destination_gauges::publish_state(now);
    Ok(())
}

/// The most destinations reported by name in `outbox_destination_pending`
/// besides the configured ones (the largest backlogs); the rest are summed
/// under `other`.
const TOP_BACKLOGS: usize = 10;

/// `outbox_destination_pending{destination}`: the pending backlog of the
/// configured destinations (pending or claimed), of the [`TOP_BACKLOGS`] largest others, and of
/// the rest summed as `other`, and no other series. One grouped scan of
/// the pending intents. `reported` becomes the names reported.
pub async fn refresh_backlog_gauges(
    store: &Store,
    settings: &HealthSettings,
    owner: &str,
    reported: &mut std::collections::HashSet<String>,
) -> Result<(), sqlx::Error> {
    let rows: Vec<(Option<String>, i64)> = sqlx::query_as(
        "SELECT outbox.destination_of(kind, destination, payload), count(*)
           FROM outbox.intents WHERE state IN ('pending', 'claimed') GROUP BY 1",
    )
    .fetch_all(store.pool())
    .await?;
    let mut by_name: HashMap<String, i64> = HashMap::new();
    for (name, n) in rows {
        let Some(name) = name else { continue };
        // a named endpoint counts under its origin
        let name = settings.endpoints.get(&name).cloned().unwrap_or(name);
        *by_name.entry(name).or_default() += n;
    }
    close_idle_breakers(store, settings, owner, &by_name).await?;
    let mut now: HashMap<String, f64> = settings
        .limits
        .keys()
        .chain(settings.overrides.keys())
        .map(|k| (k.clone(), by_name.remove(k).unwrap_or(0) as f64))
        .collect();
    let mut rest: Vec<(String, i64)> = by_name.into_iter().collect();
    rest.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let other: i64 = rest.iter().skip(TOP_BACKLOGS).map(|r| r.1).sum();
    for (name, n) in rest.into_iter().take(TOP_BACKLOGS) {
        now.insert(name, n as f64);
    }
    *reported = now.keys().cloned().collect();
    now.insert("other".into(), other as f64);
    crate::destination_gauges::publish_pending(now);
    Ok(())
}

/// Close the open breakers of destinations with no backlog left a minute
/// past their due probe: nothing would ever probe them
/// (`outbox.close_idle_breaker`).
async fn close_idle_breakers(
    store: &Store,
    settings: &HealthSettings,
    owner: &str,
    backlog: &HashMap<String, i64>,
) -> Result<(), sqlx::Error> {
    let idle: Vec<String> = sqlx::query_scalar(
        "SELECT name FROM outbox.destinations
          WHERE state = 'open' AND next_probe_at < clock_timestamp() - interval '1 minute'",
    )
    .fetch_all(store.pool())
    .await?;
    for name in idle.iter().filter(|n| !backlog.contains_key(*n)) {
        let closed: bool = sqlx::query_scalar("SELECT outbox.close_idle_breaker($1, $2, $3, $4)")
            .bind(name)
            .bind(owner)
            .bind(&settings.alerts.url)
            .bind(&settings.alerts.endpoint)
            .fetch_one(store.pool())
            .await?;
        if closed {
            tracing::info!(destination = %name, "closed the breaker of a destination with nothing left to send");
        }
    }
    Ok(())
}

/// The destination gauges and the dead-count alert, every `every` until
/// `stop` turns true (the backlog gauges every third time: they scan the
/// pending intents).
pub async fn run(
    store: Store,
    settings: HealthSettings,
    owner: String,
    every: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut reported = std::collections::HashSet::new();
    let mut backlogs = std::collections::HashSet::new();
    for tick in 0u64.. {
        check_dead_alert(&store, &settings).await;
        raise_pause_alerts(&store, &settings).await;
        raise_alert_summaries(&store, &settings).await;
        // about every minute at a 5 s tick: failures past the window
        if tick % 12 == 2 {
            if let Err(e) = sqlx::query("SELECT outbox.forget_stale_failures($1)")
                .bind(interval(settings.failure_window()))
                .execute(store.pool())
                .await
            {
                tracing::debug!(error = %e, "cannot forget stale destination failures");
            }
        }
        // about hourly at a 5 s tick
        if tick % 720 == 1 {
            if let Err(e) = sqlx::query("SELECT outbox.prune_destinations($1)")
                .bind(interval(HISTORY))
                .execute(store.pool())
                .await
            {
                tracing::debug!(error = %e, "cannot prune destination history");
            }
        }
        if let Err(e) = refresh_gauges(&store, &settings, &mut reported).await {
            tracing::debug!(error = %e, "destination gauge refresh failed");
        }
        if tick.is_multiple_of(3) {
            if let Err(e) = refresh_backlog_gauges(&store, &settings, &owner, &mut backlogs).await {
                tracing::debug!(error = %e, "destination backlog gauge refresh failed");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// What an outcome shows of its destination: (it failed, it answered). A
/// failure is transient or ambiguous; an answer is a delivery, a refusal it
/// gave (with its status), our credentials refused, or a broker's answer
/// about the one exchange, queue or subject a message goes to (that one is
/// missing or full: the broker is up, and the other messages go on). A
/// rejection without a status may be the relay's own refusal of the
/// payload: it shows nothing.
fn shown(outcome: &Outcome) -> (bool, bool) {
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

fn clip(text: &str, max: usize) -> String {
    text.chars().take(max).collect()
}

/// A duration as a Postgres interval.
pub fn interval(d: Duration) -> sqlx::postgres::types::PgInterval {
    sqlx::postgres::types::PgInterval {
        months: 0,
        days: 0,
        microseconds: d.as_micros().min(i64::MAX as u128) as i64,
    }
}

/// `pause ORIGIN` / `resume ORIGIN`, from the CLI: the name an operator
/// gave, made canonical.
pub async fn pause(
    store: &Store,
    settings: &HealthSettings,
    name: &str,
    reason: Option<&str>,
) -> anyhow::Result<String> {
    let dest = canonical(name, &settings.endpoints).map_err(anyhow::Error::msg)?;
    sqlx::query("SELECT outbox.pause_destination($1, $2)")
        .bind(&dest)
        .bind(reason)
        .execute(store.pool())
        .await
        .context("pausing the destination")?;
    Ok(dest)
}

pub async fn resume(
    store: &Store,
    settings: &HealthSettings,
    name: &str,
) -> anyhow::Result<(String, bool)> {
    let dest = canonical(name, &settings.endpoints).map_err(anyhow::Error::msg)?;
    let resumed: bool = sqlx::query_scalar("SELECT outbox.resume_destination($1)")
        .bind(&dest)
        .fetch_one(store.pool())
        .await
        .context("resuming the destination")?;
    Ok((dest, resumed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rates_parse_with_their_units() {
        assert_eq!(Rate::parse("50/s").unwrap().per_second, 50.0);
        assert_eq!(Rate::parse("600/min").unwrap().per_second, 10.0);
        assert_eq!(Rate::parse(" 3600 / h ").unwrap().per_second, 1.0);
        assert_eq!(Rate::parse("50/s").unwrap().burst, 5.0);
        assert_eq!(Rate::parse("2/s").unwrap().burst, 1.0);
        for bad in ["50", "fast/s", "0/s", "-1/s", "5/day", "1e9/s", "NaN/s"] {
            assert!(Rate::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn destinations_are_origins_or_names() {
        let endpoints = HashMap::from([("billing".to_string(), "https://pay.example".to_string())]);
        let d = |kind, dest, payload: Value| destination_of(kind, dest, &payload, &endpoints);
        assert_eq!(
            d(
                "webhook",
                None,
                json!({"url": "HTTPS://API.Example:443/a?b"})
            )
            .as_deref(),
            Some("https://api.example")
        );
        assert_eq!(
            d("webhook", None, json!({"url": "http://127.0.0.1:8080/x"})).as_deref(),
            Some("http://127.0.0.1:8080")
        );
        assert_eq!(
            d("webhook", Some("billing"), json!({})).as_deref(),
            Some("https://pay.example")
        );
        assert_eq!(d("webhook", None, json!({"url": 5})), None);
        assert_eq!(d("webhook", Some("unknown"), json!({})), None);
        assert_eq!(d("email", None, json!({})).as_deref(), Some("smtp"));
        assert_eq!(d("charge", None, json!({})).as_deref(), Some("charge"));
        assert_eq!(d("amqp", None, json!({})).as_deref(), Some("amqp"));
        assert_eq!(d("sms", None, json!({})), None);
        assert_eq!(
            canonical("billing", &endpoints).unwrap(),
            "https://pay.example"
        );
        assert_eq!(
            canonical("https://A.example:443/x", &endpoints).unwrap(),
            "https://a.example"
        );
        for spelling in [
            "http://[::ffff:127.0.0.1]:8080/x",
            "http://[::FFFF:7f00:1]:8080",
            "http://0x7f.1:8080/",
        ] {
            assert_eq!(
                canonical(spelling, &endpoints).unwrap(),
                "http://127.0.0.1:8080",
                "{spelling}"
            );
        }
        assert_eq!(
            canonical("http://[::1]:8080", &endpoints).unwrap(),
            "http://[::1]:8080"
        );
        assert_eq!(canonical("smtp", &endpoints).unwrap(), "smtp");
        assert!(canonical("partner", &endpoints)
            .unwrap_err()
            .contains("not a destination"));
    }
}

//! Destination health as configured: `[limits]`, `[breaker]` and
//! `[alerts]`, parsed and checked into [`HealthSettings`].

use std::collections::HashMap;
use std::time::Duration;

use anyhow::bail;
use serde::Deserialize;

use super::destinations::{canonical, origin};
use super::Config;
use crate::units::{dur, Dur};

/// `[breaker]`: circuit breakers per destination, shared by all relays.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BreakerSection {
    /// Off: no breaker opens (rate limits and pauses still apply).
    pub enabled: bool,
    /// Consecutive transient failures that open it.
    pub failures: u32,
    /// Then one probe; a failed probe doubles the wait, up to max_cooldown.
    pub cooldown: Dur,
    pub max_cooldown: Dur,
    /// Per destination: `[breaker.overrides."https://api.example"] failures = 3`.
    pub overrides: HashMap<String, BreakerOverride>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BreakerOverride {
    pub failures: Option<u32>,
    pub cooldown: Option<Dur>,
    pub max_cooldown: Option<Dur>,
}

impl Default for BreakerSection {
    fn default() -> Self {
        BreakerSection {
            enabled: true,
            failures: 10,
            cooldown: dur("30s"),
            max_cooldown: dur("10m"),
            overrides: HashMap::new(),
        }
    }
}

/// `[alerts]`: operator events (a breaker opened or closed, a destination
/// paused by hand, the dead count past `dead_threshold`) enqueued as signed
/// webhook intents to `url` or the named endpoint `endpoint`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AlertsSection {
    pub url: Option<String>,
    pub endpoint: Option<String>,
    pub dead_threshold: Option<u64>,
}

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

    /// `per_second` a second (a subscription's `--rate`, stored so).
    pub fn per_second(per_second: f64) -> Rate {
        Rate {
            per_second,
            burst: (per_second / 10.0).max(1.0),
            text: format!("{per_second}/s"),
        }
    }

    /// Tokens a relay takes from the bucket at once: about 50 ms worth.
    pub fn batch(&self) -> i32 {
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
        let settings = |o: &BreakerOverride| BreakerSettings {
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

    pub fn breaker_for(&self, dest: &str) -> Option<BreakerSettings> {
        self.breaker
            .map(|default| self.overrides.get(dest).copied().unwrap_or(default))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}

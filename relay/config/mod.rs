//! Configuration: embedded defaults, then a TOML file, then environment
//! overrides, then one `validate()`.
//!
//! Every key is optional. An unknown key or a malformed value is an error
//! that names it. Environment overrides use `OUTBOX_RELAY__<SECTION>__<KEY>`
//! (double underscores separate the path), e.g.
//! `OUTBOX_RELAY__RELAY__CONCURRENCY=32`; the value is read as a TOML value
//! when it parses as one and as a string otherwise.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context};
use outbox_providers::Secret;
use serde::Deserialize;

use crate::kinds::{Kind, Section};

pub mod console;
pub mod destinations;
mod env;
pub mod health;
mod relay;
mod retention;
mod retry;
pub mod schedule;
pub mod subscriptions;
mod telemetry;
#[cfg(test)]
mod tests;

pub use crate::units::{parse_duration, Dur};
pub use console::{ConsoleSection, ConsoleUser, Role};
use env::{apply_env, EnvSources};
pub use env::{read_secret_file, read_secret_files, LOOKUP_TOKEN_VAR};
pub use health::{AlertsSection, BreakerOverride, BreakerSection, HealthSettings};
pub use relay::RelaySection;
pub use retention::RetentionSection;
pub use retry::{RetryOverride, RetryPolicy, RetrySection};
pub use schedule::{Schedule, ScheduleEntry};
pub use subscriptions::{SealingKey, SubscriptionsSection};
pub use telemetry::TelemetrySection;

/// The configuration, with a section per kind from the kinds' list
/// (`kinds::kinds!`), and `Config::section`, the one map from a kind to its
/// section.
macro_rules! config_with_kinds {
    ($($variant:ident $module:ident $section:ident,)*) => {
        /// The relay's configuration: a field per section, each optional.
        #[derive(Debug, Clone, Default, Deserialize)]
        #[serde(deny_unknown_fields, default)]
        pub struct Config {
            /// Overridden by --database-url / DATABASE_URL. Kept secret: it may carry a password.
            pub database_url: Option<Secret>,
            pub relay: RelaySection,
            pub retry: RetrySection,
            $(
                #[doc = concat!("`[", stringify!($module), "]`: the `", stringify!($module),
                                "` kind's section (relay/kinds/", stringify!($module), ").")]
                pub $module: crate::kinds::$module::$section,
            )*
            /// `[limits]`: destination → rate, e.g. `"https://api.partner.example"
            /// = "50/s"`, `"smtp" = "20/s"`, held across all relays.
            pub limits: HashMap<String, String>,
            pub breaker: BreakerSection,
            pub alerts: AlertsSection,
            pub retention: RetentionSection,
            /// `[subscriptions]`: the key that seals subscriptions' secrets.
            pub subscriptions: SubscriptionsSection,
            /// `[console]`: the operator web UI (`outbox-relay console`).
            pub console: ConsoleSection,
            /// `[telemetry]`: trace spans of attempts, over OTLP.
            pub telemetry: TelemetrySection,
            #[serde(rename = "schedule")]
            pub schedules: Vec<ScheduleEntry>,
        }

        impl Config {
            /// The section of `kind` (`[webhook]`, `[email]`, ...).
            pub fn section(&self, kind: Kind) -> &dyn Section {
                match kind {
                    $(Kind::$variant => &self.$module,)*
                }
            }
        }
    };
}
crate::kinds::kinds!(config_with_kinds);

impl Config {
    /// Destination health (limits, breakers, alerts), checked.
    pub fn health(&self) -> anyhow::Result<HealthSettings> {
        HealthSettings::from_config(self)
    }

    /// The configured schedules, parsed.
    pub fn schedules(&self) -> anyhow::Result<Vec<Schedule>> {
        let mut seen = std::collections::HashSet::new();
        self.schedules
            .iter()
            .map(|e| {
                if !seen.insert(e.name.clone()) {
                    bail!("schedule {:?} is defined twice", e.name);
                }
                Schedule::from_entry(e).map_err(anyhow::Error::msg)
            })
            .collect()
    }

    /// The longest time one attempt may take, over the kinds served.
    pub fn longest_attempt(&self) -> Duration {
        Kind::ALL
            .into_iter()
            .map(|k| self.section(k))
            .filter(|s| s.serves())
            .map(|s| s.attempt_time())
            .max()
            .unwrap_or_default()
    }

    /// Load from an optional file plus `OUTBOX_RELAY__*` variables, and validate.
    pub fn load(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> anyhow::Result<Config> {
        Config::load_checked(path, env, Checks::All)
    }

    /// As `load`, validating what `checks` names.
    pub fn load_checked(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        checks: Checks,
    ) -> anyhow::Result<Config> {
        let mut table = match path {
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .with_context(|| format!("cannot read config file {}", p.display()))?;
                toml::from_str::<toml::Table>(&text)
                    .with_context(|| format!("config file {} is not valid TOML", p.display()))?
            }
            None => toml::Table::new(),
        };
        let given: Vec<(String, String)> = env.into_iter().collect();
        let env = read_secret_files(given.clone())?;
        apply_env(&mut table, env.iter().cloned())?;
        // which variable set which key, so that errors can name it
        let mut sources = EnvSources::new(&given, &env);
        if let Some((_, token)) = env.iter().find(|(k, _)| k == LOOKUP_TOKEN_VAR) {
            if env
                .iter()
                .any(|(k, _)| k.eq_ignore_ascii_case("OUTBOX_RELAY__RELAY__LOOKUP_TOKEN"))
            {
                bail!("both {LOOKUP_TOKEN_VAR} and OUTBOX_RELAY__RELAY__LOOKUP_TOKEN are set; set one");
            }
            let relay = table
                .entry("relay")
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            if let Some(t) = relay.as_table_mut() {
                t.insert("lookup_token".into(), toml::Value::String(token.clone()));
                sources.add("relay.lookup_token", LOOKUP_TOKEN_VAR, &given);
            }
        }
        if let Some((_, key)) = env.iter().find(|(k, _)| k == "STRIPE_API_KEY") {
            let charge = table
                .entry(Kind::Charge.name())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            if let Some(t) = charge.as_table_mut() {
                if !t.contains_key("api_key") {
                    t.insert("api_key".into(), toml::Value::String(key.clone()));
                    sources.add("charge.api_key", "STRIPE_API_KEY", &given);
                }
            }
        }
        // serde_path_to_error names the key a bad value sits under
        // ("relay.lease: invalid duration ..."), which serde alone does not.
        let config: Config = match serde_path_to_error::deserialize(toml::Value::Table(table)) {
            Ok(c) => c,
            Err(e) => {
                let key = e.path().to_string();
                let message = e.into_inner().message().to_string();
                let err = if key == "." {
                    anyhow::anyhow!("invalid configuration: {message}")
                } else {
                    anyhow::anyhow!("invalid configuration: {key}: {message}")
                };
                return Err(match (sources.setting(&key), path) {
                    (Some(var), _) => err.context(format!("in environment variable {var}")),
                    (None, Some(p)) => err.context(format!("in {}", p.display())),
                    (None, None) => err.context("in the environment overrides"),
                });
            }
        };
        let checked = match checks {
            Checks::All => config.validate(),
            Checks::Operator => config.validate_relay(),
        };
        checked.map_err(|e| {
            let vars = sources.named_in(&format!("{e:#}"));
            match vars.len() {
                0 => e,
                1 => e.context(format!("in environment variable {}", vars[0])),
                _ => e.context(format!("in environment variables {}", vars.join(", "))),
            }
        })?;
        Ok(config)
    }

    /// Cross-key checks, with messages that name the keys.
    pub fn validate(&self) -> anyhow::Result<()> {
        self.validate_relay()?;
        self.validate_delivery()
    }

    /// The checks of the `[relay]` section's own values: what every verb
    /// that connects uses.
    pub fn validate_relay(&self) -> anyhow::Result<()> {
        self.relay.validate()
    }

    /// The checks of everything delivery uses: providers, retries, health,
    /// schedules, the console, retention and the lookup token.
    fn validate_delivery(&self) -> anyhow::Result<()> {
        let r = &self.relay;
        // an attempt starts only with its timeout, the destination-health
        // check (1 s at most) and half a second of margin left of its lease
        if self.longest_attempt() + Duration::from_millis(1600) > r.lease.0 {
            bail!(
                "relay.lease ({:?}) must exceed the longest provider timeout ({:?}; \
                 webhook.timeout, email.timeout, charge.timeout, nats.timeout, amqp.timeout, kafka.timeout) \
                 by at least 1.6s: a delivery must end before its lease can expire, or a slow \
                 request would be redelivered while it runs",
                r.lease.0,
                self.longest_attempt()
            );
        }
        self.validate_retry()?;
        self.validate_timeouts()?;
        // what the providers would refuse: secrets, URLs, addresses
        // (`engine::providers` builds them)
        self.webhook.provider_config()?.check()?;
        if let Some(email) = self.email.provider_config()? {
            email.check()?;
        }
        self.charge.provider_config()?;
        self.nats.provider_config()?;
        self.amqp.provider_config()?;
        self.kafka.provider_config()?;
        self.health()?;
        self.schedules()?;
        self.check_schedule_payloads()?;
        self.console.validate()?;
        self.telemetry.settings()?;
        self.validate_retention()?;
        self.subscriptions.key()?;
        if self.subscriptions.disable_after.0.is_zero() {
            bail!("subscriptions.disable_after must be longer than 0s");
        }
        Ok(())
    }

    /// The retry settings: attempts, schedules and jitter.
    fn validate_retry(&self) -> anyhow::Result<()> {
        let retry = &self.retry;
        for (name, o) in [
            (
                "retry",
                &RetryOverride {
                    max_attempts: Some(retry.max_attempts),
                    schedule: Some(retry.schedule.clone()),
                },
            ),
            ("retry.webhook", &retry.webhook),
            ("retry.email", &retry.email),
            ("retry.charge", &retry.charge),
        ] {
            if o.max_attempts == Some(0) || o.max_attempts.is_some_and(|m| m > 1000) {
                bail!("{name}.max_attempts must be between 1 and 1000");
            }
            if o.schedule.as_ref().is_some_and(|s| s.is_empty()) {
                bail!("{name}.schedule must list at least one delay");
            }
        }
        if !(0.0..=1.0).contains(&retry.jitter) {
            bail!("retry.jitter must be between 0.0 and 1.0");
        }
        Ok(())
    }

    /// The webhook bounds and every provider's timeouts.
    fn validate_timeouts(&self) -> anyhow::Result<()> {
        if self.webhook.max_in_flight_per_host == 0 {
            bail!("webhook.max_in_flight_per_host must be at least 1");
        }
        if self.webhook.max_response_bytes > 1 << 20 {
            bail!("webhook.max_response_bytes must be at most 1 MiB");
        }
        for (name, d) in [
            ("webhook.timeout", self.webhook.timeout),
            ("webhook.connect_timeout", self.webhook.connect_timeout),
            ("email.timeout", self.email.timeout),
            ("email.connect_timeout", self.email.connect_timeout),
            ("charge.timeout", self.charge.timeout),
            ("charge.connect_timeout", self.charge.connect_timeout),
            ("nats.timeout", self.nats.timeout),
            ("amqp.timeout", self.amqp.timeout),
            ("kafka.timeout", self.kafka.timeout),
        ] {
            // "0s" would time out every attempt (an email timed out after
            // its body is ambiguous: every message would be parked)
            if d.0 < Duration::from_millis(100) {
                bail!("{name} must be at least 100ms, not {:?}", d.0);
            }
        }
        Ok(())
    }

    /// Retention, and the lookup token.
    fn validate_retention(&self) -> anyhow::Result<()> {
        let ret = &self.retention;
        if ret.ledger.0 < ret.intents.0 {
            bail!(
                "retention.ledger must be at least retention.intents: a purged key must stay known"
            );
        }
        if !(1..=100_000).contains(&ret.batch_size) {
            bail!("retention.batch_size must be between 1 and 100000");
        }
        if ret.interval.0 < Duration::from_secs(1) {
            bail!("retention.interval must be at least 1s");
        }
        if ret.segment.0 < Duration::from_secs(1) {
            bail!("retention.segment must be at least 1s");
        }
        if let Some(token) = &self.relay.lookup_token {
            let token = token.expose();
            if !token.bytes().all(|b| b.is_ascii_graphic()) {
                bail!(
                    "relay.lookup_token must be printable ASCII without spaces \
                     (it is sent as Authorization: Bearer <token>)"
                );
            }
            if token.len() < 16 {
                bail!(
                    "relay.lookup_token is shorter than 16 characters; use a random one \
                     (e.g. openssl rand -hex 32)"
                );
            }
        }
        Ok(())
    }
}

/// How much of the configuration a verb validates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checks {
    /// Everything: the daemon, and the verbs that read delivery settings
    /// (`schedules`, `destinations`, `console`, `health`).
    All,
    /// The `[relay]` section only: the verbs that read and change intents
    /// (`migrate`, `enqueue`, `list`, `show`, `retry`, `cancel`, `resolve`,
    /// `stats`, `relays`, `purge`). A provider setting meant for the daemon,
    /// such as an `OUTBOX_RELAY__AMQP__PASSWORD` in a shared environment
    /// without the file that holds `amqp.url`, does not stop them.
    Operator,
}

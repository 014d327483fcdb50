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
use outbox_providers::amqp::AmqpConfig;
use outbox_providers::charge::ChargeConfig;
use outbox_providers::email::{EmailConfig, SmtpTarget};
use outbox_providers::nats::NatsConfig;
use outbox_providers::webhook::WebhookConfig;
use outbox_providers::{guard, AmbiguityPolicy, Secret};
use serde::Deserialize;

use crate::transition::RetryPolicy;

/// A duration written as a string like "200ms", "5s" or "2h".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dur(pub Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d).map_err(|_| {
            serde::de::Error::custom("a duration must be a string like \"200ms\", \"5s\" or \"2h\"")
        })?;
        parse_duration(&text)
            .map(Dur)
            .map_err(serde::de::Error::custom)
    }
}

/// Parse "200ms", "5s", "2h", "1h 30m"; refuses absurd values (over 30 days).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(text.trim()).map_err(|e| {
        format!("invalid duration {text:?}: {e} (write e.g. \"200ms\", \"5s\", \"2h\")")
    })?;
    if d > Duration::from_secs(366 * 24 * 3600) {
        return Err(format!("duration {text:?} is longer than a year"));
    }
    Ok(d)
}

fn dur(text: &str) -> Dur {
    Dur(parse_duration(text).expect("valid default"))
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Overridden by --database-url / DATABASE_URL. Kept secret: it may carry a password.
    pub database_url: Option<Secret>,
    pub relay: RelaySection,
    pub retry: RetrySection,
    pub webhook: WebhookSection,
    pub email: EmailSection,
    pub charge: ChargeSection,
    pub nats: NatsSection,
    pub amqp: AmqpSection,
    /// `[limits]`: destination → rate, e.g. `"https://api.partner.example"
    /// = "50/s"`, `"smtp" = "20/s"`, held across all relays.
    pub limits: HashMap<String, String>,
    pub breaker: BreakerSection,
    pub alerts: AlertsSection,
    pub retention: RetentionSection,
    /// `[console]`: the operator web UI (`outbox-relay console`).
    pub console: crate::console::ConsoleSection,
    #[serde(rename = "schedule")]
    pub schedules: Vec<ScheduleEntry>,
}

/// `[[schedule]]`: one intent per tick, key `schedule:<name>:<tick>`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleEntry {
    pub name: String,
    /// With seconds first, as the cron crate reads it: "0 0 9 * * *".
    pub cron: String,
    pub kind: String,
    #[serde(default)]
    pub destination: Option<String>,
    pub payload: serde_json::Value,
    /// Missed ticks enqueued after downtime, most recent first (default 1).
    #[serde(default = "one")]
    pub catch_up: u32,
}

fn one() -> u32 {
    1
}

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
            interval: dur("1m"),
            batch_size: 500,
            batch_pause: dur("100ms"),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RelaySection {
    /// Deliveries in flight per relay.
    pub concurrency: u32,
    /// Intents claimed per round trip (at most). A claim + complete round
    /// has a fixed cost beyond its rows, so under load larger batches cost
    /// less per intent (docs/performance.md has the figures). But claimed intents wait for a delivery slot with their lease
    /// running: up to `concurrency + batch_size` of them queue, so when every
    /// endpoint answers at its timeout the last waits about
    /// `(concurrency + batch_size) / concurrency × timeout`, which must stay
    /// below `lease − timeout` or the claim is handed back unattempted. The
    /// default keeps that for webhooks with the default lease and timeout
    /// (64 in flight, a 15 s timeout: the last of 164 waits about 38 s,
    /// within the 44.5 s a 60 s lease leaves). A relay holds at most
    /// `concurrency + 3 × batch_size` claims.
    pub batch_size: u32,
    /// How long a claim is held before the sweeper may act on it.
    pub lease: Dur,
    /// Fallback wake-up when no NOTIFY arrives.
    pub poll_interval: Dur,
    /// LISTEN for enqueue notifications. At start the relay checks that a
    /// NOTIFY reaches it; when none does (a pooler in transaction mode), or
    /// when this is false, it delivers by polling every `poll_interval`.
    pub listen: bool,
    /// How often the sweeper looks for expired leases.
    pub sweep_interval: Dur,
    /// How long in-flight deliveries may take to finish on SIGTERM.
    pub shutdown_timeout: Dur,
    /// How often the daemon logs a one-line summary at info level
    /// (delivered, failed, retried, replays, backlog); 0s turns it off.
    pub summary_interval: Dur,
    /// Where /metrics, /healthz and /readyz are served (port 0 picks one),
    /// and `GET /v1/intents/{key}` (see `lookup`).
    pub metrics_addr: Option<String>,
    /// Answer `GET /v1/intents/{key}` on the metrics listener: an intent's
    /// state by its exact key, for a client that wants to know whether an
    /// operation happened. false: the path is 404 like any unknown one.
    pub lookup: bool,
    /// When set, `GET /v1/intents/{key}` needs `Authorization: Bearer
    /// <token>` (401 otherwise); /metrics and the probes stay open. Also
    /// `OUTBOX_RELAY_LOOKUP_TOKEN` (or `…_FILE`). Kept secret: never printed.
    pub lookup_token: Option<Secret>,
    /// The owner name written on claims; default host:pid:random.
    pub name: Option<String>,
    /// Postgres connections; default concurrency/8 + 4.
    pub max_connections: Option<u32>,
}

impl Default for RelaySection {
    fn default() -> Self {
        RelaySection {
            concurrency: 64,
            batch_size: 100,
            lease: dur("60s"),
            poll_interval: dur("1s"),
            listen: true,
            sweep_interval: dur("5s"),
            shutdown_timeout: dur("30s"),
            summary_interval: dur("60s"),
            metrics_addr: Some("127.0.0.1:9187".into()),
            lookup: true,
            lookup_token: None,
            name: None,
            max_connections: None,
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryOverride {
    pub max_attempts: Option<u32>,
    pub schedule: Option<Vec<Dur>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetrySection {
    pub max_attempts: u32,
    pub schedule: Vec<Dur>,
    /// Random stretch of each delay, 0.0 to 1.0.
    pub jitter: f64,
    pub webhook: RetryOverride,
    pub email: RetryOverride,
    pub charge: RetryOverride,
}

impl Default for RetrySection {
    fn default() -> Self {
        let d = RetryPolicy::default();
        RetrySection {
            max_attempts: d.max_attempts,
            schedule: d.schedule.into_iter().map(Dur).collect(),
            jitter: d.jitter,
            webhook: RetryOverride::default(),
            email: RetryOverride::default(),
            charge: RetryOverride::default(),
        }
    }
}

impl RetrySection {
    /// The retry policy for one kind: the kind's overrides over the defaults.
    pub fn policy(&self, kind: &str) -> RetryPolicy {
        let o = match kind {
            "webhook" => &self.webhook,
            "email" => &self.email,
            "charge" => &self.charge,
            _ => &RetryOverride {
                max_attempts: None,
                schedule: None,
            },
        };
        RetryPolicy {
            max_attempts: o.max_attempts.unwrap_or(self.max_attempts),
            schedule: o
                .schedule
                .as_ref()
                .unwrap_or(&self.schedule)
                .iter()
                .map(|d| d.0)
                .collect(),
            jitter: self.jitter,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WebhookSection {
    pub signing_secrets: Vec<Secret>,
    pub timeout: Dur,
    pub connect_timeout: Dur,
    pub allowed_networks: Vec<String>,
    pub max_response_bytes: usize,
    pub max_retry_after: Dur,
    /// Named endpoints: `[webhook.endpoints] billing = "https://..."`.
    pub endpoints: HashMap<String, String>,
    /// "redeliver" (default) or "park".
    pub on_ambiguous: AmbiguityPolicy,
    /// Requests in flight to one origin at most; more wait (deferred).
    pub max_in_flight_per_host: usize,
}

impl Default for WebhookSection {
    fn default() -> Self {
        let d = WebhookConfig::default();
        WebhookSection {
            signing_secrets: Vec::new(),
            timeout: Dur(d.timeout),
            connect_timeout: Dur(d.connect_timeout),
            allowed_networks: Vec::new(),
            max_response_bytes: d.max_response_bytes,
            max_retry_after: Dur(d.max_retry_after),
            endpoints: HashMap::new(),
            on_ambiguous: d.on_ambiguous,
            max_in_flight_per_host: d.max_in_flight_per_host,
        }
    }
}

impl WebhookSection {
    pub fn provider_config(&self) -> anyhow::Result<WebhookConfig> {
        let allowed_networks = guard::parse_networks(&self.allowed_networks)
            .map_err(|e| anyhow::anyhow!("webhook.allowed_networks: {e}"))?;
        for (name, url) in &self.endpoints {
            outbox_providers::webhook::request::parse_url(url)
                .map_err(|e| anyhow::anyhow!("webhook.endpoints.{name}: {e}"))?;
        }
        Ok(WebhookConfig {
            signing_secrets: self.signing_secrets.clone(),
            timeout: self.timeout.0,
            connect_timeout: self.connect_timeout.0,
            allowed_networks,
            max_response_bytes: self.max_response_bytes,
            endpoints: self.endpoints.clone(),
            max_retry_after: self.max_retry_after.0,
            on_ambiguous: self.on_ambiguous,
            max_in_flight_per_host: self.max_in_flight_per_host,
        })
    }
}

/// `[email]`: the email provider is enabled when `smtp_url` is set.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EmailSection {
    /// smtp:// (plain), smtp+starttls://, smtps://; credentials may be in the URL.
    pub smtp_url: Option<Secret>,
    pub username: Option<String>,
    pub password: Option<Secret>,
    /// Default sender.
    pub from: Option<String>,
    pub timeout: Dur,
    pub connect_timeout: Dur,
    pub pool_size: usize,
    /// "park" (default) or "redeliver" (same Message-ID).
    pub on_ambiguous: AmbiguityPolicy,
    pub hello_name: Option<String>,
}

impl Default for EmailSection {
    fn default() -> Self {
        EmailSection {
            smtp_url: None,
            username: None,
            password: None,
            from: None,
            timeout: dur("30s"),
            connect_timeout: dur("10s"),
            pool_size: 8,
            on_ambiguous: AmbiguityPolicy::Park,
            hello_name: None,
        }
    }
}

impl EmailSection {
    /// `None` when email is not configured.
    pub fn provider_config(&self) -> anyhow::Result<Option<EmailConfig>> {
        let Some(url) = &self.smtp_url else {
            return Ok(None);
        };
        let target = SmtpTarget::parse(url.expose()).map_err(anyhow::Error::msg)?;
        let from = match &self.from {
            Some(f) => Some(
                f.parse()
                    .map_err(|e| anyhow::anyhow!("email.from {f:?} is not a valid address: {e}"))?,
            ),
            None => None,
        };
        Ok(Some(EmailConfig {
            username: self.username.clone(),
            password: self.password.clone(),
            from,
            timeout: self.timeout.0,
            connect_timeout: self.connect_timeout.0,
            pool_size: self.pool_size,
            on_ambiguous: self.on_ambiguous,
            hello_name: self.hello_name.clone(),
            ..EmailConfig::new(target)
        }))
    }
}

/// `[charge]`: the charge provider is enabled when an API key is set
/// (STRIPE_API_KEY in the environment, preferably).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ChargeSection {
    pub api_base: String,
    pub api_key: Option<Secret>,
    pub timeout: Dur,
    pub connect_timeout: Dur,
    /// The limit on one reconcile search. A recovered claim is reconciled
    /// before it is delivered, and an ambiguous answer after; searches and
    /// the POST together stay within `timeout`, the attempt's budget that
    /// the lease must cover.
    pub reconcile_timeout: Dur,
    pub on_ambiguous: AmbiguityPolicy,
}

impl Default for ChargeSection {
    fn default() -> Self {
        ChargeSection {
            api_base: "https://api.stripe.com".into(),
            api_key: None,
            timeout: dur("30s"),
            connect_timeout: dur("10s"),
            reconcile_timeout: dur("10s"),
            on_ambiguous: AmbiguityPolicy::Park,
        }
    }
}

impl ChargeSection {
    /// `None` when no API key is configured.
    pub fn provider_config(&self) -> anyhow::Result<Option<ChargeConfig>> {
        let Some(api_key) = &self.api_key else {
            return Ok(None);
        };
        if api_key.expose().trim().is_empty() {
            bail!("charge.api_key (STRIPE_API_KEY) is empty");
        }
        let api_base = outbox_providers::charge::parse_api_base(&self.api_base)
            .map_err(|e| anyhow::anyhow!("charge.api_base: {e}"))?;
        Ok(Some(ChargeConfig {
            api_base,
            api_key: api_key.clone(),
            timeout: self.timeout.0,
            connect_timeout: self.connect_timeout.0,
            reconcile_timeout: self.reconcile_timeout.0,
            on_ambiguous: self.on_ambiguous,
        }))
    }
}

/// `[nats]`: the `nats` kind (JetStream) is enabled when `url` is set.
/// Credentials (one of `token`, `user` + `password`, `nkey`,
/// `credentials_file`) belong in the environment
/// (`OUTBOX_RELAY__NATS__TOKEN`, or `..._FILE` naming a file).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NatsSection {
    pub url: Option<String>,
    pub token: Option<Secret>,
    pub user: Option<String>,
    pub password: Option<Secret>,
    pub nkey: Option<Secret>,
    pub credentials_file: Option<std::path::PathBuf>,
    pub require_tls: bool,
    pub tls_ca_file: Option<std::path::PathBuf>,
    /// How long a publish waits for its PubAck; one attempt (reconcile
    /// included) runs within it.
    pub timeout: Dur,
    /// What to do when a publish stays unconfirmed and JetStream can no
    /// longer dedupe a republish: park (the default) or redeliver.
    pub on_ambiguous: AmbiguityPolicy,
}

impl Default for NatsSection {
    fn default() -> Self {
        NatsSection {
            url: None,
            token: None,
            user: None,
            password: None,
            nkey: None,
            credentials_file: None,
            require_tls: false,
            tls_ca_file: None,
            timeout: dur("10s"),
            on_ambiguous: AmbiguityPolicy::Park,
        }
    }
}

impl NatsSection {
    /// `None` when no URL is configured.
    pub fn provider_config(&self) -> anyhow::Result<Option<NatsConfig>> {
        let Some(url) = &self.url else {
            return Ok(None);
        };
        let config = NatsConfig {
            url: url.clone(),
            token: self.token.clone(),
            user: self.user.clone(),
            password: self.password.clone(),
            nkey: self.nkey.clone(),
            credentials_file: self.credentials_file.clone(),
            require_tls: self.require_tls,
            tls_ca_file: self.tls_ca_file.clone(),
            timeout: self.timeout.0,
            on_ambiguous: self.on_ambiguous,
        };
        config.check()?;
        Ok(Some(config))
    }
}

/// `[amqp]`: the `amqp` kind (RabbitMQ, AMQP 0-9-1) is enabled when `url`
/// is set. The URL names the user and vhost but no password: that belongs
/// in the environment (`OUTBOX_RELAY__AMQP__PASSWORD`, or `..._FILE` naming
/// a file).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AmqpSection {
    pub url: Option<String>,
    pub password: Option<Secret>,
    pub tls_ca_file: Option<std::path::PathBuf>,
    /// Send the password over `amqp://` to a broker that is not loopback.
    pub allow_plaintext: bool,
    /// How long a publish waits for its confirm; one attempt runs within it.
    pub timeout: Dur,
    /// What to do when a confirm is lost: redeliver under the same
    /// `message_id` (the default; consumers dedupe on it) or park.
    pub on_ambiguous: AmbiguityPolicy,
}

impl Default for AmqpSection {
    fn default() -> Self {
        AmqpSection {
            url: None,
            password: None,
            tls_ca_file: None,
            allow_plaintext: false,
            timeout: dur("10s"),
            on_ambiguous: AmbiguityPolicy::Redeliver,
        }
    }
}

impl AmqpSection {
    /// `None` when no URL is configured.
    pub fn provider_config(&self) -> anyhow::Result<Option<AmqpConfig>> {
        let Some(url) = &self.url else {
            if self.password.is_some() {
                bail!("amqp.password is set but amqp.url is not");
            }
            return Ok(None);
        };
        let config = AmqpConfig {
            url: url.clone(),
            password: self.password.clone(),
            tls_ca_file: self.tls_ca_file.clone(),
            allow_plaintext: self.allow_plaintext,
            timeout: self.timeout.0,
            on_ambiguous: self.on_ambiguous,
        };
        config.check()?;
        Ok(Some(config))
    }
}

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

impl Config {
    /// Destination health (limits, breakers, alerts), checked.
    pub fn health(&self) -> anyhow::Result<crate::health::HealthSettings> {
        crate::health::HealthSettings::from_config(self)
    }

    /// The configured schedules, parsed.
    pub fn schedules(&self) -> anyhow::Result<Vec<crate::schedule::Schedule>> {
        let mut seen = std::collections::HashSet::new();
        self.schedules
            .iter()
            .map(|e| {
                if !seen.insert(e.name.clone()) {
                    bail!("schedule {:?} is defined twice", e.name);
                }
                crate::schedule::Schedule::from_entry(e).map_err(anyhow::Error::msg)
            })
            .collect()
    }

    /// Each schedule's kind is one this product delivers and its payload is
    /// one that kind's provider accepts, checked the way the provider will:
    /// otherwise every tick would enqueue an intent that can only end
    /// `rejected`. Email payloads without `from` are checked against
    /// `email.from` where email is configured (elsewhere another relay's
    /// `email.from` applies).
    fn check_schedule_payloads(&self) -> anyhow::Result<()> {
        use outbox_providers::{amqp, charge, email, nats, webhook, KNOWN_KINDS};
        for s in &self.schedules {
            let checked = match s.kind.as_str() {
                "webhook" => webhook::request::parse(
                    &s.payload,
                    None,
                    s.destination.as_deref(),
                    &self.webhook.endpoints,
                )
                .map(drop),
                "email" => {
                    let from = match self.email.provider_config()? {
                        Some(c) => c.from,
                        None => Some("schedule-check@example.invalid".parse().expect("valid")),
                    };
                    outbox_providers::refuse_destination("email", s.destination.as_deref())
                        .and_then(|()| {
                            email::message::prepare(&s.payload, "schedule-check", 0, from.as_ref())
                        })
                        .map(drop)
                }
                "charge" => {
                    outbox_providers::refuse_destination("charge", s.destination.as_deref())
                        .and_then(|()| charge::request::form(&s.payload, "schedule-check", 0))
                        .map(drop)
                }
                "nats" => outbox_providers::refuse_destination("nats", s.destination.as_deref())
                    .and_then(|()| nats::request::parse(&s.payload, None))
                    .map(drop),
                "amqp" => outbox_providers::refuse_destination("amqp", s.destination.as_deref())
                    .and_then(|()| amqp::request::parse(&s.payload, None))
                    .map(drop),
                other => bail!(
                    "schedule {:?}: kind {other:?} is not one this relay delivers ({})",
                    s.name,
                    KNOWN_KINDS.join(", ")
                ),
            };
            checked.map_err(|e| anyhow::anyhow!("schedule {:?}: payload: {e}", s.name))?;
        }
        Ok(())
    }

    /// The budget of one attempt of `kind`: every provider call it makes
    /// (a charge may search, reconcile, before and after its POST) runs
    /// within it, and dispatch enforces it.
    pub fn attempt_time(&self, kind: &str) -> Duration {
        match kind {
            "email" => self.email.timeout.0,
            "charge" => self.charge.timeout.0,
            "nats" => self.nats.timeout.0,
            "amqp" => self.amqp.timeout.0,
            _ => self.webhook.timeout.0,
        }
    }

    /// The longest time one attempt may take, over the enabled kinds.
    pub fn longest_attempt(&self) -> Duration {
        let mut longest = self.attempt_time("webhook");
        if self.email.smtp_url.is_some() {
            longest = longest.max(self.attempt_time("email"));
        }
        if self.charge.api_key.is_some() {
            longest = longest.max(self.attempt_time("charge"));
        }
        if self.nats.url.is_some() {
            longest = longest.max(self.attempt_time("nats"));
        }
        if self.amqp.url.is_some() {
            longest = longest.max(self.attempt_time("amqp"));
        }
        longest
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
                .entry("charge")
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
        let r = &self.relay;
        if !(1..=10_000).contains(&r.concurrency) {
            bail!(
                "relay.concurrency must be between 1 and 10000, not {}",
                r.concurrency
            );
        }
        if !(1..=10_000).contains(&r.batch_size) {
            bail!(
                "relay.batch_size must be between 1 and 10000, not {}",
                r.batch_size
            );
        }
        if r.lease.0 < Duration::from_secs(1) {
            bail!("relay.lease must be at least 1s");
        }
        if r.poll_interval.0 < Duration::from_millis(10) {
            bail!("relay.poll_interval must be at least 10ms");
        }
        if r.sweep_interval.0 < Duration::from_millis(10) {
            bail!("relay.sweep_interval must be at least 10ms");
        }
        if let Some(addr) = &r.metrics_addr {
            addr.parse::<std::net::SocketAddr>().map_err(|_| {
                anyhow::anyhow!("relay.metrics_addr {addr:?} is not an address like 127.0.0.1:9187")
            })?;
        }
        Ok(())
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
                 webhook.timeout, email.timeout, charge.timeout, nats.timeout, amqp.timeout) \
                 by at least 1.6s: a delivery must end before its lease can expire, or a slow \
                 request would be redelivered while it runs",
                r.lease.0,
                self.longest_attempt()
            );
        }
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
        ] {
            // "0s" would time out every attempt (an email timed out after
            // its body is ambiguous: every message would be parked)
            if d.0 < Duration::from_millis(100) {
                bail!("{name} must be at least 100ms, not {:?}", d.0);
            }
        }
        // what the providers would refuse: secrets, URLs, addresses
        // (`engine::providers` builds them)
        self.webhook.provider_config()?.check()?;
        if let Some(email) = self.email.provider_config()? {
            email.check()?;
        }
        self.charge.provider_config()?;
        self.nats.provider_config()?;
        self.amqp.provider_config()?;
        self.health()?;
        self.schedules()?;
        self.check_schedule_payloads()?;
        self.console.validate()?;
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
        if let Some(token) = &r.lookup_token {
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

/// The variable that may hold `relay.lookup_token`, like `STRIPE_API_KEY`
/// for `charge.api_key`.
pub const LOOKUP_TOKEN_VAR: &str = "OUTBOX_RELAY_LOOKUP_TOKEN";

/// Secrets with a variable of their own, taken as they are (never as TOML).
const PLAIN_SECRET_VARS: &[&str] = &["STRIPE_API_KEY", LOOKUP_TOKEN_VAR];

/// Replace every `OUTBOX_RELAY__…_FILE`, `STRIPE_API_KEY_FILE` and
/// `OUTBOX_RELAY_LOOKUP_TOKEN_FILE` variable
/// by the variable without the suffix, holding the file's contents (a
/// trailing newline dropped): how container platforms hand out secrets.
/// The value is always a string, except for a list key (`signing_secrets`),
/// where each non-empty line is one item. Errors name the file, never its
/// contents.
pub fn read_secret_files(env: Vec<(String, String)>) -> anyhow::Result<Vec<(String, String)>> {
    let mut out = Vec::with_capacity(env.len());
    for (name, value) in &env {
        let Some(base) = name.strip_suffix("_FILE") else {
            out.push((name.clone(), value.clone()));
            continue;
        };
        if !(base.starts_with("OUTBOX_RELAY__") || PLAIN_SECRET_VARS.contains(&base)) {
            out.push((name.clone(), value.clone()));
            continue;
        }
        if env.iter().any(|(k, _)| k == base) {
            bail!("both {base} and {name} are set; set one");
        }
        let contents = read_secret_file(name, value)?;
        let toml_value = if base.to_ascii_lowercase().ends_with("__signing_secrets") {
            toml::Value::Array(
                contents
                    .lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .map(|l| toml::Value::String(l.to_string()))
                    .collect(),
            )
        } else {
            toml::Value::String(contents)
        };
        // STRIPE_API_KEY, the lookup token and secret keys are taken as they are (see
        // `apply_env`); anything else is read as TOML, so quote it
        let last = base
            .rsplit("__")
            .next()
            .unwrap_or(base)
            .to_ascii_lowercase();
        let raw = match toml_value.as_str() {
            Some(text) if PLAIN_SECRET_VARS.contains(&base) || is_secret_key(&last) => {
                text.to_string()
            }
            _ => toml_value.to_string(),
        };
        out.push((base.to_string(), raw));
    }
    Ok(out)
}

/// The contents of the file a `*_FILE` variable names, without the trailing
/// newline. An empty file is an error.
pub fn read_secret_file(var: &str, path: &str) -> anyhow::Result<String> {
    let contents =
        std::fs::read_to_string(path).with_context(|| format!("{var}: cannot read {path}"))?;
    let contents = contents.trim_end_matches(['\n', '\r']).to_string();
    if contents.trim().is_empty() {
        bail!("{var}: {path} is empty");
    }
    Ok(contents)
}

/// Keys whose environment values are taken as they are, never read as TOML.
fn is_secret_key(key: &str) -> bool {
    matches!(
        key,
        "password" | "api_key" | "database_url" | "lookup_token"
    )
}

/// Which environment variable set which key (`relay.concurrency` ←
/// `OUTBOX_RELAY__RELAY__CONCURRENCY`), so that an error about a key the
/// environment set names the variable rather than the config file.
struct EnvSources(Vec<(String, String)>);

impl EnvSources {
    /// From the variables as given and as read (`…_FILE` replaced by the
    /// variable without the suffix).
    fn new(given: &[(String, String)], read: &[(String, String)]) -> Self {
        let mut sources = EnvSources(Vec::new());
        for (name, _) in read {
            if let Some(path) = name.strip_prefix("OUTBOX_RELAY__") {
                let key = path.split("__").collect::<Vec<_>>().join(".");
                sources.add(&key.to_ascii_lowercase(), name, given);
            }
        }
        sources
    }

    /// `key` was set by `name` (or by `name_FILE`, when that is what was given).
    fn add(&mut self, key: &str, name: &str, given: &[(String, String)]) {
        let var = if given.iter().any(|(k, _)| k == name) {
            name.to_string()
        } else {
            format!("{name}_FILE")
        };
        self.0.push((key.to_string(), var));
    }

    /// The variable that set `key` or a section holding it (`retry.schedule`
    /// for `retry.schedule[0]`), the most specific one.
    fn setting(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .filter(|(k, _)| {
                key.strip_prefix(k.as_str())
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
            })
            .max_by_key(|(k, _)| k.len())
            .map(|(_, v)| v.as_str())
    }

    /// The variables whose keys `message` names, as whole keys.
    fn named_in(&self, message: &str) -> Vec<&str> {
        let part = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '.';
        let mut vars: Vec<&str> = self
            .0
            .iter()
            .filter(|(key, _)| {
                message.match_indices(key.as_str()).any(|(at, _)| {
                    let before = message[..at].chars().next_back();
                    let after = message[at + key.len()..].chars().next();
                    !before.is_some_and(part) && !after.is_some_and(|c| part(c) && c != '.')
                })
            })
            .map(|(_, v)| v.as_str())
            .collect();
        vars.dedup();
        vars
    }
}

/// Merge `OUTBOX_RELAY__A__B=value` into the table at `a.b`.
fn apply_env(
    table: &mut toml::Table,
    env: impl IntoIterator<Item = (String, String)>,
) -> anyhow::Result<()> {
    for (name, raw) in env {
        let Some(path) = name.strip_prefix("OUTBOX_RELAY__") else {
            continue;
        };
        let keys: Vec<String> = path.split("__").map(|k| k.to_ascii_lowercase()).collect();
        if keys.iter().any(|k| k.is_empty()) {
            bail!("environment variable {name} has an empty key segment");
        }
        // A secret is taken as it is: read as TOML, a password like 12345
        // would become a number, and the type error would quote it.
        let value = if keys.last().is_some_and(|k| is_secret_key(k)) {
            toml::Value::String(raw.clone())
        } else {
            toml::from_str::<toml::Table>(&format!("v = {raw}"))
                .ok()
                .and_then(|mut t| t.remove("v"))
                .unwrap_or_else(|| toml::Value::String(raw.clone()))
        };
        let (last, parents) = keys.split_last().expect("non-empty");
        let mut node = &mut *table;
        for k in parents {
            let entry = node
                .entry(k.clone())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            node = entry
                .as_table_mut()
                .ok_or_else(|| anyhow::anyhow!("{name}: {k} is not a section"))?;
        }
        node.insert(last.clone(), value);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load_str(text: &str, env: &[(&str, &str)]) -> anyhow::Result<Config> {
        let dir = std::env::temp_dir().join(format!("outbox-relay-cfg-{}", fastrand::u64(..)));
        std::fs::write(&dir, text).unwrap();
        let r = Config::load(
            Some(&dir),
            env.iter().map(|(k, v)| (k.to_string(), v.to_string())),
        );
        std::fs::remove_file(&dir).ok();
        r
    }

    #[test]
    fn the_example_config_loads_and_states_the_defaults() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/config.example.toml");
        let example =
            Config::load(Some(&path), Vec::new()).expect("deploy/config.example.toml is valid");
        let defaults = Config::load(None, Vec::new()).unwrap();
        assert_eq!(
            format!("{example:?}"),
            format!("{defaults:?}"),
            "the example documents the defaults"
        );
    }

    /// The fields serde knows under `section` ("" for the top level), from
    /// the error that names an unknown one: "expected one of `a`, `b`".
    fn fields_of(section: &str) -> Vec<String> {
        let text = match section {
            "" => "__probe = 1".to_string(),
            s => format!("[{s}]\n__probe = 1"),
        };
        let err = format!("{:#}", load_str(&text, &[]).unwrap_err());
        let (_, expected) = err
            .split_once("expected")
            .unwrap_or_else(|| panic!("[{section}] names no fields: {err}"));
        expected
            .split('`')
            .skip(1)
            .step_by(2)
            .map(String::from)
            .collect()
    }

    /// The example's text of `[section]`, its commented lines and
    /// subsections (`[section.x]`, `# [[section.x]]`) included.
    fn example_section<'a>(example: &'a str, section: &str) -> Vec<&'a str> {
        let header = format!("[{section}]");
        let sub = format!("[{section}.");
        let mut inside = false;
        let mut lines = Vec::new();
        for line in example.lines() {
            if line.starts_with('[') {
                inside = line.starts_with(&header) || line.starts_with(&sub);
            }
            if inside {
                lines.push(line);
            }
        }
        lines
    }

    fn names_word(lines: &[&str], word: &str) -> bool {
        lines.iter().any(|line| {
            line.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .any(|w| w == word)
        })
    }

    /// The example is the configuration's reference: every key of every
    /// section is in it, set to its default or, where it has none (a URL,
    /// a secret), named in a comment.
    #[test]
    fn the_example_config_names_every_key() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/config.example.toml");
        let example = std::fs::read_to_string(path).unwrap();
        let all: Vec<&str> = example.lines().collect();
        let mut missing = Vec::new();
        for top in fields_of("") {
            if !names_word(&all, &top) {
                missing.push(top.clone());
            }
            let lines = example_section(&example, &top);
            // only a section whose keys serde names: not a map such as
            // [limits], nor an array such as [[schedule]]
            let probed = load_str(&format!("[{top}]\n__probe = 1"), &[]);
            if lines.is_empty()
                || !probed.is_err_and(|e| format!("{e:#}").contains("unknown field"))
            {
                continue;
            }
            for field in fields_of(&top) {
                if !names_word(&lines, &field) {
                    missing.push(format!("{top}.{field}"));
                }
            }
        }
        assert!(
            missing.is_empty(),
            "deploy/config.example.toml does not name {missing:?}"
        );
        // the probe reads the fields it should
        assert!(fields_of("relay").contains(&"summary_interval".to_string()));
    }

    #[test]
    fn destination_health_settings_are_checked() {
        let c = load_str(
            r#"
            [webhook.endpoints]
            billing = "https://Pay.Example:443/hooks"
            [limits]
            "https://api.partner.example/ignored" = "50/s"
            billing = "600/min"
            smtp = "20/s"
            [breaker]
            failures = 5
            [breaker.overrides.charge]
            cooldown = "5s"
            [alerts]
            endpoint = "billing"
            dead_threshold = 10
            "#,
            &[],
        )
        .unwrap();
        let h = c.health().unwrap();
        assert_eq!(h.limits["https://api.partner.example"].per_second, 50.0);
        assert_eq!(h.limits["https://pay.example"].per_second, 10.0);
        assert_eq!(h.limits["smtp"].per_second, 20.0);
        let b = h.breaker.unwrap();
        assert_eq!((b.failures, b.cooldown), (5, Duration::from_secs(30)));
        assert_eq!(h.overrides["charge"].cooldown, Duration::from_secs(5));
        assert_eq!(h.overrides["charge"].failures, 5);
        assert_eq!(h.alerts.endpoint.as_deref(), Some("billing"));
        for (text, says) in [
            ("[limits]\npartner = \"50/s\"", "is not a destination"),
            ("[limits]\nsmtp = \"fast\"", "invalid rate"),
            ("[limits]\nsmtp = \"0/s\"", "more than zero"),
            (
                "[breaker]\nfailures = 0",
                "breaker.failures must be at least 1",
            ),
            (
                "[breaker]\ncooldown = \"1m\"\nmax_cooldown = \"10s\"",
                "max_cooldown",
            ),
            (
                "[alerts]\nurl = \"https://a.example/\"\nendpoint = \"x\"",
                "not both",
            ),
            (
                "[alerts]\nendpoint = \"ops\"",
                "is not one of [webhook.endpoints]",
            ),
            ("[alerts]\nurl = \"ftp://a.example/\"", "alerts.url"),
        ] {
            let err = format!("{:#}", load_str(text, &[]).unwrap_err());
            assert!(err.contains(says), "{text}: {err}");
        }
    }

    #[test]
    fn empty_config_gives_the_documented_defaults() {
        let c = Config::load(None, Vec::new()).unwrap();
        assert_eq!(c.relay.concurrency, 64);
        assert_eq!(c.relay.batch_size, 100);
        assert_eq!(c.relay.lease.0, Duration::from_secs(60));
        assert_eq!(c.relay.poll_interval.0, Duration::from_secs(1));
        assert_eq!(c.retry.max_attempts, 10);
        assert_eq!(c.retry.schedule.len(), 6);
        assert_eq!(c.webhook.timeout.0, Duration::from_secs(15));
        assert_eq!(c.relay.metrics_addr.as_deref(), Some("127.0.0.1:9187"));
    }

    #[test]
    fn reads_the_contract_keys() {
        let c = load_str(
            r#"
            database_url = "postgres://u:pw@localhost/db"
            [relay]
            concurrency = 8
            lease = "30s"
            poll_interval = "200ms"
            metrics_addr = "127.0.0.1:0"
            [retry]
            max_attempts = 4
            schedule = ["1s", "2s"]
            [retry.webhook]
            max_attempts = 2
            [webhook]
            signing_secrets = ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]
            timeout = "5s"
            allowed_networks = ["127.0.0.0/8"]
            "#,
            &[],
        )
        .unwrap();
        assert_eq!(c.relay.concurrency, 8);
        assert_eq!(c.relay.poll_interval.0, Duration::from_millis(200));
        assert_eq!(c.retry.policy("webhook").max_attempts, 2);
        assert_eq!(
            c.retry.policy("webhook").schedule,
            [Duration::from_secs(1), Duration::from_secs(2)]
        );
        assert_eq!(c.retry.policy("email").max_attempts, 4);
        assert!(
            !format!("{c:?}").contains("pw@"),
            "database_url must not print"
        );
        assert!(
            !format!("{c:?}").contains("MfKQ9r8"),
            "secrets must not print"
        );
    }

    #[test]
    fn errors_name_the_key() {
        for (text, needle) in [
            ("[relay]\nconcurency = 3", "concurency"),
            (
                "[relay]\nlease = \"5 parsecs\"",
                "relay.lease: invalid duration \"5 parsecs\"",
            ),
            ("[relay]\nlease = 60", "duration must be a string"),
            ("[relay]\nlease = \"9999999h\"", "longer than a year"),
            ("[[schedule]]\nname = \"d\"\ncron = \"every day\"\nkind = \"email\"\npayload = {}", "cron \"every day\" is invalid"),
            ("[[schedule]]\nname = \"d\"\ncron = \"* * * * * *\"\nkind = \"email\"\npayload = {}\n[[schedule]]\nname = \"d\"\ncron = \"* * * * * *\"\nkind = \"email\"\npayload = {}", "twice"),
            ("[[schedule]]\nname = \"d\"\ncron = \"* * * * * *\"\nkind = \"email\"", "payload"),
            ("[retention]\nintents = \"1h\"\nledger = \"30m\"", "retention.ledger"),
            ("[relay]\nconcurrency = 0", "relay.concurrency"),
            (
                "[relay]\nlease = \"10s\"\n[webhook]\ntimeout = \"15s\"",
                "relay.lease",
            ),
            ("[retry]\nschedule = []", "retry.schedule"),
            (
                "[retry.email]\nmax_attempts = 0",
                "retry.email.max_attempts",
            ),
            (
                "[webhook]\nallowed_networks = [\"nope\"]",
                "webhook.allowed_networks",
            ),
            (
                "[webhook]\nsigning_secrets = [\"plain\"]",
                "webhook.signing_secrets",
            ),
            (
                "[webhook.endpoints]\nx = \"ftp://a\"",
                "webhook.endpoints.x",
            ),
            (
                "[relay]\nmetrics_addr = \"localhost\"",
                "relay.metrics_addr",
            ),
            ("nonsense = 1", "nonsense"),
            (
                "[email]\nsmtp_url = \"http://mail.example.com\"",
                "not supported",
            ),
            (
                "[email]\nsmtp_url = \"smtp://h\"\nfrom = \"nope\"",
                "email.from",
            ),
            (
                "[email]\nsmtp_url = \"smtp://h\"\ntimeout = \"90s\"",
                "relay.lease",
            ),
            ("[email]\non_ambiguous = \"maybe\"", "maybe"),
            (
                "[charge]\napi_key = \"sk_test\"\napi_base = \"ftp://x\"",
                "charge.api_base",
            ),
            ("[charge]\napi_key = \" \"", "is empty"),
            ("[relay", "not valid TOML"),
            // absurd values: each refused with the key named, none panics
            ("[relay]\nlease = \"0s\"", "relay.lease must be at least 1s"),
            ("[relay]\nlease = \"-5s\"", "relay.lease: invalid duration \"-5s\""),
            (
                "[relay]\nlease = \"99999999999999999999s\"",
                "relay.lease: invalid duration \"99999999999999999999s\"",
            ),
            (
                "[relay]\npoll_interval = \"0ms\"",
                "relay.poll_interval must be at least 10ms",
            ),
            (
                "[relay]\nconcurrency = 1000000000",
                "relay.concurrency must be between 1 and 10000, not 1000000000",
            ),
            ("[relay]\nconcurrency = 1e9", "relay.concurrency: invalid type"),
            ("[relay]\nconcurrency = -1", "relay.concurrency"),
            (
                "[relay]\nbatch_size = 0",
                "relay.batch_size must be between 1 and 10000, not 0",
            ),
            (
                "[retry]\nschedule = [\"-1s\"]",
                "retry.schedule[0]: invalid duration \"-1s\"",
            ),
            (
                "[retry.charge]\nschedule = []",
                "retry.charge.schedule must list at least one delay",
            ),
            ("[retry]\njitter = 2.0", "retry.jitter must be between 0.0 and 1.0"),
            ("[retry]\njitter = -1", "retry.jitter must be between 0.0 and 1.0"),
            ("[retry]\njitter = nan", "retry.jitter must be between 0.0 and 1.0"),
            (
                "[retry]\nmax_attempts = 0",
                "retry.max_attempts must be between 1 and 1000",
            ),
            (
                "[retry]\nmax_attempts = 99999999999",
                "retry.max_attempts: invalid value",
            ),
            (
                "[retention]\ninterval = \"0s\"",
                "retention.interval must be at least 1s",
            ),
            (
                "[webhook]\ntimeout = \"0s\"",
                "webhook.timeout must be at least 100ms",
            ),
            (
                "[email]\nconnect_timeout = \"0s\"",
                "email.connect_timeout must be at least 100ms",
            ),
            (
                "[relay]\nmetrics_addr = \"nonsense\"",
                "relay.metrics_addr \"nonsense\" is not an address",
            ),
            (
                "[[schedule]]\nname = \"d\"\ncron = \"* * *\"\nkind = \"webhook\"\npayload = {}",
                "schedule \"d\": cron \"* * *\" is invalid (too few fields)",
            ),
            (
                "[[schedule]]\nname = \"d\"\ncron = \"61 * * * * *\"\nkind = \"webhook\"\npayload = {}",
                "schedule \"d\": cron \"61 * * * * *\" is invalid (Seconds must be",
            ),
            (
                "[[schedule]]\nname = \"d\"\ncron = \"not a cron\"\nkind = \"webhook\"\npayload = {}",
                "schedule \"d\": cron \"not a cron\" is invalid (The 'Seconds' field",
            ),
            (
                "[[schedule]]\nname = \"d\"\ncron = \"0 0 9 * * *\"\nkind = \"sms\"\npayload = { to = \"+100\" }",
                "schedule \"d\": kind \"sms\" is not one this relay delivers",
            ),
            (
                "[[schedule]]\nname = \"d\"\ncron = \"0 0 9 * * *\"\nkind = \"webhook\"\npayload = { body = 1 }",
                "schedule \"d\": payload: webhook payload has no \"url\"",
            ),
            (
                "[[schedule]]\nname = \"d\"\ncron = \"0 0 9 * * *\"\nkind = \"webhook\"\npayload = { url = \"gopher://x\", body = 1 }",
                "schedule \"d\": payload: webhook url scheme \"gopher\"",
            ),
            (
                "[[schedule]]\nname = \"d\"\ncron = \"0 0 9 * * *\"\nkind = \"email\"\npayload = { to = [\"a@\"], subject = \"s\", text = \"t\" }",
                "schedule \"d\": payload: email \"to\" address \"a@\" is invalid",
            ),
            (
                "[[schedule]]\nname = \"d\"\ncron = \"0 0 9 * * *\"\nkind = \"charge\"\npayload = { amount = 0, currency = \"usd\", payment_method = \"pm\" }",
                "schedule \"d\": payload: charge \"amount\" must be between 1 and 99999999",
            ),
            (
                "[[schedule]]\nname = \"d\"\ncron = \"0 0 9 * * *\"\nkind = \"webhook\"\npayload = \"x\"",
                "schedule \"d\": payload must be a table",
            ),
        ] {
            let err = format!("{:#}", load_str(text, &[]).unwrap_err());
            assert!(err.contains(needle), "{text:?}: {err}");
        }
    }

    #[test]
    fn schedules_with_valid_payloads_load() {
        let c = load_str(
            r#"
            [webhook.endpoints]
            ops = "https://ops.example.com/hook"
            [[schedule]]
            name = "ping"
            cron = "0 * * * * *"
            kind = "webhook"
            destination = "ops"
            payload = { body = { ping = true } }
            [[schedule]]
            name = "digest"
            cron = "0 0 9 * * *"
            kind = "email"
            payload = { to = ["ops@example.com"], subject = "Digest", text = "..." }
            [[schedule]]
            name = "fee"
            cron = "0 0 0 1 * *"
            kind = "charge"
            payload = { amount = 500, currency = "eur", payment_method = "pm_card_visa" }
            "#,
            &[],
        )
        .unwrap();
        assert_eq!(c.schedules().unwrap().len(), 3);
        // where email is configured, a payload without "from" needs email.from
        let err = load_str(
            "[email]\nsmtp_url = \"smtp://127.0.0.1:2525\"\n[[schedule]]\nname = \"d\"\ncron = \"0 0 9 * * *\"\nkind = \"email\"\npayload = { to = [\"a@example.com\"], subject = \"s\", text = \"t\" }",
            &[],
        )
        .unwrap_err();
        assert!(
            format!("{err:#}").contains("schedule \"d\": payload: email payload has no \"from\""),
            "{err:#}"
        );
    }

    #[test]
    fn secrets_can_come_from_files() {
        let dir = std::env::temp_dir().join(format!("outbox-relay-secrets-{}", fastrand::u64(..)));
        std::fs::create_dir_all(&dir).unwrap();
        let write = |name: &str, text: &str| {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            p.display().to_string()
        };
        let password = write("smtp-password", "12345\n");
        let stripe = write("stripe", "sk_test_from_file\n");
        let signing = write(
            "signing",
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n\nwhsec_c2VjcmV0LXNpZ25pbmcta2V5LTEyMzQ1Njc4OTA=\n",
        );
        let c = load_str(
            "[email]\nsmtp_url = \"smtp://127.0.0.1:2525\"\nfrom = \"a@example.com\"\nusername = \"u\"",
            &[
                ("OUTBOX_RELAY__EMAIL__PASSWORD_FILE", &password),
                ("STRIPE_API_KEY_FILE", &stripe),
                ("OUTBOX_RELAY__WEBHOOK__SIGNING_SECRETS_FILE", &signing),
            ],
        )
        .unwrap();
        // a numeric-looking password stays a string
        assert_eq!(c.email.password.as_ref().unwrap().expose(), "12345");
        // from the environment too
        let from_env = load_str(
            "[email]\nsmtp_url = \"smtp://127.0.0.1:2525\"\nfrom = \"a@example.com\"\nusername = \"u\"",
            &[("OUTBOX_RELAY__EMAIL__PASSWORD", "12345")],
        )
        .unwrap();
        assert_eq!(from_env.email.password.as_ref().unwrap().expose(), "12345");
        assert_eq!(
            c.charge.api_key.as_ref().unwrap().expose(),
            "sk_test_from_file"
        );
        assert_eq!(c.webhook.signing_secrets.len(), 2);
        assert_eq!(
            c.webhook.signing_secrets[1].expose(),
            "whsec_c2VjcmV0LXNpZ25pbmcta2V5LTEyMzQ1Njc4OTA="
        );
        // errors name the variable and the file, never the contents
        let missing = dir.join("missing").display().to_string();
        for (env, needle) in [
            (
                vec![("STRIPE_API_KEY_FILE", missing.as_str())],
                "STRIPE_API_KEY_FILE: cannot read",
            ),
            (
                vec![
                    ("STRIPE_API_KEY_FILE", write("empty", "\n").as_str()),
                    ("X", "y"),
                ],
                "is empty",
            ),
            (
                vec![
                    ("STRIPE_API_KEY_FILE", stripe.as_str()),
                    ("STRIPE_API_KEY", "sk_test_env"),
                ],
                "both STRIPE_API_KEY and STRIPE_API_KEY_FILE are set",
            ),
        ] {
            let err = format!("{:#}", load_str("", &env).unwrap_err());
            assert!(err.contains(needle), "{err}");
            assert!(!err.contains("sk_test_from_file"), "{err}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn environment_overrides_the_file() {
        let c = load_str(
            "[relay]\nconcurrency = 8",
            &[
                ("OUTBOX_RELAY__RELAY__CONCURRENCY", "16"),
                ("OUTBOX_RELAY__RELAY__LEASE", "90s"),
                (
                    "OUTBOX_RELAY__WEBHOOK__ALLOWED_NETWORKS",
                    "[\"127.0.0.1/32\"]",
                ),
                ("UNRELATED", "x"),
            ],
        )
        .unwrap();
        assert_eq!(c.relay.concurrency, 16);
        assert_eq!(c.relay.lease.0, Duration::from_secs(90));
        assert_eq!(c.webhook.allowed_networks, ["127.0.0.1/32"]);
        let c = load_str("", &[("STRIPE_API_KEY", "sk_test_123")]).unwrap();
        assert_eq!(c.charge.api_key.as_ref().unwrap().expose(), "sk_test_123");
        assert!(crate::engine::providers(&c)
            .unwrap()
            .get("charge")
            .is_some());
        assert!(
            crate::engine::providers(&c).unwrap().get("email").is_none(),
            "email needs smtp_url"
        );
        let err = load_str("", &[("OUTBOX_RELAY__RELAY__TYPO", "1")]).unwrap_err();
        assert!(format!("{err:#}").contains("typo"));
    }

    #[test]
    fn the_lookup_token_comes_from_the_file_or_the_environment_and_never_prints() {
        let token = "tok-0123456789abcdef";
        let defaults = load_str("", &[]).unwrap();
        assert!(defaults.relay.lookup && defaults.relay.lookup_token.is_none());
        let dir = std::env::temp_dir().join(format!("outbox-relay-tok-{}", fastrand::u64(..)));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, format!("{token}\n")).unwrap();
        let file = file.display().to_string();
        let in_file = format!("[relay]\nlookup_token = \"{token}\"");
        for (text, env) in [
            (in_file.as_str(), vec![]),
            ("", vec![("OUTBOX_RELAY_LOOKUP_TOKEN", token)]),
            ("", vec![("OUTBOX_RELAY_LOOKUP_TOKEN_FILE", file.as_str())]),
            ("", vec![("OUTBOX_RELAY__RELAY__LOOKUP_TOKEN", token)]),
            // the environment overrides the file
            (
                "[relay]\nlookup_token = \"from-the-file-0123456789\"",
                vec![("OUTBOX_RELAY_LOOKUP_TOKEN", token)],
            ),
        ] {
            let c = load_str(text, &env).unwrap();
            assert_eq!(c.relay.lookup_token.as_ref().unwrap().expose(), token);
            assert!(!format!("{c:?}").contains(token), "the token never prints");
        }
        let off = load_str("", &[("OUTBOX_RELAY__RELAY__LOOKUP", "false")]).unwrap();
        assert!(!off.relay.lookup);
        for (env, needle) in [
            (
                vec![("OUTBOX_RELAY_LOOKUP_TOKEN", "short-s3cret")],
                "in environment variable OUTBOX_RELAY_LOOKUP_TOKEN: relay.lookup_token is shorter than 16",
            ),
            (
                vec![("OUTBOX_RELAY_LOOKUP_TOKEN", "s3cret with spaces inside")],
                "relay.lookup_token must be printable ASCII without spaces",
            ),
            (
                vec![
                    ("OUTBOX_RELAY_LOOKUP_TOKEN", token),
                    ("OUTBOX_RELAY__RELAY__LOOKUP_TOKEN", token),
                ],
                "both OUTBOX_RELAY_LOOKUP_TOKEN and OUTBOX_RELAY__RELAY__LOOKUP_TOKEN are set",
            ),
            (
                vec![
                    ("OUTBOX_RELAY_LOOKUP_TOKEN", token),
                    ("OUTBOX_RELAY_LOOKUP_TOKEN_FILE", file.as_str()),
                ],
                "both OUTBOX_RELAY_LOOKUP_TOKEN and OUTBOX_RELAY_LOOKUP_TOKEN_FILE are set",
            ),
        ] {
            let err = format!("{:#}", load_str("", &env).unwrap_err());
            assert!(err.contains(needle), "{err}");
            assert!(!err.contains("s3cret") && !err.contains(token), "{err}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn errors_from_the_environment_name_the_variable() {
        let dir = std::env::temp_dir().join(format!("outbox-relay-env-{}", fastrand::u64(..)));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("timeout");
        std::fs::write(&file, "soon\n").unwrap();
        let file = file.display().to_string();
        for (env, file_text, needle) in [
            (
                vec![("OUTBOX_RELAY__RELAY__CONCURRENCY", "lots")],
                "[relay]\nconcurrency = 8",
                "in environment variable OUTBOX_RELAY__RELAY__CONCURRENCY: invalid configuration: \
                 relay.concurrency: invalid type: string \"lots\", expected u32",
            ),
            (
                vec![("OUTBOX_RELAY__RELAY__TYPO", "1")],
                "",
                "in environment variable OUTBOX_RELAY__RELAY__TYPO: invalid configuration: \
                 relay.typo: unknown field `typo`",
            ),
            (
                vec![("OUTBOX_RELAY__RETRY__SCHEDULE", "[\"1s\", \"later\"]")],
                "",
                "in environment variable OUTBOX_RELAY__RETRY__SCHEDULE: invalid configuration: \
                 retry.schedule[1]: invalid duration \"later\"",
            ),
            (
                vec![("OUTBOX_RELAY__RELAY__CONCURRENCY", "0")],
                "",
                "in environment variable OUTBOX_RELAY__RELAY__CONCURRENCY: relay.concurrency must be \
                 between 1 and 10000, not 0",
            ),
            (
                vec![("OUTBOX_RELAY__WEBHOOK__TIMEOUT_FILE", file.as_str())],
                "",
                "in environment variable OUTBOX_RELAY__WEBHOOK__TIMEOUT_FILE: invalid configuration: \
                 webhook.timeout: invalid duration \"soon\"",
            ),
            (
                vec![("STRIPE_API_KEY", " ")],
                "",
                "in environment variable STRIPE_API_KEY: charge.api_key (STRIPE_API_KEY) is empty",
            ),
            (
                vec![("OUTBOX_RELAY__RELAY__LEASE", "10s")],
                "[webhook]\ntimeout = \"15s\"",
                "in environment variable OUTBOX_RELAY__RELAY__LEASE: relay.lease (10s) must exceed",
            ),
        ] {
            let err = format!("{:#}", load_str(file_text, &env).unwrap_err());
            assert!(err.contains(needle), "{env:?}: {err}");
        }
        // a bad value in the file is the file's, whatever else the environment sets
        let err = load_str(
            "[relay]\nlease = \"soon\"",
            &[("OUTBOX_RELAY__RELAY__CONCURRENCY", "8")],
        )
        .unwrap_err();
        let err = format!("{err:#}");
        assert!(
            err.contains("in /") && err.contains("relay.lease") && !err.contains("OUTBOX_RELAY__"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! `[kafka]`: the `kafka` kind is enabled when `brokers` is set.

use anyhow::bail;
use outbox_providers::kafka::KafkaConfig;
use outbox_providers::AmbiguityPolicy;
use outbox_providers::Secret;
use serde::Deserialize;

use crate::units::{dur, Dur};

/// `[kafka]`: the `kafka` kind is enabled when `brokers` is set. A SASL
/// password belongs in the environment (`OUTBOX_RELAY__KAFKA__PASSWORD`, or
/// `..._FILE` naming a file), never in the file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaSection {
    /// Bootstrap brokers, `host:port` separated by commas.
    pub brokers: Option<String>,
    pub client_id: String,
    pub security_protocol: String,
    pub sasl_mechanism: Option<String>,
    /// The SASL user name; `username` is the same key.
    #[serde(alias = "username")]
    pub user: Option<String>,
    pub password: Option<Secret>,
    pub tls_ca_file: Option<std::path::PathBuf>,
    /// Send a `PLAIN` password over `sasl_plaintext` to brokers that are not
    /// loopback.
    pub allow_plaintext: bool,
    /// The budget of one attempt: half for the delivery report, the rest
    /// for a reconcile when the report does not come.
    pub timeout: Dur,
    pub linger: Dur,
    pub compression: String,
    /// What to do when reconcile cannot find a record whose report was
    /// lost: redeliver under the same `outbox-effect-key` (the default;
    /// consumers dedupe on it) or park.
    pub on_ambiguous: AmbiguityPolicy,
    pub reconcile_window: Dur,
    /// The largest record the producer sends (librdkafka's
    /// `message.max.bytes`); a larger one is rejected before any call.
    pub max_message_bytes: usize,
}

impl Default for KafkaSection {
    fn default() -> Self {
        KafkaSection {
            brokers: None,
            client_id: "outbox-relay".into(),
            security_protocol: "plaintext".into(),
            sasl_mechanism: None,
            user: None,
            password: None,
            tls_ca_file: None,
            allow_plaintext: false,
            timeout: dur("10s"),
            linger: dur("5ms"),
            compression: "none".into(),
            on_ambiguous: AmbiguityPolicy::Redeliver,
            reconcile_window: dur("15m"),
            max_message_bytes: 1_000_000,
        }
    }
}

impl KafkaSection {
    /// `None` when no brokers are configured.
    pub fn provider_config(&self) -> anyhow::Result<Option<KafkaConfig>> {
        let Some(brokers) = &self.brokers else {
            if self.password.is_some() || self.user.is_some() {
                bail!("kafka.user or kafka.password is set but kafka.brokers is not");
            }
            return Ok(None);
        };
        let config = KafkaConfig {
            brokers: brokers.clone(),
            client_id: self.client_id.clone(),
            security_protocol: self.security_protocol.clone(),
            sasl_mechanism: self.sasl_mechanism.clone(),
            user: self.user.clone(),
            password: self.password.clone(),
            tls_ca_file: self.tls_ca_file.clone(),
            allow_plaintext: self.allow_plaintext,
            timeout: self.timeout.0,
            linger: self.linger.0,
            compression: self.compression.clone(),
            on_ambiguous: self.on_ambiguous,
            reconcile_window: self.reconcile_window.0,
            max_message_bytes: self.max_message_bytes,
        };
        config.check()?;
        Ok(Some(config))
    }
}

impl crate::kinds::Section for KafkaSection {
    fn serves(&self) -> bool {
        self.brokers.is_some()
    }

    fn attempt_time(&self) -> std::time::Duration {
        self.timeout.0
    }

    fn provider(
        &self,
        _cx: &crate::kinds::Context,
    ) -> anyhow::Result<Option<std::sync::Arc<dyn outbox_providers::Provider>>> {
        crate::kinds::build(
            self.provider_config()?,
            outbox_providers::kafka::KafkaProvider::new,
        )
    }
}

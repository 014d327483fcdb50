//! `[amqp]`: the `amqp` kind (RabbitMQ, AMQP 0-9-1) is enabled when `url`

use anyhow::bail;
use outbox_providers::amqp::AmqpConfig;
use outbox_providers::AmbiguityPolicy;
use outbox_providers::Secret;
use serde::Deserialize;

use crate::units::{dur, Dur};

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

impl crate::kinds::Section for AmqpSection {
    fn serves(&self) -> bool {
        self.url.is_some()
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
            outbox_providers::amqp::AmqpProvider::new,
        )
    }
}

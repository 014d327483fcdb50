//! `[nats]`: the `nats` kind (JetStream) is enabled when `url` is set.

use outbox_providers::nats::NatsConfig;
use outbox_providers::AmbiguityPolicy;
use outbox_providers::Secret;
use serde::Deserialize;

use crate::units::{dur, Dur};

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

impl crate::kinds::Section for NatsSection {
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
            outbox_providers::nats::NatsProvider::new,
        )
    }
}

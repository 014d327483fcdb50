//! `[webhook]`: the webhook provider's settings and named endpoints.

use std::collections::HashMap;

use outbox_providers::webhook::WebhookConfig;
use outbox_providers::Secret;
use outbox_providers::{guard, AmbiguityPolicy};
use serde::Deserialize;

use crate::units::Dur;

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
            subscriptions: None,
        })
    }
}

impl crate::kinds::Section for WebhookSection {
    fn serves(&self) -> bool {
        true
    }

    fn attempt_time(&self) -> std::time::Duration {
        self.timeout.0
    }

    fn provider(
        &self,
        cx: &crate::kinds::Context,
    ) -> anyhow::Result<Option<std::sync::Arc<dyn outbox_providers::Provider>>> {
        let mut config = self.provider_config()?;
        config.subscriptions = cx.subscriptions.clone();
        crate::kinds::build(
            Some(config),
            outbox_providers::webhook::WebhookProvider::new,
        )
    }
}

//! `[charge]`: the charge provider is enabled when an API key is set

use anyhow::bail;
use outbox_providers::charge::ChargeConfig;
use outbox_providers::AmbiguityPolicy;
use outbox_providers::Secret;
use serde::Deserialize;

use crate::units::{dur, Dur};

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

impl crate::kinds::Section for ChargeSection {
    fn serves(&self) -> bool {
        self.api_key.is_some()
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
            outbox_providers::charge::ChargeProvider::new,
        )
    }
}

//! `[email]`: the email provider is enabled when `smtp_url` is set.

use outbox_providers::email::{EmailConfig, SmtpTarget};
use outbox_providers::AmbiguityPolicy;
use outbox_providers::Secret;
use serde::Deserialize;

use crate::units::{dur, Dur};

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

impl crate::kinds::Section for EmailSection {
    fn serves(&self) -> bool {
        self.smtp_url.is_some()
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
            outbox_providers::email::EmailProvider::new,
        )
    }
}

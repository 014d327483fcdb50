//! Email over SMTP (lettre, tokio, rustls).
//!
//! The SMTP transaction is driven step by step so that a failure can be
//! placed: anything that fails before the message body has been sent
//! (connect, greeting, MAIL, RCPT, DATA) changed nothing and is transient;
//! a failure after the body was sent (timeout, dropped connection,
//! incomplete reply) may or may not have delivered it and is ambiguous.
//! A 4yz reply is transient, a 5yz reply a rejection with the reply kept.

pub mod message;
mod smtp;

use std::time::Duration;

pub use lettre::message::Mailbox;

use crate::{AmbiguityPolicy, Delivery, Outcome, Provider, Secret, SpanShape};
pub use smtp::{Security, SmtpTarget};

/// Email settings, validated by the relay's config loader.
#[derive(Debug, Clone)]
pub struct EmailConfig {
    /// Where and how to connect; credentials may come from the URL.
    pub target: SmtpTarget,
    pub username: Option<String>,
    pub password: Option<Secret>,
    /// Sender when a payload has no `from`.
    pub from: Option<Mailbox>,
    /// The whole send, from connect to the final reply (lettre's own
    /// timeout covers only connecting).
    pub timeout: Duration,
    pub connect_timeout: Duration,
    /// Idle connections kept for reuse.
    pub pool_size: usize,
    /// After an ambiguous send: park (default) or redeliver with the same
    /// Message-ID.
    pub on_ambiguous: AmbiguityPolicy,
    /// EHLO name; default the machine's host name.
    pub hello_name: Option<String>,
}

impl EmailConfig {
    /// Check what the provider would refuse, without building it.
    pub fn check(&self) -> Result<(), crate::Error> {
        smtp::credentials(self)
            .map(|_| ())
            .map_err(crate::Error::Config)
    }
}

impl EmailConfig {
    pub fn new(target: SmtpTarget) -> Self {
        EmailConfig {
            target,
            username: None,
            password: None,
            from: None,
            timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            pool_size: 8,
            on_ambiguous: AmbiguityPolicy::Park,
            hello_name: None,
        }
    }
}

pub struct EmailProvider {
    smtp: smtp::Client,
    config: EmailConfig,
}

impl EmailProvider {
    pub fn new(config: EmailConfig) -> Result<Self, crate::Error> {
        Ok(EmailProvider {
            smtp: smtp::Client::new(&config).map_err(crate::Error::Config)?,
            config,
        })
    }
}

#[async_trait::async_trait]
impl Provider for EmailProvider {
    fn kind(&self) -> &'static str {
        "email"
    }

    async fn deliver(&self, d: &Delivery<'_>) -> Outcome {
        if let Err(reason) = crate::refuse_destination("email", d.destination) {
            return Outcome::invalid(reason);
        }
        let prepared = match message::prepare_traced(
            d.payload,
            d.key,
            d.key_generation,
            self.config.from.as_ref(),
            d.trace,
        ) {
            Ok(p) => p,
            Err(reason) => return Outcome::invalid(reason),
        };
        self.smtp
            .send(&prepared, d.time_left(self.config.timeout))
            .await
    }

    fn on_ambiguous(&self) -> AmbiguityPolicy {
        self.config.on_ambiguous
    }

    /// A client span of the SMTP transaction, naming the server.
    fn span_shape(&self, _d: &Delivery<'_>) -> SpanShape {
        let target = &self.config.target;
        SpanShape {
            name: "smtp send".into(),
            kind: crate::span::SpanKind::Client,
            attributes: Vec::new(),
        }
        .with("network.protocol.name", "smtp")
        .with("server.address", target.host.as_str())
        .with("server.port", i64::from(target.port))
    }
}

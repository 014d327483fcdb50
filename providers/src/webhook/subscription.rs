//! Deliveries to a subscription. Their payload names the subscription and
//! carries the body; where it goes, the headers it adds and the secrets it
//! is signed with are the subscription's at the time of sending, handed
//! over by the relay's [`Directory`] (the provider never reads a
//! database), so a payload never holds a secret.

use serde_json::{Map, Value};

use crate::Secret;

/// What a delivery to one subscription needs.
#[derive(Clone)]
pub struct Target {
    /// Its URL, checked when the subscription was made.
    pub url: String,
    /// The headers it adds to every delivery.
    pub headers: Map<String, Value>,
    /// Its signing secrets (`whsec_...`), the current one first; two
    /// during a rotation's grace window. Never empty.
    pub secrets: Vec<Secret>,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("url", &crate::redact::urls_in(&self.url))
            .field("secrets", &self.secrets.len())
            .finish_non_exhaustive()
    }
}

/// Why a subscription's delivery cannot be sent now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The subscription was removed or is disabled: the delivery is
    /// refused (a replay sends it again once the subscription is enabled).
    Gone(String),
    /// Its secret cannot be had now (the database is away): tried again.
    Unavailable(String),
    /// This relay cannot sign for subscriptions (no
    /// `[subscriptions] secret_key`, or one that does not open the
    /// secret): never sent unsigned.
    Unsigned(String),
}

/// Where the webhook provider finds a subscription's [`Target`].
#[async_trait::async_trait]
pub trait Directory: Send + Sync {
    async fn target(&self, subscription: &str) -> Result<Target, Refusal>;
}

//! `webhook`: a POST of the payload's body to its URL or to a named
//! endpoint, signed per Standard Webhooks.

mod section;

pub use section::WebhookSection;

use outbox_providers::{keys, webhook::request};

use super::{Destination, Spec};

pub(super) const SPEC: Spec = Spec {
    schema: include_str!("../../../schema/kinds/webhook.json"),
    docs: "guides/kinds.md",
    destination: Destination::Payload,
    http_status: true,
    check: |payload, c| request::parse(payload, None, c.destination, c.endpoints).map(drop),
    provider_key: |key, generation| format!("webhook-id {}", keys::webhook_id(key, generation)),
};

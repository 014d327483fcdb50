//! `nats`: a JetStream publish, deduplicated on Nats-Msg-Id.

mod section;

pub use section::NatsSection;

use outbox_providers::nats::request;

use super::{Destination, Kind, Spec};

pub(super) const SPEC: Spec = Spec {
    schema: include_str!("../../../schema/kinds/nats.json"),
    docs: "guides/brokers.md",
    destination: Destination::OwnName,
    http_status: false,
    check: |payload, _| request::parse(payload, None).map(drop),
    provider_key: |key, generation| {
        format!("Nats-Msg-Id {}", Kind::Nats.effect_key(key, generation))
    },
};

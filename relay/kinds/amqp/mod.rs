//! `amqp`: an AMQP 0-9-1 publish with confirms, its message_id derived
//! from the key.

mod section;

pub use section::AmqpSection;

use outbox_providers::amqp::request;

use super::{Destination, Kind, Spec};

pub(super) const SPEC: Spec = Spec {
    schema: include_str!("../../../schema/kinds/amqp.json"),
    docs: "guides/brokers.md",
    destination: Destination::OwnName,
    http_status: false,
    check: |payload, _| request::parse(payload, None).map(drop),
    provider_key: |key, generation| {
        format!("message_id {}", Kind::Amqp.effect_key(key, generation))
    },
};

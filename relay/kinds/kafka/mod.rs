//! `kafka`: a record from the idempotent producer, carrying the
//! outbox-effect-key header consumers dedupe on.

mod section;

pub use section::KafkaSection;

use outbox_providers::kafka::request;

use super::{Destination, Kind, Spec};

pub(super) const SPEC: Spec = Spec {
    schema: include_str!("../../../schema/kinds/kafka.json"),
    docs: "guides/kafka.md",
    destination: Destination::OwnName,
    http_status: false,
    check: |payload, _| request::parse(payload, None, None).map(drop),
    provider_key: |key, generation| {
        format!(
            "outbox-effect-key {}",
            Kind::Kafka.effect_key(key, generation)
        )
    },
};

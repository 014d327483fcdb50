//! `charge`: a Stripe-compatible PaymentIntent, keyed by Idempotency-Key.

mod section;

pub use section::ChargeSection;

use outbox_providers::charge::request;

use super::{Destination, Kind, Spec};

pub(super) const SPEC: Spec = Spec {
    schema: include_str!("../../../schema/kinds/charge.json"),
    docs: "guides/kinds.md",
    destination: Destination::OwnName,
    http_status: true,
    check: |payload, _| request::form(payload, "payload-check", 0).map(drop),
    provider_key: |key, generation| {
        format!(
            "Idempotency-Key {}",
            Kind::Charge.effect_key(key, generation)
        )
    },
};

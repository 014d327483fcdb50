//! What the providers' socket tests share.

use std::time::Instant;

use outbox_providers::Delivery;
use serde_json::Value;

/// The first attempt of one intent of `kind`, with no destination, no
/// stored text (the body is serialized from `payload`) and no trace.
pub fn delivery<'a>(kind: &'a str, payload: &'a Value, deadline: Option<Instant>) -> Delivery<'a> {
    Delivery {
        intent_id: 1,
        key: "socket-test:1",
        kind,
        destination: None,
        ordering_key: None,
        payload,
        payload_text: None,
        body: None,
        attempt: 1,
        key_generation: 0,
        previous_attempt_at: None,
        deadline,
        trace: None,
    }
}

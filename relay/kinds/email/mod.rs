//! `email`: a message sent over SMTP, its Message-ID derived from the key.

mod section;

pub use section::EmailSection;

use outbox_providers::email::message;

use super::{Check, Destination, Kind, Spec};

pub(super) const SPEC: Spec = Spec {
    schema: include_str!("../../../schema/kinds/email.json"),
    docs: "guides/kinds.md",
    destination: Destination::Named("smtp"),
    http_status: false,
    check,
    provider_key: |key, generation| {
        format!(
            "Message-ID <{}@…>",
            &Kind::Email.effect_key(key, generation)[..32]
        )
    },
};

/// Checked against `email.from` where email is configured, else against a
/// stand-in sender (another relay's `email.from` applies there).
fn check(payload: &serde_json::Value, c: &Check) -> Result<(), String> {
    let stand_in: outbox_providers::email::Mailbox = "payload-check@example.invalid"
        .parse()
        .expect("a valid address");
    let from = c.email_from.unwrap_or(Some(&stand_in));
    message::prepare(payload, "payload-check", 0, from).map(drop)
}

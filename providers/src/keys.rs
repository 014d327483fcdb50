//! Derived idempotency keys.
//!
//! A provider key is a pure function of the intent key, a step name and the
//! key generation, so any attempt on any relay after any restart sends the
//! same key, and no shared state is needed to agree on it. The same function
//! exists in SQL as `outbox.derive_key(parent, step)`; both must agree.

use sha2::{Digest, Sha256};

/// `hex(sha256(len(parent) ":" parent step))`, with `len` the parent's UTF-8
/// byte length in decimal. The length prefix makes the encoding unambiguous:
/// ("a", "bc") and ("ab", "c") give different keys.
pub fn derive_key(parent: &str, step: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(parent.len().to_string().as_bytes());
    hasher.update(b":");
    hasher.update(parent.as_bytes());
    hasher.update(step.as_bytes());
    // the digest's own hex (written through a buffer in one piece):
    // `hex::encode` builds its string a char at a time, a third of this
    // function's work
    format!("{:x}", hasher.finalize())
}

/// The key a provider sends for `step` of the intent `key`. Generation 0 (the
/// default, kept across every retry) uses the step as is; an operator's
/// explicit `retry --new-effect` bumps the generation and so the key.
pub fn effect_key(key: &str, step: &str, generation: i32) -> String {
    if generation == 0 {
        derive_key(key, step)
    } else {
        derive_key(key, &format!("{step}#{generation}"))
    }
}

/// The Standard Webhooks `webhook-id` for an intent: `msg_` and 32 hex digits.
/// Contains no '.', so it is safe inside the signed content.
pub fn webhook_id(key: &str, generation: i32) -> String {
    let k = effect_key(key, "webhook", generation);
    format!("msg_{}", &k[..32])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derive_key_known_answers() {
        // The same values are asserted against outbox.derive_key in the SQL tests.
        assert_eq!(
            derive_key("order:42", "charge"),
            hex::encode(Sha256::digest(b"8:order:42charge"))
        );
        assert_eq!(derive_key("", ""), hex::encode(Sha256::digest(b"0:")));
        // UTF-8 byte length, not characters
        assert_eq!(
            derive_key("é", "x"),
            hex::encode(Sha256::digest("2:éx".as_bytes()))
        );
    }

    #[test]
    fn derive_key_is_unambiguous() {
        assert_ne!(derive_key("a", "bc"), derive_key("ab", "c"));
        assert_ne!(derive_key("a:", "b"), derive_key("a", ":b"));
    }

    #[test]
    fn generations_change_the_key_and_only_they_do() {
        assert_eq!(webhook_id("k", 0), webhook_id("k", 0));
        assert_ne!(webhook_id("k", 0), webhook_id("k", 1));
        assert_ne!(webhook_id("k", 1), webhook_id("k", 2));
        assert_ne!(webhook_id("k1", 0), webhook_id("k2", 0));
        let id = webhook_id("order:1", 0);
        assert!(id.starts_with("msg_") && id.len() == 36 && !id.contains('.'));
    }
}

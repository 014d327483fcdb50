//! `[subscriptions]`: the key that seals subscriptions' signing secrets
//! and header values, and when a failing subscription is disabled.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use chacha20poly1305::XChaCha20Poly1305;
use outbox_providers::Secret;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::units::{dur, Dur};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SubscriptionsSection {
    /// 32 random bytes in base64 (`openssl rand -base64 32`): seals every
    /// subscription's signing secret and header values in the database. Also
    /// `OUTBOX_RELAY__SUBSCRIPTIONS__SECRET_KEY` or its `_FILE`.
    pub secret_key: Option<Secret>,
    /// A subscription whose deliveries have failed without a success for
    /// this long is disabled.
    pub disable_after: Dur,
}

impl Default for SubscriptionsSection {
    fn default() -> Self {
        SubscriptionsSection {
            secret_key: None,
            disable_after: dur("5d"),
        }
    }
}

impl SubscriptionsSection {
    /// The sealing key, checked; None when none is configured.
    pub fn key(&self) -> anyhow::Result<Option<SealingKey>> {
        self.secret_key
            .as_ref()
            .map(SealingKey::parse)
            .transpose()
            .map_err(|e| anyhow::anyhow!("subscriptions.secret_key: {e}"))
    }

    /// The sealing key, or the error that says how to configure one.
    pub fn require_key(&self) -> anyhow::Result<SealingKey> {
        self.key()?.ok_or_else(|| {
            anyhow::anyhow!(
                "subscriptions need [subscriptions] secret_key (or \
                 OUTBOX_RELAY__SUBSCRIPTIONS__SECRET_KEY, or its _FILE): 32 random bytes in \
                 base64, e.g. from `openssl rand -base64 32`; it seals the subscriptions' \
                 signing secrets, and every relay and CLI that signs or creates them needs the same one"
            )
        })
    }
}

/// The key that seals subscriptions' signing secrets and header values:
/// XChaCha20-Poly1305, a random nonce each time, and as associated data
/// the subscription's id for a secret, `<id>/headers` for the headers (a
/// sealed value moved to another subscription, or from a secret to the
/// headers or back, does not open).
#[derive(Clone)]
pub struct SealingKey(XChaCha20Poly1305);

impl std::fmt::Debug for SealingKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SealingKey(<redacted>)")
    }
}

/// Nonce length of XChaCha20-Poly1305.
const NONCE: usize = 24;

/// The associated data of a subscription's sealed headers. (An id is
/// `sub_` and letters and digits: no secret's associated data ends so.)
fn headers_aad(id: &str) -> String {
    format!("{id}/headers")
}

impl SealingKey {
    /// From 32 bytes in base64. The error never contains the key.
    pub fn parse(secret: &Secret) -> Result<SealingKey, String> {
        let bytes = B64
            .decode(secret.expose().trim())
            .map_err(|_| "must be 32 random bytes in base64 (openssl rand -base64 32)")?;
        if bytes.len() != 32 {
            return Err(format!(
                "must be 32 bytes in base64 (openssl rand -base64 32), not {}",
                bytes.len()
            ));
        }
        XChaCha20Poly1305::new_from_slice(&bytes)
            .map(SealingKey)
            .map_err(|_| "must be 32 bytes".to_string())
    }

    /// `secret` sealed for subscription `id`: nonce, then ciphertext.
    pub fn seal(&self, id: &str, secret: &Secret) -> Vec<u8> {
        self.seal_bytes(id.as_bytes(), secret.expose().as_bytes())
    }

    /// The secret sealed for subscription `id`, or an error that says the
    /// key does not open it (another key sealed it, or the bytes changed).
    pub fn open(&self, id: &str, sealed: &[u8]) -> Result<Secret, String> {
        let wrong = || {
            format!(
                "subscriptions.secret_key does not open subscription {id}'s signing secret: \
                 it was sealed with another key"
            )
        };
        let plain = self.open_bytes(id.as_bytes(), sealed).ok_or_else(wrong)?;
        String::from_utf8(plain)
            .map(Secret::new)
            .map_err(|_| wrong())
    }

    /// Subscription `id`'s headers (names and values, as a JSON object)
    /// sealed: nonce, then ciphertext.
    pub fn seal_headers(&self, id: &str, headers: &Map<String, Value>) -> Vec<u8> {
        let plain = Value::Object(headers.clone()).to_string();
        self.seal_bytes(headers_aad(id).as_bytes(), plain.as_bytes())
    }

    /// The headers sealed for subscription `id`, or an error that says the
    /// key does not open them; neither names a header nor holds a value.
    pub fn open_headers(&self, id: &str, sealed: &[u8]) -> Result<Map<String, Value>, String> {
        let wrong = || {
            format!(
                "subscriptions.secret_key does not open subscription {id}'s headers: \
                 they were sealed with another key"
            )
        };
        let plain = self
            .open_bytes(headers_aad(id).as_bytes(), sealed)
            .ok_or_else(wrong)?;
        serde_json::from_slice(&plain).map_err(|_| wrong())
    }

    fn seal_bytes(&self, aad: &[u8], msg: &[u8]) -> Vec<u8> {
        let nonce = XChaCha20Poly1305::generate_nonce(&mut OsRng);
        let sealed = self
            .0
            .encrypt(&nonce, Payload { msg, aad })
            .expect("XChaCha20-Poly1305 seals any message that fits in memory");
        let mut out = nonce.to_vec();
        out.extend(sealed);
        out
    }

    /// None: not sealed by this key with this associated data.
    fn open_bytes(&self, aad: &[u8], sealed: &[u8]) -> Option<Vec<u8>> {
        if sealed.len() < NONCE {
            return None;
        }
        let (nonce, ciphertext) = sealed.split_at(NONCE);
        self.0
            .decrypt(
                nonce.into(),
                Payload {
                    msg: ciphertext,
                    aad,
                },
            )
            .ok()
    }
}

/// A new signing secret: `whsec_` and 32 random bytes in base64, as
/// Standard Webhooks has it.
pub fn new_signing_secret() -> anyhow::Result<Secret> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)
        .map_err(|e| anyhow::anyhow!("the OS gave no random bytes for a signing secret: {e}"))?;
    Ok(Secret::new(format!("whsec_{}", B64.encode(bytes))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> SealingKey {
        SealingKey::parse(&Secret::new(B64.encode([byte; 32]))).unwrap()
    }

    #[test]
    fn a_sealed_secret_opens_with_its_key_and_subscription_only() {
        let secret = new_signing_secret().unwrap();
        assert!(secret.expose().starts_with("whsec_"));
        let sealed = key(1).seal("sub_aaaaaaaa", &secret);
        assert!(!sealed
            .windows(6)
            .any(|w| secret.expose().as_bytes().starts_with(w)));
        assert_eq!(
            key(1).open("sub_aaaaaaaa", &sealed).unwrap().expose(),
            secret.expose()
        );
        let err = key(2).open("sub_aaaaaaaa", &sealed).unwrap_err();
        assert!(err.contains("sealed with another key"), "{err}");
        assert!(key(1).open("sub_bbbbbbbb", &sealed).is_err());
        assert!(key(1).open("sub_aaaaaaaa", &sealed[..10]).is_err());
        // a nonce each time: sealing twice gives two ciphertexts
        assert_ne!(sealed, key(1).seal("sub_aaaaaaaa", &secret));
    }

    #[test]
    fn sealed_headers_open_with_their_key_and_subscription_only_and_never_as_a_secret() {
        let mut headers = Map::new();
        headers.insert("Authorization".into(), Value::from("Bearer s3cr3t"));
        headers.insert("X-Team".into(), Value::from("billing"));
        let sealed = key(1).seal_headers("sub_aaaaaaaa", &headers);
        assert!(!sealed.windows(6).any(|w| w == b"s3cr3t"));
        assert_eq!(
            key(1).open_headers("sub_aaaaaaaa", &sealed).unwrap(),
            headers
        );
        for err in [
            key(2).open_headers("sub_aaaaaaaa", &sealed).unwrap_err(),
            key(1).open_headers("sub_bbbbbbbb", &sealed).unwrap_err(),
            key(1)
                .open_headers("sub_aaaaaaaa", &sealed[..10])
                .unwrap_err(),
        ] {
            assert!(err.contains("headers"), "{err}");
            assert!(
                !err.contains("s3cr3t") && !err.contains("Authorization"),
                "{err}"
            );
        }
        // headers never open as a secret, nor a secret as headers
        assert!(key(1).open("sub_aaaaaaaa", &sealed).is_err());
        let secret = key(1).seal("sub_aaaaaaaa", &Secret::new("{}"));
        assert!(key(1).open_headers("sub_aaaaaaaa", &secret).is_err());
        assert_ne!(sealed, key(1).seal_headers("sub_aaaaaaaa", &headers));
    }

    #[test]
    fn a_bad_key_is_refused_without_echoing_it() {
        for bad in ["not base64 !!", "c2hvcnQ=", ""] {
            let err = SealingKey::parse(&Secret::new(bad)).unwrap_err();
            assert!(err.contains("32"), "{err}");
            if !bad.is_empty() {
                assert!(!err.contains(bad), "{err}");
            }
        }
    }
}

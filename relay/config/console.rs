//! `[console]`: where the console listens, who may log in, what it masks.

use std::net::SocketAddr;

use anyhow::{bail, Context};
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;
use outbox_providers::Secret;
use serde::Deserialize;

use crate::units::Dur;

/// `[console]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConsoleSection {
    /// Where the console listens (port 0 picks one). Without `users` it
    /// must be a loopback address: then anyone on this host is an operator.
    pub addr: String,
    /// Who may log in. None: no login, and only on loopback.
    pub users: Vec<ConsoleUser>,
    /// How long a login lasts.
    pub session_ttl: Dur,
    /// Mark the session cookie `Secure` (serve the console behind TLS).
    pub secure_cookies: bool,
    /// Payload fields shown masked on every page and in the API, by name at
    /// any depth, ignoring case, `-` and `_` (`api_key` masks `API-Key`).
    pub mask: Vec<String>,
    /// Intents changed per statement by a bulk action.
    pub batch_size: u32,
    /// A link to an intent's trace in the tracing UI, `{trace_id}` standing
    /// for its trace id, e.g. `https://tracing.example/trace/{trace_id}`.
    pub trace_url: Option<String>,
}

impl Default for ConsoleSection {
    fn default() -> Self {
        ConsoleSection {
            addr: "127.0.0.1:9188".into(),
            users: Vec::new(),
            session_ttl: Dur(std::time::Duration::from_secs(12 * 3600)),
            secure_cookies: false,
            mask: [
                "password",
                "secret",
                "token",
                "api_key",
                "authorization",
                "card_number",
                "cvc",
                "cvv",
            ]
            .map(String::from)
            .to_vec(),
            batch_size: 500,
            trace_url: None,
        }
    }
}

/// `[[console.users]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsoleUser {
    pub name: String,
    pub role: Role,
    /// An Argon2 PHC string (`outbox-relay console --hash-password` makes
    /// one). Kept secret: never printed.
    pub password_hash: Secret,
}

/// What a console user may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads everything, changes nothing.
    Viewer,
    /// Reads, and retries, cancels, resolves, pauses and resumes.
    Operator,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
        }
    }
}

impl ConsoleSection {
    pub fn validate(&self) -> anyhow::Result<()> {
        if let Some(template) = &self.trace_url {
            trace_link(template, "0af7651916cd43dd8448eb211c80319c")?;
        }
        self.addr.parse::<SocketAddr>().map_err(|_| {
            anyhow::anyhow!(
                "console.addr {:?} is not an address like 127.0.0.1:9188",
                self.addr
            )
        })?;
        let mut seen = std::collections::HashSet::new();
        for u in &self.users {
            let shape = !u.name.is_empty()
                && u.name.len() <= 64
                && u.name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._@-".contains(c));
            if !shape {
                bail!(
                    "console.users: user name {:?} must be 1 to 64 letters, digits or . _ @ -",
                    u.name
                );
            }
            if !seen.insert(u.name.as_str()) {
                bail!("console.users: user {:?} is defined twice", u.name);
            }
            PasswordHash::new(u.password_hash.expose())
                .ok()
                .filter(|h| h.algorithm.as_str().starts_with("argon2"))
                .with_context(|| {
                    format!(
                        "console.users: the password_hash of {:?} is not an Argon2 hash \
                         (make one with `outbox-relay console --hash-password`)",
                        u.name
                    )
                })?;
        }
        if self.session_ttl.0.as_secs() < 60 {
            bail!("console.session_ttl must be at least a minute");
        }
        if !(1..=10_000).contains(&self.batch_size) {
            bail!(
                "console.batch_size must be between 1 and 10000, not {}",
                self.batch_size
            );
        }
        Ok(())
    }

    /// The listening address (checked by `validate`).
    pub fn socket_addr(&self) -> anyhow::Result<SocketAddr> {
        self.addr
            .parse()
            .with_context(|| format!("console.addr {:?}", self.addr))
    }
}

/// An Argon2id PHC string for `password`, with a fresh random salt.
pub fn hash_password(password: &str) -> anyhow::Result<String> {
    let mut salt = [0u8; 16];
    getrandom::fill(&mut salt).map_err(|e| anyhow::anyhow!("no randomness from the OS: {e}"))?;
    let salt = SaltString::encode_b64(&salt).map_err(|e| anyhow::anyhow!("salt: {e}"))?;
    Ok(Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map_err(|e| anyhow::anyhow!("hashing the password: {e}"))?
        .to_string())
}

/// Whether `password` matches the PHC string `hash`.
pub fn verify_password(password: &str, hash: &str) -> bool {
    PasswordHash::new(hash)
        .map(|h| {
            Argon2::default()
                .verify_password(password.as_bytes(), &h)
                .is_ok()
        })
        .unwrap_or(false)
}

/// `console.trace_url` with `trace_id` in place of `{trace_id}`: an
/// `http(s)` URL, so a link on the intent page can only lead to a web page.
pub fn trace_link(template: &str, trace_id: &str) -> anyhow::Result<String> {
    if !template.contains("{trace_id}") {
        bail!("console.trace_url {template:?} must contain {{trace_id}}");
    }
    let link = template.replace("{trace_id}", trace_id);
    match url::Url::parse(&link) {
        Ok(u) if matches!(u.scheme(), "http" | "https") => Ok(link),
        _ => bail!("console.trace_url {template:?} must be an http:// or https:// URL"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hash_verifies_its_password_only() {
        let h = hash_password("correct horse").unwrap();
        assert!(h.starts_with("$argon2id$"));
        assert!(verify_password("correct horse", &h));
        assert!(!verify_password("correct horsf", &h));
        assert!(!verify_password("correct horse", "not a hash"));
        assert_ne!(h, hash_password("correct horse").unwrap(), "salted");
    }

    #[test]
    fn users_come_from_the_environment_as_toml() {
        let hash = hash_password("pw-of-alice").unwrap();
        let env = [(
            "OUTBOX_RELAY__CONSOLE__USERS".to_string(),
            format!("[{{name = \"alice\", role = \"operator\", password_hash = \"{hash}\"}}]"),
        )];
        let c = crate::config::Config::load(None, env).unwrap();
        assert_eq!(c.console.users.len(), 1);
        assert_eq!(c.console.users[0].role, Role::Operator);
        assert!(verify_password(
            "pw-of-alice",
            c.console.users[0].password_hash.expose()
        ));
        assert!(
            !format!("{:?}", c.console).contains("argon2"),
            "the hash never prints"
        );
    }

    #[test]
    fn users_are_checked() {
        let user = |name: &str, hash: &str| ConsoleUser {
            name: name.into(),
            role: Role::Viewer,
            password_hash: Secret::new(hash),
        };
        let good = hash_password("pw").unwrap();
        let mut c = ConsoleSection {
            users: vec![user("alice", &good)],
            ..ConsoleSection::default()
        };
        c.validate().unwrap();
        c.users = vec![user("alice", &good), user("alice", &good)];
        assert!(c.validate().unwrap_err().to_string().contains("twice"));
        c.users = vec![user("al ice", &good)];
        assert!(c.validate().is_err());
        c.users = vec![user("alice", "plaintext")];
        let err = c.validate().unwrap_err().to_string();
        assert!(
            err.contains("not an Argon2 hash") && !err.contains("plaintext"),
            "{err}"
        );
        c.users.clear();
        c.addr = "localhost".into();
        assert!(c.validate().is_err());
    }

    #[test]
    fn a_trace_link_is_a_web_address_with_the_trace_id() {
        assert_eq!(
            super::trace_link("https://tracing.example/trace/{trace_id}?x=1", "abc").unwrap(),
            "https://tracing.example/trace/abc?x=1"
        );
        for bad in ["https://tracing.example/", "javascript:alert({trace_id})"] {
            assert!(super::trace_link(bad, "abc").is_err(), "{bad}");
        }
    }
}

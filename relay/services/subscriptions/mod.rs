//! Subscriptions: what is checked before one is made, how its signing
//! secret is made and sealed (and its headers' values with it), and the
//! parts of the relay that read them (the webhook provider's
//! [`directory`], the `event` kind's expansion).

pub mod directory;
pub mod replay;
pub mod upkeep;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use outbox_providers::webhook::request;
use outbox_providers::Secret;
use serde_json::{Map, Value};

use crate::config::health::Rate;
use crate::config::subscriptions::new_signing_secret;
use crate::config::Config;
use crate::kinds::event::valid_event_type;
use crate::kinds::Context;
use crate::store::subscriptions::NewSubscription;
use crate::store::Store;

/// What the kinds' providers need of the database: the expansion of
/// events, and subscriptions' targets where a sealing key is configured.
pub fn context(store: &Store, config: &Config) -> anyhow::Result<Context> {
    let directory = config.subscriptions.key()?.map(|key| {
        Arc::new(directory::Directory::new(
            store.clone(),
            key,
            config.relay.listen,
        )) as Arc<dyn outbox_providers::webhook::subscription::Directory>
    });
    Ok(Context {
        events: Some(Arc::new(store.clone())),
        subscriptions: directory,
    })
}

/// At start-up: where subscriptions exist, the configured key must open
/// every one of their secrets and sealed headers (a relay that could not
/// would have to send their deliveries unsigned, or without their
/// headers). The error is the configuration's. Then the headers a row
/// still holds in clear (made before header values were sealed) are
/// sealed with that key, and their clear values removed, in one
/// transaction.
pub async fn check_key(store: &Store, config: &Config) -> anyhow::Result<()> {
    let sealed = store
        .sealed_values()
        .await
        .context("reading the subscriptions")?;
    if sealed.is_empty() {
        return Ok(());
    }
    let key = config.subscriptions.require_key().with_context(|| {
        format!(
            "{} subscription(s) exist, and their deliveries are never sent unsigned",
            sealed.len()
        )
    })?;
    for s in &sealed {
        for secret in &s.secrets {
            key.open(&s.id, secret).map_err(anyhow::Error::msg)?;
        }
        if let Some(headers) = &s.headers {
            key.open_headers(&s.id, headers)
                .map_err(anyhow::Error::msg)?;
        }
    }
    let n = store
        .seal_clear_headers(|id, headers| key.seal_headers(id, headers))
        .await
        .context("sealing the subscriptions' headers held in clear")?;
    if n > 0 {
        tracing::info!(
            subscriptions = n,
            "sealed the header values of subscriptions that held them in clear"
        );
    }
    Ok(())
}

/// A subscription as asked for, before it is checked. (Its `Debug` shows
/// no header's value.)
#[derive(Clone, Default)]
pub struct Request {
    pub url: String,
    pub tenant: Option<String>,
    /// Exact names or `prefix.*`; empty: every type.
    pub event_types: Vec<String>,
    /// `Name: value`.
    pub headers: Vec<String>,
    /// `50/s`, `600/min`, ...
    pub rate: Option<String>,
    pub description: Option<String>,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let header_names: Vec<&str> = self
            .headers
            .iter()
            .map(|h| h.split_once(':').map_or("?", |(name, _)| name.trim()))
            .collect();
        f.debug_struct("Request")
            .field("url", &outbox_providers::redact::urls_in(&self.url))
            .field("tenant", &self.tenant)
            .field("event_types", &self.event_types)
            .field("header_names", &header_names)
            .field("rate", &self.rate)
            .field("description", &self.description)
            .finish()
    }
}

/// Check a request and make the subscription; returns its id and its new
/// signing secret, which nothing shows again. Each error names its field
/// (and never holds a header's value). The header values are stored
/// sealed, as the secret is.
pub async fn add(
    store: &Store,
    config: &Config,
    req: &Request,
) -> anyhow::Result<(String, Secret)> {
    let key = config.subscriptions.require_key()?;
    let (mut new, headers) = checked(config, req)?;
    let secret = new_signing_secret()?;
    new.secret = key.seal(&new.id, &secret);
    new.headers_sealed = (!headers.is_empty()).then(|| key.seal_headers(&new.id, &headers));
    store
        .add_subscription(&new)
        .await
        .context("saving the subscription")?;
    Ok((new.id, secret))
}

/// A new secret for subscription `id`; the replaced one signs as well for
/// `grace`. Returns the new secret, which nothing shows again; None when
/// there is no such subscription.
pub async fn rotate(
    store: &Store,
    config: &Config,
    id: &str,
    grace: Duration,
) -> anyhow::Result<Option<Secret>> {
    let key = config.subscriptions.require_key()?;
    let secret = new_signing_secret()?;
    let rotated = store
        .rotate_subscription_secret(id, &key.seal(id, &secret), grace)
        .await
        .context("saving the new secret")?;
    Ok(rotated.then_some(secret))
}

/// The request checked, as a row without its sealed values yet, and its
/// headers to seal.
fn checked(
    config: &Config,
    req: &Request,
) -> anyhow::Result<(NewSubscription, Map<String, Value>)> {
    let url = check_url(config, &req.url).map_err(|e| anyhow::anyhow!("url: {e}"))?;
    if let Some(t) = &req.tenant {
        if t.is_empty() || t.chars().count() > 200 {
            bail!("tenant: must be 1 to 200 characters");
        }
    }
    let mut seen = HashSet::new();
    for p in &req.event_types {
        check_pattern(p).map_err(|e| anyhow::anyhow!("event-types: {e}"))?;
        if !seen.insert(p) {
            bail!("event-types: {p:?} is given twice");
        }
    }
    let headers = parse_headers(&req.headers).map_err(|e| anyhow::anyhow!("header: {e}"))?;
    let rate = match &req.rate {
        None => None,
        Some(text) => Some(
            Rate::parse(text)
                .map_err(|e| anyhow::anyhow!("rate: {e}"))?
                .per_second,
        ),
    };
    if let Some(d) = &req.description {
        if d.chars().count() > 1000 {
            bail!("description: at most 1000 characters");
        }
    }
    let new = NewSubscription {
        id: new_id()?,
        tenant: req.tenant.clone(),
        event_types: req.event_types.clone(),
        url,
        header_names: headers.keys().cloned().collect(),
        headers_sealed: None,
        rate,
        description: req.description.clone(),
        secret: Vec::new(),
    };
    Ok((new, headers))
}

/// An http(s) URL the webhook provider accepts, whose host, when it is an
/// address, the destination guard allows (`webhook.allowed_networks`); a
/// name is checked where it resolves, at each delivery.
fn check_url(config: &Config, text: &str) -> Result<String, String> {
    let url = request::parse_url(text)?;
    let ip = match url.host() {
        Some(url::Host::Ipv4(ip)) => Some(std::net::IpAddr::V4(ip)),
        Some(url::Host::Ipv6(ip)) => Some(std::net::IpAddr::V6(ip)),
        _ => None,
    };
    if let Some(ip) = ip {
        let networks = outbox_providers::guard::parse_networks(&config.webhook.allowed_networks)?;
        outbox_providers::guard::check(ip, &networks)?;
    }
    Ok(url.to_string())
}

/// An exact event type, or `prefix.*`.
pub fn check_pattern(p: &str) -> Result<(), String> {
    let name = p.strip_suffix(".*").unwrap_or(p);
    if valid_event_type(name) {
        Ok(())
    } else {
        Err(format!(
            "{p:?} is neither an event type (a dotted name: letters, digits, _ and -) nor one followed by .*"
        ))
    }
}

/// `Name: value` lines as a header map, each checked as a webhook's. An
/// error names a header by its name or its place, never shows a value.
fn parse_headers(lines: &[String]) -> Result<Map<String, Value>, String> {
    let mut map = Map::new();
    for (n, line) in lines.iter().enumerate() {
        let (name, value) = line.split_once(':').ok_or_else(|| {
            format!(
                "header {} of {} is not `Name: value` (it has no colon)",
                n + 1,
                lines.len()
            )
        })?;
        let name = name.trim();
        if map.contains_key(name) {
            return Err(format!("{name:?} is given twice"));
        }
        map.insert(name.to_string(), Value::String(value.trim().to_string()));
    }
    request::header_map(&map)?;
    Ok(map)
}

/// `sub_` and 22 random letters and digits.
fn new_id() -> anyhow::Result<String> {
    const ALPHABET: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let mut bytes = [0u8; 22];
    getrandom::fill(&mut bytes)
        .map_err(|e| anyhow::anyhow!("the OS gave no random bytes for an id: {e}"))?;
    let tail: String = bytes
        .iter()
        .map(|b| ALPHABET[(*b as usize) % ALPHABET.len()] as char)
        .collect();
    Ok(format!("sub_{tail}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        let mut c = Config::default();
        c.webhook.allowed_networks = vec!["127.0.0.0/8".into()];
        c
    }

    fn request(url: &str) -> Request {
        Request {
            url: url.into(),
            ..Request::default()
        }
    }

    #[test]
    fn a_good_request_is_taken_as_given() {
        let req = Request {
            url: "http://127.0.0.1:9/hooks".into(),
            tenant: Some("acme".into()),
            event_types: vec!["order.*".into(), "invoice.paid".into()],
            headers: vec!["X-Team: billing".into()],
            rate: Some("50/s".into()),
            description: Some("billing".into()),
        };
        let (s, headers) = checked(&config(), &req).unwrap();
        assert!(s.id.starts_with("sub_") && s.id.len() == 26, "{}", s.id);
        assert_eq!(s.rate, Some(50.0));
        assert_eq!(s.header_names, ["X-Team"]);
        assert_eq!(headers["X-Team"], "billing");
        assert!(s.headers_sealed.is_none(), "sealed by add, with the key");
        assert_ne!(new_id().unwrap(), new_id().unwrap());
    }

    #[test]
    fn neither_an_error_nor_a_request_shown_holds_a_header_value() {
        let req = Request {
            headers: vec![
                "Authorization: Bearer s3cr3t".into(),
                "Bearer s3cr3t".into(),
            ],
            ..request("http://127.0.0.1:9/hooks")
        };
        let err = checked(&config(), &req).unwrap_err().to_string();
        assert!(err.starts_with("header: header 2 of 2 "), "{err}");
        let shown = format!("{err} {req:?}");
        assert!(!shown.contains("s3cr3t"), "{shown}");
        assert!(shown.contains("Authorization"), "{shown}");
    }

    #[test]
    fn each_bad_field_is_refused_by_name() {
        let cases: Vec<(Request, &str)> = vec![
            (request("ftp://example.com/x"), "url: "),
            (request("http://10.1.2.3/x"), "url: "),
            (request("not a url"), "url: "),
            (
                Request {
                    tenant: Some(String::new()),
                    ..request("https://example.com")
                },
                "tenant: ",
            ),
            (
                Request {
                    event_types: vec!["order.**".into()],
                    ..request("https://example.com")
                },
                "event-types: ",
            ),
            (
                Request {
                    event_types: vec!["*".into()],
                    ..request("https://example.com")
                },
                "event-types: ",
            ),
            (
                Request {
                    headers: vec!["no colon".into()],
                    ..request("https://example.com")
                },
                "header: ",
            ),
            (
                Request {
                    headers: vec!["webhook-signature: x".into()],
                    ..request("https://example.com")
                },
                "header: ",
            ),
            (
                Request {
                    rate: Some("fast".into()),
                    ..request("https://example.com")
                },
                "rate: ",
            ),
        ];
        for (req, field) in cases {
            let err = checked(&config(), &req).unwrap_err().to_string();
            assert!(err.starts_with(field), "{req:?}: {err}");
        }
    }
}

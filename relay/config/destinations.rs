//! What a destination is called: a webhook's origin
//! (`scheme://host[:port]`, also for a named endpoint), or `smtp`,
//! `charge`, `nats`, `amqp`, `kafka`. One destination has one name, however an
//! operator or a payload spells it.

use std::collections::HashMap;

use serde_json::Value;

use crate::kinds::Kind;

/// The destinations that are not a URL's origin (`smtp`, `charge`, ...).
pub fn named() -> Vec<&'static str> {
    Kind::ALL
        .iter()
        .filter_map(|k| k.fixed_destination())
        .collect()
}

/// `scheme://host[:port]` of an http(s) URL, lowercase, without a
/// default port, a domain without its trailing dot, an IPv4 address in
/// its dotted form however it was written (`0x7f.1`, `2130706433`,
/// `[::ffff:127.0.0.1]`): one destination has one name. The SQL's
/// `outbox.url_origin` (schema 0022) gives the same name. Each text is
/// read once per thread ([`outbox_providers::memo`]).
pub fn origin(url: &str) -> Option<String> {
    outbox_providers::memo::cached(&ORIGINS, url, origin_of)
}

thread_local! {
    static ORIGINS: outbox_providers::memo::Texts<Option<String>> = Default::default();
}

fn origin_of(url: &str) -> Option<String> {
    let mut url = url::Url::parse(url).ok()?;
    if !matches!(url.scheme(), "http" | "https") {
        return None;
    }
    match url.host() {
        Some(url::Host::Ipv6(v6)) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                url.set_ip_host(std::net::IpAddr::V4(v4)).ok()?;
            }
        }
        Some(url::Host::Domain(name)) if name.ends_with('.') => {
            let name = name.trim_end_matches('.').to_string();
            if name.is_empty() {
                return None;
            }
            url.set_host(Some(&name)).ok()?;
        }
        _ => {}
    }
    let origin = url.origin();
    origin.is_tuple().then(|| origin.ascii_serialization())
}

/// Where an intent's effect goes, or None when the payload does not say
/// (the provider will refuse it).
pub fn destination_of(
    kind: &str,
    destination: Option<&str>,
    payload: &Value,
    endpoints: &HashMap<String, String>,
) -> Option<String> {
    crate::kinds::destination_of(kind, destination, payload, endpoints, origin)
}

/// Where an intent's effect goes as `outbox.destination_of` names it in
/// the database: a named endpoint by its name (the relay's own name for
/// it is its URL's origin, which the database does not know).
pub fn stored_destination_of(
    kind: &str,
    destination: Option<&str>,
    payload: &Value,
) -> Option<String> {
    let named = Kind::parse(kind).is_some_and(|k| k.fixed_destination().is_none());
    match destination {
        Some(name) if named => Some(name.to_string()),
        _ => destination_of(kind, None, payload, &HashMap::new()),
    }
}

/// A subscription's id (`sub_` and 8 to 64 letters or digits): its
/// deliveries' destination.
pub fn is_subscription(name: &str) -> bool {
    name.strip_prefix("sub_").is_some_and(|rest| {
        (8..=64).contains(&rest.len()) && rest.bytes().all(|b| b.is_ascii_alphanumeric())
    })
}

/// A destination as an operator names it (an origin, an endpoint name,
/// `smtp`, ...), as the relay names it.
pub fn canonical(name: &str, endpoints: &HashMap<String, String>) -> Result<String, String> {
    if named().contains(&name) {
        return Ok(name.to_string());
    }
    if let Some(o) = endpoints.get(name) {
        return Ok(o.clone());
    }
    if is_subscription(name) {
        return Ok(name.to_string());
    }
    match origin(name) {
        Some(o) if name.contains("://") => Ok(o),
        _ => Err(format!(
            "{name:?} is not a destination: give an origin (https://host[:port]), a webhook endpoint name, a subscription's id (sub_...), or one of {}",
            named().join(", ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn destinations_are_origins_or_names() {
        let endpoints = HashMap::from([("billing".to_string(), "https://pay.example".to_string())]);
        let d = |kind, dest, payload: Value| destination_of(kind, dest, &payload, &endpoints);
        assert_eq!(
            d(
                "webhook",
                None,
                json!({"url": "HTTPS://API.Example:443/a?b"})
            )
            .as_deref(),
            Some("https://api.example")
        );
        assert_eq!(
            d("webhook", None, json!({"url": "http://127.0.0.1:8080/x"})).as_deref(),
            Some("http://127.0.0.1:8080")
        );
        assert_eq!(
            d("webhook", Some("billing"), json!({})).as_deref(),
            Some("https://pay.example")
        );
        assert_eq!(d("webhook", None, json!({"url": 5})), None);
        assert_eq!(d("webhook", Some("unknown"), json!({})), None);
        assert_eq!(d("email", None, json!({})).as_deref(), Some("smtp"));
        assert_eq!(d("charge", None, json!({})).as_deref(), Some("charge"));
        assert_eq!(d("amqp", None, json!({})).as_deref(), Some("amqp"));
        assert_eq!(d("kafka", None, json!({})).as_deref(), Some("kafka"));
        assert_eq!(d("sms", None, json!({})), None);
        assert_eq!(
            d(
                "webhook",
                None,
                json!({"subscription": "sub_abcdefgh", "body": 1})
            )
            .as_deref(),
            Some("sub_abcdefgh")
        );
        assert_eq!(d("event", None, json!({})).as_deref(), Some("event"));
        assert_eq!(
            canonical("sub_abcdefgh", &endpoints).as_deref(),
            Ok("sub_abcdefgh")
        );
        assert!(canonical("sub_short", &endpoints).is_err());
        assert_eq!(
            canonical("billing", &endpoints).unwrap(),
            "https://pay.example"
        );
        assert_eq!(
            canonical("https://A.example:443/x", &endpoints).unwrap(),
            "https://a.example"
        );
        for spelling in [
            "http://[::ffff:127.0.0.1]:8080/x",
            "http://[::FFFF:7f00:1]:8080",
            "http://0x7f.1:8080/",
        ] {
            assert_eq!(
                canonical(spelling, &endpoints).unwrap(),
                "http://127.0.0.1:8080",
                "{spelling}"
            );
        }
        for spelling in [
            "http://localhost.:8080",
            "http://LocalHost.:8080/x",
            "HTTP://LOCALHOST:8080",
        ] {
            assert_eq!(
                canonical(spelling, &endpoints).unwrap(),
                "http://localhost:8080",
                "{spelling}"
            );
        }
        assert_eq!(
            canonical("http://[::1]:8080", &endpoints).unwrap(),
            "http://[::1]:8080"
        );
        assert_eq!(canonical("smtp", &endpoints).unwrap(), "smtp");
        assert!(canonical("partner", &endpoints)
            .unwrap_err()
            .contains("not a destination"));
    }
}

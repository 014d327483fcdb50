//! Turning a webhook intent's payload into a request, before any network call.

use std::collections::HashMap;

use http::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::Value;

/// Headers the relay sets itself; a payload may not override them.
const RESERVED: &[&str] = &[
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "idempotency-key",
    "content-type",
    "content-length",
    "transfer-encoding",
    "host",
    "connection",
    "user-agent",
];

/// Hop-by-hop headers (RFC 9110 7.6.1) and `Trailer`: they describe one
/// connection, which is the relay's, not the payload's.
const HOP_BY_HOP: &[&str] = &["keep-alive", "proxy-connection", "te", "trailer", "upgrade"];

/// A webhook ready to send: where, what, and the caller's extra headers.
#[derive(Debug)]
pub struct WebhookRequest {
    pub to: To,
    /// The JSON body, serialized once; identical bytes on every attempt
    /// because the payload comes from jsonb (canonical key order).
    pub body: Vec<u8>,
    pub headers: HeaderMap,
}

/// Where a webhook goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum To {
    /// The payload's `url`, or the configured endpoint its destination names.
    Url(url::Url),
    /// A subscription, by id: its URL, headers and signing secrets are the
    /// subscription's at the time of sending ([`super::subscription`]).
    Subscription(String),
}

/// Parse `{"url": "...", "body": <json>, "headers": {...}?}`, a payload
/// without `url` whose `destination` names a configured endpoint, or a
/// subscription's delivery `{"subscription": "sub_...", "body": <json>}`.
/// `raw_body` is the body's stored JSON text ([`raw_body`]), sent as it
/// stands; without it the parsed body is serialized.
pub fn parse(
    payload: &Value,
    raw_body: Option<Vec<u8>>,
    destination: Option<&str>,
    endpoints: &HashMap<String, String>,
) -> Result<WebhookRequest, String> {
    let obj = payload.as_object().ok_or_else(|| {
        format!(
            "webhook payload must be a JSON object, not {}",
            type_name(payload)
        )
    })?;
    if let Some(unknown) = obj
        .keys()
        .find(|k| !matches!(k.as_str(), "url" | "body" | "headers" | "subscription"))
    {
        return Err(format!(
            "webhook payload has an unknown field {unknown:?} (expected url, body, headers, subscription)"
        ));
    }
    let to = match obj.get("subscription") {
        None => To::Url(url_of(obj, destination, endpoints)?),
        Some(Value::String(id)) => {
            if let Some(field) = ["url", "headers"]
                .into_iter()
                .find(|f| obj.contains_key(*f))
            {
                return Err(format!(
                    "webhook payload names subscription {id:?} and has {field:?}: a subscription's delivery takes its URL and headers from the subscription"
                ));
            }
            if let Some(name) = destination {
                return Err(format!(
                    "webhook payload names subscription {id:?} and the intent names destination {name:?}: use one or the other"
                ));
            }
            To::Subscription(id.clone())
        }
        Some(other) => {
            return Err(format!(
                "webhook \"subscription\" must be a string, not {}",
                type_name(other)
            ))
        }
    };
    let body = crate::payload_body("webhook", obj, raw_body)?;
    let headers = match obj.get("headers") {
        None | Some(Value::Null) => HeaderMap::new(),
        Some(Value::Object(map)) => header_map(map)?,
        Some(other) => {
            return Err(format!(
                "webhook \"headers\" must be an object, not {}",
                type_name(other)
            ))
        }
    };
    Ok(WebhookRequest { to, body, headers })
}

/// Headers a payload or a subscription adds, each checked: a string value,
/// a valid name, none the relay sets itself, no hop-by-hop header.
pub fn header_map(map: &serde_json::Map<String, Value>) -> Result<HeaderMap, String> {
    let mut headers = HeaderMap::new();
    for (name, value) in map {
        let lname = name.to_ascii_lowercase();
        if RESERVED.contains(&lname.as_str()) {
            return Err(format!(
                "webhook header {name:?} is set by the relay and cannot be overridden"
            ));
        }
        if HOP_BY_HOP.contains(&lname.as_str()) {
            return Err(format!(
                "webhook header {name:?} is a hop-by-hop header and cannot be set by a payload"
            ));
        }
        let Value::String(value) = value else {
            return Err(format!("webhook header {name:?} must be a string"));
        };
        let hname = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("webhook header name {name:?} is not a valid HTTP header name"))?;
        let hvalue = HeaderValue::from_str(value)
            .map_err(|_| format!("webhook header {name:?} has a value with control characters"))?;
        headers.append(hname, hvalue);
    }
    Ok(headers)
}

/// Where a webhook goes: the payload's `url`, or the configured endpoint its
/// destination names.
fn url_of(
    obj: &serde_json::Map<String, Value>,
    destination: Option<&str>,
    endpoints: &HashMap<String, String>,
) -> Result<url::Url, String> {
    let url_text = match (obj.get("url"), destination) {
        (Some(_), Some(name)) => {
            return Err(format!(
                "webhook payload has a \"url\" and the intent names destination {name:?}: use one or the other"
            ))
        }
        (Some(Value::String(u)), None) => u.clone(),
        (Some(other), _) => {
            return Err(format!(
                "webhook \"url\" must be a string, not {}",
                type_name(other)
            ))
        }
        (None, Some(name)) => endpoints.get(name).cloned().ok_or_else(|| {
            format!("webhook destination {name:?} is not a configured endpoint (webhook.endpoints)")
        })?,
        (None, None) => {
            return Err("webhook payload has no \"url\" and the intent names no destination".into())
        }
    };
    parse_url(&url_text)
}

/// The subscription a delivery goes to, when its payload names one.
pub fn subscription_of(payload: &Value) -> Option<&str> {
    payload.get("subscription").and_then(Value::as_str)
}

/// The URL a webhook payload is sent to, when it has a readable one (for
/// the attempt's span; the attempt itself checks the payload fully).
pub fn target_url(
    payload: &Value,
    destination: Option<&str>,
    endpoints: &HashMap<String, String>,
) -> Option<url::Url> {
    url_of(payload.as_object()?, destination, endpoints).ok()
}

/// The `body` member of a payload's JSON text, byte for byte as it stands
/// there (for a payload read from jsonb: equal to `(payload->'body')::text`).
/// `None` when the text is not an object with a body.
pub fn raw_body(payload_text: &str) -> Option<Vec<u8>> {
    /// Only `body` is kept, borrowed from the text; the other members are
    /// skipped over without being built.
    #[derive(serde::Deserialize)]
    struct WithBody<'a> {
        #[serde(borrow)]
        body: &'a serde_json::value::RawValue,
    }
    // (a derived struct would read an array's first element as `body`)
    if !payload_text.trim_start().starts_with('{') {
        return None;
    }
    let p: WithBody = serde_json::from_str(payload_text).ok()?;
    Some(p.body.get().as_bytes().to_vec())
}

thread_local! {
    static URLS: crate::memo::Texts<Result<url::Url, String>> = Default::default();
}

/// http(s) only, a host, no credentials in the URL. Each text is parsed
/// once per thread ([`crate::memo`]).
pub fn parse_url(text: &str) -> Result<url::Url, String> {
    crate::memo::cached(&URLS, text, checked_url)
}

fn checked_url(text: &str) -> Result<url::Url, String> {
    // The URL standard drops tabs and line breaks anywhere in the text, so
    // "http://h/a\r\nX: y" would quietly become a request for "/aX:%20y".
    if text.chars().any(char::is_control) {
        return Err("webhook url contains control characters (CR, LF, tab, ...)".into());
    }
    let url = url::Url::parse(text).map_err(|e| format!("webhook url is not a valid URL: {e}"))?;
    match url.scheme() {
        "http" | "https" => {}
        other => {
            return Err(format!(
                "webhook url scheme {other:?} is not allowed (use http or https)"
            ))
        }
    }
    if url.host().is_none() {
        return Err("webhook url has no host".into());
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(
            "webhook url must not carry credentials; use headers or a configured endpoint".into(),
        );
    }
    Ok(url)
}

pub fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn p(v: Value) -> Result<WebhookRequest, String> {
        parse(&v, None, None, &HashMap::new())
    }

    fn url(r: &WebhookRequest) -> &str {
        match &r.to {
            To::Url(u) => u.as_str(),
            To::Subscription(id) => panic!("a subscription's delivery: {id}"),
        }
    }

    #[test]
    fn a_subscription_delivery_takes_nothing_of_where_from_the_payload() {
        let r = p(json!({"subscription": "sub_abcdefgh", "body": {"type": "a.b"}})).unwrap();
        assert_eq!(r.to, To::Subscription("sub_abcdefgh".into()));
        assert!(r.headers.is_empty());
        for (payload, says) in [
            (
                json!({"subscription": "sub_abcdefgh", "url": "https://e.com", "body": 1}),
                "has \"url\"",
            ),
            (
                json!({"subscription": "sub_abcdefgh", "headers": {}, "body": 1}),
                "has \"headers\"",
            ),
            (json!({"subscription": 7, "body": 1}), "must be a string"),
        ] {
            let err = p(payload).unwrap_err();
            assert!(err.contains(says), "{err}");
        }
        let endpoints = HashMap::from([("b".to_string(), "https://e.com/b".to_string())]);
        let err = parse(
            &json!({"subscription": "sub_abcdefgh", "body": 1}),
            None,
            Some("b"),
            &endpoints,
        )
        .unwrap_err();
        assert!(err.contains("use one or the other"), "{err}");
    }

    #[test]
    fn accepts_the_contract_shape() {
        let r = p(
            json!({"url": "https://example.com/hook?x=1", "body": {"b": 1, "a": [1]},
                         "headers": {"X-Tenant": "t1"}}),
        )
        .unwrap();
        assert_eq!(url(&r), "https://example.com/hook?x=1");
        assert_eq!(r.body, br#"{"a":[1],"b":1}"#);
        assert_eq!(r.headers["x-tenant"], "t1");
    }

    #[test]
    fn destination_names_an_endpoint() {
        let endpoints =
            HashMap::from([("billing".to_string(), "https://example.com/b".to_string())]);
        let r = parse(&json!({"body": null}), None, Some("billing"), &endpoints).unwrap();
        assert_eq!(url(&r), "https://example.com/b");
        assert_eq!(r.body, b"null");
        let err = parse(&json!({"body": 1}), None, Some("nope"), &endpoints).unwrap_err();
        assert!(
            err.contains("\"nope\" is not a configured endpoint"),
            "{err}"
        );
        // a url and a destination: which one was meant is not guessed
        let err = parse(
            &json!({"url": "https://example.com/x", "body": 1}),
            None,
            Some("billing"),
            &endpoints,
        )
        .unwrap_err();
        assert!(err.contains("use one or the other"), "{err}");
    }

    #[test]
    fn the_raw_body_keeps_every_digit() {
        let text = r#"{"url": "http://h/", "body": {"n": 123456789012345678901234567890, "d": 0.1000000000000000055511151231257827}}"#;
        assert_eq!(
            raw_body(text).unwrap(),
            br#"{"n": 123456789012345678901234567890, "d": 0.1000000000000000055511151231257827}"#
        );
        assert_eq!(raw_body(r#"{"url": "x"}"#), None);
        assert_eq!(raw_body("[1]"), None);
        assert_eq!(raw_body(r#"{"body": null}"#).unwrap(), b"null");
        // given the raw body, the request sends it as it stands; the body
        // must still be there in the parse
        let payload: Value = serde_json::from_str(text).unwrap();
        let r = parse(&payload, raw_body(text), None, &HashMap::new()).unwrap();
        assert_eq!(r.body, raw_body(text).unwrap());
        let err = parse(
            &json!({"url": "http://h/"}),
            Some(b"1".to_vec()),
            None,
            &HashMap::new(),
        )
        .unwrap_err();
        assert!(err.contains("has no \"body\""), "{err}");
    }

    #[test]
    fn refuses_bad_payloads_with_a_reason() {
        let cases = [
            (json!([1, 2]), "must be a JSON object, not an array"),
            (json!("x"), "not a string"),
            (json!({"body": 1}), "no \"url\""),
            (json!({"url": 5, "body": 1}), "\"url\" must be a string"),
            (json!({"url": "https://e.com"}), "no \"body\""),
            (
                json!({"url": "ftp://e.com/x", "body": 1}),
                "scheme \"ftp\" is not allowed",
            ),
            (
                json!({"url": "file:///etc/passwd", "body": 1}),
                "scheme \"file\"",
            ),
            (json!({"url": "not a url", "body": 1}), "not a valid URL"),
            (
                json!({"url": "https://e.com/a\r\nX-Evil: 1", "body": 1}),
                "url contains control characters",
            ),
            (
                json!({"url": "https://e.com/a\tb", "body": 1}),
                "url contains control characters",
            ),
            (
                json!({"url": "https://u:p@e.com", "body": 1}),
                "credentials",
            ),
            (
                json!({"url": "https://e.com", "body": 1, "extra": 1}),
                "unknown field \"extra\"",
            ),
            (
                json!({"url": "https://e.com", "body": 1, "headers": []}),
                "\"headers\" must be an object",
            ),
            (
                json!({"url": "https://e.com", "body": 1, "headers": {"webhook-id": "x"}}),
                "set by the relay",
            ),
            (
                json!({"url": "https://e.com", "body": 1, "headers": {"X-A": 1}}),
                "must be a string",
            ),
            (
                json!({"url": "https://e.com", "body": 1, "headers": {"X-A": "a\r\nX-Evil: 1"}}),
                "control characters",
            ),
            (
                json!({"url": "https://e.com", "body": 1, "headers": {"bad name": "v"}}),
                "not a valid HTTP header name",
            ),
            (
                json!({"url": "https://e.com", "body": 1, "headers": {"User-Agent": "x"}}),
                "set by the relay",
            ),
            (
                json!({"url": "https://e.com", "body": 1, "headers": {"Upgrade": "websocket"}}),
                "hop-by-hop",
            ),
        ];
        for (payload, expected) in cases {
            let err = p(payload.clone()).unwrap_err();
            assert!(
                err.contains(expected),
                "{payload}: {err:?} should mention {expected:?}"
            );
        }
    }
}

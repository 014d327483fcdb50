//! The invariants: what each kind's parsing may accept. `check` runs a
//! payload through the kind's request building and checks what it
//! accepted; `Ok(())` when accepted, `Err(reason)` when refused.

use std::collections::HashMap;

use outbox_providers::charge::request as charge;
use outbox_providers::email::message as email;
use outbox_providers::webhook::request as webhook;
use serde_json::Value;

use super::{default_from, endpoints};

/// Run `payload` through the kind's parsing and check what it accepted.
/// `Ok(())` when accepted, `Err(reason)` when refused.
pub fn check(kind: &str, payload: &Value, destination: Option<&str>) -> Result<(), String> {
    match kind {
        "webhook" => check_webhook(payload, destination),
        "email" => check_email(payload),
        "charge" => check_charge(payload),
        "nats" => check_nats(payload),
        "amqp" => check_amqp(payload),
        "kafka" => check_kafka(payload),
        other => panic!("no parser for kind {other:?}"),
    }
}

/// What a nats publish accepted carries: a concrete subject, headers that
/// cannot forge JetStream's or break the header block, the body as given.
pub fn check_nats(payload: &Value) -> Result<(), String> {
    let p = outbox_providers::nats::request::parse(payload, None)?;
    assert!(!p.subject.is_empty());
    assert!(!p
        .subject
        .chars()
        .any(|c| c.is_whitespace() || c.is_control()));
    assert!(p
        .subject
        .split('.')
        .all(|t| !t.is_empty() && t != "*" && t != ">"));
    for (name, value) in &p.headers {
        assert!(!name.to_ascii_lowercase().starts_with("nats-"), "{name}");
        assert!(name.bytes().all(|b| b.is_ascii_graphic() && b != b':'));
        assert!(!value.contains(['\r', '\n', '\0']));
    }
    let body = payload
        .get("body")
        .map(Value::to_string)
        .unwrap_or_default();
    assert_eq!(String::from_utf8(p.body).unwrap(), body);
    Ok(())
}

/// What a kafka record accepted carries: a topic name Kafka allows, a
/// partition in range, string headers none of which forges the effect key,
/// the body as given, the key as given or else the ordering key.
pub fn check_kafka(payload: &Value) -> Result<(), String> {
    use outbox_providers::kafka::request::{parse, EFFECT_KEY_HEADER};
    let r = parse(payload, None, Some("ordering"))?;
    assert!((1..=249).contains(&r.topic.len()), "{}", r.topic);
    assert!(r.topic != "." && r.topic != "..");
    assert!(r
        .topic
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')));
    assert!(r.partition.is_none_or(|p| p >= 0));
    for (name, value) in &r.headers {
        assert!(!name.eq_ignore_ascii_case(EFFECT_KEY_HEADER), "{name}");
        assert!(!name.is_empty() && name.bytes().all(|b| (b' '..=b'~').contains(&b)));
        assert!(!name.starts_with(' ') && !name.ends_with(' '), "{name:?}");
        assert!(!value.chars().any(char::is_control), "{value:?}");
    }
    let key = match payload.get("key") {
        Some(Value::String(k)) => Some(k.as_str()),
        _ => Some("ordering"),
    };
    assert_eq!(r.key.as_deref(), key);
    let body = payload
        .get("body")
        .map(Value::to_string)
        .unwrap_or_default();
    assert_eq!(String::from_utf8(r.body).unwrap(), body);
    Ok(())
}

/// What an amqp publish accepted carries: an exchange name AMQP allows,
/// short strings within 255 bytes, typed headers, the body as given.
pub fn check_amqp(payload: &Value) -> Result<(), String> {
    use outbox_providers::amqp::request::Header;
    let p = outbox_providers::amqp::request::parse(payload, None)?;
    assert!(p.exchange.len() <= 255 && p.routing_key.len() <= 255);
    assert!(p
        .exchange
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c)));
    assert!(!p.routing_key.chars().any(char::is_control));
    for (name, value) in &p.headers {
        assert!(!name.is_empty() && name.len() <= 255);
        assert!(!name.chars().any(|c| c.is_control() || c.is_whitespace()));
        let given = &payload["headers"][name.as_str()];
        match value {
            Header::Text(t) => assert_eq!(given.as_str(), Some(t.as_str())),
            Header::Integer(i) => assert_eq!(given.as_i64(), Some(*i)),
            Header::Boolean(b) => assert_eq!(given.as_bool(), Some(*b)),
        }
    }
    let body = payload
        .get("body")
        .map(Value::to_string)
        .unwrap_or_default();
    assert_eq!(String::from_utf8(p.body).unwrap(), body);
    Ok(())
}

pub fn check_webhook(payload: &Value, destination: Option<&str>) -> Result<(), String> {
    let req = webhook::parse(payload, None, destination, &endpoints())?;
    match &req.to {
        webhook::To::Url(url) => {
            assert!(
                matches!(url.scheme(), "http" | "https"),
                "accepted a {} URL: {payload}",
                url.scheme()
            );
            assert!(url.host().is_some(), "accepted a URL without a host");
            assert!(
                url.username().is_empty() && url.password().is_none(),
                "accepted credentials in {url}"
            );
        }
        // where a subscription's delivery goes is the subscription's
        webhook::To::Subscription(_) => assert!(
            payload.get("url").is_none() && payload.get("headers").is_none(),
            "a subscription's delivery with a url or headers: {payload}"
        ),
    }
    for (name, value) in &req.headers {
        let bytes = value.as_bytes();
        assert!(
            !bytes.iter().any(|b| matches!(b, b'\r' | b'\n' | 0)),
            "header {name} carries CR, LF or NUL: {value:?}"
        );
        for relay_owned in [
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
            "upgrade",
            "te",
        ] {
            assert_ne!(name.as_str(), relay_owned, "a payload set {name}");
        }
    }
    let body = serde_json::to_vec(&payload["body"]).unwrap();
    assert_eq!(req.body, body, "the body is the payload's body, unchanged");
    Ok(())
}

/// Headers lettre writes for the messages `prepare` builds.
const EMAIL_HEADERS: &[&str] = &[
    "from",
    "to",
    "cc",
    "reply-to",
    "subject",
    "message-id",
    "date",
    "mime-version",
    "content-type",
    "content-transfer-encoding",
];

pub fn check_email(payload: &Value) -> Result<(), String> {
    let from = default_from();
    let p = email::prepare(payload, "fuzz:key", 0, Some(&from))?;
    let text = &p.bytes;
    let end = text
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a header block ends with an empty line");
    let head = &text[..end + 2];
    let shown = String::from_utf8_lossy(head);
    // no bare CR or LF: every line break is CRLF
    for (i, b) in head.iter().enumerate() {
        match b {
            b'\r' => assert_eq!(head.get(i + 1), Some(&b'\n'), "bare CR in:\n{shown}"),
            b'\n' => assert!(i > 0 && head[i - 1] == b'\r', "bare LF in:\n{shown}"),
            0 => panic!("NUL in the header block:\n{shown}"),
            _ => {}
        }
    }
    // every line is a builder's header or the folded continuation of one
    let mut counts: HashMap<String, usize> = HashMap::new();
    for line in shown.split("\r\n").filter(|l| !l.is_empty()) {
        if line.starts_with([' ', '\t']) {
            continue;
        }
        let name = line
            .split_once(':')
            .map(|(n, _)| n.to_ascii_lowercase())
            .unwrap_or_else(|| panic!("not a header line {line:?} in:\n{shown}"));
        assert!(
            EMAIL_HEADERS.contains(&name.as_str()),
            "unexpected header {line:?} in:\n{shown}"
        );
        *counts.entry(name).or_default() += 1;
    }
    for (name, n) in &counts {
        assert_eq!(*n, 1, "{n} {name} headers in:\n{shown}");
    }
    for required in ["from", "to", "subject", "message-id"] {
        assert!(counts.contains_key(required), "no {required} in:\n{shown}");
    }
    let rcpts = p.envelope.to().len();
    assert!(
        (1..=email::MAX_RECIPIENTS).contains(&rcpts),
        "{rcpts} recipients"
    );
    for a in p.envelope.to() {
        assert!(
            !a.to_string().contains(['\r', '\n', '\0']),
            "recipient {a:?}"
        );
    }
    assert!(p.message_id.starts_with('<') && p.message_id.ends_with('>'));
    Ok(())
}

pub fn check_charge(payload: &Value) -> Result<(), String> {
    let form = charge::form(payload, "fuzz:key", 0)?;
    assert_eq!(form[0].0, "amount");
    let amount: i64 = form[0].1.parse().expect("the amount is an integer");
    assert!((1..=99_999_999).contains(&amount), "amount {amount}");
    assert_eq!(
        Some(amount),
        payload["amount"].as_i64(),
        "the amount sent is the payload's"
    );
    assert_eq!(form[1].0, "currency");
    assert!(
        form[1].1.len() == 3 && form[1].1.bytes().all(|b| b.is_ascii_lowercase()),
        "currency {:?}",
        form[1].1
    );
    assert_eq!(form[2].0, "payment_method");
    assert!(!form[2].1.is_empty());
    assert_eq!(form[3], ("confirm".to_string(), "true".to_string()));
    let n = form.len();
    assert_eq!(
        form[n - 2],
        (
            "metadata[outbox_intent_key]".to_string(),
            "fuzz:key".to_string()
        )
    );
    assert_eq!(
        form[n - 1],
        (
            "metadata[outbox_idempotency_key]".to_string(),
            charge::idempotency_key("fuzz:key", 0)
        )
    );
    for (k, _) in &form[4..n - 2] {
        let ok = matches!(k.as_str(), "customer" | "description")
            || k.strip_prefix("metadata[")
                .and_then(|r| r.strip_suffix(']'))
                .is_some_and(|inner| {
                    !inner.is_empty()
                        && !inner.contains(['[', ']'])
                        && inner != charge::META_INTENT_KEY
                        && inner != charge::META_IDEMPOTENCY_KEY
                });
        assert!(ok, "unexpected parameter {k:?}");
    }
    // the provider encodes this with expect(): it must never fail
    serde_urlencoded::to_string(&form).expect("the form encodes");
    Ok(())
}

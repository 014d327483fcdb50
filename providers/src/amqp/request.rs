//! Turning an `amqp` intent's payload into a publish, before any network
//! call: `{"exchange": "orders", "routing_key": "created", "body": <any
//! JSON>, "headers"?: {...}}`.

use std::collections::BTreeMap;

use serde_json::Value;

/// A publish ready to send.
#[derive(Debug, Clone, PartialEq)]
pub struct Publish {
    /// `""` is the default exchange (the routing key names a queue).
    pub exchange: String,
    pub routing_key: String,
    /// The body's JSON text (the stored text when the relay has it).
    pub body: Vec<u8>,
    /// The payload's headers, in name order.
    pub headers: BTreeMap<String, Header>,
}

/// A header value: AMQP tables are typed; a payload may give text, a whole
/// number or a boolean.
#[derive(Debug, Clone, PartialEq)]
pub enum Header {
    Text(String),
    Integer(i64),
    Boolean(bool),
}

/// The `message_id` of an intent: identical on every attempt, relay,
/// restart and operator retry, new only with a new key generation.
/// Consumers dedupe on it (RabbitMQ itself does not).
pub fn message_id(key: &str, generation: i32) -> String {
    crate::keys::effect_key(key, "amqp", generation)
}

/// What the broker limits a short string to (exchange, routing key,
/// header name, message id).
const SHORT_STRING: usize = 255;

/// Parse and check the payload. `raw_body` is the body's stored JSON text,
/// sent as it is when given.
pub fn parse(payload: &Value, raw_body: Option<Vec<u8>>) -> Result<Publish, String> {
    let obj = payload.as_object().ok_or(
        "amqp payload must be a JSON object with \"exchange\", \"routing_key\" and \"body\"",
    )?;
    if let Some(unknown) = obj
        .keys()
        .find(|k| !matches!(k.as_str(), "exchange" | "routing_key" | "body" | "headers"))
    {
        return Err(format!(
            "amqp payload has an unknown field {unknown:?} (expected exchange, routing_key, body, headers)"
        ));
    }
    let text = |field: &str| match obj.get(field) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(format!("amqp {field:?} must be a string")),
        None => Err(format!(
            "amqp payload has no {field:?} (use \"\" for the default exchange or an empty key)"
        )),
    };
    let exchange = text("exchange")?;
    check_exchange(&exchange)?;
    let routing_key = text("routing_key")?;
    check_routing_key(&routing_key)?;
    let body = crate::payload_body("amqp", obj, raw_body)?;
    let mut headers = BTreeMap::new();
    match obj.get("headers") {
        None | Some(Value::Null) => {}
        Some(Value::Object(map)) => {
            for (name, value) in map {
                check_header_name(name)?;
                let value = match value {
                    Value::String(s) if s.contains('\0') => {
                        return Err(format!("amqp header {name:?} has a NUL in its value"))
                    }
                    Value::String(s) => Header::Text(s.clone()),
                    Value::Bool(b) => Header::Boolean(*b),
                    Value::Number(n) => match n.as_i64() {
                        Some(i) => Header::Integer(i),
                        None => {
                            return Err(format!(
                                "amqp header {name:?} must be text, a whole number or a boolean (got {n})"
                            ))
                        }
                    },
                    _ => {
                        return Err(format!(
                            "amqp header {name:?} must be text, a whole number or a boolean"
                        ))
                    }
                };
                headers.insert(name.clone(), value);
            }
        }
        Some(_) => return Err("amqp \"headers\" must be an object".into()),
    }
    Ok(Publish {
        exchange,
        routing_key,
        body,
        headers,
    })
}

/// An exchange name as AMQP 0-9-1 defines it: up to 255 letters, digits,
/// `-`, `_`, `.` and `:`; empty is the default exchange.
pub fn check_exchange(name: &str) -> Result<(), String> {
    if name.len() > SHORT_STRING {
        return Err(format!(
            "amqp exchange is {} bytes; the limit is {SHORT_STRING}",
            name.len()
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':')))
    {
        return Err(format!(
            "amqp exchange {name:?} has {c:?}: an exchange name is letters, digits, '-', '_', '.' and ':'"
        ));
    }
    Ok(())
}

/// A routing key: up to 255 bytes without control characters.
pub fn check_routing_key(key: &str) -> Result<(), String> {
    if key.len() > SHORT_STRING {
        return Err(format!(
            "amqp routing_key is {} bytes; the limit is {SHORT_STRING}",
            key.len()
        ));
    }
    if key.chars().any(char::is_control) {
        return Err(format!("amqp routing_key {key:?} has control characters"));
    }
    Ok(())
}

/// A header name a payload may set: up to 255 bytes of printable
/// characters.
fn check_header_name(name: &str) -> Result<(), String> {
    if name.is_empty()
        || name.len() > SHORT_STRING
        || name.chars().any(|c| c.is_control() || c.is_whitespace())
    {
        return Err(format!(
            "amqp header name {name:?} is not a valid header name (1 to {SHORT_STRING} bytes, no spaces or control characters)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_payload_becomes_a_publish() {
        let p = parse(
            &json!({"exchange": "orders", "routing_key": "created", "body": {"id": 7},
                    "headers": {"trace": "t1", "n": 3, "ok": true}}),
            None,
        )
        .unwrap();
        assert_eq!(p.exchange, "orders");
        assert_eq!(p.routing_key, "created");
        assert_eq!(p.body, br#"{"id":7}"#);
        assert_eq!(p.headers["trace"], Header::Text("t1".into()));
        assert_eq!(p.headers["n"], Header::Integer(3));
        assert_eq!(p.headers["ok"], Header::Boolean(true));
        let default = parse(
            &json!({"exchange": "", "routing_key": "q", "body": 1}),
            Some(b"1.000".to_vec()),
        )
        .unwrap();
        assert_eq!(default.exchange, "");
        assert_eq!(default.body, b"1.000");
    }

    #[test]
    fn bad_payloads_are_refused_with_a_reason() {
        let long = "x".repeat(256);
        let cases = [
            (json!("x"), "JSON object"),
            (json!({"routing_key": "k", "body": 1}), "no \"exchange\""),
            (json!({"exchange": "e", "body": 1}), "no \"routing_key\""),
            (
                json!({"exchange": 1, "routing_key": "k", "body": 1}),
                "must be a string",
            ),
            (
                json!({"exchange": "a b", "routing_key": "k", "body": 1}),
                "exchange name is",
            ),
            (
                json!({"exchange": "a/b", "routing_key": "k", "body": 1}),
                "exchange name is",
            ),
            (
                json!({"exchange": long, "routing_key": "k", "body": 1}),
                "limit is 255",
            ),
            (
                json!({"exchange": "e", "routing_key": long, "body": 1}),
                "limit is 255",
            ),
            (
                json!({"exchange": "e", "routing_key": "a\nb", "body": 1}),
                "control",
            ),
            (json!({"exchange": "e", "routing_key": "k"}), "no \"body\""),
            (
                json!({"exchange": "e", "routing_key": "k", "body": 1, "x": 1}),
                "unknown field",
            ),
            (
                json!({"exchange": "e", "routing_key": "k", "body": 1, "headers": []}),
                "must be an object",
            ),
            (
                json!({"exchange": "e", "routing_key": "k", "body": 1, "headers": {"": "v"}}),
                "not a valid header name",
            ),
            (
                json!({"exchange": "e", "routing_key": "k", "body": 1, "headers": {"a b": "v"}}),
                "not a valid header name",
            ),
            (
                json!({"exchange": "e", "routing_key": "k", "body": 1, "headers": {"k": 1.5}}),
                "whole number",
            ),
            (
                json!({"exchange": "e", "routing_key": "k", "body": 1, "headers": {"k": [1]}}),
                "whole number",
            ),
            (
                json!({"exchange": "e", "routing_key": "k", "body": 1, "headers": {"k": "a\u{0}b"}}),
                "NUL",
            ),
        ];
        for (payload, says) in cases {
            let err = parse(&payload, None).unwrap_err();
            assert!(err.contains(says), "{payload}: {err:?} should say {says:?}");
        }
    }

    #[test]
    fn the_message_id_is_stable_and_new_only_with_a_new_generation() {
        assert_eq!(message_id("order:1", 0), message_id("order:1", 0));
        assert_ne!(message_id("order:1", 0), message_id("order:1", 1));
        assert_ne!(message_id("order:1", 0), message_id("order:2", 0));
        assert_ne!(
            message_id("order:1", 0),
            crate::nats::request::message_id("order:1", 0)
        );
        assert!(message_id("order:1", 0).len() <= SHORT_STRING);
    }
}

//! Turning a `nats` intent's payload into a JetStream publish, before any
//! network call: `{"subject": "...", "body": <any JSON>, "headers"?: {...}}`.

use std::collections::BTreeMap;

use serde_json::Value;

/// A publish ready to send.
#[derive(Debug, Clone, PartialEq)]
pub struct Publish {
    pub subject: String,
    /// The body's JSON text (the stored text when the relay has it).
    pub body: Vec<u8>,
    /// The payload's headers, in name order; `Nats-*` names are the relay's.
    pub headers: BTreeMap<String, String>,
}

/// The message id of an intent, sent as `Nats-Msg-Id` (JetStream dedupes on
/// it within the stream's duplicate window; the provider sets it through
/// `async_nats::header::NATS_MESSAGE_ID`): identical on every attempt,
/// relay, restart and operator retry, new only with a new key generation.
pub fn message_id(key: &str, generation: i32) -> String {
    crate::keys::effect_key(key, "nats", generation)
}

/// Parse and check the payload. `raw_body` is the body's stored JSON text,
/// sent as it is when given.
pub fn parse(payload: &Value, raw_body: Option<Vec<u8>>) -> Result<Publish, String> {
    let obj = payload
        .as_object()
        .ok_or("nats payload must be a JSON object with \"subject\" and \"body\"")?;
    if let Some(unknown) = obj
        .keys()
        .find(|k| !matches!(k.as_str(), "subject" | "body" | "headers"))
    {
        return Err(format!(
            "nats payload has an unknown field {unknown:?} (expected subject, body, headers)"
        ));
    }
    let subject = match obj.get("subject") {
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err("nats \"subject\" must be a string".into()),
        None => return Err("nats payload has no \"subject\"".into()),
    };
    check_subject(&subject)?;
    let body = crate::payload_body("nats", obj, raw_body)?;
    let mut headers = BTreeMap::new();
    match obj.get("headers") {
        None | Some(Value::Null) => {}
        Some(Value::Object(map)) => {
            for (name, value) in map {
                check_header_name(name)?;
                let Value::String(value) = value else {
                    return Err(format!("nats header {name:?} must be a string"));
                };
                if value.chars().any(|c| c == '\r' || c == '\n' || c == '\0') {
                    return Err(format!(
                        "nats header {name:?} has a line break or NUL in its value"
                    ));
                }
                headers.insert(name.clone(), value.clone());
            }
        }
        Some(_) => return Err("nats \"headers\" must be an object".into()),
    }
    Ok(Publish {
        subject,
        body,
        headers,
    })
}

/// A subject one can publish to: dot-separated non-empty tokens of
/// printable characters without spaces, no wildcards (`*`, `>`).
pub fn check_subject(subject: &str) -> Result<(), String> {
    if subject.is_empty() {
        return Err("nats subject must not be empty".into());
    }
    if subject.len() > 1024 {
        return Err(format!(
            "nats subject is {} bytes; the limit is 1024",
            subject.len()
        ));
    }
    if subject.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "nats subject {subject:?} has whitespace or control characters"
        ));
    }
    if subject.split('.').any(|t| t.is_empty()) {
        return Err(format!("nats subject {subject:?} has an empty token"));
    }
    if subject.split('.').any(|t| t == "*" || t == ">") {
        return Err(format!(
            "nats subject {subject:?} has a wildcard: publish to a concrete subject"
        ));
    }
    Ok(())
}

/// A header name a payload may set: printable ASCII without ':' or spaces,
/// and not one of the `Nats-` headers JetStream reads (the relay sets
/// `Nats-Msg-Id`; the others change how the stream stores the message).
fn check_header_name(name: &str) -> Result<(), String> {
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_graphic() && b != b':') {
        return Err(format!(
            "nats header name {name:?} is not a valid header name"
        ));
    }
    if name.to_ascii_lowercase().starts_with("nats-") {
        return Err(format!(
            "nats header {name:?} is reserved: Nats-* headers are JetStream's (the relay sets Nats-Msg-Id)"
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
            &json!({"subject": "orders.created", "body": {"id": 7}, "headers": {"trace": "t1"}}),
            None,
        )
        .unwrap();
        assert_eq!(p.subject, "orders.created");
        assert_eq!(p.body, br#"{"id":7}"#);
        assert_eq!(p.headers.get("trace").map(String::as_str), Some("t1"));
        let raw = parse(&json!({"subject": "a", "body": 1}), Some(b"1.000".to_vec())).unwrap();
        assert_eq!(raw.body, b"1.000");
    }

    #[test]
    fn bad_payloads_are_refused_with_a_reason() {
        let cases = [
            (json!([1]), "JSON object"),
            (json!({"body": 1}), "no \"subject\""),
            (json!({"subject": 1, "body": 1}), "must be a string"),
            (json!({"subject": "", "body": 1}), "must not be empty"),
            (json!({"subject": "a b", "body": 1}), "whitespace"),
            (json!({"subject": "a..b", "body": 1}), "empty token"),
            (json!({"subject": "orders.*", "body": 1}), "wildcard"),
            (json!({"subject": "orders.>", "body": 1}), "wildcard"),
            (json!({"subject": "a"}), "no \"body\""),
            (json!({"subject": "a", "body": 1, "x": 1}), "unknown field"),
            (
                json!({"subject": "a", "body": 1, "headers": []}),
                "must be an object",
            ),
            (
                json!({"subject": "a", "body": 1, "headers": {"a:b": "v"}}),
                "not a valid header name",
            ),
            (
                json!({"subject": "a", "body": 1, "headers": {"k": "v\r\nx: y"}}),
                "line break",
            ),
            (
                json!({"subject": "a", "body": 1, "headers": {"k": 1}}),
                "must be a string",
            ),
            (
                json!({"subject": "a", "body": 1, "headers": {"Nats-Msg-Id": "x"}}),
                "reserved",
            ),
            (
                json!({"subject": "a", "body": 1, "headers": {"nats-expected-stream": "S"}}),
                "reserved",
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
        assert_eq!(message_id("order:1", 0).len(), 64);
    }
}

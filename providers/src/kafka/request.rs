//! Turning a `kafka` intent's payload into a record, before any network
//! call: `{"topic": "orders", "key"?: "...", "body": <any JSON>,
//! "headers"?: {"name": "value"}, "partition"?: n}`.

use std::collections::BTreeMap;

use serde_json::Value;

/// The header every record carries: the intent's effect key, identical on
/// every attempt, relay, restart and operator retry. Consumers dedupe on it.
pub const EFFECT_KEY_HEADER: &str = "outbox-effect-key";

/// A record ready to produce.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub topic: String,
    /// The payload's `key`, else the intent's ordering key, else none.
    pub key: Option<String>,
    /// The body's JSON text (the stored text when the relay has it).
    pub body: Vec<u8>,
    /// The payload's headers, in name order.
    pub headers: BTreeMap<String, String>,
    /// A partition the payload names; else the partitioner chooses.
    pub partition: Option<i32>,
}

impl Record {
    /// The record's size as librdkafka counts it against
    /// `message.max.bytes`: body, key, and each header's name and value
    /// with a few bytes of framing, the effect key's header included.
    pub fn size(&self, effect_key: &str) -> usize {
        const HEADER_FRAMING: usize = 10;
        let headers = self
            .headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .chain([(EFFECT_KEY_HEADER, effect_key)])
            .map(|(n, v)| n.len() + v.len() + HEADER_FRAMING)
            .sum::<usize>();
        self.body.len() + self.key.as_ref().map_or(0, String::len) + headers
    }
}

/// The value of [`EFFECT_KEY_HEADER`] for an intent.
pub fn effect_key(key: &str, generation: i32) -> String {
    crate::keys::effect_key(key, "kafka", generation)
}

/// The longest topic name Kafka accepts.
const MAX_TOPIC: usize = 249;
/// A bound on header names and on the record key, far above any real use:
/// the record as a whole is bounded by the broker's `message.max.bytes`.
const MAX_NAME: usize = 1024;
const MAX_KEY: usize = 64 * 1024;

/// Parse and check the payload. `raw_body` is the body's stored JSON text,
/// sent as it is when given; `ordering_key` is the intent's.
pub fn parse(
    payload: &Value,
    raw_body: Option<Vec<u8>>,
    ordering_key: Option<&str>,
) -> Result<Record, String> {
    let obj = payload
        .as_object()
        .ok_or("kafka payload must be a JSON object with \"topic\" and \"body\"")?;
    if let Some(unknown) = obj.keys().find(|k| {
        !matches!(
            k.as_str(),
            "topic" | "key" | "body" | "headers" | "partition"
        )
    }) {
        return Err(format!(
            "kafka payload has an unknown field {unknown:?} (expected topic, key, body, headers, partition)"
        ));
    }
    let topic = match obj.get("topic") {
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err("kafka \"topic\" must be a string".into()),
        None => return Err("kafka payload has no \"topic\"".into()),
    };
    check_topic(&topic)?;
    let key = match obj.get("key") {
        None | Some(Value::Null) => ordering_key.map(str::to_string),
        Some(Value::String(s)) if s.len() > MAX_KEY => {
            return Err(format!(
                "kafka \"key\" is {} bytes; the limit is {MAX_KEY}",
                s.len()
            ))
        }
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err("kafka \"key\" must be a string".into()),
    };
    let partition = match obj.get("partition") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => match n.as_u64().and_then(|p| i32::try_from(p).ok()) {
            Some(p) => Some(p),
            None => {
                return Err(format!(
                    "kafka \"partition\" must be a whole number from 0 to {} (got {n})",
                    i32::MAX
                ))
            }
        },
        Some(_) => return Err("kafka \"partition\" must be a whole number".into()),
    };
    let body = crate::payload_body("kafka", obj, raw_body)?;
    let mut headers = BTreeMap::new();
    match obj.get("headers") {
        None | Some(Value::Null) => {}
        Some(Value::Object(map)) => {
            for (name, value) in map {
                check_header_name(name)?;
                let Value::String(value) = value else {
                    return Err(format!("kafka header {name:?} must be a string"));
                };
                if value.chars().any(char::is_control) {
                    return Err(format!(
                        "kafka header {name:?} has a control character (CR, LF or another) in its value"
                    ));
                }
                headers.insert(name.clone(), value.clone());
            }
        }
        Some(_) => return Err("kafka \"headers\" must be an object".into()),
    }
    Ok(Record {
        topic,
        key,
        body,
        headers,
        partition,
    })
}

/// A topic name as Kafka defines it: 1 to 249 ASCII letters, digits, `.`,
/// `_` and `-`, and neither `.` nor `..`.
pub fn check_topic(topic: &str) -> Result<(), String> {
    if topic.is_empty() || topic.len() > MAX_TOPIC {
        return Err(format!(
            "kafka topic must be 1 to {MAX_TOPIC} characters (got {})",
            topic.len()
        ));
    }
    if topic == "." || topic == ".." {
        return Err(format!("kafka topic {topic:?} is not a valid name"));
    }
    if let Some(c) = topic
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "kafka topic {topic:?} has {c:?}: a topic name is ASCII letters, digits, '.', '_' and '-'"
        ));
    }
    Ok(())
}

/// A header name a payload may set: 1 to 1024 printable ASCII characters
/// without a leading or trailing space (a name that only looks like
/// another is refused), and not the one the relay sets.
fn check_header_name(name: &str) -> Result<(), String> {
    let printable = name.bytes().all(|b| (b' '..=b'~').contains(&b));
    if name.is_empty()
        || name.len() > MAX_NAME
        || !printable
        || name.starts_with(' ')
        || name.ends_with(' ')
    {
        return Err(format!(
            "kafka header name {name:?} is not a valid header name (1 to {MAX_NAME} printable ASCII characters, no leading or trailing space)"
        ));
    }
    if name.eq_ignore_ascii_case(EFFECT_KEY_HEADER) {
        return Err(format!(
            "kafka header {name:?} is set by the relay (the effect key consumers dedupe on)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_full_payload() {
        let r = parse(
            &json!({"topic": "orders.v1", "key": "acct-1", "body": {"id": 1},
                    "headers": {"source": "shop"}, "partition": 2}),
            None,
            Some("ignored"),
        )
        .unwrap();
        assert_eq!(r.topic, "orders.v1");
        assert_eq!(r.key.as_deref(), Some("acct-1"));
        assert_eq!(r.body, br#"{"id":1}"#);
        assert_eq!(r.headers["source"], "shop");
        assert_eq!(r.partition, Some(2));
    }

    #[test]
    fn the_key_falls_back_to_the_ordering_key_then_to_none() {
        let p = json!({"topic": "t", "body": null});
        assert_eq!(
            parse(&p, None, Some("acct-7")).unwrap().key.as_deref(),
            Some("acct-7")
        );
        assert_eq!(parse(&p, None, None).unwrap().key, None);
    }

    #[test]
    fn the_stored_body_text_is_sent_as_is() {
        let r = parse(
            &json!({"topic": "t", "body": 1.0}),
            Some(b"1.000000000000000000001".to_vec()),
            None,
        )
        .unwrap();
        assert_eq!(r.body, b"1.000000000000000000001");
    }

    #[test]
    fn bad_payloads_say_why() {
        for (payload, needle) in [
            (json!([]), "JSON object"),
            (json!({"body": 1}), "no \"topic\""),
            (json!({"topic": 1, "body": 1}), "must be a string"),
            (json!({"topic": "", "body": 1}), "1 to 249"),
            (json!({"topic": "a b", "body": 1}), "ASCII letters"),
            (json!({"topic": "..", "body": 1}), "not a valid name"),
            (json!({"topic": "t"}), "no \"body\""),
            (
                json!({"topic": "t", "body": 1, "key": 5}),
                "\"key\" must be",
            ),
            (json!({"topic": "t", "body": 1, "partition": -1}), "0 to"),
            (json!({"topic": "t", "body": 1, "partition": 1.5}), "0 to"),
            (
                json!({"topic": "t", "body": 1, "partition": "1"}),
                "whole number",
            ),
            (json!({"topic": "t", "body": 1, "headers": []}), "object"),
            (
                json!({"topic": "t", "body": 1, "headers": {"a": 1}}),
                "string",
            ),
            (
                json!({"topic": "t", "body": 1, "headers": {"": "x"}}),
                "valid header",
            ),
            (
                json!({"topic": "t", "body": 1, "headers": {"Outbox-Effect-Key": "x"}}),
                "set by the relay",
            ),
            (
                json!({"topic": "t", "body": 1, "headers": {" outbox-effect-key": "x"}}),
                "valid header",
            ),
            (
                json!({"topic": "t", "body": 1, "headers": {"outbox-effect-key\u{200b}": "x"}}),
                "valid header",
            ),
            (
                json!({"topic": "t", "body": 1, "headers": {"source ": "x"}}),
                "valid header",
            ),
            (
                json!({"topic": "t", "body": 1, "headers": {"a": "b\r\nc: d"}}),
                "control character",
            ),
            (
                json!({"topic": "t", "body": 1, "headers": {"a": "b\u{7f}"}}),
                "control character",
            ),
            (
                json!({"topic": "t", "body": 1, "url": "x"}),
                "unknown field",
            ),
        ] {
            let err = parse(&payload, None, None).unwrap_err();
            assert!(err.contains(needle), "{payload}: {err}");
        }
    }

    #[test]
    fn the_effect_key_is_the_kinds_derived_key() {
        assert_eq!(effect_key("k", 0), crate::keys::effect_key("k", "kafka", 0));
        assert_ne!(effect_key("k", 0), effect_key("k", 1));
        assert_eq!(effect_key("k", 0).len(), 64);
    }
}

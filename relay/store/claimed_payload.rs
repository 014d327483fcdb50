//! A claimed intent's payload, read from its stored text.
//!
//! Every kind with a `body` (webhook, nats, amqp, kafka) sends it as the
//! stored text spells it, digits intact, and reads nothing inside it; the
//! relay reads only the members around it (where the effect goes, its
//! headers). So the top-level members become a JSON value, and `body`
//! stays a slice of the text, standing as `null` in the value: building
//! the body's tree was most of what reading a claimed row cost the relay.

use std::ops::Range;

use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// Nesting a body may have before the whole payload is read as a value
/// after all, so that a payload deeper than the JSON parser's limit (128
/// levels) fails as it would. `outbox.enqueue` refuses anything deeper
/// than 64; only a row written otherwise comes near.
const BODY_DEPTH_READ_IN_FULL: usize = 100;

/// The payload read from `text`: its value (with `body`, if the payload
/// is an object that has one, as `null`, unless the body nests so deep
/// that the whole payload is read) and where the body's text is.
#[derive(Debug)]
pub struct Read {
    pub value: Value,
    pub body: Option<Range<usize>>,
}

/// Read a stored payload. An error is the JSON parser's, as reading the
/// whole text as a value gives it.
pub fn read(text: &str) -> Result<Read, serde_json::Error> {
    if !text.trim_start().starts_with('{') {
        return whole(text);
    }
    let top = serde_json::from_str::<TopLevel>(text)?;
    let Some(body) = top.body else {
        return Ok(Read {
            value: Value::Object(top.members),
            body: None,
        });
    };
    // the slice is borrowed from `text`: its place there is its offset
    let text_of_body = body.get();
    let start = text_of_body.as_ptr() as usize - text.as_ptr() as usize;
    let body = Some(start..start + text_of_body.len());
    // nesting d takes 2d brackets: a shorter body is not scanned
    if text_of_body.len() >= 2 * BODY_DEPTH_READ_IN_FULL
        && depth(text_of_body) >= BODY_DEPTH_READ_IN_FULL
    {
        return Ok(Read {
            body,
            ..whole(text)?
        });
    }
    Ok(Read {
        value: Value::Object(top.members),
        body,
    })
}

fn whole(text: &str) -> Result<Read, serde_json::Error> {
    Ok(Read {
        value: serde_json::from_str(text)?,
        body: None,
    })
}

/// How deeply the JSON text nests its arrays and objects.
fn depth(json: &str) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for b in json.bytes() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// A payload object's members, `body` among them as `null` and aside as
/// its text.
struct TopLevel<'a> {
    members: Map<String, Value>,
    body: Option<&'a RawValue>,
}

impl<'de> serde::Deserialize<'de> for TopLevel<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(TopLevelVisitor)
    }
}

struct TopLevelVisitor;

impl<'de> Visitor<'de> for TopLevelVisitor {
    type Value = TopLevel<'de>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<TopLevel<'de>, A::Error> {
        let mut members = Map::new();
        let mut body = None;
        while let Some(key) = map.next_key::<String>()? {
            if key == "body" {
                body = Some(map.next_value::<&RawValue>()?);
                members.insert(key, Value::Null);
            } else {
                members.insert(key, map.next_value()?);
            }
        }
        Ok(TopLevel { members, body })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body_of<'a>(text: &'a str, read: &Read) -> Option<&'a str> {
        read.body.clone().map(|r| &text[r])
    }

    #[test]
    fn the_body_stays_text_and_the_rest_is_read() {
        let text = r#"{"url": "http://h/x", "body": {"n": 123456789012345678901234567890, "s": "a\"}b"}, "headers": {"x-a": "1"}}"#;
        let read = read(text).unwrap();
        assert_eq!(
            body_of(text, &read),
            Some(r#"{"n": 123456789012345678901234567890, "s": "a\"}b"}"#)
        );
        assert_eq!(
            read.value,
            json!({"url": "http://h/x", "body": null, "headers": {"x-a": "1"}})
        );
    }

    #[test]
    fn a_payload_without_a_body_or_not_an_object_is_read_whole() {
        let text = r#"{"amount": 1999, "currency": "usd"}"#;
        let r = read(text).unwrap();
        assert_eq!(
            (r.value, r.body),
            (json!({"amount": 1999, "currency": "usd"}), None)
        );
        for text in ["[1, 2]", "\"s\"", "null", " 12"] {
            let r = read(text).unwrap();
            assert_eq!(r.value, serde_json::from_str::<Value>(text).unwrap());
            assert_eq!(r.body, None);
        }
        let r = read(r#"{"body": null}"#).unwrap();
        assert_eq!(body_of(r#"{"body": null}"#, &r), Some("null"));
    }

    #[test]
    fn what_the_parser_refuses_is_refused_as_it_was() {
        let deep = format!(
            r#"{{"url": "http://h/", "body": {}1{}}}"#,
            "[".repeat(200),
            "]".repeat(200)
        );
        let err = read(&deep).unwrap_err().to_string();
        assert!(err.contains("recursion limit exceeded"), "{err}");
        // outside the body a number beyond a double is read, and refused
        let err = read(r#"{"amount": 1e400, "body": 1}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("number out of range"), "{err}");
        assert!(read(r#"{"url": "x", "body": }"#).is_err());
        assert!(read(r#"{"url": "x"} trailing"#).is_err());
    }

    #[test]
    fn a_body_read_whole_for_its_depth_is_still_found_as_text() {
        let body = format!("{}1{}", "[".repeat(110), "]".repeat(110));
        let text = format!(r#"{{"url": "http://h/", "body": {body}}}"#);
        let r = read(&text).unwrap();
        assert_eq!(body_of(&text, &r), Some(body.as_str()));
        assert_eq!(r.value, serde_json::from_str::<Value>(&text).unwrap());
    }

    #[test]
    fn depth_counts_nesting_outside_strings() {
        assert_eq!(depth("1"), 0);
        assert_eq!(depth(r#"{"a": [1, {"b": []}]}"#), 4);
        assert_eq!(depth(r#"{"a": "[[[[\"{{"}"#), 1);
        assert_eq!(depth(r#"["\\", [1]]"#), 2);
    }
}

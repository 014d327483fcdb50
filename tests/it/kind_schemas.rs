//! Each kind's payload schema (`schema/kinds/<kind>.json`, the file the
//! clients' builders are checked against) agrees with the relay's own
//! payload check: every example passes both, and a payload the schema
//! refuses for its shape (a field missing, unknown or of the wrong type)
//! the relay refuses too.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use outbox_relay::kinds::{Check, Kind};
use serde_json::{json, Value};

fn schema_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("schema/kinds")
}

fn schema_of(kind: Kind) -> Value {
    let path = schema_dir().join(format!("{}.json", kind.name()));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(text, kind.schema(), "the relay embeds {}", path.display());
    serde_json::from_str(&text).unwrap()
}

/// The relay's check of a payload; a webhook without a `url` names a
/// configured endpoint, as it must.
fn relay_check(kind: Kind, payload: &Value) -> Result<(), String> {
    let endpoints = HashMap::from([(
        "billing".to_string(),
        "https://billing.example/hooks".to_string(),
    )]);
    let named = kind == Kind::Webhook && payload.get("url").is_none();
    kind.check(
        payload,
        &Check {
            destination: named.then_some("billing"),
            endpoints: &endpoints,
            email_from: None,
        },
    )
}

#[test]
fn there_is_one_schema_file_per_kind() {
    let files: BTreeSet<String> = std::fs::read_dir(schema_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let kinds: BTreeSet<String> = Kind::ALL
        .iter()
        .map(|k| format!("{}.json", k.name()))
        .collect();
    assert_eq!(files, kinds);
}

#[test]
fn every_example_passes_the_schema_and_the_relay() {
    for kind in Kind::ALL {
        let schema = schema_of(kind);
        let validator = jsonschema::validator_for(&schema)
            .unwrap_or_else(|e| panic!("{kind}'s schema is not a valid JSON Schema: {e}"));
        let examples = schema["examples"].as_array().expect("examples");
        assert!(!examples.is_empty(), "{kind} has examples");
        for example in examples {
            let errors: Vec<String> = validator
                .iter_errors(example)
                .map(|e| e.to_string())
                .collect();
            assert!(errors.is_empty(), "{kind} {example}: {errors:?}");
            relay_check(kind, example).unwrap_or_else(|e| panic!("{kind} {example}: {e}"));
        }
    }
}

/// A value of a type the property's schema does not allow.
fn wrong_type(property: &Value) -> Option<Value> {
    let types: Vec<&str> = match &property["type"] {
        Value::String(t) => vec![t.as_str()],
        Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
        // "body" takes any JSON; the email's addresses are a $ref
        _ => return None,
    };
    [json!(["x"]), json!(5.5), json!({"a": "b"}), json!("x")]
        .into_iter()
        .find(|v| {
            !types.iter().any(|t| match *t {
                "string" => v.is_string(),
                "integer" | "number" => v.is_number(),
                "object" => v.is_object(),
                "array" => v.is_array(),
                _ => false,
            })
        })
}

#[test]
fn what_the_schema_refuses_for_its_shape_the_relay_refuses() {
    for kind in Kind::ALL {
        let schema = schema_of(kind);
        let validator = jsonschema::validator_for(&schema).unwrap();
        let required: Vec<&str> = schema["required"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        let properties = schema["properties"].as_object().unwrap();
        let example = schema["examples"][0].as_object().unwrap().clone();
        let mut bad: Vec<(String, Value)> = Vec::new();
        let mut unknown = example.clone();
        unknown.insert("colour".into(), json!("blue"));
        bad.push(("an unknown field".into(), Value::Object(unknown)));
        for field in &required {
            let mut p = example.clone();
            p.remove(*field);
            bad.push((format!("no {field:?}"), Value::Object(p)));
        }
        for (field, property) in properties {
            if let Some(v) = wrong_type(property) {
                let mut p = example.clone();
                p.insert(field.clone(), v);
                bad.push((format!("{field:?} of another type"), Value::Object(p)));
            }
        }
        assert!(bad.len() > required.len(), "{kind}: {bad:?}");
        for (what, payload) in bad {
            assert!(
                !validator.is_valid(&payload),
                "{kind}'s schema takes a payload with {what}: {payload}"
            );
            assert!(
                relay_check(kind, &payload).is_err(),
                "the relay takes a {kind} payload with {what}, which its schema refuses: {payload}"
            );
        }
    }
}

//! Every kind the relay delivers has a builder here, and what each builder
//! makes is valid by its kind's JSON Schema (`schema/kinds/<kind>.json`,
//! which the relay's own tests hold to its payload checks). A kind with a
//! schema and no builder fails this test. The `event` kind has no builder:
//! `publish` writes it, and the integration suite checks what it writes,
//! read back from the database (`tests/it/clients_rust_publish.rs`).

use std::path::{Path, PathBuf};

use outbox_client::{Amqp, Charge, Email, Intent, Kafka, Nats, Webhook};
use serde_json::{json, Value};

/// The kinds written by a call of their own rather than by `enqueue` and a
/// builder.
const PUBLISHED: [&str; 1] = ["event"];

fn schemas() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../schema/kinds")
}

fn validator(kind: &str) -> jsonschema::Validator {
    let path = schemas().join(format!("{kind}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let schema: Value = serde_json::from_str(&text).unwrap();
    jsonschema::validator_for(&schema).unwrap()
}

/// Each kind's builders, from the fewest fields to all of them.
fn built(kind: &str) -> Option<Vec<Box<dyn Intent>>> {
    let intents: Vec<Box<dyn Intent>> = match kind {
        "webhook" => vec![
            Box::new(Webhook::new("https://h.example/in", json!({"n": 1}))),
            Box::new(Webhook::to_endpoint("partner", json!(null)).header("x-tenant", "t1")),
        ],
        "email" => vec![
            Box::new(Email::new(["a@x.example"], "Hi").text("t")),
            Box::new(
                Email::new(["a@x.example", "B <b@x.example>"], "Receipt")
                    .from("Shop <shop@x.example>")
                    .cc("c@x.example")
                    .bcc("d@x.example")
                    .reply_to("help@x.example")
                    .text("plain")
                    .html("<p>html</p>"),
            ),
        ],
        "charge" => vec![
            Box::new(Charge::new(1999, "usd", "pm_card_visa")),
            Box::new(
                Charge::new(500, "eur", "pm_x")
                    .customer("cus_1")
                    .description("Order 42")
                    .metadata("order", "42"),
            ),
        ],
        "nats" => vec![
            Box::new(Nats::new("orders.created", json!({"id": 1}))),
            Box::new(Nats::new("orders.created", json!([1])).header("tenant", "t")),
        ],
        "amqp" => vec![
            Box::new(Amqp::new("", "work", json!(null))),
            Box::new(
                Amqp::new("orders", "created", json!(1))
                    .header("v", 2)
                    .header("ok", true)
                    .header("tenant", "t"),
            ),
        ],
        "kafka" => vec![
            Box::new(Kafka::new("orders.v1", json!(null))),
            Box::new(
                Kafka::new("orders.v1", json!({"id": 1}))
                    .key("acct-1")
                    .header("source", "shop")
                    .partition(2),
            ),
        ],
        _ => return None,
    };
    Some(intents)
}

#[test]
fn every_kind_has_a_builder_and_its_payloads_are_valid_by_the_schema() {
    let dir = schemas();
    let mut kinds = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        let kind = path.file_stem().unwrap().to_string_lossy().into_owned();
        kinds.push(kind.clone());
        if PUBLISHED.contains(&kind.as_str()) {
            continue;
        }
        let validator = validator(&kind);
        let intents = built(&kind)
            .unwrap_or_else(|| panic!("the Rust client has no builder for the {kind:?} kind"));
        for intent in intents {
            assert_eq!(intent.kind(), kind);
            let payload = intent.payload();
            let errors: Vec<String> = validator
                .iter_errors(&payload)
                .map(|e| e.to_string())
                .collect();
            assert!(errors.is_empty(), "{kind} {payload}: {errors:?}");
        }
    }
    kinds.sort();
    assert_eq!(
        kinds,
        ["amqp", "charge", "email", "event", "kafka", "nats", "webhook"]
    );
}

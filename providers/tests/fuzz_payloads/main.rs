//! Property tests of payload parsing: arbitrary JSON (the known field names
//! mixed with random ones; strings with CR/LF, NUL, other controls and
//! non-ASCII; huge, negative and fractional numbers) through each provider's
//! pure request building, which runs before any network call:
//!
//! - webhook: `webhook::request::parse`, and `raw_body` (the bytes sent)
//! - email:   `email::message::prepare`
//! - charge:  `charge::request::form`
//! - nats:    `nats::request::parse` (subjects and headers JetStream takes)
//! - kafka:   `kafka::request::parse` (topic names, partitions, string
//!   headers, never the relay's `outbox-effect-key`)
//! - amqp:    `amqp::request::parse` (exchange names, short strings, typed
//!   headers)
//!
//! Each must return, never panic, and whatever it accepts must be safe:
//! webhook URLs are http(s) without credentials and header values carry no
//! CR, LF or NUL; an email's header block is only the headers the builder
//! writes, each once, with no bare CR or LF (so nothing can be injected), and
//! at most 100 recipients; a charge has an integer amount in 1..=99999999 and
//! only the parameters the provider writes.
//!
//! The same checks run over every payload of tests/corpus/bad-payloads.json
//! (whose `parse`-stage cases must also fail with their reason) and
//! tests/corpus/good-payloads.json (which must be accepted), and proptest
//! mutates the good payloads field by field. Failures found by proptest are
//! kept in providers/proptest-regressions/ and replayed first; commit them.
//! `PROPTEST_CASES` overrides the number of cases per property (512).

use std::collections::HashMap;

use lettre::message::Mailbox;
use outbox_providers::webhook::request as webhook;
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use serde_json::{Map, Value};

const RECEIVER: &str = "http://127.0.0.1:9";

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(512);
    ProptestConfig {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/fuzz_payloads.txt",
        ))),
        ..ProptestConfig::default()
    }
}

fn endpoints() -> HashMap<String, String> {
    HashMap::from([("known".to_string(), format!("{RECEIVER}/known"))])
}

fn default_from() -> Mailbox {
    "Shop <shop@example.com>".parse().unwrap()
}

mod invariants;

use invariants::{
    check, check_amqp, check_charge, check_email, check_kafka, check_nats, check_webhook,
};

// ---------------------------------------------------------------------------
// The corpus files

#[derive(serde::Deserialize)]
struct Case {
    name: String,
    kind: String,
    #[serde(default)]
    payload: Option<Value>,
    #[serde(default)]
    payload_text: Option<String>,
    #[serde(default)]
    destination: Option<String>,
    #[serde(default)]
    expect: Option<String>,
    #[serde(default)]
    stage: Option<String>,
    #[serde(default)]
    reason_contains: Option<String>,
}

fn load(file: &str) -> Vec<Case> {
    let path = format!("{}/../tests/corpus/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str::<Vec<Value>>(&text)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .into_iter()
        .map(|v| serde_json::from_value(v).unwrap())
        .collect()
}

/// The corpus placeholders (see tests/it/bad_input.rs).
fn expand(v: &Value) -> Value {
    match v {
        Value::String(s) => {
            if let Some(spec) = s.strip_prefix("{{").and_then(|r| r.strip_suffix("}}")) {
                let mut w = spec.splitn(3, ' ');
                let verb = w.next().unwrap();
                let n: usize = w.next().and_then(|n| n.parse().ok()).unwrap_or(0);
                match verb {
                    "repeat" => return Value::String(w.next().unwrap().repeat(n)),
                    "nest" => {
                        let mut v = Value::from(1);
                        for _ in 0..n {
                            v = Value::Array(vec![v]);
                        }
                        return v;
                    }
                    "addresses" => {
                        return (0..n)
                            .map(|i| Value::String(format!("rcpt{i}@example.com")))
                            .collect()
                    }
                    _ => {}
                }
            }
            Value::String(s.replace("{{receiver}}", RECEIVER))
        }
        Value::Array(a) => Value::Array(a.iter().map(expand).collect()),
        Value::Object(m) => Value::Object(m.iter().map(|(k, v)| (k.clone(), expand(v))).collect()),
        other => other.clone(),
    }
}

fn corpus_payload(c: &Case) -> Option<Value> {
    match (&c.payload, &c.payload_text) {
        (Some(p), _) => Some(expand(p)),
        // text Postgres refuses may not even be JSON; what parses is checked
        (None, Some(text)) => serde_json::from_str(text).ok(),
        (None, None) => None,
    }
}

fn is_known(kind: &str) -> bool {
    outbox_providers::KNOWN_KINDS.contains(&kind)
}

#[test]
fn the_bad_corpus_is_refused_with_its_reasons_and_nothing_unsafe_is_accepted() {
    let cases = load("bad-payloads.json");
    assert!(cases.len() >= 100, "the corpus has {} cases", cases.len());
    let mut failures = Vec::new();
    for c in &cases {
        let Some(payload) = corpus_payload(c).filter(|_| is_known(&c.kind)) else {
            continue;
        };
        let result = check(&c.kind, &payload, c.destination.as_deref());
        let expect = c.expect.as_deref().unwrap_or_default();
        match (c.stage.as_deref(), result) {
            (Some("parse"), Ok(())) if expect != "delivered" => {
                failures.push(format!("{}: accepted, expected a refusal", c.name))
            }
            (Some("parse"), Err(e)) if expect == "delivered" => {
                failures.push(format!("{}: refused ({e}), expected delivery", c.name))
            }
            (Some("parse"), Err(e)) => {
                let needle = c.reason_contains.as_deref().unwrap_or_default();
                if !e.contains(needle) {
                    failures.push(format!("{}: {e:?} should contain {needle:?}", c.name));
                }
            }
            // refused later (provider, relay) or earlier (enqueue): parsing
            // just must not panic, and what it accepts passed the checks
            _ => {}
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_good_corpus_is_accepted() {
    for c in load("good-payloads.json") {
        let payload = corpus_payload(&c).unwrap();
        if let Err(e) = check(&c.kind, &payload, c.destination.as_deref()) {
            panic!("{}: refused: {e}", c.name);
        }
    }
}

// ---------------------------------------------------------------------------
// Strategies

const FIELDS: &[&str] = &[
    "url",
    "body",
    "headers",
    "from",
    "to",
    "cc",
    "bcc",
    "reply_to",
    "subject",
    "text",
    "html",
    "amount",
    "currency",
    "payment_method",
    "customer",
    "description",
    "metadata",
];

/// Strings that are plausible values somewhere.
const PLAUSIBLE: &[&str] = &[
    "",
    "a@example.com",
    "Shop <shop@example.com>",
    "\"Doe, Jane\" <jane@example.com>",
    "https://example.com/hook",
    "http://127.0.0.1:9/x",
    "http://[::1]/",
    "usd",
    "eur",
    "USD",
    "xyz",
    "pm_card_visa",
    "outbox_intent_key",
    "outbox_idempotency_key",
    "webhook-id",
    "Content-Length",
    "Upgrade",
    "User-Agent",
    "X-Tenant",
    "known",
    "Hi",
];

/// Things an attacker appends.
const HOSTILE: &[&str] = &[
    "\r\nBcc: victim@example.com",
    "\nX-Injected: 1",
    "\r\n\r\n<html>",
    "\r\n.\r\nMAIL FROM:<evil@example.com>\r\n",
    "\u{0}",
    "\u{1b}[31m",
    "\u{7f}",
    "\u{2028}",
    "\u{feff}",
    "\u{fffd}",
    "é",
    "😀",
    "@",
    "@@",
    "<>",
    ",",
    ";",
    ":",
    "]",
    "[",
    "%0d%0a",
    " ",
    "\t",
    "\\",
    "\"",
];

fn nasty_string() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => (
            prop::sample::select(PLAUSIBLE),
            prop::sample::select(HOSTILE),
            prop::sample::select(PLAUSIBLE)
        )
            .prop_map(|(a, b, c)| format!("{a}{b}{c}")),
        2 => prop::sample::select(PLAUSIBLE).prop_map(str::to_string),
        2 => "[\\x00-\\x1f\\x7f a-zA-Z0-9@.:/<>\"\\\\,;()\\[\\]_-]{0,24}",
        1 => any::<String>(),
        1 => prop::sample::select(FIELDS).prop_map(str::to_string),
    ]
}

fn number() -> impl Strategy<Value = Value> {
    prop_oneof![
        2 => prop::sample::select(vec![
            Value::from(0),
            Value::from(-1),
            Value::from(1),
            Value::from(1999),
            Value::from(99_999_999),
            Value::from(100_000_000),
            Value::from(i64::MIN),
            Value::from(i64::MAX),
            Value::from(u64::MAX),
            Value::from(1e20),
            Value::from(-0.0),
            Value::from(0.5),
            Value::from(1999.0),
            Value::from(f64::MAX),
            Value::from(f64::MIN_POSITIVE),
        ]),
        1 => any::<i64>().prop_map(Value::from),
        1 => any::<u64>().prop_map(Value::from),
        1 => any::<f64>().prop_map(Value::from),
        1 => (-1000i64..200_000_000).prop_map(Value::from),
    ]
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        1 => Just(Value::Null),
        1 => any::<bool>().prop_map(Value::Bool),
        2 => number(),
        4 => nasty_string().prop_map(Value::String),
    ]
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(FIELDS).prop_map(str::to_string),
        1 => nasty_string(),
    ]
}

/// Any JSON value, objects favouring the known field names.
fn json() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((key(), inner), 0..7)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// An address-ish value: a string, a list of them, or anything.
fn addresses() -> impl Strategy<Value = Value> {
    prop_oneof![
        3 => nasty_string().prop_map(Value::String),
        3 => prop::collection::vec(nasty_string().prop_map(Value::String), 0..4)
            .prop_map(Value::Array),
        1 => (0usize..130).prop_map(|n| {
            (0..n)
                .map(|i| Value::String(format!("r{i}@example.com")))
                .collect()
        }),
        1 => json(),
    ]
}

/// A payload shaped for `kind`: each of its fields present or not, with a
/// plausible, hostile or arbitrary value, plus now and then a stray field.
fn shaped(kind: &'static str) -> BoxedStrategy<Value> {
    let field = |name: &'static str, s: BoxedStrategy<Value>| {
        prop::option::weighted(0.8, s).prop_map(move |v| (name, v))
    };
    let fields: Vec<BoxedStrategy<(&'static str, Option<Value>)>> = match kind {
        "webhook" => vec![
            field(
                "url",
                prop_oneof![
                    3 => (
                        prop::sample::select(vec![
                            "http://", "https://", "ftp://", "file://", "javascript:", "",
                            "http://u:p@", "HTTP://", "http:/", "//",
                        ]),
                        prop::sample::select(vec![
                            "example.com", "127.0.0.1:9", "[::1]", "169.254.169.254", "0",
                            "xn--bcher-kva.example", "exa mple.com", "", "a.b:99999",
                        ]),
                        nasty_string(),
                    )
                        .prop_map(|(s, h, p)| Value::String(format!("{s}{h}/{p}"))),
                    1 => json(),
                ]
                .boxed(),
            )
            .boxed(),
            field("body", json().boxed()).boxed(),
            field(
                "headers",
                prop_oneof![
                    3 => prop::collection::vec(
                        (nasty_string(), prop_oneof![3 => nasty_string().prop_map(Value::String), 1 => leaf()]),
                        0..4,
                    )
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
                    1 => json(),
                ]
                .boxed(),
            )
            .boxed(),
        ],
        "email" => vec![
            field("from", addresses().boxed()).boxed(),
            field("to", addresses().boxed()).boxed(),
            field("cc", addresses().boxed()).boxed(),
            field("bcc", addresses().boxed()).boxed(),
            field("reply_to", addresses().boxed()).boxed(),
            field("subject", leaf().boxed()).boxed(),
            field("text", leaf().boxed()).boxed(),
            field("html", leaf().boxed()).boxed(),
        ],
        "charge" => vec![
            field("amount", prop_oneof![4 => number(), 1 => leaf()].boxed()).boxed(),
            field(
                "currency",
                prop_oneof![
                    2 => prop::sample::select(vec!["usd", "eur", "jpy", "USD", "xyz", "us", "usdx", ""])
                        .prop_map(|s| Value::String(s.to_string())),
                    1 => leaf(),
                ]
                .boxed(),
            )
            .boxed(),
            field("payment_method", leaf().boxed()).boxed(),
            field("customer", leaf().boxed()).boxed(),
            field("description", leaf().boxed()).boxed(),
            field(
                "metadata",
                prop_oneof![
                    3 => prop::collection::vec((nasty_string(), leaf()), 0..5)
                        .prop_map(|kv| Value::Object(kv.into_iter().collect())),
                    1 => json(),
                ]
                .boxed(),
            )
            .boxed(),
        ],
        other => panic!("{other}"),
    };
    (fields, prop::option::weighted(0.15, (key(), json())))
        .prop_map(|(fields, stray)| {
            let mut map: Map<String, Value> = fields
                .into_iter()
                .filter_map(|(k, v)| v.map(|v| (k.to_string(), v)))
                .collect();
            if let Some((k, v)) = stray {
                map.insert(k, v);
            }
            Value::Object(map)
        })
        .boxed()
}

/// A good payload with one field replaced, removed or added.
fn mutated(kind: &'static str) -> BoxedStrategy<Value> {
    let seeds: Vec<Value> = load("good-payloads.json")
        .into_iter()
        .filter(|c| c.kind == kind && c.destination.is_none())
        .map(|c| expand(&c.payload.unwrap()))
        .collect();
    let own: &'static [&'static str] = match kind {
        "webhook" => &FIELDS[..3],
        "email" => &FIELDS[3..11],
        _ => &FIELDS[11..],
    };
    (
        prop::sample::select(seeds),
        prop_oneof![4 => prop::sample::select(own).prop_map(str::to_string), 1 => key()],
        prop::option::weighted(0.85, prop_oneof![leaf(), json()]),
    )
        .prop_map(|(mut seed, k, v)| {
            let map = seed.as_object_mut().unwrap();
            match v {
                Some(v) => {
                    map.insert(k, v);
                }
                None => {
                    map.remove(&k);
                }
            }
            seed
        })
        .boxed()
}

/// A nats payload: a subject from near-misses and nasty strings, any body,
/// headers with nasty names and values, now and then a stray field.
fn nats_payload() -> BoxedStrategy<Value> {
    let subject = prop_oneof![
        2 => prop::sample::select(vec![
            "orders.created", "orders.*", "orders.>", ">", "a..b", ".a", "a.", "a b",
            "orders.\u{0}", "ok", "orders.created.eu-1",
        ])
        .prop_map(|s| Value::String(s.to_string())),
        2 => nasty_string().prop_map(Value::String),
        1 => json(),
    ];
    let headers = prop::collection::btree_map(
        prop_oneof![
            nasty_string(),
            Just("Nats-Msg-Id".to_string()),
            Just("trace".to_string())
        ],
        prop_oneof![nasty_string().prop_map(Value::String), json()],
        0..4,
    )
    .prop_map(|m| Value::Object(m.into_iter().collect()));
    (
        prop::option::weighted(0.9, subject),
        prop::option::weighted(0.9, json()),
        prop::option::weighted(0.4, headers),
        prop::option::weighted(0.1, (key(), json())),
    )
        .prop_map(|(subject, body, headers, stray)| {
            let mut map = Map::new();
            for (k, v) in [("subject", subject), ("body", body), ("headers", headers)] {
                if let Some(v) = v {
                    map.insert(k.to_string(), v);
                }
            }
            if let Some((k, v)) = stray {
                map.insert(k, v);
            }
            Value::Object(map)
        })
        .boxed()
}

/// A kafka payload: a topic from near-misses and nasty strings, a key and
/// a partition of any JSON now and then, headers with nasty names and
/// values (the relay's own among them), now and then a stray field.
fn kafka_payload() -> BoxedStrategy<Value> {
    let topic = prop_oneof![
        2 => prop::sample::select(vec![
            "orders", "orders.v1", "a_b-c", ".", "..", "", "a b", "caf\u{e9}", "a/b",
            "orders\u{0}",
        ])
        .prop_map(|s| Value::String(s.to_string())),
        2 => nasty_string().prop_map(Value::String),
        1 => json(),
    ];
    let partition = prop_oneof![
        (-2i64..5).prop_map(Value::from),
        Just(Value::from(u64::MAX)),
        Just(Value::from(i64::from(i32::MAX) + 1)),
        json(),
    ];
    let headers = prop::collection::btree_map(
        prop_oneof![
            nasty_string(),
            Just("outbox-effect-key".to_string()),
            Just("Outbox-Effect-Key".to_string()),
            Just("traceparent".to_string())
        ],
        prop_oneof![nasty_string().prop_map(Value::String), json()],
        0..4,
    )
    .prop_map(|m| Value::Object(m.into_iter().collect()));
    (
        prop::option::weighted(0.9, topic),
        prop::option::weighted(0.9, json()),
        prop::option::weighted(
            0.4,
            prop_oneof![nasty_string().prop_map(Value::String), json()],
        ),
        prop::option::weighted(0.3, partition),
        prop::option::weighted(0.4, headers),
        prop::option::weighted(0.1, (key(), json())),
    )
        .prop_map(|(topic, body, key, partition, headers, stray)| {
            let mut map = Map::new();
            for (k, v) in [
                ("topic", topic),
                ("body", body),
                ("key", key),
                ("partition", partition),
                ("headers", headers),
            ] {
                if let Some(v) = v {
                    map.insert(k.to_string(), v);
                }
            }
            if let Some((k, v)) = stray {
                map.insert(k, v);
            }
            Value::Object(map)
        })
        .boxed()
}

/// An amqp payload: exchange and routing key from near-misses and nasty
/// strings, any body, headers of every JSON type, now and then a stray
/// field.
fn amqp_payload() -> BoxedStrategy<Value> {
    let name = || {
        prop_oneof![
            2 => prop::sample::select(vec![
                "", "orders", "amq.topic", "a b", "a/b", "orders.eu-1:x", "caf\u{e9}",
                "created", "a\nb", "#", "*.created",
            ])
            .prop_map(|s| Value::String(s.to_string())),
            2 => nasty_string().prop_map(Value::String),
            1 => "[a-z]{250,260}".prop_map(Value::String),
            1 => json(),
        ]
    };
    let headers = prop::collection::btree_map(
        prop_oneof![
            nasty_string(),
            Just("trace".to_string()),
            Just("x-delay".to_string())
        ],
        json(),
        0..4,
    )
    .prop_map(|m| Value::Object(m.into_iter().collect()));
    (
        prop::option::weighted(0.9, name()),
        prop::option::weighted(0.9, name()),
        prop::option::weighted(0.9, json()),
        prop::option::weighted(0.4, headers),
        prop::option::weighted(0.1, (key(), json())),
    )
        .prop_map(|(exchange, routing_key, body, headers, stray)| {
            let mut map = Map::new();
            for (k, v) in [
                ("exchange", exchange),
                ("routing_key", routing_key),
                ("body", body),
                ("headers", headers),
            ] {
                if let Some(v) = v {
                    map.insert(k.to_string(), v);
                }
            }
            if let Some((k, v)) = stray {
                map.insert(k, v);
            }
            Value::Object(map)
        })
        .boxed()
}

fn destination() -> impl Strategy<Value = Option<String>> {
    prop::option::weighted(0.2, prop_oneof![Just("known".to_string()), nasty_string()])
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn webhook_parsing_never_panics_and_accepts_only_safe_requests(
        payload in prop_oneof![2 => shaped("webhook"), 2 => mutated("webhook"), 1 => json()],
        dest in destination(),
    ) {
        let _ = check_webhook(&payload, dest.as_deref());
    }

    #[test]
    fn the_raw_body_is_the_body_of_the_text_it_came_from(
        payload in prop_oneof![2 => shaped("webhook"), 2 => mutated("webhook"), 1 => json()],
    ) {
        // the relay hands the provider the payload's stored text; the bytes
        // sent are exactly that text's body, as the same writer spells it
        // (not a parse and re-serialization: that is where digits go)
        let text = payload.to_string();
        match (webhook::raw_body(&text), payload.get("body")) {
            (Some(raw), Some(body)) => {
                prop_assert_eq!(String::from_utf8(raw).expect("UTF-8"), body.to_string());
            }
            (None, None) => {}
            (raw, body) => prop_assert!(false, "raw {:?} for body {:?}", raw, body),
        }
    }

    #[test]
    fn nats_parsing_never_panics_and_accepts_only_publishable_subjects(payload in nats_payload()) {
        let _ = check_nats(&payload);
    }

    #[test]
    fn amqp_parsing_never_panics_and_accepts_only_publishable_messages(payload in amqp_payload()) {
        let _ = check_amqp(&payload);
    }

    #[test]
    fn kafka_parsing_never_panics_and_accepts_only_producible_records(payload in kafka_payload()) {
        let _ = check_kafka(&payload);
    }

    #[test]
    fn email_building_never_panics_and_cannot_be_injected(
        payload in prop_oneof![2 => shaped("email"), 2 => mutated("email"), 1 => json()],
    ) {
        let _ = check_email(&payload);
    }

    #[test]
    fn charge_parameters_never_panic_and_carry_a_valid_amount(
        payload in prop_oneof![2 => shaped("charge"), 2 => mutated("charge"), 1 => json()],
    ) {
        let _ = check_charge(&payload);
    }
}

//! The builders: one per kind, each making exactly the payload its
//! provider reads (the field names are the payload's).

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

/// Something the relay can deliver: a kind and its payload.
pub trait Intent {
    /// The intent's kind (`webhook`, `email`, ...).
    fn kind(&self) -> &'static str;
    /// The payload, as `outbox.enqueue` stores it.
    fn payload(&self) -> Value;
    /// The destination the intent names, if any (a webhook endpoint).
    fn destination(&self) -> Option<&str> {
        None
    }
}

fn to_value(payload: &impl Serialize) -> Value {
    // the builders hold strings, numbers, maps with string keys and JSON
    // values: serializing them cannot fail
    serde_json::to_value(payload).unwrap_or(Value::Null)
}

/// A webhook: `{"url", "body", "headers"?}`, or a configured endpoint
/// named by its destination (`webhook.endpoints`) instead of a URL.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Webhook {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    pub body: Value,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    #[serde(skip)]
    pub endpoint: Option<String>,
}

impl Webhook {
    /// A POST of `body` (any JSON) to `url`.
    pub fn new(url: impl Into<String>, body: Value) -> Webhook {
        Webhook {
            url: Some(url.into()),
            body,
            headers: BTreeMap::new(),
            endpoint: None,
        }
    }

    /// A POST of `body` to the endpoint configured under `name`.
    pub fn to_endpoint(name: impl Into<String>, body: Value) -> Webhook {
        Webhook {
            url: None,
            body,
            headers: BTreeMap::new(),
            endpoint: Some(name.into()),
        }
    }

    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Webhook {
        self.headers.insert(name.into(), value.into());
        self
    }
}

impl Intent for Webhook {
    fn kind(&self) -> &'static str {
        "webhook"
    }
    fn payload(&self) -> Value {
        to_value(self)
    }
    fn destination(&self) -> Option<&str> {
        self.endpoint.as_deref()
    }
}

/// An email: `{"from"?, "to", "cc"?, "bcc"?, "reply_to"?, "subject",
/// "text"?, "html"?}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Email {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    pub to: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub cc: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub bcc: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
    pub subject: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub html: Option<String>,
}

impl Email {
    pub fn new<S: Into<String>>(
        to: impl IntoIterator<Item = S>,
        subject: impl Into<String>,
    ) -> Email {
        Email {
            from: None,
            to: to.into_iter().map(Into::into).collect(),
            cc: Vec::new(),
            bcc: Vec::new(),
            reply_to: None,
            subject: subject.into(),
            text: None,
            html: None,
        }
    }
    pub fn from(mut self, from: impl Into<String>) -> Email {
        self.from = Some(from.into());
        self
    }
    pub fn cc(mut self, to: impl Into<String>) -> Email {
        self.cc.push(to.into());
        self
    }
    pub fn bcc(mut self, to: impl Into<String>) -> Email {
        self.bcc.push(to.into());
        self
    }
    pub fn reply_to(mut self, to: impl Into<String>) -> Email {
        self.reply_to = Some(to.into());
        self
    }
    pub fn text(mut self, text: impl Into<String>) -> Email {
        self.text = Some(text.into());
        self
    }
    pub fn html(mut self, html: impl Into<String>) -> Email {
        self.html = Some(html.into());
        self
    }
}

impl Intent for Email {
    fn kind(&self) -> &'static str {
        "email"
    }
    fn payload(&self) -> Value {
        to_value(self)
    }
}

/// A charge: `{"amount" (minor units), "currency", "payment_method",
/// "customer"?, "description"?, "metadata"?}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Charge {
    pub amount: i64,
    pub currency: String,
    pub payment_method: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub customer: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
}

impl Charge {
    pub fn new(
        amount: i64,
        currency: impl Into<String>,
        payment_method: impl Into<String>,
    ) -> Charge {
        Charge {
            amount,
            currency: currency.into(),
            payment_method: payment_method.into(),
            customer: None,
            description: None,
            metadata: BTreeMap::new(),
        }
    }
    pub fn customer(mut self, customer: impl Into<String>) -> Charge {
        self.customer = Some(customer.into());
        self
    }
    pub fn description(mut self, description: impl Into<String>) -> Charge {
        self.description = Some(description.into());
        self
    }
    pub fn metadata(mut self, name: impl Into<String>, value: impl Into<String>) -> Charge {
        self.metadata.insert(name.into(), value.into());
        self
    }
}

impl Intent for Charge {
    fn kind(&self) -> &'static str {
        "charge"
    }
    fn payload(&self) -> Value {
        to_value(self)
    }
}

/// A NATS JetStream publish: `{"subject", "body", "headers"?}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Nats {
    pub subject: String,
    pub body: Value,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
}

impl Nats {
    pub fn new(subject: impl Into<String>, body: Value) -> Nats {
        Nats {
            subject: subject.into(),
            body,
            headers: BTreeMap::new(),
        }
    }
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Nats {
        self.headers.insert(name.into(), value.into());
        self
    }
}

impl Intent for Nats {
    fn kind(&self) -> &'static str {
        "nats"
    }
    fn payload(&self) -> Value {
        to_value(self)
    }
}

/// An AMQP publish: `{"exchange", "routing_key", "body", "headers"?}`
/// (`""` is the default exchange). A header is text, a whole number or a
/// boolean.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Amqp {
    pub exchange: String,
    pub routing_key: String,
    pub body: Value,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, Value>,
}

impl Amqp {
    pub fn new(exchange: impl Into<String>, routing_key: impl Into<String>, body: Value) -> Amqp {
        Amqp {
            exchange: exchange.into(),
            routing_key: routing_key.into(),
            body,
            headers: BTreeMap::new(),
        }
    }
    /// A header: text, a whole number or a boolean (`"v1"`, `3`, `true`).
    pub fn header(mut self, name: impl Into<String>, value: impl Into<AmqpHeader>) -> Amqp {
        self.headers.insert(name.into(), value.into().0);
        self
    }
}

/// The values an AMQP header may take.
#[derive(Debug, Clone, PartialEq)]
pub struct AmqpHeader(Value);

impl From<&str> for AmqpHeader {
    fn from(v: &str) -> Self {
        AmqpHeader(Value::from(v))
    }
}
impl From<String> for AmqpHeader {
    fn from(v: String) -> Self {
        AmqpHeader(Value::from(v))
    }
}
impl From<i64> for AmqpHeader {
    fn from(v: i64) -> Self {
        AmqpHeader(Value::from(v))
    }
}
impl From<bool> for AmqpHeader {
    fn from(v: bool) -> Self {
        AmqpHeader(Value::from(v))
    }
}

impl Intent for Amqp {
    fn kind(&self) -> &'static str {
        "amqp"
    }
    fn payload(&self) -> Value {
        to_value(self)
    }
}

/// A Kafka record: `{"topic", "key"?, "body", "headers"?, "partition"?}`.
/// Without a `key`, the record's key is the intent's ordering key, if it
/// has one; without a `partition`, the producer's partitioner chooses.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Kafka {
    pub topic: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    pub body: Value,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition: Option<u32>,
}

impl Kafka {
    pub fn new(topic: impl Into<String>, body: Value) -> Kafka {
        Kafka {
            topic: topic.into(),
            key: None,
            body,
            headers: BTreeMap::new(),
            partition: None,
        }
    }
    /// The record's key (it decides the partition).
    pub fn key(mut self, key: impl Into<String>) -> Kafka {
        self.key = Some(key.into());
        self
    }
    /// A header; its value is text. `outbox-effect-key` is the relay's.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Kafka {
        self.headers.insert(name.into(), value.into());
        self
    }
    /// A partition of the topic (at most 2147483647, as Kafka counts).
    pub fn partition(mut self, partition: u32) -> Kafka {
        self.partition = Some(partition);
        self
    }
}

impl Intent for Kafka {
    fn kind(&self) -> &'static str {
        "kafka"
    }
    fn payload(&self) -> Value {
        to_value(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_builder_makes_its_kinds_payload() {
        let hook = Webhook::new("https://h.example/in", json!({"n": 1})).header("X-Tenant", "t1");
        assert_eq!(
            (hook.kind(), hook.payload(), hook.destination()),
            (
                "webhook",
                json!({"url": "https://h.example/in", "body": {"n": 1}, "headers": {"X-Tenant": "t1"}}),
                None
            )
        );
        let named = Webhook::to_endpoint("partner", json!(null));
        assert_eq!(
            (named.payload(), named.destination()),
            (json!({"body": null}), Some("partner"))
        );
        let mail = Email::new(["a@x.example"], "Hi")
            .from("shop@x.example")
            .text("t");
        assert_eq!(
            mail.payload(),
            json!({"from": "shop@x.example", "to": ["a@x.example"], "subject": "Hi", "text": "t"})
        );
        let charge = Charge::new(1999, "usd", "pm_card_visa").metadata("order", "42");
        assert_eq!(
            charge.payload(),
            json!({"amount": 1999, "currency": "usd", "payment_method": "pm_card_visa", "metadata": {"order": "42"}})
        );
        assert_eq!(
            Nats::new("orders.created", json!({"id": 1})).payload(),
            json!({"subject": "orders.created", "body": {"id": 1}})
        );
        let amqp = Amqp::new("orders", "created", json!(1))
            .header("v", 2)
            .header("ok", true);
        assert_eq!(
            (amqp.kind(), amqp.payload()),
            (
                "amqp",
                json!({"exchange": "orders", "routing_key": "created", "body": 1, "headers": {"ok": true, "v": 2}})
            )
        );
        let record = Kafka::new("orders.v1", json!({"id": 1}))
            .key("acct-1")
            .header("source", "shop")
            .partition(2);
        assert_eq!(
            (record.kind(), record.payload()),
            (
                "kafka",
                json!({"topic": "orders.v1", "key": "acct-1", "body": {"id": 1}, "headers": {"source": "shop"}, "partition": 2})
            )
        );
        assert_eq!(
            Kafka::new("orders.v1", json!(null)).payload(),
            json!({"topic": "orders.v1", "body": null})
        );
    }
}

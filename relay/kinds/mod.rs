//! The delivery kinds, each in one module: how its payload is checked
//! before anything is sent (and the JSON Schema the clients build it by),
//! which destination it goes to, the key its provider sees, its page in
//! the book, and its configuration section, which builds its provider. The rest of the relay
//! names a kind only through [`Kind`], and reads its configuration section
//! through [`Section`].
//!
//! Adding a kind to the relay is a module here, named as the kind, holding
//! its [`Spec`] and its configuration section (which implements
//! [`Section`] and builds its provider), and a line in the list of [`kinds!`];
//! beside the relay, its provider in `outbox-providers`, its payload's
//! schema in `schema/kinds/` and a builder in each client. Kind names are
//! written in that list and nowhere else in the relay.

pub mod amqp;
pub mod charge;
pub mod email;
pub mod event;
pub mod kafka;
pub mod nats;
pub mod webhook;

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use outbox_providers::Provider;
use serde_json::Value;

/// The one list of kinds. Each line: the kind's variant, its module here
/// (whose name is the kind's: an intent's `kind` and its configuration
/// section's `[name]`), and its section's type. `kinds!(m)` hands the list
/// to the macro `m`: [`Kind`] and its table are made from it below, and
/// `Config`'s section fields and `Config::section` in `config`.
macro_rules! kinds {
    ($then:ident) => {
        $then! {
            Webhook webhook WebhookSection,
            Email email EmailSection,
            Charge charge ChargeSection,
            Nats nats NatsSection,
            Amqp amqp AmqpSection,
            Kafka kafka KafkaSection,
            Event event EventSection,
        }
    };
}
pub(crate) use kinds;

macro_rules! define_kinds {
    ($($variant:ident $module:ident $section:ident,)*) => {
        /// A kind this relay delivers.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Kind {
            $($variant,)*
        }

        /// How many kinds there are.
        const COUNT: usize = [$(stringify!($variant)),*].len();

        /// Each kind: its variant, its name, and its module's [`Spec`], in
        /// the order of [`Kind`]'s variants.
        const KINDS: [(Kind, &str, &Spec); COUNT] = [
            $((Kind::$variant, stringify!($module), &$module::SPEC),)*
        ];

        impl Kind {
            /// Every kind, in the order pages and metrics list them.
            pub const ALL: [Kind; COUNT] = [$(Kind::$variant,)*];
        }
    };
}
kinds!(define_kinds);

/// Where a kind's effects go, as destination health names it.
pub enum Destination {
    /// The origin of the payload's URL, or the named endpoint's.
    Payload,
    /// One destination, named as the kind is (`charge`, `kafka`).
    OwnName,
    /// One destination of this name (`smtp` for email).
    Named(&'static str),
}

/// What one kind is. Each kind's module holds one.
pub struct Spec {
    /// Its payload's JSON Schema (`schema/kinds/<name>.json`).
    pub schema: &'static str,
    /// The book's page on it, under `docs/`.
    pub docs: &'static str,
    /// Where its effects go.
    pub destination: Destination,
    /// Does an attempt's `status` hold an HTTP status? (An email's is an
    /// SMTP reply code, where 5xx is a deliberate refusal.)
    pub http_status: bool,
    /// The payload checked as its provider will check it, before any
    /// network call.
    pub check: fn(&Value, &Check) -> Result<(), String>,
    /// The key the provider sees for (intent key, key generation), as the
    /// provider names it.
    pub provider_key: fn(&str, i32) -> String,
}

/// A kind's configuration section (`[webhook]`, `[email]`, ...) as the
/// relay reads it. Each kind's module defines its section, with its
/// defaults and checks, and implements this; `Config::section` maps a kind
/// to its section.
pub trait Section {
    /// Is the kind served by this relay: does its section say where to
    /// deliver? (A webhook's payload says where: always.)
    fn serves(&self) -> bool;
    /// The budget of one attempt (every provider call it makes runs within
    /// it): the provider's timeout.
    fn attempt_time(&self) -> Duration;
    /// The kind's provider, built from the section's settings ([`build`]);
    /// None when the kind is not served. An
    /// `outbox_providers::Error::Config` in the chain is the
    /// configuration's fault.
    fn provider(&self, cx: &Context) -> anyhow::Result<Option<Arc<dyn Provider>>>;
}

/// What a kind's provider may need of the relay beyond its section: the
/// parts that read the database, which the kinds do not.
#[derive(Clone, Default)]
pub struct Context {
    /// Expands an event into its deliveries (the `event` kind's effect).
    pub events: Option<Arc<dyn event::Expand>>,
    /// A subscription's URL, headers and signing secrets, for its
    /// deliveries (None: no `[subscriptions] secret_key` here).
    pub subscriptions: Option<Arc<dyn outbox_providers::webhook::subscription::Directory>>,
}

/// A kind's provider, built by its constructor from its section's
/// settings; None when the section gives none (the kind is not served).
pub(crate) fn build<C, P: Provider + 'static>(
    settings: Option<C>,
    new: fn(C) -> Result<P, outbox_providers::Error>,
) -> anyhow::Result<Option<Arc<dyn Provider>>> {
    match settings {
        None => Ok(None),
        Some(settings) => Ok(Some(Arc::new(new(settings)?))),
    }
}

/// What a payload check may need beside the payload.
pub struct Check<'a> {
    /// The intent's named destination.
    pub destination: Option<&'a str>,
    /// `[webhook.endpoints]`: name → URL.
    pub endpoints: &'a HashMap<String, String>,
    /// Where email is configured, its `email.from` (None: a payload must
    /// give `from`); None where it is not, and another relay's applies.
    pub email_from: Option<Option<&'a outbox_providers::email::Mailbox>>,
}

impl Kind {
    fn spec(self) -> &'static Spec {
        KINDS[self as usize].2
    }

    /// The kind an intent's `kind` names, if this relay knows it.
    pub fn parse(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Every kind's name.
    pub fn names() -> Vec<&'static str> {
        Kind::ALL.iter().map(|k| k.name()).collect()
    }

    pub fn name(self) -> &'static str {
        KINDS[self as usize].1
    }

    /// The payload's JSON Schema.
    pub fn schema(self) -> &'static str {
        self.spec().schema
    }

    /// The book's page on the kind (a path under `docs/`).
    pub fn docs(self) -> &'static str {
        self.spec().docs
    }

    /// The destination every intent of this kind goes to (`smtp`,
    /// `charge`, ...); None for a webhook, whose payload names it.
    pub fn fixed_destination(self) -> Option<&'static str> {
        match self.spec().destination {
            Destination::Payload => None,
            Destination::OwnName => Some(self.name()),
            Destination::Named(name) => Some(name),
        }
    }

    pub fn reports_http_status(self) -> bool {
        self.spec().http_status
    }

    /// Check a payload as the kind's provider will, before anything is
    /// sent: the reason it would be `rejected`, if it would.
    pub fn check(self, payload: &Value, check: &Check) -> Result<(), String> {
        if self != Kind::Webhook {
            outbox_providers::refuse_destination(self.name(), check.destination)?;
        }
        (self.spec().check)(payload, check)
    }

    /// The key the provider sees, as the provider names it
    /// (`webhook-id msg_…`, `Idempotency-Key …`).
    pub fn provider_key(self, key: &str, generation: i32) -> String {
        (self.spec().provider_key)(key, generation)
    }

    /// The effect key derived for this kind (the step is the kind's name).
    pub fn effect_key(self, key: &str, generation: i32) -> String {
        outbox_providers::keys::effect_key(key, self.name(), generation)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where an intent's effect goes, or None when the payload does not say
/// (the provider will refuse it) or the kind is not one this relay knows.
/// `origin` names a URL's destination (`config::destinations::origin`).
pub fn destination_of(
    kind: &str,
    destination: Option<&str>,
    payload: &Value,
    endpoints: &HashMap<String, String>,
    origin: fn(&str) -> Option<String>,
) -> Option<String> {
    let kind = Kind::parse(kind)?;
    if let Some(fixed) = kind.fixed_destination() {
        return Some(fixed.into());
    }
    match destination {
        Some(name) => endpoints.get(name).cloned(),
        // a subscription's delivery goes to the subscription
        None => match payload.get("subscription").and_then(Value::as_str) {
            Some(subscription) => Some(subscription.into()),
            None => payload.get("url").and_then(Value::as_str).and_then(origin),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_own_name_and_schema() {
        let mut names = Kind::names();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), Kind::ALL.len());
        for (i, k) in Kind::ALL.into_iter().enumerate() {
            assert_eq!(KINDS[i].0, k, "KINDS is in the order of Kind's variants");
            assert_eq!(k as usize, i);
            assert_eq!(Kind::parse(k.name()), Some(k));
            let schema: Value = serde_json::from_str(k.schema()).expect("the schema is JSON");
            assert_eq!(
                schema["title"],
                k.name(),
                "{k}'s schema is titled by its name"
            );
            let page = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("docs")
                .join(k.docs());
            let text = std::fs::read_to_string(&page)
                .unwrap_or_else(|e| panic!("{k}'s page {}: {e}", page.display()));
            assert!(
                text.contains(&format!("`{k}`")),
                "{} describes the `{k}` kind",
                page.display()
            );
        }
        assert_eq!(Kind::parse("fax"), None);
    }

    #[test]
    fn each_kind_shows_the_key_its_provider_sees() {
        use outbox_providers::keys;
        assert_eq!(
            Kind::Webhook.provider_key("k", 0),
            format!("webhook-id {}", keys::webhook_id("k", 0))
        );
        assert!(Kind::Email.provider_key("k", 1).starts_with("Message-ID <"));
        assert_eq!(
            Kind::Kafka.provider_key("k", 2),
            format!("outbox-effect-key {}", keys::effect_key("k", "kafka", 2))
        );
    }
}

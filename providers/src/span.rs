//! What an attempt's span is called and what it says, in the words of the
//! OpenTelemetry semantic conventions. A provider describes its own call
//! (the URL it posts to, the subject it publishes on); the relay starts,
//! ends and exports the span. This crate stays free of any tracing SDK.

/// The span kinds an attempt can be (OpenTelemetry `SpanKind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    /// A request to a remote service that answers (HTTP, SMTP).
    Client,
    /// A message handed to a broker (NATS, AMQP).
    Producer,
    /// Work inside the relay.
    Internal,
}

/// An attribute's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Text(String),
    Int(i64),
}

impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::Text(v)
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::Text(v.to_string())
    }
}

impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::Int(v)
    }
}

/// The name, kind and attributes of one attempt's span, known before the
/// call is made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpanShape {
    pub name: String,
    pub kind: SpanKind,
    pub attributes: Vec<(&'static str, Value)>,
}

impl SpanShape {
    /// A span named after the kind, for a payload that cannot be read
    /// (the attempt will reject it) or a provider that says nothing more.
    pub fn plain(kind: &str) -> SpanShape {
        SpanShape {
            name: kind.to_string(),
            kind: SpanKind::Internal,
            attributes: Vec::new(),
        }
    }

    pub fn with(mut self, key: &'static str, value: impl Into<Value>) -> SpanShape {
        self.attributes.push((key, value.into()));
        self
    }
}

/// The W3C Trace Context an attempt carries outward (`traceparent`,
/// `tracestate`): the attempt's own span when the relay exports spans,
/// else the intent's context unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceHeaders<'a> {
    pub traceparent: &'a str,
    pub tracestate: Option<&'a str>,
}

/// Put the attempt's `traceparent` and `tracestate` into a broker message's
/// headers, in place of any the payload gave (whatever their case).
pub fn set_trace_headers<V>(
    headers: &mut std::collections::BTreeMap<String, V>,
    trace: TraceHeaders<'_>,
    value: impl Fn(&str) -> V,
) {
    headers.retain(|name, _| {
        !name.eq_ignore_ascii_case("traceparent") && !name.eq_ignore_ascii_case("tracestate")
    });
    if printable(trace.traceparent) {
        headers.insert("traceparent".into(), value(trace.traceparent));
    }
    if let Some(state) = trace.tracestate.filter(|s| printable(s)) {
        headers.insert("tracestate".into(), value(state));
    }
}

/// Printable ASCII only: a trace header can never carry a line break
/// into a message's headers, whatever was stored.
pub fn printable(value: &str) -> bool {
    value.bytes().all(|b| (0x20..0x7f).contains(&b))
}

/// A messaging `publish` span (`publish <destination>`), producer kind.
pub fn publish(system: &'static str, destination: &str, message_id: String) -> SpanShape {
    SpanShape {
        name: format!("publish {destination}"),
        kind: SpanKind::Producer,
        attributes: vec![
            ("messaging.system", system.into()),
            ("messaging.operation.type", "send".into()),
            ("messaging.operation.name", "publish".into()),
            ("messaging.destination.name", destination.into()),
            ("messaging.message.id", message_id.into()),
        ],
    }
}

/// `server.address` and `server.port` of a URL.
pub fn server_of(shape: SpanShape, url: &url::Url) -> SpanShape {
    let shape = match url.host_str() {
        Some(host) => shape.with("server.address", host),
        None => shape,
    };
    match url.port_or_known_default() {
        Some(port) => shape.with("server.port", i64::from(port)),
        None => shape,
    }
}

/// A URL for `url.full`, by the rule every shown URL follows
/// ([`crate::redact`]).
pub use crate::redact::redacted_url;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_relays_trace_context_replaces_the_payloads() {
        let mut headers = std::collections::BTreeMap::from([
            ("TraceParent".to_string(), "stale".to_string()),
            ("x-tenant".to_string(), "t1".to_string()),
        ]);
        let trace = TraceHeaders {
            traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            tracestate: Some("congo=t61rcWkgMzE"),
        };
        set_trace_headers(&mut headers, trace, str::to_string);
        let mut forged = headers.clone();
        let smuggling = TraceHeaders {
            traceparent: "00-x\r\nNats-Msg-Id: forged",
            tracestate: Some("a=b\n"),
        };
        set_trace_headers(&mut forged, smuggling, str::to_string);
        assert_eq!(forged.keys().collect::<Vec<_>>(), ["x-tenant"]);
        assert_eq!(
            headers.keys().collect::<Vec<_>>(),
            ["traceparent", "tracestate", "x-tenant"]
        );
        assert_eq!(headers["traceparent"], trace.traceparent);
    }

    #[test]
    fn a_url_keeps_its_shape_and_loses_its_secrets() {
        let url = url::Url::parse("https://user:pw@hooks.example:8443/in/7?token=s3cret&v=2#frag")
            .unwrap();
        assert_eq!(
            redacted_url(&url),
            "https://hooks.example:8443/in/REDACTED?token=REDACTED&v=REDACTED"
        );
        let plain = url::Url::parse("http://127.0.0.1:9/hook").unwrap();
        assert_eq!(redacted_url(&plain), "http://127.0.0.1:9/hook");
        let slack =
            url::Url::parse("https://hooks.slack.com/services/T000/B000/XXXXsecret").unwrap();
        assert_eq!(
            redacted_url(&slack),
            "https://hooks.slack.com/services/REDACTED/REDACTED/REDACTED"
        );
        let shape = server_of(SpanShape::plain("webhook"), &url);
        assert_eq!(
            shape.attributes,
            vec![
                ("server.address", Value::from("hooks.example")),
                ("server.port", Value::Int(8443))
            ]
        );
    }
}

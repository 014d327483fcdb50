//! The span of one attempt (or of the reconcile of a lost one), and the
//! trace context the attempt sends outward.

use opentelemetry::trace::{Span as _, SpanBuilder, SpanKind, Status};
use opentelemetry::{Context, KeyValue};
use outbox_providers::span::{SpanKind as Kind, Value};
use outbox_providers::{Outcome, SpanShape, TraceHeaders};

use super::context::{derived_trace_id, headers_of, in_trace, IntentContext};
use super::Tracer;

/// The intent and claim an attempt is made for.
#[derive(Debug, Clone, Copy)]
pub struct Identity<'a> {
    pub id: i64,
    pub key: &'a str,
    pub kind: &'a str,
    pub attempt: i32,
    pub fence: i64,
    pub context: IntentContext<'a>,
}

/// One attempt's span: recording when the relay exports, else only the
/// intent's context to forward. Ended with [`Attempt::end`]; dropped
/// unended, the SDK ends it then.
#[derive(Debug)]
pub struct Attempt {
    span: Option<opentelemetry_sdk::trace::Span>,
    traceparent: Option<String>,
    tracestate: Option<String>,
    trace_id: Option<String>,
    span_id: Option<String>,
    /// The intent's kind, for the status of a span its attempt never ended.
    kind: String,
}

impl Tracer {
    /// Start the span of an attempt shaped by its provider (`shape` is
    /// asked only when spans are exported).
    pub fn attempt(&self, who: &Identity<'_>, shape: impl FnOnce() -> SpanShape) -> Attempt {
        if !self.is_on() {
            return forwarded(who);
        }
        let shape = shape();
        let kind = match shape.kind {
            Kind::Client => SpanKind::Client,
            Kind::Producer => SpanKind::Producer,
            Kind::Internal => SpanKind::Internal,
        };
        // room for the identity and the end's attributes: the SDK keeps
        // this vector, and a push past its capacity copies it
        let mut attributes: Vec<KeyValue> = Vec::with_capacity(shape.attributes.len() + 10);
        attributes.extend(shape.attributes.into_iter().map(|(k, v)| match v {
            Value::Text(t) => KeyValue::new(k, t),
            Value::Int(i) => KeyValue::new(k, i),
        }));
        attributes.extend(identity(who));
        self.start_span(who, shape.name, kind, attributes)
    }

    /// Start the span of a reconcile: what became of an attempt whose
    /// lease was lost.
    pub fn reconcile(&self, who: &Identity<'_>, previous_owner: &str) -> Attempt {
        if !self.is_on() {
            return forwarded(who);
        }
        let mut attributes = identity(who);
        attributes.push(KeyValue::new(
            "outbox.previous_owner",
            previous_owner.to_string(),
        ));
        self.start_span(
            who,
            "outbox.reconcile".into(),
            SpanKind::Internal,
            attributes,
        )
    }

    fn start_span(
        &self,
        who: &Identity<'_>,
        name: String,
        kind: SpanKind,
        attributes: Vec<KeyValue>,
    ) -> Attempt {
        let Some(tracer) = self.sdk() else {
            return forwarded(who);
        };
        let builder = SpanBuilder::from_name(name)
            .with_kind(kind)
            .with_attributes(attributes);
        let span = match who.context.parent() {
            Some(parent) => builder.start_with_context(tracer, &parent),
            // a new root, in the intent's own trace: every attempt of it
            // lands in one trace
            None => in_trace(derived_trace_id(who.key), || {
                builder.start_with_context(tracer, &Context::new())
            }),
        };
        let (traceparent, tracestate) = headers_of(span.span_context());
        Attempt {
            span: Some(span),
            trace_id: Some(traceparent[3..35].to_string()),
            span_id: Some(traceparent[36..52].to_string()),
            traceparent: Some(traceparent),
            tracestate,
            kind: who.kind.to_string(),
        }
    }
}

/// No export: the application's own context goes out unchanged.
fn forwarded(who: &Identity<'_>) -> Attempt {
    let ids = who.context.ids();
    Attempt {
        span: None,
        traceparent: who.context.traceparent.map(str::to_string),
        tracestate: who.context.tracestate.map(str::to_string),
        trace_id: ids.map(|(t, _)| t.to_string()),
        span_id: ids.map(|(_, s)| s.to_string()),
        kind: String::new(),
    }
}

fn identity(who: &Identity<'_>) -> Vec<KeyValue> {
    vec![
        KeyValue::new("outbox.intent.id", who.id),
        KeyValue::new("outbox.intent.key", who.key.to_string()),
        KeyValue::new("outbox.intent.kind", who.kind.to_string()),
        KeyValue::new("outbox.attempt", i64::from(who.attempt)),
        KeyValue::new("outbox.fence", who.fence),
    ]
}

impl Attempt {
    /// The `traceparent` / `tracestate` to send with the effect.
    pub fn headers(&self) -> Option<TraceHeaders<'_>> {
        Some(TraceHeaders {
            traceparent: self.traceparent.as_deref()?,
            tracestate: self.tracestate.as_deref(),
        })
    }

    /// The trace this attempt is part of, for the log lines.
    pub fn trace_id(&self) -> Option<&str> {
        self.trace_id.as_deref()
    }

    /// This attempt's span (or, with no export, the application's).
    pub fn span_id(&self) -> Option<&str> {
        self.span_id.as_deref()
    }

    /// End the span with what the attempt came to. `http_status`: the
    /// outcome's status is an HTTP status (webhooks, charges).
    pub fn end(mut self, outcome: &Outcome, http_status: bool) {
        let Some(mut span) = self.span.take() else {
            return;
        };
        span.set_attribute(KeyValue::new("outbox.outcome", outcome.class()));
        if let Outcome::Delivered {
            replayed,
            reference,
            ..
        } = outcome
        {
            span.set_attribute(KeyValue::new("outbox.replayed", *replayed));
            if let Some(reference) = reference {
                span.set_attribute(KeyValue::new("outbox.reference", reference.clone()));
            }
        }
        if let Some(status) = outcome.status().filter(|_| http_status) {
            span.set_attribute(KeyValue::new(
                "http.response.status_code",
                i64::from(status),
            ));
        }
        if !matches!(
            outcome,
            Outcome::Delivered { .. } | Outcome::Deferred { .. }
        ) {
            span.set_attribute(KeyValue::new("error.type", outcome.class()));
            span.set_status(Status::error(outcome.reason().unwrap_or("").to_string()));
        }
        span.end();
    }

    /// End a reconcile's span: `result` is what it settled
    /// (`delivered`, `redeliver`, ...), `failed` whether that is a failure.
    pub fn end_reconcile(mut self, result: &'static str, failure: Option<&str>) {
        let failure = failure.filter(|_| result != "deferred");
        let Some(mut span) = self.span.take() else {
            return;
        };
        span.set_attribute(KeyValue::new("outbox.reconcile.result", result));
        if let Some(reason) = failure {
            span.set_status(Status::error(reason.to_string()));
        }
        span.end();
    }
}

/// A span its attempt never ended: the provider panicked (the relay parks
/// the intent as ambiguous), or the attempt was stopped midway. Either way
/// whether the effect happened is unknown, and the span says so.
impl Drop for Attempt {
    fn drop(&mut self) {
        let Some(mut span) = self.span.take() else {
            return;
        };
        let (error, why) = if std::thread::panicking() {
            (
                "panic",
                format!(
                    "the {} provider panicked; whether the effect happened is unknown",
                    self.kind
                ),
            )
        } else {
            (
                "abandoned",
                format!(
                    "the {} attempt was stopped before it had an outcome; whether the effect happened is unknown",
                    self.kind
                ),
            )
        };
        span.set_attribute(KeyValue::new("outbox.outcome", "ambiguous"));
        span.set_attribute(KeyValue::new("error.type", error));
        span.set_status(Status::error(why));
        span.end();
    }
}

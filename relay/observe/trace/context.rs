//! An intent's trace context: the W3C `traceparent` and `tracestate` the
//! application stored with it, read back as the parent of its attempts.

use std::cell::Cell;
use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceId};
use opentelemetry::Context;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator};
use sha2::{Digest, Sha256};

/// The context an intent was enqueued with (as stored: outbox.enqueue
/// keeps only well-formed values).
#[derive(Debug, Clone, Copy, Default)]
pub struct IntentContext<'a> {
    pub traceparent: Option<&'a str>,
    pub tracestate: Option<&'a str>,
}

impl IntentContext<'_> {
    /// The application's span, as a remote parent; none when the intent
    /// has no (readable) context.
    pub fn parent(&self) -> Option<Context> {
        let traceparent = self.traceparent?;
        let mut carrier = HashMap::from([("traceparent".to_string(), traceparent.to_string())]);
        if let Some(state) = self.tracestate {
            carrier.insert("tracestate".into(), state.to_string());
        }
        let cx = TraceContextPropagator::new().extract(&carrier);
        cx.span().span_context().is_valid().then_some(cx)
    }

    /// The trace id and the application's span id, as the stored
    /// `traceparent` spells them.
    pub fn ids(&self) -> Option<(&str, &str)> {
        let t = self.traceparent?;
        Some((t.get(3..35)?, t.get(36..52)?))
    }
}

/// The trace of an intent enqueued without a context: derived from its
/// key, so that every attempt of it, by any relay, after any restart,
/// lands in one trace, and the console can name it without asking.
pub fn derived_trace_id(key: &str) -> TraceId {
    let digest = Sha256::new()
        .chain_update(b"outbox-relay trace\0")
        .chain_update(key.as_bytes())
        .finalize();
    let mut id = [0u8; 16];
    id.copy_from_slice(&digest[..16]);
    TraceId::from_bytes(id)
}

/// The `traceparent` (and `tracestate`) naming `span`.
pub fn headers_of(span: &SpanContext) -> (String, Option<String>) {
    let parent = format!(
        "00-{}-{}-{:02x}",
        span.trace_id(),
        span.span_id(),
        span.trace_flags() & opentelemetry::trace::TraceFlags::SAMPLED
    );
    let state = Some(span.trace_state().header()).filter(|s| !s.is_empty());
    (parent, state)
}

thread_local! {
    /// The trace id the next root span started on this thread takes.
    static NEXT_TRACE: Cell<Option<TraceId>> = const { Cell::new(None) };
}

/// Start a root span in a chosen trace: `start` runs with the id set, on
/// this thread, and takes it.
pub fn in_trace<T>(trace: TraceId, start: impl FnOnce() -> T) -> T {
    NEXT_TRACE.with(|next| next.set(Some(trace)));
    let started = start();
    NEXT_TRACE.with(|next| next.set(None));
    started
}

/// Random ids, except a root span's trace id chosen with [`in_trace`].
#[derive(Debug, Default)]
pub struct Ids {
    random: RandomIdGenerator,
}

impl IdGenerator for Ids {
    fn new_trace_id(&self) -> TraceId {
        NEXT_TRACE
            .with(|next| next.take())
            .unwrap_or_else(|| self.random.new_trace_id())
    }

    fn new_span_id(&self) -> SpanId {
        self.random.new_span_id()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    #[test]
    fn a_stored_context_is_the_parent() {
        let cx = IntentContext {
            traceparent: Some(PARENT),
            tracestate: Some("congo=t61rcWkgMzE"),
        };
        let parent = cx.parent().unwrap();
        let span = parent.span();
        let sc = span.span_context();
        assert_eq!(
            sc.trace_id().to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
        assert_eq!(sc.span_id().to_string(), "b7ad6b7169203331");
        assert!(sc.is_remote() && sc.is_sampled());
        assert_eq!(sc.trace_state().header(), "congo=t61rcWkgMzE");
        assert_eq!(
            cx.ids(),
            Some(("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"))
        );
        let (header, state) = headers_of(sc);
        assert_eq!(header, PARENT);
        assert_eq!(state.as_deref(), Some("congo=t61rcWkgMzE"));
    }

    #[test]
    fn no_context_or_a_broken_one_is_no_parent() {
        for t in [
            None,
            Some("garbage"),
            Some("00-00000000000000000000000000000000-b7ad6b7169203331-01"),
        ] {
            let cx = IntentContext {
                traceparent: t,
                tracestate: None,
            };
            assert!(cx.parent().is_none(), "{t:?}");
        }
    }

    #[test]
    fn a_derived_trace_is_the_keys_alone() {
        assert_eq!(derived_trace_id("order:1"), derived_trace_id("order:1"));
        assert_ne!(derived_trace_id("order:1"), derived_trace_id("order:2"));
        assert_ne!(derived_trace_id("order:1"), TraceId::INVALID);
        let ids = Ids::default();
        let chosen = in_trace(derived_trace_id("k"), || ids.new_trace_id());
        assert_eq!(chosen, derived_trace_id("k"));
        assert_ne!(ids.new_trace_id(), derived_trace_id("k"));
    }
}

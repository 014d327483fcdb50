//! The current OpenTelemetry span's context, attached to an intent or an
//! event that has none (feature `opentelemetry`; without it, nothing is
//! attached).

use crate::NewIntent;

/// `intent` with the current span's `traceparent`, when it has none of
/// its own and a span is current; else `None` (use `intent` as it is).
#[cfg(feature = "opentelemetry")]
pub(crate) fn current(intent: &NewIntent) -> Option<NewIntent> {
    if intent.traceparent.is_some() {
        return None;
    }
    let (traceparent, tracestate) = span_context()?;
    Some(intent.clone().traceparent(traceparent, tracestate))
}

/// The current span's `traceparent` (an event carries no tracestate), when
/// a span is current.
#[cfg(feature = "opentelemetry")]
pub(crate) fn current_traceparent() -> Option<String> {
    span_context().map(|(traceparent, _)| traceparent)
}

/// The current span's `traceparent` and `tracestate` (none when empty).
#[cfg(feature = "opentelemetry")]
fn span_context() -> Option<(String, Option<String>)> {
    use opentelemetry::trace::TraceContextExt;
    let cx = opentelemetry::Context::current();
    let span = cx.span();
    let sc = span.span_context();
    if !sc.is_valid() {
        return None;
    }
    let state = sc.trace_state().header();
    Some((
        format!(
            "00-{}-{}-{:02x}",
            sc.trace_id(),
            sc.span_id(),
            sc.trace_flags().to_u8()
        ),
        (!state.is_empty()).then_some(state),
    ))
}

/// A span is current.
#[cfg(feature = "opentelemetry")]
pub(crate) fn has_current() -> bool {
    use opentelemetry::trace::TraceContextExt;
    opentelemetry::Context::current()
        .span()
        .span_context()
        .is_valid()
}

#[cfg(not(feature = "opentelemetry"))]
pub(crate) fn current(_intent: &NewIntent) -> Option<NewIntent> {
    None
}

#[cfg(not(feature = "opentelemetry"))]
pub(crate) fn has_current() -> bool {
    false
}

#[cfg(not(feature = "opentelemetry"))]
pub(crate) fn current_traceparent() -> Option<String> {
    None
}

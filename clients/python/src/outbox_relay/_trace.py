"""The active OpenTelemetry span's W3C trace context, when the API is installed."""

from __future__ import annotations

import importlib
from types import ModuleType

_UNSET = object()
_trace_api: ModuleType | object | None = _UNSET


def _api() -> ModuleType | None:
    global _trace_api
    if _trace_api is _UNSET:
        try:
            _trace_api = importlib.import_module("opentelemetry.trace")
        except ImportError:
            _trace_api = None
    return _trace_api if isinstance(_trace_api, ModuleType) else None


def active_context() -> tuple[str, str | None] | None:
    """`(traceparent, tracestate)` of the current span, or None without a valid one."""
    api = _api()
    if api is None:
        return None
    ctx = api.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    traceparent = f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"
    tracestate: str = ctx.trace_state.to_header()
    return traceparent, tracestate or None

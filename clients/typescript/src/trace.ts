// The active OpenTelemetry span's W3C trace context, when the application
// has @opentelemetry/api installed (an optional peer dependency, loaded on
// first use, never required).

type OtelApi = typeof import("@opentelemetry/api");

export interface TraceContext {
  readonly traceparent: string;
  readonly tracestate: string | undefined;
}

let otel: Promise<OtelApi | undefined> | undefined;

function loadOtel(): Promise<OtelApi | undefined> {
  otel ??= import("@opentelemetry/api").then(
    (m) => m,
    () => undefined,
  );
  return otel;
}

/**
 * `00-<trace id>-<span id>-<flags>` (and the tracestate) of the span active
 * in the caller's context, or undefined without the API or a valid span.
 */
export async function activeTraceContext(): Promise<TraceContext | undefined> {
  const api = await loadOtel();
  const span = api?.trace.getActiveSpan();
  if (api === undefined || span === undefined) return undefined;
  const sc = span.spanContext();
  if (!api.isSpanContextValid(sc)) return undefined;
  const flags = (sc.traceFlags & 0xff).toString(16).padStart(2, "0");
  const state = sc.traceState?.serialize();
  return {
    traceparent: `00-${sc.traceId}-${sc.spanId}-${flags}`,
    tracestate: state === undefined || state === "" ? undefined : state,
  };
}

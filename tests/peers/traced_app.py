"""An application instrumented with the OpenTelemetry SDK for Python: it
handles a request in a span, writes an intent in its own transaction with
`SET LOCAL outbox.traceparent`, and exports its span over OTLP/HTTP.

Usage: traced_app.py DATABASE_URL OTLP_TRACES_URL WEBHOOK_URL
Prints one JSON line: the traceparent it attached.
"""

import json
import sys

import psycopg2
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.propagate import inject
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

database_url, traces_url, webhook_url = sys.argv[1:4]

provider = TracerProvider(resource=Resource.create({"service.name": "checkout"}))
provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=traces_url)))
trace.set_tracer_provider(provider)
tracer = trace.get_tracer("checkout")

with tracer.start_as_current_span("POST /orders", kind=trace.SpanKind.SERVER):
    carrier = {}
    inject(carrier)
    conn = psycopg2.connect(database_url)
    with conn:  # one transaction: the order and its confirmation commit together
        with conn.cursor() as cur:
            cur.execute("SET LOCAL outbox.traceparent = %s", (carrier["traceparent"],))
            cur.execute(
                "SELECT id FROM outbox.enqueue(%s, 'webhook', %s::jsonb)",
                ("order:7:confirmation", json.dumps({"url": webhook_url, "body": {"order": 7}})),
            )
    conn.close()

provider.shutdown()
print(json.dumps({"traceparent": carrier["traceparent"]}))

//! The export queue between finished spans and the OTLP exporter: bounded,
//! never waited on by a delivery. A span that finds the queue full, or
//! whose batch the collector did not take, is dropped and counted
//! (`outbox_spans_dropped_total`); the relay warns at most once a minute.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry::Context;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use opentelemetry_sdk::Resource;
use tokio::sync::{mpsc, oneshot};

/// Spans sent to the collector in one request, at most.
const BATCH: usize = 512;
/// How long a span may wait in the queue for others to join its batch.
const LINGER: Duration = Duration::from_millis(500);
/// The shortest time between two warnings about dropped spans.
const WARN_EVERY: Duration = Duration::from_secs(60);

enum Message {
    Span(Box<SpanData>),
    /// Export everything queued before this, then answer.
    Flush(oneshot::Sender<()>),
}

/// A span processor with a bounded queue and one export task on the
/// runtime. `on_end` only ever tries to enqueue.
#[derive(Debug)]
pub struct BoundedExport<E: SpanExporter + 'static> {
    queue: mpsc::Sender<Message>,
    exporter: Arc<tokio::sync::Mutex<E>>,
    drops: Arc<Drops>,
    closed: AtomicBool,
}

impl<E: SpanExporter + 'static> BoundedExport<E> {
    /// Start the export task (on the current tokio runtime); `capacity`
    /// spans may wait for it.
    pub fn start(exporter: E, capacity: usize) -> (BoundedExport<E>, Flusher) {
        let (queue, rx) = mpsc::channel(capacity.max(1));
        let exporter = Arc::new(tokio::sync::Mutex::new(exporter));
        let drops = Arc::new(Drops::default());
        tokio::spawn(run(rx, exporter.clone(), drops.clone()));
        let flusher = Flusher {
            queue: queue.clone(),
        };
        let processor = BoundedExport {
            queue,
            exporter,
            drops,
            closed: AtomicBool::new(false),
        };
        (processor, flusher)
    }
}

impl<E: SpanExporter + 'static> SpanProcessor for BoundedExport<E> {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() || self.closed.load(Ordering::Relaxed) {
            return;
        }
        if self.queue.try_send(Message::Span(Box::new(span))).is_err() {
            self.drops.add(
                1,
                "the export queue is full (the collector is slow or unreachable)",
            );
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        // flushing waits on the runtime: the relay flushes with
        // `Flusher::flush` before it shuts the provider down
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        self.closed.store(true, Ordering::Relaxed);
        Ok(())
    }

    fn set_resource(&mut self, resource: &Resource) {
        // called while the provider is built, before any span exists
        if let Ok(mut exporter) = self.exporter.try_lock() {
            exporter.set_resource(resource);
        }
    }
}

/// Asks the export task to send what is queued.
#[derive(Debug, Clone)]
pub struct Flusher {
    queue: mpsc::Sender<Message>,
}

impl Flusher {
    /// Export every span queued so far, waiting at most `timeout` in all.
    pub async fn flush(&self, timeout: Duration) {
        let (done, wait) = oneshot::channel();
        let _ = tokio::time::timeout(timeout, async {
            if self.queue.send(Message::Flush(done)).await.is_ok() {
                let _ = wait.await;
            }
        })
        .await;
    }
}

async fn run<E: SpanExporter>(
    mut rx: mpsc::Receiver<Message>,
    exporter: Arc<tokio::sync::Mutex<E>>,
    drops: Arc<Drops>,
) {
    let mut batch: Vec<SpanData> = Vec::with_capacity(BATCH);
    while let Some(first) = rx.recv().await {
        let mut flushed = Vec::new();
        take(first, &mut batch, &mut flushed);
        let until = tokio::time::Instant::now() + LINGER;
        while batch.len() < BATCH && flushed.is_empty() {
            match tokio::time::timeout_at(until, rx.recv()).await {
                Ok(Some(m)) => take(m, &mut batch, &mut flushed),
                _ => break,
            }
        }
        // a flush sends everything already queued
        if !flushed.is_empty() {
            while let Ok(m) = rx.try_recv() {
                take(m, &mut batch, &mut flushed);
            }
        }
        while !batch.is_empty() {
            let rest = batch.split_off(batch.len().min(BATCH));
            let chunk = std::mem::replace(&mut batch, rest);
            let n = chunk.len() as u64;
            let result = exporter.lock().await.export(chunk).await;
            if let Err(err) = result {
                drops.add(n, &format!("the collector did not take a batch: {err}"));
            }
        }
        batch.reserve(BATCH);
        for done in flushed {
            let _ = done.send(());
        }
    }
}

fn take(m: Message, batch: &mut Vec<SpanData>, flushed: &mut Vec<oneshot::Sender<()>>) {
    match m {
        Message::Span(span) => batch.push(*span),
        Message::Flush(done) => flushed.push(done),
    }
}

/// Dropped spans: counted always, warned about at most once a minute.
#[derive(Debug, Default)]
struct Drops {
    last_warning: Mutex<Option<Instant>>,
}

impl Drops {
    fn add(&self, n: u64, why: &str) {
        metrics::counter!("outbox_spans_dropped_total").increment(n);
        let mut last = self.last_warning.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
            *last = Some(Instant::now());
            tracing::warn!(
                spans = n,
                "trace spans dropped: {why}; deliveries go on (outbox_spans_dropped_total counts them)"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keeps what it is given.
    #[derive(Debug, Clone, Default)]
    struct Memory(Arc<Mutex<Vec<SpanData>>>);

    impl SpanExporter for Memory {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            self.0.lock().unwrap().extend(batch);
            Ok(())
        }
    }

    #[test]
    fn a_warning_waits_a_minute_but_every_drop_counts() {
        let drops = Drops::default();
        drops.add(1, "full");
        let first = *drops.last_warning.lock().unwrap();
        drops.add(1, "full");
        assert_eq!(*drops.last_warning.lock().unwrap(), first);
    }

    #[tokio::test]
    async fn queued_spans_reach_the_exporter_on_a_flush() {
        let memory = Memory::default();
        let (processor, flusher) = BoundedExport::start(memory.clone(), 8);
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_span_processor(processor)
            .build();
        use opentelemetry::trace::{Tracer as _, TracerProvider as _};
        let tracer = provider.tracer("test");
        for _ in 0..3 {
            tracer.in_span("attempt", |_| {});
        }
        flusher.flush(Duration::from_secs(5)).await;
        assert_eq!(memory.0.lock().unwrap().len(), 3);
    }
}

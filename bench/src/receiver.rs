//! The bench's webhook receiver, on a thread and runtime of its own, and
//! peak RSS readings.

use std::time::Duration;

/// The webhook-ids the bench receiver has seen, and how many requests.
#[derive(Clone, Default)]
pub(crate) struct Seen {
    log: std::sync::Arc<std::sync::Mutex<(u64, std::collections::HashSet<String>)>>,
    /// How long the receiver takes to answer, in ms.
    delay_ms: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Seen {
    pub(crate) fn delay(&self) -> Duration {
        Duration::from_millis(self.delay_ms.load(std::sync::atomic::Ordering::Relaxed))
    }
    pub(crate) fn set_delay(&self, d: Duration) {
        self.delay_ms
            .store(d.as_millis() as u64, std::sync::atomic::Ordering::Relaxed);
    }
    pub(crate) fn record(&self, id: Option<&str>) {
        let mut s = self.log.lock().expect("receiver log");
        s.0 += 1;
        if let Some(id) = id {
            s.1.insert(id.to_string());
        }
    }
    pub(crate) fn reset(&self) {
        *self.log.lock().expect("receiver log") = Default::default();
    }
    /// (requests, distinct webhook-ids)
    pub(crate) fn counts(&self) -> (u64, u64) {
        let s = self.log.lock().expect("receiver log");
        (s.0, s.1.len() as u64)
    }
    /// Until `n` distinct webhook-ids have arrived, or `limit` has passed:
    /// watching a drain's progress without a query to the database it
    /// measures.
    pub(crate) async fn wait_distinct(&self, n: u64, limit: Duration) {
        let deadline = std::time::Instant::now() + limit;
        while self.counts().1 < n && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

/// Serve `app` on a free loopback port, on a thread and runtime of its own
/// (so it does not share the relay's executor).
pub(crate) fn serve_on_thread(
    name: &str,
    app: axum::Router,
) -> anyhow::Result<(u16, std::thread::JoinHandle<()>)> {
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    std_listener.set_nonblocking(true)?;
    let port = std_listener.local_addr()?.port();
    let handle = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(std_listener).expect("listener");
                let _ = axum::serve(listener, app).await;
            });
        })?;
    Ok((port, handle))
}

/// A webhook receiver on its own thread: answers 200 to every POST and
/// notes its webhook-id.
pub(crate) fn receiver() -> anyhow::Result<(u16, std::thread::JoinHandle<()>, Seen)> {
    let seen = Seen::default();
    let log = seen.clone();
    let app = axum::Router::new().fallback(move |headers: axum::http::HeaderMap| {
        log.record(headers.get("webhook-id").and_then(|v| v.to_str().ok()));
        let delay = log.delay();
        async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            ""
        }
    });
    let (port, handle) = serve_on_thread("bench-receiver", app)?;
    Ok((port, handle, seen))
}

/// The process's peak resident set (VmHWM), in MB.
pub fn peak_rss_mb() -> f64 {
    peak_rss_mb_of("/proc/self/status")
}

/// VmHWM from a /proc/<pid>/status file, in MB.
pub(crate) fn peak_rss_mb_of(status: &str) -> f64 {
    std::fs::read_to_string(status)
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|kb| kb.parse::<f64>().ok())
            })
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

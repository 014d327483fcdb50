//! What `/readyz` reports besides the database: the relay shutting down,
//! or a task the supervisor saw die or get stuck.

use std::sync::atomic::AtomicBool;
use std::sync::Mutex;

/// Readiness inputs shared with the daemon.
#[derive(Debug, Default)]
pub struct Health {
    pub shutting_down: AtomicBool,
    /// Set once the relay is in `outbox.relays`: until then other relays
    /// do not know which kinds it knows (an older relay would reject an
    /// intent of a kind only this one knows), so it is not ready.
    pub registered: AtomicBool,
    /// Set by the supervisor when a task died or got stuck: the relay is
    /// broken and on its way out.
    failure: Mutex<Option<String>>,
}

impl Health {
    /// Mark the relay broken, naming why.
    pub fn fail(&self, why: &str) {
        let mut failure = self.failure.lock().unwrap_or_else(|e| e.into_inner());
        failure.get_or_insert_with(|| why.to_string());
    }

    /// Why the relay is broken, if it is.
    pub fn failure(&self) -> Option<String> {
        self.failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

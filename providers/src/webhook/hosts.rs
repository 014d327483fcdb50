//! At most N requests in flight to one origin, so one slow receiver cannot
//! occupy every delivery slot of a relay. A request over the limit is not
//! attempted: it is deferred (back to pending shortly, no attempt spent).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub struct HostLimits {
    per_host: usize,
    hosts: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl HostLimits {
    pub fn new(per_host: usize) -> Self {
        HostLimits {
            per_host: per_host.max(1),
            hosts: Mutex::new(HashMap::new()),
        }
    }

    pub fn limit(&self) -> usize {
        self.per_host
    }

    /// A slot for `origin`, or `None` when it already has `per_host` requests in flight.
    pub fn try_acquire(&self, origin: &str) -> Option<OwnedSemaphorePermit> {
        let sem = {
            let mut hosts = self.hosts.lock().ok()?;
            if hosts.len() > 4096 {
                // forget idle origins so the map stays bounded
                let full = self.per_host;
                hosts.retain(|_, s| s.available_permits() < full);
            }
            hosts
                .entry(origin.to_string())
                .or_insert_with(|| Arc::new(Semaphore::new(self.per_host)))
                .clone()
        };
        sem.try_acquire_owned().ok()
    }
}

/// `scheme://host:port` of a URL, with the default port filled in and a
/// DNS name's trailing dot dropped (`a.example.` is `a.example`; the parser
/// has already lowered its case).
pub fn origin(url: &url::Url) -> String {
    format!(
        "{}://{}:{}",
        url.scheme(),
        url.host_str().unwrap_or("").trim_end_matches('.'),
        url.port_or_known_default().unwrap_or(0)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_origin_however_its_name_is_spelled() {
        let o = |u: &str| origin(&url::Url::parse(u).unwrap());
        assert_eq!(o("http://A.Example./x"), "http://a.example:80");
        assert_eq!(o("http://a.example:80/y"), "http://a.example:80");
        assert_eq!(o("https://a.example/"), "https://a.example:443");
    }

    #[test]
    fn limits_each_origin_separately() {
        let limits = HostLimits::new(2);
        let a1 = limits.try_acquire("http://a:80").unwrap();
        let _a2 = limits.try_acquire("http://a:80").unwrap();
        assert!(limits.try_acquire("http://a:80").is_none());
        assert!(limits.try_acquire("http://b:80").is_some());
        drop(a1);
        assert!(limits.try_acquire("http://a:80").is_some());
        let u = url::Url::parse("https://example.com/x").unwrap();
        assert_eq!(origin(&u), "https://example.com:443");
    }
}

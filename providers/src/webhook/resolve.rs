//! A DNS resolver that returns only the addresses the guard allows, so the
//! HTTP client can connect to nothing else (no DNS-rebinding window between
//! a check and the connect).

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::client::legacy::connect::dns::Name;
use ipnet::IpNet;

use crate::guard;

/// The guard refused every address a host resolved to.
#[derive(Debug)]
pub struct Refused {
    host: String,
    reason: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "webhook host {} refused: {}", self.host, self.reason)
    }
}

impl std::error::Error for Refused {}

type Resolving = Pin<
    Box<
        dyn Future<
                Output = Result<
                    std::vec::IntoIter<SocketAddr>,
                    Box<dyn std::error::Error + Send + Sync>,
                >,
            > + Send,
    >,
>;

/// The system's resolver, with every answer the guard refuses taken out.
#[derive(Clone)]
pub struct GuardedResolver {
    allowed: Arc<Vec<IpNet>>,
}

impl GuardedResolver {
    pub fn new(allowed: Vec<IpNet>) -> Self {
        GuardedResolver {
            allowed: Arc::new(allowed),
        }
    }
}

impl tower_service::Service<Name> for GuardedResolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = Box<dyn std::error::Error + Send + Sync>;
    type Future = Resolving;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Resolving {
        let allowed = self.allowed.clone();
        Box::pin(async move {
            let host = name.as_str().to_string();
            let resolved: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let mut last_refusal = None;
            let approved: Vec<SocketAddr> = resolved
                .into_iter()
                .filter(|a| match guard::check(a.ip(), &allowed) {
                    Ok(()) => true,
                    Err(reason) => {
                        last_refusal = Some(reason);
                        false
                    }
                })
                .collect();
            if approved.is_empty() {
                let reason = last_refusal.unwrap_or_else(|| "it resolved to no address".into());
                return Err(Box::new(Refused { host, reason }) as Box<_>);
            }
            Ok(approved.into_iter())
        })
    }
}

/// The IP address of a URL whose host is an IP literal.
pub fn literal_ip(url: &url::Url) -> Option<IpAddr> {
    match url.host()? {
        url::Host::Ipv4(v4) => Some(IpAddr::V4(v4)),
        url::Host::Ipv6(v6) => Some(IpAddr::V6(v6)),
        url::Host::Domain(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numeric_hosts_are_literals() {
        for (url, ip) in [
            ("http://127.0.0.1/", "127.0.0.1"),
            ("http://2130706433/", "127.0.0.1"),
            ("http://0x7f.1/", "127.0.0.1"),
            ("http://017700000001/", "127.0.0.1"),
            ("http://[::ffff:7f00:1]/", "::ffff:127.0.0.1"),
            ("http://[::1]:8080/x", "::1"),
        ] {
            let u = url::Url::parse(url).unwrap();
            assert_eq!(literal_ip(&u), Some(ip.parse().unwrap()), "{url}");
            assert!(guard::check(literal_ip(&u).unwrap(), &[]).is_err(), "{url}");
        }
        assert_eq!(
            literal_ip(&url::Url::parse("http://example.com/").unwrap()),
            None
        );
    }
}

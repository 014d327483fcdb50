//! `[relay]`: the claim loop, leases, listeners and the lookup token.

use std::time::Duration;

use anyhow::bail;
use outbox_providers::Secret;
use serde::Deserialize;

use crate::units::{dur, Dur};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RelaySection {
    /// Deliveries in flight per relay.
    pub concurrency: u32,
    /// Intents claimed per round trip (at most). A claim + complete round
    /// has a fixed cost beyond its rows, so under load larger batches cost
    /// less per intent (docs/performance.md has the figures). But claimed intents wait for a delivery slot with their lease
    /// running: up to `concurrency + batch_size` of them queue, so when every
    /// endpoint answers at its timeout the last waits about
    /// `(concurrency + batch_size) / concurrency × timeout`, which must stay
    /// below `lease − timeout` or the claim is handed back unattempted. The
    /// default keeps that for webhooks with the default lease and timeout
    /// (64 in flight, a 15 s timeout: the last of 164 waits about 38 s,
    /// within the 44.5 s a 60 s lease leaves). A relay holds at most
    /// `concurrency + 3 × batch_size` claims.
    pub batch_size: u32,
    /// How long a claim is held before the sweeper may act on it.
    pub lease: Dur,
    /// Fallback wake-up when no NOTIFY arrives.
    pub poll_interval: Dur,
    /// LISTEN for enqueue notifications. At start the relay checks that a
    /// NOTIFY reaches it; when none does (a pooler in transaction mode), or
    /// when this is false, it delivers by polling every `poll_interval`.
    pub listen: bool,
    /// How often the sweeper looks for expired leases.
    pub sweep_interval: Dur,
    /// How long in-flight deliveries may take to finish on SIGTERM.
    pub shutdown_timeout: Dur,
    /// How often the daemon logs a one-line summary at info level
    /// (delivered, failed, retried, replays, backlog); 0s turns it off.
    pub summary_interval: Dur,
    /// Where /metrics, /healthz and /readyz are served (port 0 picks one),
    /// and `GET /v1/intents/{key}` (see `lookup`).
    pub metrics_addr: Option<String>,
    /// Answer `GET /v1/intents/{key}` on the metrics listener: an intent's
    /// state by its exact key, for a client that wants to know whether an
    /// operation happened. false: the path is 404 like any unknown one.
    pub lookup: bool,
    /// When set, `GET /v1/intents/{key}` needs `Authorization: Bearer
    /// <token>` (401 otherwise); /metrics and the probes stay open. Also
    /// `OUTBOX_RELAY_LOOKUP_TOKEN` (or `…_FILE`). Kept secret: never printed.
    pub lookup_token: Option<Secret>,
    /// The owner name written on claims; default host:pid:random.
    pub name: Option<String>,
    /// Postgres connections; default concurrency/8 + 4.
    pub max_connections: Option<u32>,
    /// Perform an intent's effect only after its commit is flushed on at
    /// least this many streaming standbys, so that a failover to one of
    /// them cannot lose an intent whose effect already happened. 0 (the
    /// default) turns the wait off: a database without standbys would
    /// otherwise deliver nothing, and the relay cannot tell which standbys
    /// a failover would promote. Set it to 1 where an asynchronous
    /// standby can be promoted. While too few standbys keep up, deliveries
    /// wait (no intent fails for it).
    pub wait_for_standbys: u32,
    /// The standbys `wait_for_standbys` counts, by the `application_name`
    /// each connects with (as in PostgreSQL's `synchronous_standby_names`,
    /// compared case-insensitively): the servers a failover may promote.
    /// Unset, every physical walsender counts except those named
    /// `pg_receivewal`, `pg_basebackup` or `barman_receive_wal`: a WAL
    /// archiver or a base backup streams WAL too, but is no server to fail
    /// over to. Set it wherever an archiver connects under another name.
    pub standby_names: Option<Vec<String>>,
}

impl Default for RelaySection {
    fn default() -> Self {
        RelaySection {
            concurrency: 64,
            batch_size: 100,
            lease: dur("60s"),
            poll_interval: dur("1s"),
            listen: true,
            sweep_interval: dur("5s"),
            shutdown_timeout: dur("30s"),
            summary_interval: dur("60s"),
            metrics_addr: Some("127.0.0.1:9187".into()),
            lookup: true,
            lookup_token: None,
            name: None,
            max_connections: None,
            wait_for_standbys: 0,
            standby_names: None,
        }
    }
}

impl RelaySection {
    /// The checks of the `[relay]` section's own values: what every verb
    /// that connects uses.
    pub fn validate(&self) -> anyhow::Result<()> {
        let r = self;
        if !(1..=10_000).contains(&r.concurrency) {
            bail!(
                "relay.concurrency must be between 1 and 10000, not {}",
                r.concurrency
            );
        }
        if !(1..=10_000).contains(&r.batch_size) {
            bail!(
                "relay.batch_size must be between 1 and 10000, not {}",
                r.batch_size
            );
        }
        if r.lease.0 < Duration::from_secs(1) {
            bail!("relay.lease must be at least 1s");
        }
        if r.poll_interval.0 < Duration::from_millis(10) {
            bail!("relay.poll_interval must be at least 10ms");
        }
        if r.sweep_interval.0 < Duration::from_millis(10) {
            bail!("relay.sweep_interval must be at least 10ms");
        }
        if r.wait_for_standbys > 64 {
            bail!(
                "relay.wait_for_standbys must be between 0 and 64, not {}",
                r.wait_for_standbys
            );
        }
        if let Some(names) = &r.standby_names {
            check_standby_names(names)?;
        }
        if let Some(addr) = &r.metrics_addr {
            addr.parse::<std::net::SocketAddr>().map_err(|_| {
                anyhow::anyhow!("relay.metrics_addr {addr:?} is not an address like 127.0.0.1:9187")
            })?;
        }
        Ok(())
    }
}

/// `relay.standby_names`: application_names as PostgreSQL keeps them
/// (printable ASCII, at most 63 bytes), at least one.
fn check_standby_names(names: &[String]) -> anyhow::Result<()> {
    if names.is_empty() {
        bail!(
            "relay.standby_names is empty: name the standbys a failover may promote \
             (their application_name), or leave the setting out"
        );
    }
    for name in names {
        let printable = name.bytes().all(|b| (0x20..0x7f).contains(&b));
        if name.trim().is_empty() || name.trim() != name || !printable || name.len() > 63 {
            bail!(
                "relay.standby_names: {name:?} is not an application_name PostgreSQL \
                 reports: printable ASCII without leading or trailing spaces, 1 to 63 bytes"
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standby_names_are_application_names() {
        let with = |names: &[&str]| RelaySection {
            standby_names: Some(names.iter().map(|n| n.to_string()).collect()),
            ..RelaySection::default()
        };
        assert!(with(&["standby-a", "walreceiver"]).validate().is_ok());
        assert!(RelaySection::default().validate().is_ok());
        for bad in [
            &[][..],
            &[""],
            &[" standby"],
            &["standby\u{200b}"],
            &["a\nb"],
        ] {
            let err = with(bad).validate().unwrap_err().to_string();
            assert!(err.contains("relay.standby_names"), "{bad:?}: {err}");
        }
        let long = "s".repeat(64);
        assert!(with(&[long.as_str()]).validate().is_err());
    }
}

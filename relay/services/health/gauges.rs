//! The destination gauges: `outbox_destination_state` and
//! `outbox_destination_pending`, bounded in series, and the closing of
//! idle breakers that the backlog read reveals.

use std::collections::HashMap;

use crate::config::HealthSettings;
use crate::store::Store;

/// The most destinations reported by name in `outbox_destination_state`
/// besides the configured ones; the rest are summed under `other`.
const GAUGED_DESTINATIONS: usize = 20;

/// `outbox_destination_state{destination}` (0 closed, 1 open, 2 half
/// open, 3 paused) for the configured destinations and the unhealthy ones
/// (at most [`GAUGED_DESTINATIONS`] by name, the rest as `other`: the
/// number of them not closed), and no other series: one that leaves the
/// set leaves the exposition. `reported` becomes the names reported.
pub async fn refresh_gauges(
    store: &Store,
    settings: &HealthSettings,
    reported: &mut std::collections::HashSet<String>,
) -> Result<(), sqlx::Error> {
    let rows = store.destinations_not_closed().await?;
    let code = |state: &str| match state {
        "open" => 1.0,
        "half_open" => 2.0,
        "paused" => 3.0,
        _ => 0.0,
    };
    let mut now: HashMap<String, f64> = settings
        .limits
        .keys()
        .chain(settings.overrides.keys())
        .map(|k| (k.clone(), 0.0))
        .collect();
    let mut other = 0.0;
    let mut named = 0;
    for (name, state) in rows {
        match now.entry(name) {
            std::collections::hash_map::Entry::Occupied(mut e) => {
                e.insert(code(&state));
            }
            std::collections::hash_map::Entry::Vacant(e) if named < GAUGED_DESTINATIONS => {
                named += 1;
                e.insert(code(&state));
            }
            std::collections::hash_map::Entry::Vacant(_) => other += 1.0,
        }
    }
    // a destination that left the set leaves the exposition with it
    *reported = now.keys().cloned().collect();
    now.insert("other".into(), other);
    crate::observe::destination_gauges::publish_state(now);
    Ok(())
}

/// The most destinations reported by name in `outbox_destination_pending`
/// besides the configured ones (the largest backlogs); the rest are summed
/// under `other`.
const TOP_BACKLOGS: usize = 10;

/// `outbox_destination_pending{destination}`: the pending backlog of the
/// configured destinations (pending or claimed), of the [`TOP_BACKLOGS`] largest others, and of
/// the rest summed as `other`, and no other series. Read from the
/// tallies, one row per destination group, whatever the backlog.
/// `reported` becomes the names reported.
pub async fn refresh_backlog_gauges(
    store: &Store,
    settings: &HealthSettings,
    owner: &str,
    reported: &mut std::collections::HashSet<String>,
) -> Result<(), sqlx::Error> {
    let rows = store.destination_backlogs().await?;
    let mut by_name: HashMap<String, i64> = HashMap::new();
    for (name, n) in rows {
        let Some(name) = name else { continue };
        // a named endpoint counts under its origin
        let name = settings.endpoints.get(&name).cloned().unwrap_or(name);
        *by_name.entry(name).or_default() += n;
    }
    close_idle_breakers(store, settings, owner, &by_name).await?;
    let mut now: HashMap<String, f64> = settings
        .limits
        .keys()
        .chain(settings.overrides.keys())
        .map(|k| (k.clone(), by_name.remove(k).unwrap_or(0) as f64))
        .collect();
    let mut rest: Vec<(String, i64)> = by_name.into_iter().collect();
    rest.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let other: i64 = rest.iter().skip(TOP_BACKLOGS).map(|r| r.1).sum();
    for (name, n) in rest.into_iter().take(TOP_BACKLOGS) {
        now.insert(name, n as f64);
    }
    *reported = now.keys().cloned().collect();
    now.insert("other".into(), other as f64);
    crate::observe::destination_gauges::publish_pending(now);
    Ok(())
}

/// Close the open breakers of destinations with no backlog left a minute
/// past their due probe: nothing would ever probe them
/// (`outbox.close_idle_breaker`).
async fn close_idle_breakers(
    store: &Store,
    settings: &HealthSettings,
    owner: &str,
    backlog: &HashMap<String, i64>,
) -> Result<(), sqlx::Error> {
    let idle = store.overdue_open_breakers().await?;
    for name in idle.iter().filter(|n| !backlog.contains_key(*n)) {
        let closed = store
            .close_idle_breaker(name, owner, &settings.alerts)
            .await?;
        if closed {
            tracing::info!(destination = %name, "closed the breaker of a destination with nothing left to send");
        }
    }
    Ok(())
}

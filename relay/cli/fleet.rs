//! `relays`: the fleet as `outbox.relays` knows it.

use super::output::{json, table};
use super::Outcome;
use crate::store::Store;

pub async fn relays(store: &Store, as_json: bool) -> Outcome {
    let rows = store
        .relays()
        .await
        .map_err(crate::store::StoreError::from)?;
    if as_json {
        json(&rows);
        return Ok(());
    }
    if rows.is_empty() {
        println!("no relay has registered (relays register when `outbox-relay run` starts)");
        return Ok(());
    }
    let now = chrono::Utc::now();
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let state = match (r.live, r.stopped_at) {
                (true, _) => "live".to_string(),
                (false, Some(at)) => format!("stopped {}", ago(now - at)),
                (false, None) => "silent".to_string(),
            };
            vec![
                r.owner.clone(),
                state,
                r.version.clone(),
                r.kinds.join(","),
                ago(now - r.heartbeat_at),
                ago(now - r.started_at),
            ]
        })
        .collect();
    table(
        &[
            "OWNER",
            "STATE",
            "VERSION",
            "SERVES",
            "HEARTBEAT",
            "STARTED",
        ],
        &rows,
    );
    Ok(())
}

/// "12s ago", "5m ago", "3h ago".
fn ago(d: chrono::TimeDelta) -> String {
    let s = d.num_seconds().max(0);
    match s {
        0..=119 => format!("{s}s ago"),
        120..=7199 => format!("{}m ago", s / 60),
        _ => format!("{}h ago", s / 3600),
    }
}

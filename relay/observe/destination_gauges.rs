//! The per-destination gauges, `outbox_destination_state` and
//! `outbox_destination_pending`. Their label sets follow the destinations
//! that are unhealthy or backlogged now, so each refresh publishes exactly
//! the current series: they live in a recorder of their own, rebuilt at
//! every refresh and rendered after the process recorder's metrics (which
//! keeps every series it was ever given, for the life of the process).

use std::collections::BTreeMap;
use std::sync::Mutex;

use metrics_exporter_prometheus::PrometheusBuilder;

struct Current {
    state: BTreeMap<String, f64>,
    pending: BTreeMap<String, f64>,
    /// Both, in the exposition format.
    rendered: String,
}

static CURRENT: Mutex<Current> = Mutex::new(Current {
    state: BTreeMap::new(),
    pending: BTreeMap::new(),
    rendered: String::new(),
});

/// `outbox_destination_state{destination}`: these series and no others.
pub fn publish_state(series: impl IntoIterator<Item = (String, f64)>) {
    let mut current = CURRENT.lock().unwrap_or_else(|p| p.into_inner());
    current.state = series.into_iter().collect();
    rebuild(&mut current);
}

/// `outbox_destination_pending{destination}`: these series and no others.
pub fn publish_pending(series: impl IntoIterator<Item = (String, f64)>) {
    let mut current = CURRENT.lock().unwrap_or_else(|p| p.into_inner());
    current.pending = series.into_iter().collect();
    rebuild(&mut current);
}

fn rebuild(current: &mut Current) {
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        metrics::describe_gauge!(
            "outbox_destination_pending",
            "Pending intents per destination: the configured ones, the 10 largest other backlogs, the rest as other"
        );
        metrics::describe_gauge!(
            "outbox_destination_state",
            "Destination health: 0 closed, 1 breaker open, 2 half open (probing), 3 paused"
        );
        for (name, value) in &current.state {
            metrics::gauge!("outbox_destination_state", "destination" => name.clone()).set(*value);
        }
        for (name, value) in &current.pending {
            metrics::gauge!("outbox_destination_pending", "destination" => name.clone())
                .set(*value);
        }
    });
    current.rendered = handle.render();
}

/// The gauges as last published, in the exposition format.
pub fn render() -> String {
    CURRENT
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .rendered
        .clone()
}

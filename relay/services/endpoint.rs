//! The relay's one HTTP listener, at `relay.metrics_addr`: `/metrics`,
//! `/healthz` (the process is alive), `/readyz` (the database answers, the
//! schema is current, and the relay is neither shutting down nor broken),
//! and the lookup `GET /v1/intents/{key}`.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;

use crate::observe::metrics::recorder;
use crate::observe::readiness::Health;
use crate::store::Store;

#[derive(Clone)]
struct Served {
    handle: PrometheusHandle,
    store: Store,
    health: Arc<Health>,
}

/// Bind `addr` (port 0 picks one). Returns the bound address and the
/// server, which runs until it is dropped: it answers (`/readyz` 503)
/// through the whole shutdown. `lookup` says who may ask
/// `GET /v1/intents/{key}` ([`crate::services::lookup`]).
pub async fn serve(
    addr: SocketAddr,
    store: Store,
    health: Arc<Health>,
    lookup: crate::services::lookup::Access,
) -> anyhow::Result<(
    SocketAddr,
    impl std::future::Future<Output = ()> + Send + 'static,
)> {
    let served = Served {
        handle: recorder(),
        store,
        health,
    };
    let app = axum::Router::new()
        .route("/metrics", get(render))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .route(
            "/v1/intents/{*key}",
            crate::services::lookup::route(served.store.clone(), lookup),
        )
        .with_state(served);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on relay.metrics_addr {addr}: {e}"))?;
    let bound = listener.local_addr()?;
    let server = async move {
        if let Err(err) = axum::serve(listener, app).await {
            tracing::error!(error = %err, "metrics listener stopped");
        }
    };
    Ok((bound, server))
}

async fn render(State(s): State<Served>) -> String {
    let mut text = s.handle.render();
    text.push_str(&crate::observe::destination_gauges::render());
    text
}

async fn ready(State(s): State<Served>) -> (StatusCode, String) {
    if let Some(why) = s.health.failure() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("broken: {why}; the relay is stopping\n"),
        );
    }
    if s.health.shutting_down.load(Ordering::SeqCst) {
        return (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n".into());
    }
    if !s.health.registered.load(Ordering::SeqCst) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "starting: not registered in outbox.relays yet\n".into(),
        );
    }
    let check = tokio::time::timeout(Duration::from_secs(2), s.store.migrations_current()).await;
    match check {
        Ok(Ok(true)) => (
            StatusCode::OK,
            format!("ready\n{}", standby_hold(&s.store).await),
        ),
        Ok(Ok(false)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "schema not current: run `outbox-relay migrate`\n".into(),
        ),
        Ok(Err(e)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("database unreachable: {e}\n"),
        ),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "database did not answer within 2s\n".into(),
        ),
    }
}

/// The relays whose deliveries are held back for the standbys
/// (`relay.wait_for_standbys`), one line each, for `/readyz`: still ready
/// (another relay would wait for the same standbys), but an operator
/// reading it sees why nothing goes out. Empty when none is, or when the
/// database does not say within a second.
async fn standby_hold(store: &Store) -> String {
    let waits = tokio::time::timeout(Duration::from_secs(1), store.standby_waits()).await;
    let Ok(Ok(waits)) = waits else {
        return String::new();
    };
    waits
        .iter()
        .map(|w| {
            format!(
                "held up: relay {} has held deliveries back for {:.0}s: their commits must reach {} standby(s), {} streaming (relay.wait_for_standbys)\n",
                w.owner,
                w.behind_seconds,
                w.needed,
                w.streaming.map_or_else(|| "an unknown number".to_string(), |n| n.to_string())
            )
        })
        .collect()
}

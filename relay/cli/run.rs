//! `run`: the daemon.

use std::sync::Arc;
use std::time::Duration;

use super::{Failure, Outcome};
use crate::config::Config;
use crate::engine::{Engine, EngineConfig};
use crate::lookup::Access;
use crate::metrics::{self, Health};
use crate::store::Store;
use crate::supervisor::Service;

pub async fn run(store: Store, config: &Config, once: bool) -> Outcome {
    // `migrate` does nothing when the schema is current, so a relay role
    // without DDL rights runs against a schema its owner migrated.
    store.migrate().await?;
    let providers = crate::engine::providers(config).map_err(|e| {
        // the operator's configuration (exit 2), or this machine (exit 1)
        let setup = matches!(
            e.downcast_ref::<outbox_providers::Error>(),
            Some(outbox_providers::Error::Setup(_))
        );
        Failure::new(if setup { 1 } else { 2 }, format!("{e:#}"))
    })?;
    if once {
        let engine = Engine::new(store, providers, EngineConfig::from_config(config));
        engine.run_once().await?;
        return Ok(());
    }
    let health = Arc::new(Health::default());
    let engine_config = EngineConfig::from_config(config);
    let owner = engine_config.owner.clone();
    let engine = Engine::new(store.clone(), providers, engine_config);
    let stop = engine.stop_signal();
    let mut services = Vec::new();
    if let Some(addr) = &config.relay.metrics_addr {
        let addr = addr.parse().map_err(|_| {
            Failure::usage(format!("relay.metrics_addr {addr:?} is not an address"))
        })?;
        let lookup = Access::from_config(&config.relay);
        let (bound, server) =
            metrics::serve(addr, store.clone(), health.clone(), lookup.clone()).await?;
        tracing::info!(%bound, "serving /metrics, /healthz and /readyz");
        let lookup_is = lookup.describe(bound);
        if lookup.open_beyond_this_host(bound) {
            tracing::warn!(%bound, "GET /v1/intents/{{key}} is {lookup_is}");
        } else {
            tracing::info!(%bound, "GET /v1/intents/{{key}} is {lookup_is}");
        }
        services.push(Service::lasting("http listener", server));
        services.push(Service::new(
            "gauges",
            metrics::gauges_loop(store.clone(), Duration::from_secs(5), stop.clone()),
        ));
    }
    let schedules = config
        .schedules()
        .map_err(|e| Failure::usage(format!("{e:#}")))?;
    services.push(Service::new(
        "schedules",
        crate::schedule::run(store.clone(), schedules, stop.clone()),
    ));
    let health_settings = config
        .health()
        .map_err(|e| Failure::usage(format!("{e:#}")))?;
    services.push(Service::new(
        "destination health",
        crate::health::run(
            store.clone(),
            health_settings,
            owner,
            Duration::from_secs(5),
            stop.clone(),
        ),
    ));
    services.push(Service::new(
        "retention",
        crate::retention::run(store.clone(), config.retention.clone(), stop),
    ));
    engine.run_with(shutdown_signal(), services, health).await?;
    Ok(())
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => tracing::info!("SIGINT received"),
        _ = term => tracing::info!("SIGTERM received"),
    }
}

//! `run`: the daemon.

use std::sync::Arc;
use std::time::Duration;

use super::{Failure, Outcome};
use crate::config::Config;
use crate::engine::supervisor::Service;
use crate::engine::{Engine, EngineConfig};
use crate::observe::readiness::Health;
use crate::observe::trace::Tracer;
use crate::services::lookup::Access;
use crate::services::{endpoint, gauges};
use crate::store::Store;

/// `run`, or `run --once`. The daemon stops on `shutdown`, which the caller
/// makes before it connects ([`shutdown_signal`]); `None`, and it is made
/// here.
pub async fn run(store: Store, config: &Config, once: bool, shutdown: Option<Shutdown>) -> Outcome {
    let tracer = start_tracing(config)?;
    let ran = run_traced(store, config, once, shutdown, tracer.clone()).await;
    tracer.shutdown().await;
    ran
}

/// Start the export of attempt spans when `[telemetry]` or the `OTEL_*`
/// variables name an endpoint.
fn start_tracing(config: &Config) -> Result<Tracer, Failure> {
    let settings = config
        .telemetry
        .settings()
        .map_err(|e| Failure::usage(format!("{e:#}")))?;
    let export = settings
        .resolve(|name| std::env::var(name).ok())
        .map_err(|e| Failure::usage(format!("{e:#}")))?;
    let Some(export) = export else {
        return Ok(Tracer::off());
    };
    let tracer = Tracer::start(&export).map_err(|e| Failure::usage(format!("{e:#}")))?;
    tracing::info!(
        protocol = %export.protocol,
        endpoint = export
            .endpoint
            .as_deref()
            .and_then(|e| url::Url::parse(e).ok())
            .map(|u| outbox_providers::span::redacted_url(&u))
            .unwrap_or_else(|| "from OTEL_EXPORTER_OTLP_*".into()),
        also_set = ?crate::observe::trace::READ_BY_THE_SDK
            .iter()
            .filter(|v| std::env::var_os(v).is_some())
            .collect::<Vec<_>>(),
        "exporting a trace span of every attempt"
    );
    Ok(tracer)
}

async fn run_traced(
    store: Store,
    config: &Config,
    once: bool,
    shutdown: Option<Shutdown>,
    tracer: Tracer,
) -> Outcome {
    if once {
        let providers = prepare(&store, config).await?;
        let engine_config = EngineConfig::from_config(config).with_tracer(tracer);
        let engine = Engine::new(store, providers, engine_config);
        engine.run_once().await?;
        return Ok(());
    }
    let shutdown = shutdown.unwrap_or_else(shutdown_signal);
    let providers = prepare(&store, config).await?;
    let health = Arc::new(Health::default());
    let engine_config = EngineConfig::from_config(config).with_tracer(tracer);
    let owner = engine_config.owner().to_string();
    let engine = Engine::new(store.clone(), providers, engine_config);
    let stop = engine.stop_signal();
    let mut services = Vec::new();
    if let Some(addr) = &config.relay.metrics_addr {
        let addr = addr.parse().map_err(|_| {
            Failure::usage(format!("relay.metrics_addr {addr:?} is not an address"))
        })?;
        let lookup = Access::from_config(&config.relay);
        let (bound, server) =
            endpoint::serve(addr, store.clone(), health.clone(), lookup.clone()).await?;
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
            gauges::gauges_loop(store.clone(), Duration::from_secs(5), stop.clone()),
        ));
    }
    let schedules = config
        .schedules()
        .map_err(|e| Failure::usage(format!("{e:#}")))?;
    services.push(Service::new(
        "schedules",
        crate::services::schedule::run(store.clone(), owner.clone(), schedules, stop.clone()),
    ));
    let health_settings = config
        .health()
        .map_err(|e| Failure::usage(format!("{e:#}")))?;
    services.push(Service::new(
        "destination health",
        crate::services::health::run(
            store.clone(),
            health_settings.clone(),
            owner,
            Duration::from_secs(5),
            stop.clone(),
        ),
    ));
    services.push(Service::new(
        "subscriptions",
        crate::services::subscriptions::upkeep::run(
            store.clone(),
            config.subscriptions.disable_after.0,
            health_settings.alerts.clone(),
            stop.clone(),
        ),
    ));
    services.push(Service::new(
        "retention",
        crate::services::retention::run(store.clone(), config.retention.clone(), stop),
    ));
    engine.run_with(shutdown, services, health).await?;
    Ok(())
}

/// Migrate (a no-op when the schema is current, so a relay role without DDL
/// rights runs against a schema its owner migrated) and build the providers.
async fn prepare(store: &Store, config: &Config) -> Result<outbox_providers::ProviderSet, Failure> {
    store.migrate().await?;
    crate::services::subscriptions::check_key(store, config)
        .await
        .map_err(|e| Failure::new(2, format!("{e:#}")))?;
    let cx = crate::services::subscriptions::context(store, config)
        .map_err(|e| Failure::new(2, format!("{e:#}")))?;
    crate::engine::providers(config, &cx).map_err(|e| {
        // the operator's configuration (exit 2), or this machine (exit 1)
        let setup = matches!(
            e.downcast_ref::<outbox_providers::Error>(),
            Some(outbox_providers::Error::Setup(_))
        );
        Failure::new(if setup { 1 } else { 2 }, format!("{e:#}"))
    })
}

/// Resolves on SIGINT or SIGTERM. The handlers are installed when this is
/// called, not when the future is first polled: the engine polls it only
/// once its claim loop and services are running, and a signal before that
/// took the default action, killing the relay mid-start (possibly
/// mid-claim) instead of stopping it.
pub fn shutdown_signal() -> Shutdown {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let interrupt = signal(SignalKind::interrupt());
        let terminate = signal(SignalKind::terminate());
        Box::pin(async move {
            // a handler that could not be installed never fires
            let received = |s: std::io::Result<tokio::signal::unix::Signal>| async move {
                match s {
                    Ok(mut s) => {
                        s.recv().await;
                    }
                    Err(_) => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                _ = received(interrupt) => tracing::info!("SIGINT received"),
                _ = received(terminate) => tracing::info!("SIGTERM received"),
            }
        })
    }
    #[cfg(not(unix))]
    Box::pin(async {
        if tokio::signal::ctrl_c().await.is_ok() {
            tracing::info!("SIGINT received");
        } else {
            std::future::pending::<()>().await
        }
    })
}

/// What [`shutdown_signal`] returns: resolves on SIGINT or SIGTERM.
pub type Shutdown = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

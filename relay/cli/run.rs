//! `run`: the daemon.

use super::{Failure, Outcome};
use crate::config::Config;
use crate::engine::{Engine, EngineConfig};
use crate::store::Store;

pub async fn run(store: Store, config: &Config, once: bool) -> Outcome {
    store.migrate().await?;
    let providers = config
        .providers()
        .map_err(|e| Failure::usage(format!("{e:#}")))?;
    let engine = Engine::new(store, providers, EngineConfig::from_config(config));
    if once {
        engine.run_once().await?;
    } else {
        engine.run(shutdown_signal()).await?;
    }
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

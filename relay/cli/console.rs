//! `console`: serve the operator web UI and its JSON API; `console
//! --hash-password` makes a password hash for `[[console.users]]`.

use std::io::BufRead;

use clap::Args;

use super::{Failure, Outcome};
use crate::config::Config;
use crate::console::{self, App};
use crate::store::Store;

#[derive(Debug, Args)]
pub struct ConsoleArgs {
    /// Listen here instead of console.addr (port 0 picks a free port).
    #[arg(long)]
    pub addr: Option<String>,
    /// Read a password from stdin, print its Argon2id hash for
    /// `password_hash` in `[[console.users]]`, and exit.
    #[arg(long)]
    pub hash_password: bool,
}

/// `console --hash-password`: needs no database.
pub fn hash_password() -> Outcome {
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .map_err(|e| Failure::new(1, format!("reading the password from stdin: {e}")))?;
    let password = line.trim_end_matches(['\n', '\r']);
    if password.len() < 8 {
        return Err(Failure::usage(
            "the password must be at least 8 characters (read from stdin, one line)",
        ));
    }
    let hash = crate::config::console::hash_password(password)
        .map_err(|e| Failure::new(1, format!("{e:#}")))?;
    println!("{hash}");
    Ok(())
}

pub async fn console(store: Store, mut config: Config, args: ConsoleArgs) -> Outcome {
    if let Some(addr) = args.addr {
        config.console.addr = addr;
        config
            .console
            .validate()
            .map_err(|e| Failure::usage(format!("--addr: {e:#}")))?;
    }
    let addr = config
        .console
        .socket_addr()
        .map_err(|e| Failure::usage(format!("{e:#}")))?;
    console::check_exposure(&config.console, addr).map_err(|e| Failure::usage(format!("{e:#}")))?;
    if !store.migrations_current().await.unwrap_or(false) {
        return Err(Failure::new(
            1,
            "the outbox schema is missing or older than this console: run `outbox-relay migrate`",
        ));
    }
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Failure::new(1, format!("cannot listen on console.addr {addr}: {e}")))?;
    let bound = listener
        .local_addr()
        .map_err(|e| Failure::new(1, format!("console listener: {e}")))?;
    let users = config.console.users.len();
    let app = App::new(store, config).map_err(|e| Failure::usage(format!("{e:#}")))?;
    if users == 0 {
        tracing::warn!(
            %bound,
            "console: no login (no [[console.users]]): anyone on this host can act as an operator; \
             it listens on loopback only"
        );
    } else {
        tracing::info!(%bound, users, "console: login required");
    }
    // the address, for people and for scripts that pass port 0
    println!("console listening on http://{bound}");
    console::serve(listener, app, super::run::shutdown_signal())
        .await
        .map_err(|e| Failure::new(1, format!("console: {e}")))
}

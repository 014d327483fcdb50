//! A tiny webhook receiver for `deploy/demo.sh` and docs/getting-started.md.
//!
//! `demo-receiver [--port PORT] [--port-file PATH]` listens on 127.0.0.1
//! (PORT, or a free port when it is not given), writes the port it listens
//! on to PATH when asked, and answers POSTs on any path: `/gone` → 410,
//! `/flaky` → 503 for the first two requests carrying a given `webhook-id`,
//! then 200; anything else → 200. One line on stdout per request. SIGTERM or
//! SIGINT stops it (exit status 0).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::routing::post;
use axum::Router;

type Seen = Arc<Mutex<HashMap<String, u32>>>;

const USAGE: &str = "usage: demo-receiver [--port PORT] [--port-file PATH]";

async fn handle(State(seen): State<Seen>, uri: Uri, headers: HeaderMap) -> StatusCode {
    let path = uri.path();
    let id = headers
        .get("webhook-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_string();
    let status = match path {
        "/gone" => StatusCode::GONE,
        "/flaky" => {
            let mut seen = seen.lock().unwrap();
            let n = seen.entry(id.clone()).or_insert(0);
            *n += 1;
            if *n <= 2 {
                StatusCode::SERVICE_UNAVAILABLE
            } else {
                StatusCode::OK
            }
        }
        _ => StatusCode::OK,
    };
    println!(
        "receiver: POST {path} webhook-id={id} -> {}",
        status.as_u16()
    );
    status
}

/// Resolves on SIGTERM or SIGINT.
#[cfg(unix)]
async fn stop_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

/// Resolves on Ctrl-C.
#[cfg(not(unix))]
async fn stop_signal() {
    if tokio::signal::ctrl_c().await.is_err() {
        std::future::pending::<()>().await
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mut port: u16 = 0;
    let mut port_file = None;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--port" => {
                port = args
                    .next()
                    .and_then(|p| p.parse().ok())
                    .ok_or(format!("--port takes a port number; {USAGE}"))?
            }
            "--port-file" => port_file = Some(args.next().ok_or(USAGE)?),
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => return Err(format!("unknown argument {other:?}; {USAGE}").into()),
        }
    }
    let app = Router::new()
        .route("/", post(handle))
        .route("/{*path}", post(handle))
        .with_state(Seen::default());
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .map_err(|e| format!("cannot listen on 127.0.0.1:{port}: {e}"))?;
    let port = listener.local_addr()?.port();
    if let Some(port_file) = port_file {
        // Write then rename, so a waiting script never reads a half-written file.
        let tmp = format!("{port_file}.tmp");
        std::fs::write(&tmp, format!("{port}\n"))?;
        std::fs::rename(&tmp, &port_file)?;
    }
    println!("receiver: listening on 127.0.0.1:{port}");
    axum::serve(listener, app)
        .with_graceful_shutdown(stop_signal())
        .await?;
    println!("receiver: stopped");
    Ok(())
}

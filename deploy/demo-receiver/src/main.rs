//! A tiny webhook receiver for `deploy/demo.sh`.
//!
//! `cargo run -p outbox-demo-receiver -- --port-file PATH` binds 127.0.0.1:0,
//! writes the chosen port to PATH and answers POSTs on any path:
//! `/gone` → 410, `/flaky` → 503 for the first two requests carrying a given
//! `webhook-id`, then 200; anything else → 200. One log line per request.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::routing::post;
use axum::Router;

type Seen = Arc<Mutex<HashMap<String, u32>>>;

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

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mut port_file = None;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--port-file" => port_file = args.next(),
            other => return Err(format!("unknown argument {other:?}").into()),
        }
    }
    let port_file = port_file.ok_or("usage: demo-receiver --port-file PATH")?;
    let app = Router::new()
        .route("/", post(handle))
        .route("/{*path}", post(handle))
        .with_state(Seen::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    // Write then rename, so a waiting script never reads a half-written file.
    let tmp = format!("{port_file}.tmp");
    std::fs::write(&tmp, format!("{port}\n"))?;
    std::fs::rename(&tmp, &port_file)?;
    println!("receiver: listening on 127.0.0.1:{port}");
    axum::serve(listener, app).await?;
    Ok(())
}

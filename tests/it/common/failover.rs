//! A stable database address in front of a primary and its standby:
//! HAProxy (Debian's package, tests/peers/haproxy.sh) sends connections to
//! whichever node its health check finds primary, as Patroni-style
//! deployments do. Each node's check is an HTTP endpoint here that answers
//! `GET /primary` with 200 when the node is a primary that answers and 503
//! otherwise (Patroni's REST API answers the same question).

use std::process::Stdio;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use sqlx::Connection;

use super::free_port;

/// HAProxy and the role checks; stopped on drop.
pub struct Haproxy {
    pub url: String,
    child: tokio::process::Child,
    checks: Vec<tokio::task::JoinHandle<()>>,
    config: std::path::PathBuf,
}

/// Answer `GET /primary`: 200 when the node at `url` is a primary.
async fn primary(State(url): State<String>) -> StatusCode {
    let check = async {
        let mut conn = sqlx::PgConnection::connect(&url).await.ok()?;
        let standby: bool = sqlx::query_scalar("SELECT pg_is_in_recovery()")
            .fetch_one(&mut conn)
            .await
            .ok()?;
        let _ = conn.close().await;
        Some(!standby)
    };
    match tokio::time::timeout(Duration::from_millis(800), check).await {
        Ok(Some(true)) => StatusCode::OK,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    }
}

impl Haproxy {
    /// Front the nodes (their `postgres://` URLs and ports) on a free port.
    pub async fn start(nodes: &[(&str, u16)]) -> Haproxy {
        let out = std::process::Command::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/peers/haproxy.sh"
        ))
        .stderr(Stdio::inherit())
        .output()
        .expect("run tests/peers/haproxy.sh");
        assert!(
            out.status.success(),
            "the failover drill needs HAProxy; tests/peers/haproxy.sh failed (see above)"
        );
        let bin = String::from_utf8(out.stdout).unwrap().trim().to_string();
        let mut checks = Vec::new();
        let mut servers = String::new();
        for (i, (url, port)) in nodes.iter().enumerate() {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let check_port = listener.local_addr().unwrap().port();
            let app = axum::Router::new()
                .route("/primary", get(primary))
                .with_state(url.to_string());
            checks.push(tokio::spawn(async move {
                let _ = axum::serve(listener, app).await;
            }));
            servers.push_str(&format!(
                "    server node{i} 127.0.0.1:{port} check port {check_port}\n"
            ));
        }
        let port = free_port();
        // a node is marked down after two failed checks 200 ms apart, and
        // the sessions it held are cut; up after one good check. Every node
        // starts up until its first check: `balance first` sends
        // connections to the first node up, the primary the caller names
        // first
        let config = format!(
            "global
    maxconn 1000
defaults
    mode tcp
    timeout connect 1s
    timeout client 10m
    timeout server 10m
    timeout check 1s
listen postgres
    bind 127.0.0.1:{port}
    balance first
    option httpchk GET /primary
    http-check expect status 200
    default-server inter 200ms fastinter 100ms downinter 200ms fall 2 rise 1 on-marked-down shutdown-sessions
{servers}"
        );
        let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("haproxy-{}-{port}.cfg", std::process::id()));
        std::fs::write(&path, config).unwrap();
        let child = tokio::process::Command::new(bin)
            .arg("-db")
            .arg("-f")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("start haproxy");
        let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
        let up = super::wait_for(Duration::from_secs(15), || async {
            let Ok(mut conn) = sqlx::PgConnection::connect(&url).await else {
                return false;
            };
            let standby: Result<bool, _> = sqlx::query_scalar("SELECT pg_is_in_recovery()")
                .fetch_one(&mut conn)
                .await;
            matches!(standby, Ok(false))
        })
        .await;
        assert!(up, "HAProxy on port {port} did not reach a primary");
        Haproxy {
            url,
            child,
            checks,
            config: path,
        }
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        for c in &self.checks {
            c.abort();
        }
        let _ = std::fs::remove_file(&self.config);
    }
}

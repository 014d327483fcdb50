//! What the bench's tests share: the server they run it against, and the
//! bench's binary set up for it.

use std::process::Output;
use std::time::Duration;

use tokio::process::Command;

/// The server the bench creates its scratch databases on.
pub fn server() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// `outbox-relay-bench` against `server`, without a configuration file
/// and logging warnings: a test adds its arguments and settings.
pub fn bench(server: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_outbox-relay-bench"));
    cmd.env_remove("OUTBOX_RELAY_CONFIG")
        .env("RUST_LOG", "warn")
        .env("DATABASE_URL", server);
    cmd
}

/// Run `cmd` to its end, killed and failing the test past `limit`.
#[allow(dead_code)] // not every test binary bounds its run
pub async fn output_within(cmd: &mut Command, limit: Duration) -> Output {
    tokio::time::timeout(limit, cmd.kill_on_drop(true).output())
        .await
        .unwrap_or_else(|_| panic!("the bench did not end within {limit:?}"))
        .expect("run outbox-relay-bench")
}

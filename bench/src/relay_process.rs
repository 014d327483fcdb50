//! The relay processes the bench starts: this binary (or another build)
//! run as `outbox-relay` (see [`crate::RUN_AS_RELAY`]) in a clean
//! environment, so that nothing of the caller's configuration (its
//! schedules, provider credentials, tuning) reaches them, delivering to the
//! bench's loopback receivers.

use std::path::Path;
use std::process::Stdio;

use tokio::process::Command;

/// `exe subcommand` against `db_url`, webhooks allowed to 127.0.0.1, its
/// input and output closed, killed when dropped; the caller adds its own
/// settings and `RUST_LOG`.
pub(crate) fn relay_process(exe: &Path, subcommand: &str, db_url: &str) -> Command {
    let mut cmd = Command::new(exe);
    cmd.arg(subcommand)
        .env_clear()
        .env(crate::RUN_AS_RELAY, "1")
        .env("DATABASE_URL", db_url)
        .env(
            "OUTBOX_RELAY__WEBHOOK__ALLOWED_NETWORKS",
            "[\"127.0.0.1/32\"]",
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .kill_on_drop(true);
    cmd
}

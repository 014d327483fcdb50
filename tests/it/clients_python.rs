//! The Python client (`clients/python`, import `outbox_relay`): its own
//! check — ruff, mypy --strict, and its pytest suite against a migrated
//! database of this harness and the relay binary built for these tests —
//! run from here, so that it is part of the suite.

use std::path::Path;

use crate::common::{relay_bin, TestDb};

/// `clients/python/check.sh` passes: every connection type (psycopg 3 sync
/// and async, psycopg2, SQLAlchemy, Django) writes intents in the caller's
/// transaction, and the relay delivers them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_client_passes_its_check() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let venv = root.join("target/clients/python-venv");
    assert!(
        venv.join(".installed").is_file(),
        "the Python client's private environment {} is missing: run clients/python/setup.sh",
        venv.display()
    );
    let db = TestDb::new().await;
    let out = tokio::process::Command::new("bash")
        .arg(root.join("clients/python/check.sh"))
        .env("DATABASE_URL", &db.url)
        .env("OUTBOX_RELAY_BIN", relay_bin())
        .env_remove("OUTBOX_RELAY_CONFIG")
        .output()
        .await
        .expect("run clients/python/check.sh");
    assert!(
        out.status.success(),
        "clients/python/check.sh failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(" passed") && !stdout.contains(" failed"),
        "pytest said:\n{stdout}"
    );
}

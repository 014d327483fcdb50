//! The TypeScript client, `clients/typescript`: its `check.sh` (the strict
//! type-check, the build and the `node:test` suite, which enqueues through
//! node-postgres, Knex and Kysely and has this build's relay deliver to a
//! receiver on 127.0.0.1) against a fresh migrated database. The client's
//! private environment comes from `clients/typescript/setup.sh`; without it
//! this test fails, saying so.

use std::path::Path;
use std::process::Command;

use crate::common::{relay_bin, TestDb};

const CLIENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/clients/typescript");

#[tokio::test]
async fn the_typescript_client_passes_its_checks_against_postgres_and_the_relay() {
    let dir = Path::new(CLIENT);
    assert!(
        dir.join("node_modules/.outbox-relay-lock").is_file(),
        "the TypeScript client's private environment is missing: run clients/typescript/setup.sh \
         (it installs the locked npm packages into clients/typescript/node_modules)"
    );
    let db = TestDb::new().await;
    let url = db.url.clone();
    let out = tokio::task::spawn_blocking(move || {
        Command::new("bash")
            .arg(dir.join("check.sh"))
            .env("DATABASE_URL", url)
            .env("OUTBOX_RELAY_BIN", relay_bin())
            .output()
    })
    .await
    .unwrap()
    .expect("bash runs clients/typescript/check.sh");
    assert!(
        out.status.success(),
        "clients/typescript/check.sh failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

//! Every CLI verb against a real database, through the real binary.

use crate::common;
use crate::common::{relay_bin, Receiver, TestDb};
use serde_json::{json, Value};

pub(crate) struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

mod intents;
mod operate;
mod output;

impl Out {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.stdout))
    }
}

pub(crate) async fn cli_env(db_url: Option<&str>, args: &[&str], env: &[(&str, &str)]) -> Out {
    let mut cmd = tokio::process::Command::new(relay_bin());
    cmd.args(args)
        .env_remove("DATABASE_URL")
        .env_remove("OUTBOX_RELAY_CONFIG")
        .env(
            "OUTBOX_RELAY__WEBHOOK__ALLOWED_NETWORKS",
            "[\"127.0.0.0/8\"]",
        )
        .env("OUTBOX_RELAY__RELAY__METRICS_ADDR", "\"127.0.0.1:0\"")
        .env("RUST_LOG", "warn");
    if let Some(url) = db_url {
        cmd.env("DATABASE_URL", url);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().await.expect("run outbox-relay");
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

async fn cli(db: &TestDb, args: &[&str]) -> Out {
    cli_env(Some(&db.url), args, &[]).await
}

async fn ok(db: &TestDb, args: &[&str]) -> Out {
    let out = cli(db, args).await;
    assert_eq!(out.code, 0, "{args:?} failed: {}{}", out.stdout, out.stderr);
    out
}

fn payload(rx: &Receiver, path: &str) -> String {
    json!({"url": rx.url(path), "body": {"hello": "world"}}).to_string()
}

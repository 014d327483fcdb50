//! A private PostgreSQL cluster for one test (tests/peers/pg-cluster.sh):
//! one it may restart, or whose TLS certificate it knows.

use std::process::Command as StdCommand;
use std::time::{Duration, Instant};

/// A running cluster; stopped and removed on drop.
pub struct Cluster {
    pub url: String,
    pub dir: String,
}

impl Cluster {
    fn script() -> String {
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/peers/pg-cluster.sh").to_string()
    }

    pub fn start(prefix: &str) -> Cluster {
        let name = format!("{prefix}-{}-{:04x}", std::process::id(), fastrand::u16(..));
        let out = StdCommand::new(Cluster::script())
            .args(["start", &name])
            .stderr(std::process::Stdio::inherit())
            .output()
            .expect("run tests/peers/pg-cluster.sh");
        assert!(
            out.status.success(),
            "this test needs a private PostgreSQL cluster; tests/peers/pg-cluster.sh start failed (see above)"
        );
        let text = String::from_utf8(out.stdout).unwrap();
        let mut lines = text.lines();
        Cluster {
            url: lines.next().expect("url").to_string(),
            dir: lines.next().expect("dir").to_string(),
        }
    }

    pub fn restart(&self) -> Duration {
        let started = Instant::now();
        let status = StdCommand::new(Cluster::script())
            .args(["restart", &self.dir])
            .status()
            .unwrap();
        assert!(status.success(), "pg_ctl restart failed");
        started.elapsed()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = StdCommand::new(Cluster::script())
            .args(["stop", &self.dir])
            .status();
    }
}

impl Cluster {
    /// The CA that signed the cluster's certificate, when it has TLS.
    pub fn certificate(&self) -> Option<std::path::PathBuf> {
        let p = std::path::Path::new(&self.dir).join("ca.crt");
        p.exists().then_some(p)
    }
}

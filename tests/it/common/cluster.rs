//! A private PostgreSQL cluster for one test (tests/peers/pg-cluster.sh):
//! one it may restart, kill, replicate and promote, or whose TLS
//! certificate it knows.

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
        Cluster::run(&["start", &Cluster::name(prefix)])
    }

    /// An asynchronous streaming standby of this cluster (pg_basebackup -R).
    pub fn replica(&self, prefix: &str) -> Cluster {
        Cluster::run(&["replica", &self.dir, &Cluster::name(prefix)])
    }

    fn name(prefix: &str) -> String {
        format!("{prefix}-{}-{:04x}", std::process::id(), fastrand::u16(..))
    }

    fn run(args: &[&str]) -> Cluster {
        let out = StdCommand::new(Cluster::script())
            .args(args)
            .stderr(std::process::Stdio::inherit())
            .output()
            .expect("run tests/peers/pg-cluster.sh");
        assert!(
            out.status.success(),
            "this test needs a private PostgreSQL cluster; tests/peers/pg-cluster.sh {} failed (see above)",
            args[0]
        );
        let text = String::from_utf8(out.stdout).unwrap();
        let mut lines = text.lines();
        Cluster {
            url: lines.next().expect("url").to_string(),
            dir: lines.next().expect("dir").to_string(),
        }
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.url
            .rsplit(':')
            .next()
            .and_then(|p| p.split('/').next())
            .and_then(|p| p.parse().ok())
            .expect("the cluster's URL has a port")
    }

    /// SIGKILL the server and every process of it, as when its machine dies.
    pub fn kill(&self) {
        let status = StdCommand::new(Cluster::script())
            .args(["kill", &self.dir])
            .status()
            .unwrap();
        assert!(status.success(), "pg-cluster.sh kill failed");
    }

    /// Promote a standby (pg_ctl promote, waiting until it is a primary).
    pub fn promote(&self) {
        let status = StdCommand::new(Cluster::script())
            .args(["promote", &self.dir])
            .status()
            .unwrap();
        assert!(status.success(), "pg_ctl promote failed");
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

/// `pg_receivewal --synchronous` archiving a cluster's WAL: a walsender in
/// state streaming that flushes at once, but no server a failover can
/// promote. Stopped on drop.
pub struct WalArchiver {
    child: std::process::Child,
    dir: std::path::PathBuf,
}

impl Cluster {
    /// Start `pg_receivewal --synchronous` against this cluster, under its
    /// default application_name (`pg_receivewal`), or `name`.
    pub fn archive_wal(&self, name: Option<&str>) -> WalArchiver {
        let out = StdCommand::new(Cluster::script())
            .args(["tool", "pg_receivewal"])
            .output()
            .expect("run tests/peers/pg-cluster.sh tool");
        assert!(out.status.success(), "pg_receivewal not found");
        let program = String::from_utf8(out.stdout).unwrap().trim().to_string();
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "receivewal-{}-{:04x}",
            std::process::id(),
            fastrand::u16(..)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let mut url = url::Url::parse(&self.url).expect("the cluster's URL");
        if let Some(name) = name {
            url.query_pairs_mut().append_pair("application_name", name);
        }
        let child = StdCommand::new(program)
            .args(["--synchronous", "--no-loop", "--no-password", "-d"])
            .arg(url.as_str())
            .arg("-D")
            .arg(&dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .expect("start pg_receivewal");
        WalArchiver { child, dir }
    }
}

impl Drop for WalArchiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

//! The real SMTP peer (aiosmtpd, tests/peers/smtp_peer.py) as a child process.

use std::path::PathBuf;

use tokio::io::{AsyncBufReadExt, BufReader};

pub struct SmtpPeer {
    pub port: u16,
    record: PathBuf,
    _child: tokio::process::Child,
}

impl SmtpPeer {
    /// Start the peer. Fails loudly when Python or aiosmtpd is missing
    /// (tests/run.sh installs them).
    pub async fn start() -> SmtpPeer {
        SmtpPeer::start_with(&[]).await
    }

    /// Start the peer with extra arguments (e.g. `--drop-rate 0.01`).
    pub async fn start_with(args: &[&str]) -> SmtpPeer {
        let python = std::env::var("OUTBOX_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
        let record = std::env::temp_dir().join(format!(
            "outbox-smtp-{}-{:08x}.jsonl",
            std::process::id(),
            fastrand::u32(..)
        ));
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/peers/smtp_peer.py");
        let mut child = tokio::process::Command::new(&python)
            .arg(script)
            .arg("--record")
            .arg(&record)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {python} for the SMTP peer ({e}); run the suite with tests/run.sh, which installs python3 and aiosmtpd"));
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let line = tokio::time::timeout(std::time::Duration::from_secs(20), lines.next_line())
            .await
            .expect("the SMTP peer starts within 20s")
            .unwrap()
            .unwrap_or_else(|| panic!("the SMTP peer exited: is aiosmtpd installed for {python}? (tests/run.sh installs it)"));
        let port = line
            .strip_prefix("PORT ")
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("unexpected SMTP peer output: {line}"));
        SmtpPeer {
            port,
            record,
            _child: child,
        }
    }

    pub fn url(&self) -> String {
        format!("smtp://127.0.0.1:{}", self.port)
    }

    /// Every message the server received, in order.
    pub fn messages(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.record)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

impl Drop for SmtpPeer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.record);
    }
}

//! A relay subprocess whose stderr is read as it is written.
//!
//! A pipe the test reads only after the relay stops fills at 64 KiB: the
//! relay's next log line then blocks the thread writing it, a runtime worker,
//! and with both workers blocked it stops answering. So a relay (or
//! console) that a test keeps running and whose logs it reads is spawned
//! through [`LoggedRelay::spawn`]; a one-shot command's `output()` reads
//! its pipes as it runs.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncBufReadExt;

pub struct LoggedRelay {
    pub child: tokio::process::Child,
    logs: Arc<Mutex<String>>,
    reader: tokio::task::JoinHandle<()>,
}

impl LoggedRelay {
    /// Spawn `cmd` with its stderr collected line by line (stdout is left
    /// as the command set it).
    pub fn spawn(cmd: &mut tokio::process::Command) -> LoggedRelay {
        let mut child = cmd
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn relay");
        let logs = Arc::new(Mutex::new(String::new()));
        // by bytes, so a line that is not UTF-8 is kept (lossily) and the
        // pipe is still drained after it
        let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).split(b'\n');
        let sink = logs.clone();
        let reader = tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_segment().await {
                let mut s = sink.lock().unwrap();
                s.push_str(&String::from_utf8_lossy(&line));
                s.push('\n');
            }
        });
        LoggedRelay {
            child,
            logs,
            reader,
        }
    }

    /// What the relay has logged so far.
    pub fn logs(&self) -> String {
        self.logs.lock().unwrap().clone()
    }

    /// Whether `needle` appears in the logs within 15 s.
    pub async fn wait_for_log(&self, needle: &str) -> bool {
        super::wait_for(Duration::from_secs(15), || async {
            self.logs().contains(needle)
        })
        .await
    }

    /// SIGTERM the relay, wait for it, and return its exit status and
    /// everything it logged.
    pub async fn stop(mut self) -> (std::process::ExitStatus, String) {
        let status = super::terminate(&mut self.child).await;
        (status, self.finish().await)
    }

    /// Wait up to `within` for the relay to exit on its own: its exit
    /// status and everything it logged.
    pub async fn exited(mut self, within: Duration) -> (std::process::ExitStatus, String) {
        let status = tokio::time::timeout(within, self.child.wait())
            .await
            .expect("the relay exits")
            .expect("wait");
        (status, self.finish().await)
    }

    /// The logs once the process is gone: its pipe closes with it, and the
    /// reader ends at that end of file.
    async fn finish(&mut self) -> String {
        tokio::time::timeout(Duration::from_secs(15), &mut self.reader)
            .await
            .expect("the relay's stderr closes after it exits")
            .expect("the log reader");
        self.logs()
    }
}

//! A private `nats-server -js` (its own loopback port and store directory),
//! stopped with the test.

use std::time::Duration;

pub struct NatsServer {
    pub port: u16,
    store: std::path::PathBuf,
    /// Started with `-js`.
    jetstream: bool,
    child: Option<tokio::process::Child>,
}

impl NatsServer {
    /// Start it and wait until it answers. Fails loudly when nats-server is
    /// missing (tests/run.sh installs Debian's nats-server).
    pub async fn start() -> NatsServer {
        NatsServer::start_with(true).await
    }

    /// A core NATS server: no JetStream at all.
    pub async fn start_without_jetstream() -> NatsServer {
        NatsServer::start_with(false).await
    }

    async fn start_with(jetstream: bool) -> NatsServer {
        let port = super::free_port();
        let store = std::env::temp_dir().join(format!(
            "outbox-nats-{}-{:08x}",
            std::process::id(),
            fastrand::u32(..)
        ));
        let mut server = NatsServer {
            port,
            store,
            jetstream,
            child: None,
        };
        server.up().await;
        server
    }

    /// Start the server (again, on the same port and store) and wait until
    /// JetStream answers (or, without JetStream, the server).
    async fn up(&mut self) {
        let mut command = tokio::process::Command::new("nats-server");
        command.args(["-a", "127.0.0.1", "-p", &self.port.to_string()]);
        if self.jetstream {
            command.arg("-js").arg("-sd").arg(&self.store);
        }
        let child = command
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start nats-server ({e}); run the suite with tests/run.sh, which installs it (apt-get install nats-server)")
            });
        self.child = Some(child);
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let why = match async_nats::connect(self.url()).await {
                // JetStream is up once its API answers
                Ok(_) if !self.jetstream => break,
                Ok(client) => match client.request("$JS.API.INFO", "".into()).await {
                    Ok(_) => break,
                    Err(e) => e.to_string(),
                },
                Err(e) => e.to_string(),
            };
            assert!(
                std::time::Instant::now() < deadline,
                "nats-server did not start within 20s: {why}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGKILL the server and start it again on its store; returns how long
    /// it was away.
    pub async fn restart(&mut self) -> Duration {
        let began = std::time::Instant::now();
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
        self.up().await;
        began.elapsed()
    }

    /// Every message of stream `name`: (subject, Nats-Msg-Id, payload).
    pub async fn messages(&self, name: &str) -> Vec<(String, String, String)> {
        let js = self.jetstream().await;
        let s = js.get_stream(name).await.unwrap();
        let mut out = Vec::new();
        let last = s.cached_info().state.last_sequence;
        for seq in 1..=last {
            if let Ok(m) = s.get_raw_message(seq).await {
                out.push((
                    m.subject.to_string(),
                    m.headers
                        .get(async_nats::header::NATS_MESSAGE_ID)
                        .map(|v| v.as_str().to_string())
                        .unwrap_or_default(),
                    String::from_utf8_lossy(&m.payload).into_owned(),
                ));
            }
        }
        out
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    pub async fn jetstream(&self) -> async_nats::jetstream::Context {
        async_nats::jetstream::new(async_nats::connect(self.url()).await.unwrap())
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.store);
    }
}

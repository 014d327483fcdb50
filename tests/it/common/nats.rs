//! A private `nats-server -js` (its own loopback port and store directory),
//! stopped with the test.

use std::time::Duration;

pub struct NatsServer {
    pub port: u16,
    store: std::path::PathBuf,
    _child: tokio::process::Child,
}

impl NatsServer {
    /// Start it and wait until it answers. Fails loudly when nats-server is
    /// missing (tests/run.sh installs Debian's nats-server).
    pub async fn start() -> NatsServer {
        let port = super::free_port();
        let store = std::env::temp_dir().join(format!(
            "outbox-nats-{}-{:08x}",
            std::process::id(),
            fastrand::u32(..)
        ));
        let child = tokio::process::Command::new("nats-server")
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
            .arg(&store)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start nats-server ({e}); run the suite with tests/run.sh, which installs it (apt-get install nats-server)")
            });
        let server = NatsServer {
            port,
            store,
            _child: child,
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let why = match async_nats::connect(server.url()).await {
                // JetStream is up once its API answers
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
        server
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

//! RabbitMQ for the `amqp` tests: the broker tests/run.sh made available
//! (`OUTBOX_TEST_AMQP_URL` and `OUTBOX_TEST_AMQP_PASSWORD`, else the
//! machine's on 127.0.0.1:5672 as guest), where each test declares its own
//! exchange and exclusive queue; a private node for the drills that stop
//! the broker; and a TCP proxy that can hold the broker's answers back.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A broker to publish to: the URL as the relay is configured with it (no
/// password in it) and the password.
#[derive(Clone)]
pub struct Rabbit {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: String,
}

impl Rabbit {
    /// The suite's broker.
    pub fn shared() -> Rabbit {
        let url = std::env::var("OUTBOX_TEST_AMQP_URL")
            .unwrap_or_else(|_| "amqp://guest@127.0.0.1:5672/%2f".into());
        let parsed = reqwest::Url::parse(&url).expect("OUTBOX_TEST_AMQP_URL is a URL");
        Rabbit {
            host: parsed.host_str().unwrap_or("127.0.0.1").to_string(),
            port: parsed.port().unwrap_or(5672),
            user: match parsed.username() {
                "" => "guest".into(),
                u => u.to_string(),
            },
            password: std::env::var("OUTBOX_TEST_AMQP_PASSWORD").unwrap_or_else(|_| "guest".into()),
        }
    }

    /// The relay's `amqp.url`.
    pub fn url(&self) -> String {
        format!("amqp://{}@{}:{}/%2f", self.user, self.host, self.port)
    }

    /// The same broker on another port (a proxy in front of it).
    pub fn via(&self, port: u16) -> Rabbit {
        Rabbit {
            host: "127.0.0.1".into(),
            port,
            ..self.clone()
        }
    }

    /// A connection of the test's own, with a clear failure when there is
    /// no broker, or one that does not answer within 30 s.
    pub async fn connect(&self) -> Connection {
        let url = format!(
            "amqp://{}:{}@{}:{}/%2f",
            self.user, self.password, self.host, self.port
        );
        match tokio::time::timeout(
            Duration::from_secs(30),
            Connection::connect(&url, ConnectionProperties::default()),
        )
        .await
        {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => panic!(
                "no RabbitMQ at {}:{} ({e}); run the suite with tests/run.sh, which installs and starts one",
                self.host, self.port
            ),
            Err(_) => panic!(
                "RabbitMQ at {}:{} took the connection but did not open it within 30s",
                self.host, self.port
            ),
        }
    }

    /// A fresh direct exchange with `routing_key` bound to an exclusive
    /// queue (both gone with the returned channel's connection). Returns
    /// the channel, the exchange and the queue names.
    pub async fn topology(&self, routing_key: &str) -> (Connection, Channel, String, String) {
        self.topology_with(routing_key, FieldTable::default()).await
    }

    /// [`Rabbit::topology`] with arguments for the queue (`x-max-length`).
    pub async fn topology_with(
        &self,
        routing_key: &str,
        queue_arguments: FieldTable,
    ) -> (Connection, Channel, String, String) {
        let conn = self.connect().await;
        let ch = conn.create_channel().await.unwrap();
        let tag = format!("{}-{:08x}", std::process::id(), fastrand::u32(..));
        let exchange = format!("outbox-test-{tag}");
        let queue = format!("outbox-test-q-{tag}");
        ch.exchange_declare(
            exchange.as_str().into(),
            ExchangeKind::Direct,
            ExchangeDeclareOptions {
                auto_delete: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
        ch.queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions {
                exclusive: true,
                ..Default::default()
            },
            queue_arguments,
        )
        .await
        .unwrap();
        ch.queue_bind(
            queue.as_str().into(),
            exchange.as_str().into(),
            routing_key.into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
        (conn, ch, exchange, queue)
    }
}

/// A durable direct exchange and a durable queue bound to it with routing
/// key `e`: a topology that outlives a broker restart.
pub async fn declare_durable(ch: &lapin::Channel, exchange: &str, queue: &str) {
    ch.exchange_declare(
        exchange.into(),
        ExchangeKind::Direct,
        ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    ch.queue_declare(
        queue.into(),
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    ch.queue_bind(
        queue.into(),
        exchange.into(),
        "e".into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
}

/// The first message waiting in `queue`, taken off it with one get.
pub async fn take_one(ch: &Channel, queue: &str) -> Option<lapin::message::BasicGetMessage> {
    ch.basic_get(queue.into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
}

/// Every message waiting in `queue`, taken off it.
pub async fn drain(ch: &Channel, queue: &str) -> Vec<lapin::message::BasicGetMessage> {
    let mut out = Vec::new();
    while let Some(m) = take_one(ch, queue).await {
        out.push(m);
    }
    out
}

/// The `message_id` of each message.
pub fn message_ids(messages: &[lapin::message::BasicGetMessage]) -> Vec<String> {
    messages
        .iter()
        .map(|m| {
            m.delivery
                .properties
                .message_id()
                .as_ref()
                .map(|id| id.to_string())
                .unwrap_or_default()
        })
        .collect()
}

/// A private RabbitMQ node (own ports, own data directory), for a test
/// that stops and restarts the broker. Stopped and removed on drop.
pub struct RabbitNode {
    pub port: u16,
    dist_port: u16,
    dir: PathBuf,
    name: String,
}

impl RabbitNode {
    pub async fn start() -> RabbitNode {
        let dir = std::env::temp_dir().join(format!(
            "outbox-rabbit-{}-{:08x}",
            std::process::id(),
            fastrand::u32(..)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let node = RabbitNode {
            port: super::free_port(),
            dist_port: super::free_port(),
            name: format!("outbox{:08x}@localhost", fastrand::u32(..)),
            dir,
        };
        node.up().await;
        node
    }

    fn server() -> PathBuf {
        ["/usr/lib/rabbitmq/bin/rabbitmq-server", "/usr/sbin/rabbitmq-server"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.exists())
            .expect("rabbitmq-server is not installed; tests/run.sh installs it (apt-get install rabbitmq-server)")
    }

    /// Start the node (again, on its data) and wait until it takes AMQP.
    pub async fn up(&self) {
        let d = &self.dir;
        let status = std::process::Command::new(Self::server())
            .arg("-detached")
            .env("HOME", d)
            .env("RABBITMQ_NODENAME", &self.name)
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODE_PORT", self.port.to_string())
            .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
            .env("RABBITMQ_MNESIA_BASE", d.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", d.join("log"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", d.join("plugins"))
            .env("RABBITMQ_CONFIG_FILE", d.join("rabbitmq"))
            .env("RABBITMQ_PID_FILE", d.join("pid"))
            .status()
            .expect("cannot run rabbitmq-server");
        assert!(status.success(), "rabbitmq-server -detached failed");
        let rabbit = self.rabbit();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let url = format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port);
        loop {
            // a node still booting may take the TCP connection and not
            // answer on it: each try is bounded
            let tried = tokio::time::timeout(
                Duration::from_secs(5),
                Connection::connect(&url, ConnectionProperties::default()),
            )
            .await
            .map_err(|_| "no answer within 5s".to_string())
            .and_then(|c| c.map_err(|e| e.to_string()));
            match tried {
                Ok(c) => {
                    let _ = c.close(200, "up".into()).await;
                    break;
                }
                Err(e) => assert!(
                    std::time::Instant::now() < deadline,
                    "the private RabbitMQ node did not start within 60s ({e}); its log is in {}",
                    self.dir.join("log").display()
                ),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        drop(rabbit);
    }

    /// Kill the node (SIGKILL: no clean shutdown) and wait until it is gone.
    ///
    /// The topology the test declared is written to disk first. The broker
    /// logs metadata (exchanges, queues, bindings) to Mnesia asynchronously,
    /// so a SIGKILL soon after a declare can lose the last binding, and the
    /// restarted broker answers NO_ROUTE for good. Messages are unaffected:
    /// a persistent message is confirmed only once it is on disk.
    pub async fn kill(&self) {
        let Ok(pid) = std::fs::read_to_string(self.dir.join("pid")) else {
            return;
        };
        self.dump_metadata_log();
        let pid = pid.trim().to_string();
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &pid])
            .status();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::path::Path::new(&format!("/proc/{pid}")).exists()
            && std::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = std::fs::remove_file(self.dir.join("pid"));
    }

    /// `mnesia:dump_log()` on the node, through rabbitmqctl (the node's
    /// cookie is in its HOME).
    fn dump_metadata_log(&self) {
        let ctl = Self::server().with_file_name("rabbitmqctl");
        let out = std::process::Command::new(&ctl)
            .env("HOME", &self.dir)
            .args(["-n", &self.name, "-t", "30", "eval", "mnesia:dump_log()."])
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", ctl.display()));
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains("dumped"),
            "rabbitmqctl eval mnesia:dump_log() failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub fn rabbit(&self) -> Rabbit {
        Rabbit {
            host: "127.0.0.1".into(),
            port: self.port,
            user: "guest".into(),
            password: "guest".into(),
        }
    }
}

impl Drop for RabbitNode {
    fn drop(&mut self) {
        // a test that failed shows what the broker logged
        if std::thread::panicking() {
            for log in super::files_under(&self.dir.join("log"), "log") {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(60).collect();
                eprintln!("--- the last lines of {}:", log.display());
                for line in tail.into_iter().rev() {
                    eprintln!("{line}");
                }
            }
        }
        if let Ok(pid) = std::fs::read_to_string(self.dir.join("pid")) {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", pid.trim()])
                .status();
        }
        // epmd (started with the node) stays for the next node
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A TCP proxy in front of a broker that, once armed, swallows everything
/// the broker sends after the client's next `basic.publish`: the publish
/// reaches the broker (and its queue), its confirm never comes back. What
/// the relay sees when a connection dies between a publish and its confirm.
pub struct HoldingProxy {
    pub port: u16,
    armed: Arc<AtomicBool>,
    held: Arc<AtomicBool>,
    /// Close the connection instead of holding its answers.
    cut: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

/// AMQP 0-9-1 `basic.publish`: class 60, method 40.
const BASIC_PUBLISH: [u8; 4] = [0, 60, 0, 40];

impl HoldingProxy {
    pub async fn start(upstream: &Rabbit) -> HoldingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let armed = Arc::new(AtomicBool::new(false));
        let held = Arc::new(AtomicBool::new(false));
        let cut = Arc::new(AtomicBool::new(false));
        let upstream = format!("{}:{}", upstream.host, upstream.port);
        let (a, h, c) = (armed.clone(), held.clone(), cut.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                let (armed, held, cut) = (a.clone(), h.clone(), c.clone());
                tokio::spawn(async move {
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let up = pass_frames(&mut cr, &mut sw, &armed, &held);
                    // server to client: swallowed once held
                    let down = async {
                        let mut buf = vec![0u8; 64 * 1024];
                        loop {
                            let n = sr.read(&mut buf).await?;
                            if n == 0 {
                                return Ok::<_, std::io::Error>(());
                            }
                            if held.load(Ordering::SeqCst) && cut.load(Ordering::SeqCst) {
                                // the broker answered the publish: drop the
                                // connection before the answer gets through
                                return Ok(());
                            }
                            if !held.load(Ordering::SeqCst) {
                                cw.write_all(&buf[..n]).await?;
                            }
                        }
                    };
                    tokio::select! {
                        _ = up => {}
                        _ = down => {}
                    }
                });
            }
        });
        HoldingProxy {
            port,
            armed,
            held,
            cut,
            task,
        }
    }

    /// Hold the broker's answers from the next publish on.
    pub fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    /// Close the connection right after the next publish reached the
    /// broker, before its confirm reaches the client.
    pub fn arm_cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        self.armed.store(true, Ordering::SeqCst);
    }

    /// Did a publish go through armed (and its answers get held)?
    pub fn holding(&self) -> bool {
        self.held.load(Ordering::SeqCst)
    }

    /// Pass everything again (connections opened from now on).
    pub fn release(&self) {
        self.armed.store(false, Ordering::SeqCst);
        self.held.store(false, Ordering::SeqCst);
        self.cut.store(false, Ordering::SeqCst);
    }
}

/// Client to server: passed on, read frame by frame (after the protocol
/// header) to spot a `basic.publish` while armed.
async fn pass_frames(
    from: &mut (impl tokio::io::AsyncRead + Unpin),
    to: &mut (impl tokio::io::AsyncWrite + Unpin),
    armed: &AtomicBool,
    held: &AtomicBool,
) -> std::io::Result<()> {
    let mut header = [0u8; 8];
    from.read_exact(&mut header).await?;
    to.write_all(&header).await?;
    loop {
        let mut head = [0u8; 7];
        from.read_exact(&mut head).await?;
        let size = u32::from_be_bytes([head[3], head[4], head[5], head[6]]);
        // the payload and the frame-end octet
        let mut rest = vec![0u8; size as usize + 1];
        from.read_exact(&mut rest).await?;
        let publish = head[0] == 1 && rest.starts_with(&BASIC_PUBLISH);
        if publish && armed.swap(false, Ordering::SeqCst) {
            held.store(true, Ordering::SeqCst);
        }
        to.write_all(&head).await?;
        to.write_all(&rest).await?;
    }
}

impl Drop for HoldingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

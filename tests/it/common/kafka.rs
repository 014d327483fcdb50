//! A private Kafka-API broker (Tansu, its own loopback port, in-memory
//! storage), stopped with the test, and a proxy in front of it that reads
//! the Kafka protocol's frames, so that a test can drop a produce request,
//! swallow its response, or cut the network.
//!
//! Tansu is installed once per machine by deploy/lib/tansu.sh (tests/run.sh
//! calls it and exports OUTBOX_TEST_TANSU).

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::free_port;

/// The broker's binary: $OUTBOX_TEST_TANSU, else where deploy/lib/tansu.sh
/// installs it.
fn tansu() -> String {
    match std::env::var("OUTBOX_TEST_TANSU") {
        Ok(v) if v.starts_with("unavailable:") => panic!(
            "the Kafka-API test broker is unavailable: {}",
            &v["unavailable:".len()..]
        ),
        Ok(v) => v,
        Err(_) => {
            let home = std::env::var("OUTBOX_TOOLS_DIR").unwrap_or_else(|_| {
                format!(
                    "{}/.cache/outbox-relay/tools",
                    std::env::var("HOME").unwrap_or_else(|_| "/root".into())
                )
            });
            let bin = format!("{home}/tansu-0.6.0/bin/tansu");
            assert!(
                std::path::Path::new(&bin).exists(),
                "no Tansu at {bin}: run the suite with tests/run.sh, which installs it once per machine (deploy/lib/tansu.sh)"
            );
            bin
        }
    }
}

/// One record as a consumer reads it.
#[derive(Debug, Clone)]
pub struct Record {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<String>,
    pub value: String,
    pub headers: BTreeMap<String, String>,
}

pub struct Broker {
    pub port: u16,
    /// The address clients are told to use (a proxy's, when there is one).
    pub advertised: u16,
    child: Option<tokio::process::Child>,
}

impl Broker {
    pub async fn start() -> Broker {
        let port = free_port();
        Broker::start_advertising(port, port).await
    }

    /// A broker on `port` that tells clients to connect to `advertised`
    /// (a proxy's port).
    pub async fn start_advertising(port: u16, advertised: u16) -> Broker {
        let child = tokio::process::Command::new(tansu())
            .args([
                "broker",
                "--listener-url",
                &format!("tcp://127.0.0.1:{port}"),
                "--advertised-listener-url",
                &format!("tcp://127.0.0.1:{advertised}"),
                "--storage-engine",
                "memory://tansu/",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start Tansu: {e}"));
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", port)).await.is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "Tansu did not listen within 20s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Broker {
            port,
            advertised,
            child: Some(child),
        }
    }

    /// What `kafka.brokers` says.
    pub fn brokers(&self) -> String {
        format!("127.0.0.1:{}", self.advertised)
    }

    /// Create a topic (Tansu's own CLI, straight to the broker).
    pub async fn create_topic(&self, name: &str, partitions: u32) {
        let out = tokio::process::Command::new(tansu())
            .args([
                "topic",
                "create",
                "--broker",
                &format!("tcp://127.0.0.1:{}", self.port),
                "--partitions",
                &partitions.to_string(),
                name,
            ])
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "tansu topic create {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Every record of `topic` (all `partitions`), read from the start
    /// until none arrives for 1.5 s.
    pub async fn records(&self, topic: &str, partitions: i32) -> Vec<Record> {
        let brokers = format!("127.0.0.1:{}", self.port);
        let topic = topic.to_string();
        tokio::task::spawn_blocking(move || read_all(&brokers, &topic, partitions))
            .await
            .unwrap()
    }

    pub async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }
}

fn read_all(brokers: &str, topic: &str, partitions: i32) -> Vec<Record> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "outbox-relay-tests")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&tpl).unwrap();
    let mut out = Vec::new();
    let mut last = std::time::Instant::now();
    while last.elapsed() < Duration::from_millis(1500) {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                last = std::time::Instant::now();
                let headers = m
                    .headers()
                    .map(|h| {
                        h.iter()
                            .map(|h| {
                                (
                                    h.key.to_string(),
                                    String::from_utf8_lossy(h.value.unwrap_or_default())
                                        .into_owned(),
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                out.push(Record {
                    partition: m.partition(),
                    offset: m.offset(),
                    key: m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
                    value: String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned(),
                    headers,
                });
            }
            Some(Err(e)) => panic!("reading {topic}: {e}"),
            None => {}
        }
    }
    out.sort_by_key(|r| (r.partition, r.offset));
    out
}

/// What the proxy does to the traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Mode {
    Pass = 0,
    /// Produce requests reach the broker; their responses never come back.
    SwallowProduceResponses = 1,
    /// Produce requests are read from the client and never forwarded.
    DropProduceRequests = 2,
    /// Every connection is closed and new ones are closed at once.
    Cut = 3,
}

/// A Kafka-protocol proxy on its own port in front of a broker.
pub struct Proxy {
    pub port: u16,
    mode: Arc<AtomicU8>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listen on `port`, forwarding to the broker on `upstream`.
    pub async fn start(port: u16, upstream: u16) -> Proxy {
        let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
        let mode = Arc::new(AtomicU8::new(Mode::Pass as u8));
        let m = mode.clone();
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                if m.load(Ordering::SeqCst) == Mode::Cut as u8 {
                    drop(client);
                    continue;
                }
                conns.spawn(relay_conn(client, upstream, m.clone()));
            }
        });
        Proxy { port, mode, task }
    }

    pub fn set(&self, mode: Mode) {
        self.mode.store(mode as u8, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn read_frame(r: &mut (impl AsyncReadExt + Unpin)) -> Option<Vec<u8>> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len).await.ok()?;
    let n = i32::from_be_bytes(len).max(0) as usize;
    let mut frame = len.to_vec();
    frame.resize(4 + n, 0);
    r.read_exact(&mut frame[4..]).await.ok()?;
    Some(frame)
}

async fn relay_conn(client: TcpStream, upstream: u16, mode: Arc<AtomicU8>) {
    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
        return;
    };
    let (mut client_rd, mut client_wr) = client.into_split();
    let (mut server_rd, mut server_wr) = server.into_split();
    // correlation ids of produce requests whose responses are swallowed
    let swallowed: Arc<Mutex<HashSet<i32>>> = Arc::default();
    let cut = |mode: &AtomicU8| mode.load(Ordering::SeqCst) == Mode::Cut as u8;
    let up = {
        let (mode, swallowed) = (mode.clone(), swallowed.clone());
        async move {
            while let Some(frame) = read_frame(&mut client_rd).await {
                if cut(&mode) || frame.len() < 12 {
                    return;
                }
                let api_key = i16::from_be_bytes([frame[4], frame[5]]);
                let correlation = i32::from_be_bytes([frame[8], frame[9], frame[10], frame[11]]);
                if api_key == 0 {
                    match mode.load(Ordering::SeqCst) {
                        m if m == Mode::DropProduceRequests as u8 => continue,
                        m if m == Mode::SwallowProduceResponses as u8 => {
                            swallowed.lock().unwrap().insert(correlation);
                        }
                        _ => {}
                    }
                }
                if server_wr.write_all(&frame).await.is_err() {
                    return;
                }
            }
        }
    };
    let down = {
        let mode = mode.clone();
        async move {
            while let Some(frame) = read_frame(&mut server_rd).await {
                if cut(&mode) || frame.len() < 8 {
                    return;
                }
                let correlation = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
                if swallowed.lock().unwrap().remove(&correlation) {
                    continue;
                }
                if client_wr.write_all(&frame).await.is_err() {
                    return;
                }
            }
        }
    };
    let watch_cut = async {
        while !cut(&mode) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::select! {
        _ = up => {}
        _ = down => {}
        _ = watch_cut => {}
    }
}

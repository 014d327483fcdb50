//! A private Kafka-API broker (Tansu, its own loopback port, in-memory
//! storage), stopped with the test, and a proxy in front of it that reads
//! the Kafka protocol's frames, so that a test can drop a produce request,
//! swallow its response, cut the network, or show fewer partitions in
//! Metadata than a topic has.
//!
//! Tansu is installed once per machine by deploy/lib/tansu.sh (tests/run.sh
//! calls it and exports OUTBOX_TEST_TANSU).

use std::collections::HashMap;
use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicI32, AtomicU8, Ordering};
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

    /// Another producer writing a record with `key` to `topic` every
    /// `every`, until the returned handle is dropped.
    pub fn chatter(&self, topic: &str, key: &str, every: Duration) -> Chatter {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let producer: rdkafka::producer::BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", format!("127.0.0.1:{}", self.port))
            .set("linger.ms", "0")
            .create()
            .unwrap();
        let (topic, key, flag) = (topic.to_string(), key.to_string(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut n = 0u64;
            while !flag.load(Ordering::SeqCst) {
                let body = format!("{{\"chatter\": {n}}}");
                let record = rdkafka::producer::BaseRecord::<str, str>::to(&topic)
                    .key(&key)
                    .payload(&body);
                if producer.send(record).is_ok() {
                    n += 1;
                }
                producer.poll(every);
            }
            let _ = rdkafka::producer::Producer::flush(&producer, Duration::from_secs(2));
            n
        });
        Chatter {
            stop,
            thread: Some(thread),
        }
    }

    pub async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }
}

/// A producer of [`Broker::chatter`]; stopped when dropped.
pub struct Chatter {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<u64>>,
}

impl Chatter {
    /// Stop, and say how many records were sent.
    pub fn stop(mut self) -> u64 {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.take().map_or(0, |t| t.join().unwrap())
    }
}

impl Drop for Chatter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
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
    /// Fetch and ListOffsets requests (a consumer's reads) are read from
    /// the client and never forwarded; produce requests pass.
    DropReads = 4,
}

/// A Kafka-protocol proxy on its own port in front of a broker.
pub struct Proxy {
    pub port: u16,
    mode: Arc<AtomicU8>,
    /// While positive: Metadata responses show each topic's partitions
    /// below this index only, until a produce request has passed.
    shown: Arc<AtomicI32>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listen on `port`, forwarding to the broker on `upstream`.
    pub async fn start(port: u16, upstream: u16) -> Proxy {
        let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
        let mode = Arc::new(AtomicU8::new(Mode::Pass as u8));
        let shown = Arc::new(AtomicI32::new(0));
        let (m, sh) = (mode.clone(), shown.clone());
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
                conns.spawn(relay_conn(client, upstream, m.clone(), sh.clone()));
            }
        });
        Proxy {
            port,
            mode,
            shown,
            task,
        }
    }

    pub fn set(&self, mode: Mode) {
        self.mode.store(mode as u8, Ordering::SeqCst);
    }

    /// Show `partitions` partitions of every topic in Metadata responses
    /// until the first produce request passes the proxy; all of them from
    /// then on (a topic that gained partitions while a record was on its
    /// way).
    pub fn show_partitions_until_produce(&self, partitions: i32) {
        self.shown.store(partitions, Ordering::SeqCst);
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

async fn relay_conn(client: TcpStream, upstream: u16, mode: Arc<AtomicU8>, shown: Arc<AtomicI32>) {
    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
        return;
    };
    let (mut client_rd, mut client_wr) = client.into_split();
    let (mut server_rd, mut server_wr) = server.into_split();
    // correlation ids of produce requests whose responses are swallowed
    let swallowed: Arc<Mutex<HashSet<i32>>> = Arc::default();
    // correlation id -> version of Metadata requests whose responses are
    // trimmed
    let metadata: Arc<Mutex<HashMap<i32, i16>>> = Arc::default();
    let cut = |mode: &AtomicU8| mode.load(Ordering::SeqCst) == Mode::Cut as u8;
    let up = {
        let (mode, swallowed) = (mode.clone(), swallowed.clone());
        let (shown, metadata) = (shown.clone(), metadata.clone());
        async move {
            while let Some(frame) = read_frame(&mut client_rd).await {
                if cut(&mode) || frame.len() < 12 {
                    return;
                }
                let api_key = i16::from_be_bytes([frame[4], frame[5]]);
                let correlation = i32::from_be_bytes([frame[8], frame[9], frame[10], frame[11]]);
                let version = i16::from_be_bytes([frame[6], frame[7]]);
                if api_key == 3 && shown.load(Ordering::SeqCst) > 0 {
                    metadata.lock().unwrap().insert(correlation, version);
                }
                if matches!(api_key, 1 | 2) && mode.load(Ordering::SeqCst) == Mode::DropReads as u8
                {
                    continue;
                }
                if api_key == 0 {
                    shown.store(0, Ordering::SeqCst);
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
                let version = metadata.lock().unwrap().remove(&correlation);
                let frame = match (version, shown.load(Ordering::SeqCst)) {
                    (Some(v), limit) if limit > 0 => {
                        trim_metadata(&frame, v, limit).unwrap_or(frame)
                    }
                    _ => frame,
                };
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

/// Reads the Kafka protocol's primitive types from a frame.
struct Wire<'a> {
    buf: &'a [u8],
    pos: usize,
    /// Flexible versions: compact strings and arrays, tagged fields.
    flexible: bool,
}

impl Wire<'_> {
    fn skip(&mut self, n: usize) -> Option<()> {
        (self.pos + n <= self.buf.len()).then(|| self.pos += n)
    }

    /// A big-endian signed integer of `n` (2 or 4) bytes.
    fn int(&mut self, n: usize) -> Option<i64> {
        let bytes = self.buf.get(self.pos..self.pos + n)?;
        self.pos += n;
        Some(match *bytes {
            [a, b] => i64::from(i16::from_be_bytes([a, b])),
            [a, b, c, d] => i64::from(i32::from_be_bytes([a, b, c, d])),
            _ => return None,
        })
    }

    fn uvarint(&mut self) -> Option<u64> {
        let mut value = 0u64;
        for shift in (0..35).step_by(7) {
            let b = *self.buf.get(self.pos)?;
            self.pos += 1;
            value |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Some(value);
            }
        }
        None
    }

    /// An array's or a string's length (0 for a null one).
    fn len(&mut self, array: bool) -> Option<usize> {
        if self.flexible {
            Some(self.uvarint()?.saturating_sub(1) as usize)
        } else {
            let n = self.int(if array { 4 } else { 2 })?;
            Some(n.max(0) as usize)
        }
    }

    fn string(&mut self) -> Option<()> {
        let n = self.len(false)?;
        self.skip(n)
    }

    fn int32s(&mut self) -> Option<()> {
        let n = self.len(true)?;
        self.skip(4 * n)
    }

    fn tagged(&mut self) -> Option<()> {
        if !self.flexible {
            return Some(());
        }
        for _ in 0..self.uvarint()? {
            self.uvarint()?;
            let size = self.uvarint()? as usize;
            self.skip(size)?;
        }
        Some(())
    }
}

fn put_uvarint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A Metadata response frame of `version` with each topic's partitions
/// from index `limit` on left out; `None` when it cannot be read.
fn trim_metadata(frame: &[u8], version: i16, limit: i32) -> Option<Vec<u8>> {
    let flexible = version >= 9;
    let mut w = Wire {
        buf: frame,
        pos: 4,
        flexible,
    };
    // the response header: correlation id, then (flexible) tagged fields
    w.skip(4)?;
    w.tagged()?;
    if version >= 3 {
        w.skip(4)?; // throttle time
    }
    for _ in 0..w.len(true)? {
        w.skip(4)?; // node id
        w.string()?; // host
        w.skip(4)?; // port
        if version >= 1 {
            w.string()?; // rack
        }
        w.tagged()?;
    }
    if version >= 2 {
        w.string()?; // cluster id
    }
    if version >= 1 {
        w.skip(4)?; // controller id
    }
    let mut out = Vec::with_capacity(frame.len());
    let mut copied = 4;
    for _ in 0..w.len(true)? {
        w.skip(2)?; // error code
        w.string()?; // name
        if version >= 10 {
            w.skip(16)?; // topic id
        }
        if version >= 1 {
            w.skip(1)?; // is internal
        }
        out.extend_from_slice(&frame[copied..w.pos]);
        let mut kept = Vec::new();
        let mut count = 0u64;
        for _ in 0..w.len(true)? {
            let start = w.pos;
            w.skip(2)?; // error code
            let index = w.int(4)?;
            w.skip(4)?; // leader
            if version >= 7 {
                w.skip(4)?; // leader epoch
            }
            w.int32s()?; // replicas
            w.int32s()?; // in-sync replicas
            if version >= 5 {
                w.int32s()?; // offline replicas
            }
            w.tagged()?;
            if index < i64::from(limit) {
                kept.extend_from_slice(&frame[start..w.pos]);
                count += 1;
            }
        }
        if flexible {
            put_uvarint(&mut out, count + 1);
        } else {
            out.extend_from_slice(&(count as i32).to_be_bytes());
        }
        out.extend_from_slice(&kept);
        copied = w.pos;
        if version >= 8 {
            w.skip(4)?; // topic authorized operations
        }
        w.tagged()?;
    }
    out.extend_from_slice(&frame[copied..]);
    let mut trimmed = ((out.len()) as i32).to_be_bytes().to_vec();
    trimmed.extend_from_slice(&out);
    Some(trimmed)
}

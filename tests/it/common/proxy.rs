//! A TCP proxy in front of Postgres that can be taken down and brought back:
//! a database outage as the relay sees it, without touching the server.

use tokio::net::{TcpListener, TcpStream};

use super::{admin_url, free_port, TestDb};

pub struct Proxy {
    pub port: u16,
    upstream: String,
    /// Drop NotificationResponse messages on their way to the client, as a
    /// pooler in transaction mode does (needs `sslmode=disable`: the proxy
    /// reads the protocol).
    drop_notifications: bool,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Proxy {
    /// A running proxy to the test server.
    pub async fn to_postgres() -> Proxy {
        Proxy::start(false).await
    }

    /// A running proxy that passes everything but notifications.
    pub async fn without_notifications() -> Proxy {
        Proxy::start(true).await
    }

    async fn start(drop_notifications: bool) -> Proxy {
        let admin = reqwest::Url::parse(&admin_url()).unwrap();
        let mut proxy = Proxy {
            port: free_port(),
            upstream: format!(
                "{}:{}",
                admin.host_str().unwrap(),
                admin.port().unwrap_or(5432)
            ),
            drop_notifications,
            task: None,
        };
        proxy.up().await;
        proxy
    }

    /// The test database's URL, through the proxy.
    pub fn url_for(&self, db: &TestDb) -> String {
        let mut url = reqwest::Url::parse(&db.url).unwrap();
        url.set_host(Some("127.0.0.1")).unwrap();
        url.set_port(Some(self.port)).unwrap();
        if self.drop_notifications {
            url.query_pairs_mut().append_pair("sslmode", "disable");
        }
        url.to_string()
    }

    pub async fn up(&mut self) {
        let listener = TcpListener::bind(("127.0.0.1", self.port)).await.unwrap();
        let upstream = self.upstream.clone();
        let filter = self.drop_notifications;
        self.task = Some(tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    return;
                };
                let upstream = upstream.clone();
                conns.spawn(async move {
                    let Ok(mut server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    if !filter {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                        return;
                    }
                    let (mut client_rd, mut client_wr) = client.split();
                    let (mut server_rd, mut server_wr) = server.split();
                    tokio::select! {
                        _ = tokio::io::copy(&mut client_rd, &mut server_wr) => {}
                        _ = copy_without_notifications(&mut server_rd, &mut client_wr) => {}
                    }
                });
            }
        }));
    }

    /// Refuse new connections and cut the open ones.
    pub fn down(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

/// Copy backend messages (type byte, then a 4-byte length that counts
/// itself) and leave out every NotificationResponse ('A').
async fn copy_without_notifications(
    from: &mut (impl tokio::io::AsyncRead + Unpin),
    to: &mut (impl tokio::io::AsyncWrite + Unpin),
) -> std::io::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    loop {
        let mut header = [0u8; 5];
        from.read_exact(&mut header).await?;
        let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
        let mut body = vec![0u8; len.saturating_sub(4)];
        from.read_exact(&mut body).await?;
        if header[0] == b'A' {
            continue;
        }
        to.write_all(&header).await?;
        to.write_all(&body).await?;
    }
}

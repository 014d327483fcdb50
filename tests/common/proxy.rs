//! A TCP proxy in front of Postgres that can be taken down and brought back:
//! a database outage as the relay sees it, without touching the server.

use tokio::net::{TcpListener, TcpStream};

use super::{admin_url, free_port, TestDb};

pub struct Proxy {
    pub port: u16,
    upstream: String,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Proxy {
    /// A running proxy to the test server.
    pub async fn to_postgres() -> Proxy {
        let admin = reqwest::Url::parse(&admin_url()).unwrap();
        let mut proxy = Proxy {
            port: free_port(),
            upstream: format!(
                "{}:{}",
                admin.host_str().unwrap(),
                admin.port().unwrap_or(5432)
            ),
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
        url.to_string()
    }

    pub async fn up(&mut self) {
        let listener = TcpListener::bind(("127.0.0.1", self.port)).await.unwrap();
        let upstream = self.upstream.clone();
        self.task = Some(tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    return;
                };
                let upstream = upstream.clone();
                conns.spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
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

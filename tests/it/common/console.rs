//! The console under test: served in-process on 127.0.0.1:0 against the
//! test database; a small HTTP client that keeps its session cookie; and a
//! real headless Chromium driven over WebDriver (Debian's `chromium` and
//! `chromium-driver`, which tests/run.sh installs).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use outbox_providers::Secret;
use outbox_relay::config::console::hash_password;
use outbox_relay::config::Config;
use outbox_relay::console::{App, ConsoleUser, Role};

use super::TestDb;

/// A console serving the test database.
pub struct ConsoleServer {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl ConsoleServer {
    /// Serve with these users (name, role, password); none: the open,
    /// loopback-only console.
    pub async fn start(db: &TestDb, users: &[(&str, Role, &str)]) -> ConsoleServer {
        Self::start_with(db, users, |_| {}).await
    }

    pub async fn start_with(
        db: &TestDb,
        users: &[(&str, Role, &str)],
        adjust: impl FnOnce(&mut Config),
    ) -> ConsoleServer {
        Self::serve(db.another_store().await, users, adjust).await
    }

    /// Serve through `store` (a pool under another database role).
    pub async fn start_on(
        store: outbox_relay::store::Store,
        users: &[(&str, Role, &str)],
    ) -> ConsoleServer {
        Self::serve(store, users, |_| {}).await
    }

    async fn serve(
        store: outbox_relay::store::Store,
        users: &[(&str, Role, &str)],
        adjust: impl FnOnce(&mut Config),
    ) -> ConsoleServer {
        let mut config = super::config();
        config.console.users = users
            .iter()
            .map(|(name, role, password)| ConsoleUser {
                name: name.to_string(),
                role: *role,
                password_hash: Secret::new(hash_password(password).expect("hash")),
            })
            .collect();
        adjust(&mut config);
        config.console.validate().expect("console settings");
        let app = App::new(store, config).expect("console app");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            outbox_relay::console::serve(listener, app, async {
                let _ = rx.await;
            })
            .await
            .expect("console serves");
        });
        ConsoleServer {
            addr,
            stop: Some(tx),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

impl Drop for ConsoleServer {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

/// An HTTP client with one session: it keeps the console's cookie.
pub struct Session {
    pub base: String,
    http: reqwest::Client,
    cookie: Option<String>,
}

/// A response's status and body.
pub struct Answer {
    pub status: u16,
    pub body: String,
    pub location: Option<String>,
}

impl Session {
    pub fn new(console: &ConsoleServer) -> Session {
        Session {
            base: console.url(""),
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap(),
            cookie: None,
        }
    }

    async fn send(&mut self, req: reqwest::RequestBuilder) -> Answer {
        let req = match &self.cookie {
            Some(c) => req.header("cookie", c.clone()),
            None => req,
        };
        let resp = req.send().await.expect("the console answers");
        for v in resp.headers().get_all("set-cookie") {
            let v = v.to_str().unwrap();
            let pair = v.split(';').next().unwrap().to_string();
            self.cookie = Some(pair);
        }
        let location = resp
            .headers()
            .get("location")
            .map(|l| l.to_str().unwrap().to_string());
        Answer {
            status: resp.status().as_u16(),
            location,
            body: resp.text().await.unwrap(),
        }
    }

    pub async fn get(&mut self, path: &str) -> Answer {
        let req = self.http.get(format!("{}{path}", self.base));
        self.send(req).await
    }

    pub async fn post_form(&mut self, path: &str, form: &[(&str, &str)]) -> Answer {
        let req = self.http.post(format!("{}{path}", self.base)).form(form);
        self.send(req).await
    }

    pub async fn post_json(
        &mut self,
        path: &str,
        body: &serde_json::Value,
        headers: &[(&str, &str)],
    ) -> Answer {
        let mut req = self.http.post(format!("{}{path}", self.base)).json(body);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        self.send(req).await
    }

    /// The session cookie (`name=value`), as a browser would send it.
    pub fn cookie(&self) -> String {
        self.cookie.clone().expect("a session cookie")
    }

    /// The CSRF token of the page at `path` (its first `csrf` field).
    pub async fn csrf(&mut self, path: &str) -> String {
        let page = self.get(path).await;
        csrf_of(&page.body).unwrap_or_else(|| panic!("no csrf field on {path}: {}", page.body))
    }

    /// Log in through the form; panics unless it works.
    pub async fn login(&mut self, user: &str, password: &str) {
        let csrf = self.csrf("/login").await;
        let a = self
            .post_form(
                "/login",
                &[
                    ("user", user),
                    ("password", password),
                    ("csrf", &csrf),
                    ("next", "/"),
                ],
            )
            .await;
        assert_eq!(a.status, 303, "login as {user}: {}", a.body);
    }
}

/// The value of the first `name="csrf"` field in a page.
pub fn csrf_of(html: &str) -> Option<String> {
    let at = html.find("name=\"csrf\" value=\"")? + "name=\"csrf\" value=\"".len();
    Some(html[at..].split('"').next()?.to_string())
}

/// The value of the hidden field `name` in a page.
pub fn field_of(html: &str, name: &str) -> Option<String> {
    let needle = format!("name=\"{name}\" value=\"");
    let at = html.find(&needle)? + needle.len();
    Some(html[at..].split('"').next()?.to_string())
}

/// A headless Chromium under chromedriver, and a WebDriver client on it.
pub struct Browser {
    pub client: fantoccini::Client,
    driver: tokio::process::Child,
    _profile: TempDir,
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn find_program(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    names.iter().find_map(|name| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    })
}

impl Browser {
    /// Start chromedriver on a free port and a headless Chromium through
    /// it. Panics, saying what to install, when either is missing.
    pub async fn start() -> Browser {
        let driver_bin = std::env::var_os("OUTBOX_TEST_CHROMEDRIVER")
            .map(PathBuf::from)
            .or_else(|| find_program(&["chromedriver"]))
            .expect(
                "chromedriver is missing: install Debian's chromium and chromium-driver \
                 (tests/run.sh does, as root), or set OUTBOX_TEST_CHROMEDRIVER",
            );
        let chromium = std::env::var_os("OUTBOX_TEST_CHROMIUM")
            .map(PathBuf::from)
            .or_else(|| find_program(&["chromium", "chromium-browser", "google-chrome"]))
            .expect(
                "chromium is missing: install Debian's chromium and chromium-driver \
                 (tests/run.sh does, as root), or set OUTBOX_TEST_CHROMIUM",
            );
        let port = super::free_port();
        let driver = tokio::process::Command::new(&driver_bin)
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", driver_bin.display()));
        let webdriver = format!("http://127.0.0.1:{port}");
        let ready = super::wait_for(Duration::from_secs(20), || {
            let url = format!("{webdriver}/status");
            async move {
                reqwest::get(url)
                    .await
                    .map(|r| r.status().is_success())
                    .unwrap_or(false)
            }
        })
        .await;
        assert!(
            ready,
            "chromedriver did not answer on {webdriver} within 20 s"
        );
        let profile = TempDir(std::env::temp_dir().join(format!(
            "outbox-console-chromium-{}-{:08x}",
            std::process::id(),
            fastrand::u32(..)
        )));
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({
                "binary": chromium,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--disable-quic", "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--disable-extensions",
                    "--window-size=1360,900", "--hide-scrollbars",
                    format!("--user-data-dir={}", profile.0.display()),
                ],
            }),
        );
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = fantoccini::ClientBuilder::rustls()
            .expect("rustls")
            .capabilities(caps)
            .connect(&webdriver)
            .await
            .expect("a Chromium session through chromedriver");
        Browser {
            client,
            driver,
            _profile: profile,
        }
    }

    /// Save a screenshot of the window to `target/tmp/screenshots/<name>.png`;
    /// with `OUTBOX_REFRESH_SCREENSHOTS=1` also over the committed copy in
    /// `docs/screenshots/` (the README's pictures), and only then.
    pub async fn screenshot(&self, name: &str) {
        let png = self.client.screenshot().await.expect("screenshot");
        let file = format!("{name}.png");
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("screenshots");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(&file), &png).unwrap();
        if std::env::var_os("OUTBOX_REFRESH_SCREENSHOTS").is_some_and(|v| v == "1") {
            let docs = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/screenshots");
            std::fs::write(docs.join(&file), &png).unwrap();
        }
    }

    pub async fn close(mut self) {
        let _ = self.client.clone().close().await;
        let _ = self.driver.kill().await;
    }
}

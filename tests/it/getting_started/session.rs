//! A reader's terminal session through pages of the book: their blocks in
//! one `bash` process under `set -euo pipefail`, in a scratch directory
//! under target/tmp, with the binaries this build made on `PATH`.
//!
//! - A command that fails fails the test, and a shell variable set in one
//!   block is there in the next. Processes the pages start in the
//!   background (`&`) are part of the script's process group, which the
//!   test kills at the end and when it fails; `finish` also checks that the
//!   pages' own clean-up left nothing running.
//! - Before each block the script prints a marker line, `### PAGE:LINE`;
//!   what a block printed (bash's output is `transcript.log`) is compared
//!   with the output its page shows (page.rs says how).
//! - What is the reader's and would collide with other tests is replaced
//!   in the commands, the files and the shown output: the receiver's port
//!   48080 and the console's address 127.0.0.1:9188 by free ones (the
//!   console is pointed at its port through `OUTBOX_RELAY__CONSOLE__ADDR`,
//!   and a running relay's metrics listener is moved to a free port
//!   through `OUTBOX_RELAY__RELAY__METRICS_ADDR`); the server
//!   `postgres://localhost` by the test server's URL, and the database
//!   `outbox_tutorial` by one of the test's own (dropped when the test
//!   ends, however it ends); and where the output names the reader's
//!   database role (`retry by postgres`), the test server's role.
//! - None of the test runner's relay settings nor its `DATABASE_URL` reach
//!   the script: only what the pages say.
//!
//! A failed run leaves its directory to look at.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;

use super::page::{self, Block, Run, Shown};
use crate::common::{admin_url, free_port, relay_bin};

/// The receiver's port as the pages name it.
const PAGE_RECEIVER_PORT: &str = "48080";
/// The console's address as the pages name it (its default).
pub const PAGE_CONSOLE_ADDR: &str = "127.0.0.1:9188";
/// The server and database as the pages name them.
const PAGE_SERVER: &str = "postgres://localhost";
const PAGE_DATABASE: &str = "outbox_tutorial";
/// The reader's database role, as the output names it.
const PAGE_ROLE: &str = "retry by postgres";

/// The role a URL connects as (libpq's default: the system user).
fn role(url: &str) -> String {
    let user = reqwest::Url::parse(url)
        .map(|u| u.username().to_string())
        .unwrap_or_default();
    if user.is_empty() {
        std::env::var("USER").unwrap_or_else(|_| "postgres".into())
    } else {
        user
    }
}

/// A page's name and text, read from the repository.
pub struct Page {
    pub name: &'static str,
    pub blocks: Vec<Block>,
}

impl Page {
    pub fn read(name: &'static str) -> Page {
        let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(name))
            .unwrap_or_else(|e| panic!("read {name}: {e}"));
        Page {
            name,
            blocks: page::blocks(name, &text),
        }
    }

    /// The text of the blocks that run in page order.
    pub fn commands(&self) -> String {
        self.blocks
            .iter()
            .filter(|b| b.run == Run::InOrder)
            .map(|b| b.text.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// The script being written, then run.
pub struct Session {
    pub scratch: PathBuf,
    /// The database the pages create, and its URL.
    pub db_name: String,
    pub db_url: String,
    pub console_addr: String,
    replacements: Vec<(String, String)>,
    script: String,
    /// Each marker with the page, the line and the output shown there.
    shown: Vec<(String, String, Vec<Shown>)>,
    path: Vec<PathBuf>,
    env: Vec<(String, String)>,
    /// How many times the script waits for the test's checks.
    stops: usize,
    _db: DropOnExit,
}

impl Session {
    pub async fn new(label: &str) -> Session {
        for (tool, install) in [
            ("bash", "apt-get install bash"),
            (
                "psql",
                "tests/run.sh installs Debian's postgresql; or apt-get install postgresql-client",
            ),
            ("curl", "apt-get install curl"),
            ("openssl", "apt-get install openssl"),
        ] {
            let found = std::process::Command::new("sh")
                .args(["-c", &format!("command -v {tool}")])
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            assert!(
                found,
                "the pages use {tool}, which is not installed ({install})"
            );
        }
        let scratch = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "{label}-{}-{:08x}",
            std::process::id(),
            fastrand::u32(..)
        ));
        let bin = scratch.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::os::unix::fs::symlink(relay_bin(), bin.join("outbox-relay")).unwrap();
        std::os::unix::fs::symlink(demo_receiver_bin().await, bin.join("demo-receiver")).unwrap();
        let db_name = format!(
            "outbox_page_{}_{:08x}",
            std::process::id(),
            fastrand::u32(..)
        );
        let admin = admin_url();
        let server = admin
            .split('?')
            .next()
            .and_then(|u| u.rsplit_once('/'))
            .map(|(server, _)| server.to_string())
            .expect("DATABASE_URL names a database");
        let console_addr = format!("127.0.0.1:{}", free_port());
        Session {
            stops: 0,
            db_url: format!("{server}/{db_name}"),
            replacements: vec![
                (PAGE_RECEIVER_PORT.into(), free_port().to_string()),
                (PAGE_CONSOLE_ADDR.into(), console_addr.clone()),
                (PAGE_SERVER.into(), server),
                (PAGE_DATABASE.into(), db_name.clone()),
                (PAGE_ROLE.into(), format!("retry by {}", role(&admin))),
            ],
            _db: DropOnExit(db_name.clone()),
            db_name,
            console_addr,
            script: String::from("set -euo pipefail\n"),
            shown: Vec::new(),
            path: vec![bin],
            env: Vec::new(),
            scratch,
        }
    }

    /// Also replace `from` by `to` in what runs, the files and what is
    /// shown.
    pub fn replace(&mut self, from: &str, to: &str) {
        self.replacements.push((from.into(), to.into()));
    }

    /// Put `dir` on the script's `PATH`, before the binaries of the build.
    pub fn path_first(&mut self, dir: PathBuf) {
        self.path.insert(0, dir);
    }

    pub fn env(&mut self, name: &str, value: &str) {
        self.env.push((name.into(), value.into()));
    }

    fn localise(&self, text: &str) -> String {
        self.replacements
            .iter()
            .fold(text.to_string(), |t, (from, to)| t.replace(from, to))
    }

    /// Add the blocks of `page` that run when `when` says.
    pub fn add(&mut self, page: &Page, when: impl Fn(&Run) -> bool) {
        for b in page.blocks.iter().filter(|b| when(&b.run)) {
            let marker = format!("### {}:{}", page.name, b.line);
            let text = self.localise(&b.text);
            let command = match &b.run {
                Run::File(path) => {
                    let dir = Path::new(path)
                        .parent()
                        .filter(|d| !d.as_os_str().is_empty());
                    let mkdir =
                        dir.map_or(String::new(), |d| format!("mkdir -p '{}'\n", d.display()));
                    format!("{mkdir}cat > '{path}' <<'OUTBOX_PAGE_FILE'\n{text}\nOUTBOX_PAGE_FILE")
                }
                _ => text,
            };
            self.script
                .push_str(&format!("\necho '{marker}'\n{command}\n"));
            let shown = b
                .shown
                .iter()
                .map(|s| Shown {
                    line: s.line,
                    text: self.localise(&s.text),
                })
                .collect();
            self.shown.push((marker, page.name.to_string(), shown));
        }
    }

    /// Here the script waits for the test's checks (`Running::checks`,
    /// then `Running::resume` or `Running::finish`).
    pub fn checks_here(&mut self) {
        self.stops += 1;
        self.script.push_str(&format!(
            "\necho '### the test checks what the pages promised'\ntouch '{}'\nuntil [ -e '{}' ]; do sleep 0.1; done\n",
            self.wanted(self.stops).display(),
            self.done(self.stops).display()
        ));
    }

    fn wanted(&self, stop: usize) -> PathBuf {
        self.scratch.join(format!(".checks-wanted-{stop}"))
    }

    fn done(&self, stop: usize) -> PathBuf {
        self.scratch.join(format!(".checks-done-{stop}"))
    }

    pub fn start(self) -> Running {
        let script_path = self.scratch.join("session.sh");
        std::fs::write(&script_path, &self.script).unwrap();
        let transcript_path = self.scratch.join("transcript.log");
        let transcript = std::fs::File::create(&transcript_path).unwrap();
        let mut path = std::env::join_paths(&self.path).unwrap();
        path.push(":");
        path.push(std::env::var_os("PATH").unwrap_or_default());
        let mut cmd = tokio::process::Command::new("bash");
        for (name, _) in std::env::vars_os() {
            let name = name.to_string_lossy();
            if name.starts_with("OUTBOX_RELAY_")
                || name == "DATABASE_URL"
                || name == "DATABASE_URL_FILE"
            {
                cmd.env_remove(&*name);
            }
        }
        cmd.arg(&script_path)
            .current_dir(&self.scratch)
            .env("PATH", path)
            .env(
                "OUTBOX_RELAY__CONSOLE__ADDR",
                format!("\"{}\"", self.console_addr),
            )
            .env("OUTBOX_RELAY__RELAY__METRICS_ADDR", "\"127.0.0.1:0\"")
            .env("NO_COLOR", "1")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(transcript.try_clone().unwrap())
            .stderr(transcript)
            .process_group(0);
        let bash = cmd.spawn().expect("start bash");
        let group = ProcessGroup(bash.id().expect("bash's pid"));
        Running {
            bash,
            group,
            transcript_path,
            resumed: 0,
            session: self,
        }
    }
}

/// The script, running.
pub struct Running {
    bash: tokio::process::Child,
    group: ProcessGroup,
    transcript_path: PathBuf,
    /// The stops the script has been let past.
    resumed: usize,
    pub session: Session,
}

impl Running {
    /// bash's output so far, and the relay's and the console's logs.
    pub fn transcript(&self) -> String {
        let text = std::fs::read_to_string(&self.transcript_path).unwrap_or_default();
        let mut out = format!("--- {} ---\n{text}", self.transcript_path.display());
        for log in ["relay.log", "console.log"] {
            if let Ok(t) = std::fs::read_to_string(self.session.scratch.join(log)) {
                out.push_str(&format!("\n--- {log} ---\n{t}"));
            }
        }
        out
    }

    /// Wait until the script reaches its next `checks_here` (within
    /// `limit`).
    pub async fn checks(&mut self, limit: Duration) {
        let started = Instant::now();
        while !self.session.wanted(self.resumed + 1).exists() {
            if let Some(status) = self.bash.try_wait().unwrap() {
                panic!(
                    "the pages' commands stopped ({status}) before the end:\n{}",
                    self.transcript()
                );
            }
            assert!(
                started.elapsed() < limit,
                "the pages' commands did not finish within {limit:?}:\n{}",
                self.transcript()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Let the script run to its end: it must succeed, leave nothing
    /// running, and have printed what the pages show. Answers the whole
    /// transcript.
    pub async fn finish(mut self) -> String {
        while self.resumed < self.session.stops {
            self.resume();
        }
        let status = tokio::time::timeout(Duration::from_secs(60), self.bash.wait())
            .await
            .unwrap_or_else(|_| {
                panic!("the script did not end within 60 s:\n{}", self.transcript())
            })
            .unwrap();
        assert!(
            status.success(),
            "the script failed:\n{}",
            self.transcript()
        );
        let left = self.group.members();
        assert!(
            left.is_empty(),
            "the pages' clean-up left these running: {left:?}\n{}",
            self.transcript()
        );
        let printed = std::fs::read_to_string(&self.transcript_path).unwrap();
        let mut wrong = Vec::new();
        for (marker, page, shown) in &self.session.shown {
            if shown.is_empty() {
                continue;
            }
            let real = section(&printed, marker)
                .unwrap_or_else(|| panic!("{marker} never ran:\n{}", self.transcript()));
            for s in shown {
                if let Err(e) = page::compare(&s.text, real) {
                    wrong.push(format!("{page}:{}: the output shown differs:\n{e}", s.line));
                }
            }
        }
        assert!(
            wrong.is_empty(),
            "{}\n\n{}",
            wrong.join("\n\n"),
            self.transcript()
        );
        let all = self.transcript();
        std::fs::remove_dir_all(&self.session.scratch).ok();
        all
    }
}

impl Running {
    /// Let the script go on past the stop it waits at.
    pub fn resume(&mut self) {
        self.resumed += 1;
        std::fs::write(self.session.done(self.resumed), "").unwrap();
    }

    /// A connection to the pages' database, for the test's checks.
    pub async fn connect(&self) -> PgPool {
        let options: PgConnectOptions = self.session.db_url.parse().expect("the database's URL");
        PgPoolOptions::new()
            .max_connections(1)
            .connect_with(options.application_name(TEST_CONNECTION))
            .await
            .expect("connect to the database the pages created")
    }

    /// Close `db` and end its session on the server (a closed pool's
    /// connection may linger a moment), so that the pages can drop their
    /// database.
    pub async fn disconnect(&self, db: PgPool) {
        db.close().await;
        let admin = PgPool::connect(&admin_url()).await.unwrap();
        let ours = "FROM pg_stat_activity WHERE datname = $1 AND application_name = $2";
        let gone = crate::common::wait_for(Duration::from_secs(10), || async {
            sqlx::query(&format!("SELECT pg_terminate_backend(pid) {ours}"))
                .bind(&self.session.db_name)
                .bind(TEST_CONNECTION)
                .execute(&admin)
                .await
                .unwrap();
            sqlx::query_scalar::<_, i64>(&format!("SELECT count(*) {ours}"))
                .bind(&self.session.db_name)
                .bind(TEST_CONNECTION)
                .fetch_one(&admin)
                .await
                .unwrap()
                == 0
        })
        .await;
        admin.close().await;
        assert!(
            gone,
            "the test's own session on the pages' database did not end"
        );
    }
}

/// The `application_name` of the test's own connection.
const TEST_CONNECTION: &str = "outbox-page-test";

/// What the script printed after `marker` and before the next marker.
fn section<'a>(transcript: &'a str, marker: &str) -> Option<&'a str> {
    let start = transcript.find(&format!("{marker}\n"))? + marker.len() + 1;
    let rest = &transcript[start..];
    let end = rest
        .match_indices("### ")
        .map(|(at, _)| at)
        .find(|&at| at == 0 || rest.as_bytes()[at - 1] == b'\n')
        .unwrap_or(rest.len());
    Some(&rest[..end])
}

/// `demo-receiver`, built by cargo beside the relay binary these tests
/// run: it belongs to another package of the workspace, which cargo does
/// not build for this one. tests/run.sh builds it with the same command
/// before the suite, so that here it is a no-op; a binary newer than its
/// sources and Cargo.lock is used without asking cargo (which would wait
/// for the build directory's lock while other builds hold it).
async fn demo_receiver_bin() -> PathBuf {
    let relay = relay_bin();
    let profile_dir = relay.parent().expect("the relay's directory");
    let target_dir = profile_dir.parent().expect("the target directory");
    let bin = profile_dir.join("demo-receiver");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let sources = crate::common::files_under(&root.join("deploy/demo-receiver"), "rs")
        .into_iter()
        .chain([
            root.join("deploy/demo-receiver/Cargo.toml"),
            root.join("Cargo.lock"),
        ]);
    if let Some(built) = modified(&bin) {
        if sources
            .map(|s| modified(&s))
            .all(|m| m.is_some_and(|m| m < built))
        {
            return bin;
        }
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = tokio::process::Command::new(cargo);
    cmd.args(["build", "--locked", "--quiet", "-p", "outbox-demo-receiver"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("CARGO_TARGET_DIR", target_dir);
    if profile_dir.ends_with("release") {
        cmd.arg("--release");
    }
    let out = cmd.output().await.expect("run cargo");
    assert!(
        out.status.success(),
        "cargo build -p outbox-demo-receiver failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(bin.exists(), "{} was not built", bin.display());
    bin
}

/// Drops the pages' database when the test ends, however it ends (the
/// pages drop it themselves when they get that far).
struct DropOnExit(String);

impl Drop for DropOnExit {
    fn drop(&mut self) {
        let _ = std::process::Command::new("psql")
            .arg(admin_url())
            .args(["--quiet", "--command"])
            .arg(format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.0))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// The process group of the script: killed on drop, so that a failing
/// test leaves nothing running.
struct ProcessGroup(u32);

impl ProcessGroup {
    /// The group's processes that still run (not zombies), as "pid name".
    fn members(&self) -> Vec<String> {
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        dir.filter_map(|e| {
            let stat = std::fs::read_to_string(e.ok()?.path().join("stat")).ok()?;
            // pid (comm) state ppid pgrp ...; comm may hold spaces
            let (head, rest) = stat.rsplit_once(") ")?;
            let mut fields = rest.split_whitespace();
            let state = fields.next()?;
            let pgrp: u32 = fields.nth(1)?.parse().ok()?;
            (pgrp == self.0 && state != "Z").then(|| head.replacen(" (", " ", 1))
        })
        .collect()
    }

    fn signal(&self, signal: &str) {
        let _ = std::process::Command::new("kill")
            .args([signal, "--", &format!("-{}", self.0)])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        if self.members().is_empty() {
            return;
        }
        self.signal("-TERM");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.members().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        if !self.members().is_empty() {
            self.signal("-KILL");
        }
    }
}

#[test]
fn a_section_ends_at_the_next_marker_at_the_start_of_a_line() {
    let t = "### a.md:1\none\n### a.md:5\ntwo ### not a marker\n### checks\n";
    assert_eq!(section(t, "### a.md:1"), Some("one\n"));
    assert_eq!(section(t, "### a.md:5"), Some("two ### not a marker\n"));
    assert_eq!(section(t, "### a.md:9"), None);
}

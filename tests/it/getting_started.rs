//! docs/getting-started.md, run as written, so that the tutorial cannot
//! drift from the product.
//!
//! How the page is read (its first comment says so too):
//!
//! - Every ` ```sh ` block runs, in the page's order, in one `bash` process
//!   under `set -euo pipefail`: a command that fails fails the test, and a
//!   shell variable set in one block is there in the next, as in a reader's
//!   terminal. Processes the page starts in the background (`&`) are part of
//!   that script.
//! - A block right after `<!-- test: skip, REASON -->` is not run: the
//!   installation (the test puts the binaries it built on `PATH` instead:
//!   `outbox-relay`, and `demo-receiver`, which it builds with cargo) and
//!   the database's creation (the test creates one without the outbox schema
//!   and sets `DATABASE_URL` to it).
//! - A block right after `<!-- test: after the checks -->` runs last, after
//!   the test has checked what the page promises while its processes still
//!   run: the clean-up.
//! - Other fences (` ```text ` for output) are for reading. A shell block
//!   spelt other than ` ```sh ` (`bash`, `console`, `sh,ignore`, ...) and a
//!   directive not followed by a ` ```sh ` block are errors, so that nothing
//!   meant to run is left out quietly.
//! - Ports: the page names 48080 for its receiver and the console's default
//!   address, 127.0.0.1:9188. The test replaces both in the commands with
//!   free ports (and points the console at its port through
//!   `OUTBOX_RELAY__CONSOLE__ADDR`), and moves the running relay's metrics
//!   listener to a free port (`OUTBOX_RELAY__RELAY__METRICS_ADDR`), so that
//!   it runs beside other tests and whatever else listens on those ports.
//!
//! It runs in a scratch directory under target/tmp (bash's output is
//! `transcript.log` there), removed when the test passes. Every process the page starts is in the
//! script's process group, which the test kills at the end and when it
//! fails; it also checks that the page's own clean-up left nothing running.
//! Needs bash, psql and curl: tests/run.sh installs Debian's `postgresql`,
//! which brings psql.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common::{free_port, relay_bin, wait_for, TestDb};

/// The page, from the repository root.
const PAGE: &str = "docs/getting-started.md";
/// The receiver's port as the page names it.
const PAGE_RECEIVER_PORT: &str = "48080";
/// The console's address as the page names it (its default).
const PAGE_CONSOLE_ADDR: &str = "127.0.0.1:9188";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Run {
    /// In page order.
    InOrder,
    /// Not at all (`test: skip, REASON`).
    Skip,
    /// After the test's checks (`test: after the checks`).
    AfterChecks,
}

#[derive(Debug)]
struct Block {
    /// 1-based line of the opening fence.
    line: usize,
    run: Run,
    text: String,
}

/// The shell blocks of a page, with what the directive before each says.
fn shell_blocks(page: &str) -> Vec<Block> {
    let lines: Vec<&str> = page.lines().collect();
    let mut blocks = Vec::new();
    let mut directive: Option<(usize, Run)> = None;
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i].trim();
        if let Some(rest) = line.strip_prefix("<!-- test:") {
            let what = rest.trim().trim_end_matches("-->").trim();
            let run = match what.strip_prefix("skip,") {
                Some(reason) if !reason.trim().is_empty() => Run::Skip,
                _ if what == "after the checks" => Run::AfterChecks,
                _ => panic!(
                    "{PAGE}:{}: unknown directive {line:?} \
                     (`<!-- test: skip, REASON -->` or `<!-- test: after the checks -->`)",
                    i + 1
                ),
            };
            assert!(
                directive.is_none(),
                "{PAGE}:{}: two directives for one block",
                i + 1
            );
            directive = Some((i + 1, run));
            i += 1;
            continue;
        }
        if let Some(info) = lines[i].strip_prefix("```") {
            let info = info.trim();
            let end = (i + 1..lines.len())
                .find(|&j| lines[j].trim_start().starts_with("```"))
                .unwrap_or_else(|| panic!("{PAGE}:{}: a fence that is never closed", i + 1));
            let lang = info
                .split([' ', ',', '{'])
                .next()
                .unwrap_or("")
                .to_lowercase();
            let shell = matches!(
                lang.as_str(),
                "sh" | "bash" | "shell" | "zsh" | "console" | "shell-session" | "shellsession"
            );
            if shell {
                assert_eq!(
                    info,
                    "sh",
                    "{PAGE}:{}: a shell block is fenced ```sh (a `<!-- test: skip, REASON -->` \
                     line before it keeps the test from running it)",
                    i + 1
                );
                blocks.push(Block {
                    line: i + 1,
                    run: directive.take().map_or(Run::InOrder, |(_, run)| run),
                    text: lines[i + 1..end].join("\n"),
                });
            } else if let Some((at, _)) = directive {
                panic!("{PAGE}:{at}: a directive must come right before a ```sh block");
            }
            i = end + 1;
            continue;
        }
        if let Some((at, _)) = directive.filter(|_| !line.is_empty()) {
            panic!("{PAGE}:{at}: a directive must come right before a ```sh block");
        }
        i += 1;
    }
    if let Some((at, _)) = directive {
        panic!("{PAGE}:{at}: a directive must come right before a ```sh block");
    }
    blocks
}

#[test]
fn the_page_reader_sees_directives_and_refuses_other_shell_fences() {
    let page = "# T\n\n<!-- test: skip, it installs -->\n```sh\ncargo install x\n```\n\n\
                ```sh\necho one\necho two\n```\n\n```text\nout\n```\n\n\
                <!-- test: after the checks -->\n```sh\nkill $P\n```\n";
    let blocks = shell_blocks(page);
    let got: Vec<(usize, Run, &str)> = blocks
        .iter()
        .map(|b| (b.line, b.run, b.text.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            (4, Run::Skip, "cargo install x"),
            (8, Run::InOrder, "echo one\necho two"),
            (18, Run::AfterChecks, "kill $P"),
        ]
    );
    for bad in [
        "```bash\necho\n```\n",
        "```sh,ignore\necho\n```\n",
        "<!-- test: skip -->\n```sh\necho\n```\n",
        "<!-- test: later -->\n```sh\necho\n```\n",
        "<!-- test: skip, why -->\n\nsome text\n```sh\necho\n```\n",
        "<!-- test: skip, why -->\n```text\nout\n```\n",
    ] {
        let refused = std::panic::catch_unwind(|| shell_blocks(bad)).is_err();
        assert!(refused, "accepted: {bad:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_getting_started_page_runs_as_written() {
    for (tool, install) in [
        ("bash", "apt-get install bash"),
        (
            "psql",
            "tests/run.sh installs Debian's postgresql; or apt-get install postgresql-client",
        ),
        ("curl", "apt-get install curl"),
    ] {
        let found = std::process::Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            found,
            "{PAGE} uses {tool}, which is not installed ({install})"
        );
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let page = std::fs::read_to_string(root.join(PAGE)).expect("read the page");
    let blocks = shell_blocks(&page);

    // what the page must hold for this test to mean anything
    let run: Vec<&Block> = blocks.iter().filter(|b| b.run == Run::InOrder).collect();
    let commands: String = run.iter().map(|b| b.text.as_str()).collect();
    for needed in [
        "outbox-relay migrate",
        "outbox.enqueue(",
        "demo-receiver --port 48080 &",
        "allowed_networks = [\"127.0.0.0/8\"]",
        "outbox-relay run --once --config relay.toml",
        "outbox-relay show order:42:confirmation",
        "outbox-relay retry order:43:confirmation",
        "outbox-relay console",
        PAGE_CONSOLE_ADDR,
    ] {
        assert!(
            commands.contains(needed),
            "{PAGE}: no command holds {needed:?}"
        );
    }
    let skipped: Vec<&Block> = blocks.iter().filter(|b| b.run == Run::Skip).collect();
    assert!(
        skipped.iter().any(|b| b.text.contains("cargo install")),
        "{PAGE}: the install step (cargo install) is not a skipped block"
    );
    assert!(
        skipped.iter().all(|b| !b
            .text
            .lines()
            .any(|l| l.trim_start().starts_with("outbox-relay"))),
        "{PAGE}: a skipped block runs outbox-relay, which this test would then not check"
    );

    let db = TestDb::unmigrated().await;
    let scratch = scratch_dir();
    let bin = scratch.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(relay_bin(), bin.join("outbox-relay")).unwrap();
    std::os::unix::fs::symlink(demo_receiver_bin().await, bin.join("demo-receiver")).unwrap();

    let receiver_port = free_port().to_string();
    let console_addr = format!("127.0.0.1:{}", free_port());
    let localise = |text: &str| {
        text.replace(PAGE_RECEIVER_PORT, &receiver_port)
            .replace(PAGE_CONSOLE_ADDR, &console_addr)
    };
    let checks_wanted = scratch.join(".checks-wanted");
    let checks_done = scratch.join(".checks-done");
    let mut script = String::from("set -euo pipefail\n");
    let mut add = |from: &str, text: &str| {
        script.push_str(&format!("\necho '### {from}'\n{text}\n"));
    };
    for b in &run {
        add(&format!("{PAGE}:{}", b.line), &localise(&b.text));
    }
    // the test's checks run here, while the page's processes run
    add(
        "the test checks what the page promised",
        &format!(
            "touch '{}'\nuntil [ -e '{}' ]; do sleep 0.1; done",
            checks_wanted.display(),
            checks_done.display()
        ),
    );
    for b in blocks.iter().filter(|b| b.run == Run::AfterChecks) {
        add(&format!("{PAGE}:{}", b.line), &localise(&b.text));
    }
    let script_path = scratch.join("getting-started.sh");
    std::fs::write(&script_path, &script).unwrap();

    let transcript_path = scratch.join("transcript.log");
    let transcript_file = std::fs::File::create(&transcript_path).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = tokio::process::Command::new("bash");
    // none of the test runner's relay settings: only what the page says,
    // and the two listeners moved to free ports
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if name.starts_with("OUTBOX_RELAY_") || name == "DATABASE_URL_FILE" {
            cmd.env_remove(&*name);
        }
    }
    cmd.arg(&script_path)
        .current_dir(&scratch)
        .env("PATH", path)
        .env("DATABASE_URL", &db.url)
        .env("OUTBOX_RELAY__CONSOLE__ADDR", format!("\"{console_addr}\""))
        .env("OUTBOX_RELAY__RELAY__METRICS_ADDR", "\"127.0.0.1:0\"")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(transcript_file.try_clone().unwrap())
        .stderr(transcript_file)
        .process_group(0);
    let mut bash = cmd.spawn().expect("start bash");
    // declared after `db`, so it is dropped first: nothing of the page's
    // still holds the database when it goes
    let group = ProcessGroup(bash.id().expect("bash's pid"));
    let transcript = || {
        let text = std::fs::read_to_string(&transcript_path).unwrap_or_default();
        let mut out = format!("--- {} ---\n{text}", transcript_path.display());
        for log in ["relay.log", "console.log"] {
            if let Ok(t) = std::fs::read_to_string(scratch.join(log)) {
                out.push_str(&format!("\n--- {log} ---\n{t}"));
            }
        }
        out
    };

    // the page, up to its clean-up
    let started = Instant::now();
    while !checks_wanted.exists() {
        if let Some(status) = bash.try_wait().unwrap() {
            panic!(
                "the page's commands stopped ({status}) before the end:\n{}",
                transcript()
            );
        }
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "the page's commands did not finish within 90 s:\n{}",
            transcript()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // 3: migrate created the schema
    let out = transcript();
    assert!(
        out.contains("applied 0001 core") && out.contains("the schema is at version"),
        "migrate did not say what it applied:\n{out}"
    );
    // 4: the order and its intent committed together
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders WHERE id = 42")
        .fetch_one(db.pool())
        .await
        .expect("the page's orders table");
    assert_eq!(orders, 1);
    // 5, 6: the first webhook was delivered, at the first attempt
    assert_eq!(db.state("order:42:confirmation").await, "delivered");
    assert_eq!(outcomes(&db, "order:42:confirmation").await, ["delivered"]);
    // 7: three refused attempts made it dead, `show` said so, and the retry
    // delivered it under the same key generation, recorded as from dead
    assert_eq!(db.state("order:43:confirmation").await, "delivered");
    assert_eq!(
        outcomes(&db, "order:43:confirmation").await,
        ["transient", "transient", "transient", "delivered"]
    );
    let (action, detail): (String, serde_json::Value) = sqlx::query_as(
        "SELECT a.action, a.detail::jsonb FROM outbox.operator_actions a \
         JOIN outbox.intents i ON i.id = a.intent_id WHERE i.key = 'order:43:confirmation'",
    )
    .fetch_one(db.pool())
    .await
    .expect("one operator action on order:43");
    assert_eq!(action, "retry");
    assert_eq!(detail["from"], "dead", "{detail}");
    assert_eq!(detail["new_effect"], false, "{detail}");
    let shown_states: Vec<&str> = out
        .lines()
        .filter_map(|l| l.strip_prefix("state "))
        .map(str::trim)
        .collect();
    assert_eq!(
        shown_states,
        ["delivered", "dead", "delivered"],
        "what `show` printed:\n{out}"
    );
    // 8: the running relay delivers what is enqueued next, with no command
    let delivered = wait_for(Duration::from_secs(30), || async {
        db.state("order:44:confirmation").await == "delivered"
    })
    .await;
    assert!(
        delivered,
        "the running relay did not deliver order:44:\n{}",
        transcript()
    );
    let out = transcript();
    // a receiver's line may follow output that ends without a newline of
    // its own (curl's JSON), so it is found anywhere on a line
    let received = out
        .match_indices("receiver: POST /orders webhook-id=msg_")
        .filter(|(at, _)| {
            out[*at..]
                .lines()
                .next()
                .is_some_and(|l| l.ends_with("-> 200"))
        })
        .count();
    assert_eq!(received, 3, "the receiver's lines:\n{out}");
    // the output the page shows: a webhook-id is derived from the intent's
    // key, so each one the page shows is one this run printed
    let shown = webhook_ids(&page);
    assert!(!shown.is_empty(), "{PAGE} shows no webhook-id");
    for id in shown {
        assert!(
            out.contains(id),
            "{PAGE} shows {id}, which this run did not print:\n{out}"
        );
    }
    // 8: the console answers, with the pages the page tells you to look at
    assert!(
        out.contains("\"verdict\":\"Yes: the effect happened.\""),
        "the console's lookup answer:\n{out}"
    );
    let console = format!("http://{console_addr}");
    let id43: i64 = sqlx::query_scalar("SELECT id FROM outbox.intents WHERE key = $1")
        .bind("order:43:confirmation")
        .fetch_one(db.pool())
        .await
        .unwrap();
    for (path, expected) in [
        ("/".to_string(), "Overview"),
        (format!("/intents/{id43}"), "order:43:confirmation"),
        (format!("/intents/{id43}"), "gave up after 3 attempts"),
        ("/failures".to_string(), "Failures"),
        ("/lookup".to_string(), "Did it happen?"),
    ] {
        let page = reqwest::get(format!("{console}{path}"))
            .await
            .unwrap_or_else(|e| panic!("GET {path} from the console: {e}\n{}", transcript()));
        assert_eq!(page.status(), 200, "GET {path}");
        let body = page.text().await.unwrap();
        assert!(
            body.contains(expected),
            "GET {path}: no {expected:?}:\n{body}"
        );
    }

    // the page's clean-up stops everything it started
    std::fs::write(&checks_done, "").unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), bash.wait())
        .await
        .unwrap_or_else(|_| panic!("the clean-up did not finish within 30 s:\n{}", transcript()))
        .unwrap();
    assert!(status.success(), "the clean-up failed:\n{}", transcript());
    let left = group.members();
    assert!(
        left.is_empty(),
        "the page's clean-up left these running: {left:?}\n{}",
        transcript()
    );
    let out = transcript();
    assert!(
        out.contains("receiver: stopped") && out.contains("SIGTERM received"),
        "{out}"
    );
    // a failed run leaves its directory to look at
    std::fs::remove_dir_all(&scratch).ok();
}

/// The webhook ids (`msg_` and 32 hex digits) a text holds.
fn webhook_ids(text: &str) -> Vec<&str> {
    text.match_indices("msg_")
        .filter_map(|(i, _)| text.get(i..i + 36))
        .filter(|id| id[4..].bytes().all(|b| b.is_ascii_hexdigit()))
        .collect()
}

/// The outcomes of an intent's attempts, in order.
async fn outcomes(db: &TestDb, key: &str) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT a.outcome FROM outbox.attempt_history a JOIN outbox.intents i ON i.id = a.intent_id \
         WHERE i.key = $1 ORDER BY a.attempt",
    )
    .bind(key)
    .fetch_all(db.pool())
    .await
    .unwrap()
}

/// A fresh directory under target/tmp for the page's files.
fn scratch_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "getting-started-{}-{:08x}",
        std::process::id(),
        fastrand::u32(..)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `demo-receiver`, built by cargo beside the relay binary these tests
/// run: it belongs to another package of the workspace, which cargo does
/// not build for this one. tests/run.sh builds it with the same command
/// before the suite, so that here it is a no-op.
async fn demo_receiver_bin() -> PathBuf {
    let relay = relay_bin();
    let profile_dir = relay.parent().expect("the relay's directory");
    let target_dir = profile_dir.parent().expect("the target directory");
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
    let bin = profile_dir.join("demo-receiver");
    assert!(bin.exists(), "{} was not built", bin.display());
    bin
}

/// The process group of the page's script: killed on drop, so that a
/// failing test leaves nothing running.
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

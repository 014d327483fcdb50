//! The client guides run as written, each where docs/getting-started.md
//! ends: one shell runs the tutorial (as its own test does, up to its
//! clean-up), then the guide's commands and the files it saves, then the
//! tutorial's last step (dropping its database). Each output the guide
//! shows is compared with the real one (getting_started/page.rs says how),
//! and the intent the guide enqueues must be delivered with its order.
//!
//! The clients come from their private environments, as the clients' own
//! tests use them: the Python guide's `python` is
//! target/clients/python-venv's (clients/python/setup.sh), which holds the
//! client and psycopg; the TypeScript guide's packages, `outbox-relay` (built
//! here from clients/typescript with its own tsc) and `pg`, come from
//! clients/typescript/node_modules (clients/typescript/setup.sh). The
//! guides' install commands are skipped for them. The Rust guide's program
//! is built by cargo as the guide says, offline, with the versions of the
//! workspace's Cargo.lock, its path to clients/rust made absolute, into
//! target/guides/rust, which later runs reuse (the first build compiles
//! its dependencies: about a minute of CPU).

use std::path::Path;
use std::time::Duration;

use crate::common::wait_for;
use crate::getting_started::page::Run;
use crate::getting_started::session::{Page, Session};
use crate::getting_started::{outcomes, state, PAGE as TUTORIAL};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Run the tutorial, then `guide`, and check that `key` (order `order`)
/// was delivered at its first attempt. `prepare` sets the session up.
async fn continue_from_the_tutorial(
    guide: &'static str,
    key: &str,
    order: i64,
    prepare: impl FnOnce(&mut Session),
) {
    let tutorial = Page::read(TUTORIAL);
    let page = Page::read(guide);
    let commands = page.commands();
    for needed in [
        "demo-receiver --port 48080 &",
        "outbox-relay run --once --config relay.toml",
        "kill $RECEIVER_PID",
    ] {
        assert!(
            commands.contains(needed),
            "{guide}: no command holds {needed:?}"
        );
    }
    let files: String = page
        .blocks
        .iter()
        .filter(|b| matches!(b.run, Run::File(_)))
        .map(|b| b.text.as_str())
        .collect();
    assert!(
        files.contains(key) && files.contains("127.0.0.1:48080"),
        "{guide}: no file it saves enqueues {key} to the receiver on 127.0.0.1:48080"
    );
    for used in ["order:42:", "order:43:", "order:44:"] {
        assert!(
            !files.contains(used),
            "{guide}: reuses the tutorial's key {used}, which fails after the tutorial"
        );
    }

    let mut session = Session::new("guide").await;
    prepare(&mut session);
    session.add(&tutorial, |r| *r == Run::InOrder);
    // as a reader would, the test lets the tutorial's running relay deliver
    // its last intent before the tutorial's clean-up stops it
    session.checks_here();
    session.add(&tutorial, |r| *r == Run::AfterChecks);
    session.add(&page, |r| matches!(r, Run::InOrder | Run::File(_)));
    session.checks_here();
    session.add(&page, |r| *r == Run::AfterChecks);
    session.add(&tutorial, |r| *r == Run::AtEnd);
    let mut run = session.start();
    run.checks(Duration::from_secs(90)).await;
    let db = run.connect().await;
    let delivered = wait_for(Duration::from_secs(30), || async {
        state(&db, "order:44:confirmation").await == "delivered"
    })
    .await;
    assert!(
        delivered,
        "the tutorial's order:44 was not delivered:\n{}",
        run.transcript()
    );
    run.resume();
    // the guide's own steps: the Rust guide's first build compiles its
    // dependencies, minutes on two busy cores (nextest allows 5)
    run.checks(Duration::from_secs(240)).await;

    assert_eq!(state(&db, key).await, "delivered", "{}", run.transcript());
    assert_eq!(outcomes(&db, key).await, ["delivered"]);
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders WHERE id = $1")
        .bind(order)
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(orders, 1, "order {order} committed with its intent");
    run.disconnect(db).await;
    run.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_client_guide_runs_where_the_tutorial_ends() {
    let venv = Path::new(ROOT).join("target/clients/python-venv");
    assert!(
        venv.join(".installed").is_file(),
        "the Python client's private environment {} is missing: run clients/python/setup.sh",
        venv.display()
    );
    continue_from_the_tutorial(
        "docs/guides/client-python.md",
        "order:45:confirmation",
        45,
        |s| {
            s.path_first(venv.join("bin"));
            s.env("PYTHONDONTWRITEBYTECODE", "1");
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_typescript_client_guide_runs_where_the_tutorial_ends() {
    let client = Path::new(ROOT).join("clients/typescript");
    let modules = client.join("node_modules");
    assert!(
        modules.join(".outbox-relay-lock").is_file(),
        "the TypeScript client's private environment is missing: run clients/typescript/setup.sh"
    );
    // the package as `npm install` of its tarball lays it out: its
    // package.json and its build, here into a directory of this test's
    let packages =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("guide-node-{}", fastrand::u32(..)));
    let package = packages.join("node_modules/outbox-relay");
    std::fs::create_dir_all(&package).unwrap();
    std::fs::copy(client.join("package.json"), package.join("package.json")).unwrap();
    let built = tokio::process::Command::new(modules.join(".bin/tsc"))
        .arg("-p")
        .arg(client.join("tsconfig.json"))
        .arg("--outDir")
        .arg(package.join("dist"))
        .output()
        .await
        .expect("run tsc");
    assert!(
        built.status.success(),
        "tsc failed:\n{}",
        String::from_utf8_lossy(&built.stdout)
    );
    std::os::unix::fs::symlink(modules.join("pg"), packages.join("node_modules/pg")).unwrap();
    // where the guide's file is saved: Node resolves its imports from there
    let resolved = packages.join("node_modules");
    continue_from_the_tutorial(
        "docs/guides/client-typescript.md",
        "order:46:confirmation",
        46,
        |s| std::os::unix::fs::symlink(resolved, s.scratch.join("node_modules")).unwrap(),
    )
    .await;
    std::fs::remove_dir_all(&packages).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_client_guide_runs_where_the_tutorial_ends() {
    let root = Path::new(ROOT);
    let target = crate::common::relay_bin()
        .parent()
        .and_then(Path::parent)
        .expect("the target directory")
        .join("guides/rust");
    continue_from_the_tutorial(
        "docs/guides/client-rust.md",
        "order:47:confirmation",
        47,
        |s| {
            s.replace(
                "path = \"../clients/rust\"",
                &format!("path = \"{}\"", root.join("clients/rust").display()),
            );
            s.env("CARGO_TARGET_DIR", &target.display().to_string());
            s.env("CARGO_NET_OFFLINE", "true");
            let project = s.scratch.join("confirm-order");
            std::fs::create_dir_all(&project).unwrap();
            std::fs::copy(root.join("Cargo.lock"), project.join("Cargo.lock")).unwrap();
        },
    )
    .await;
}

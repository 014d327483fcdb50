//! The Postgres server's share of a drain: the CPU time of its processes
//! and the WAL it wrote.
//!
//! Relays scale out; the database they share does not, so what Postgres
//! spends per job bounds a whole fleet. The server's processes are the
//! postmaster and its children (backends, WAL writer, checkpointer,
//! autovacuum workers, ...), found from a backend of the bench's own
//! connection; their CPU time is read from `/proc/PID/schedstat`
//! (nanoseconds on the CPU), and a child that exits during a window is
//! counted through the postmaster's reaped-children time (`cutime` and
//! `cstime` of `/proc/PID/stat`). Only for a server on this machine (the
//! bench only talks to loopback), and only on Linux; elsewhere the figures
//! are absent. The WAL is `pg_current_wal_insert_lsn()`: bytes the whole
//! server wrote, whoever wrote them.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_relay::store::Store;

/// The local Postgres server the bench's database lives on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Server {
    postmaster: u32,
}

/// Clock ticks per second of `/proc/PID/stat` (USER_HZ: 100 on Linux,
/// whatever the kernel's own tick rate).
const USER_HZ: f64 = 100.0;

/// Fields of `/proc/PID/stat` after the parenthesised command name (which
/// may hold spaces): index 0 is field 3 (state).
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    Some(stat[stat.rfind(')')? + 1..].split_whitespace().collect())
}

/// The command name of `/proc/PID/stat`.
fn stat_comm(stat: &str) -> Option<&str> {
    Some(&stat[stat.find('(')? + 1..stat.rfind(')')?])
}

/// Nanoseconds a process has run, from its `/proc/PID/schedstat`.
fn schedstat_ns(text: &str) -> Option<u64> {
    text.split_whitespace().next()?.parse().ok()
}

impl Server {
    /// The server behind `store`: its backend's parent, when that is a
    /// `postgres` process on this machine.
    pub(crate) async fn find(store: &Store) -> Option<Server> {
        let backend: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(store.pool())
            .await
            .ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{backend}/stat")).ok()?;
        // field 4, the parent
        let postmaster: u32 = stat_fields(&stat)?.get(1)?.parse().ok()?;
        let pm_stat = std::fs::read_to_string(format!("/proc/{postmaster}/stat")).ok()?;
        if !matches!(stat_comm(&pm_stat)?, "postgres" | "postmaster") {
            return None;
        }
        let server = Server { postmaster };
        server.processes().map(|_| server)
    }

    /// The CPU of the postmaster, of each live child by what it does, and
    /// of the children it has reaped.
    pub(crate) fn processes(&self) -> Option<Processes> {
        let pm = self.postmaster;
        let stat = std::fs::read_to_string(format!("/proc/{pm}/stat")).ok()?;
        let fields = stat_fields(&stat)?;
        // cutime and cstime are fields 16 and 17
        let reaped_ticks: u64 =
            fields.get(13)?.parse::<u64>().ok()? + fields.get(14)?.parse::<u64>().ok()?;
        let postmaster_ns =
            schedstat_ns(&std::fs::read_to_string(format!("/proc/{pm}/schedstat")).ok()?)?;
        let children = std::fs::read_to_string(format!("/proc/{pm}/task/{pm}/children")).ok()?;
        let mut live = Vec::new();
        for child in children.split_whitespace() {
            // a child that exited since the listing is in the reaped time
            // once the postmaster has waited for it
            let Some(ns) = std::fs::read_to_string(format!("/proc/{child}/schedstat"))
                .ok()
                .as_deref()
                .and_then(schedstat_ns)
            else {
                continue;
            };
            let title = std::fs::read(format!("/proc/{child}/cmdline")).unwrap_or_default();
            let pid = child.parse().unwrap_or(0);
            live.push((pid, role_of(&String::from_utf8_lossy(&title)), ns));
        }
        Some(Processes {
            postmaster_ns,
            reaped_ns: (reaped_ticks as f64 / USER_HZ * 1e9) as u64,
            live,
        })
    }
}

/// One reading of the server's processes' CPU, in nanoseconds.
#[derive(Debug, Clone, Default)]
pub(crate) struct Processes {
    postmaster_ns: u64,
    /// Every child the postmaster has waited for (clock-tick resolution).
    reaped_ns: u64,
    /// Each live child: its pid, its [`role_of`] and its CPU so far.
    live: Vec<(u32, &'static str, u64)>,
}

impl Processes {
    /// A reading of a server whose postmaster alone has run `ns`.
    #[cfg(test)]
    pub(crate) fn postmaster_only(ns: u64) -> Processes {
        Processes {
            postmaster_ns: ns,
            ..Processes::default()
        }
    }

    /// Nanoseconds of CPU the server's processes have used.
    pub(crate) fn total_ns(&self) -> u64 {
        self.postmaster_ns + self.reaped_ns + self.live.iter().map(|c| c.2).sum::<u64>()
    }

    /// What each role spent from `self` to `to`. A child that exited in
    /// between (an autovacuum worker, mostly) is counted as `exited`: the
    /// reaped time that grew, less what those children had spent before.
    pub(crate) fn by_role(&self, to: &Processes) -> BTreeMap<&'static str, u64> {
        let before: HashMap<u32, u64> = self.live.iter().map(|c| (c.0, c.2)).collect();
        let now: HashMap<u32, u64> = to.live.iter().map(|c| (c.0, c.2)).collect();
        let mut roles = BTreeMap::new();
        for &(pid, role, ns) in &to.live {
            *roles.entry(role).or_insert(0) +=
                ns.saturating_sub(before.get(&pid).copied().unwrap_or(0));
        }
        let gone: u64 = before
            .iter()
            .filter(|(pid, _)| !now.contains_key(pid))
            .map(|(_, ns)| ns)
            .sum();
        *roles.entry("exited").or_insert(0) += to.reaped_ns.saturating_sub(self.reaped_ns + gone);
        *roles.entry("other").or_insert(0) += to.postmaster_ns.saturating_sub(self.postmaster_ns);
        roles
    }
}

/// What a server process does, from the title Postgres gives it
/// (`postgres: walwriter`, `postgres: 15/main: USER DB HOST(PORT) STATE`
/// with a `cluster_name`, ...).
fn role_of(title: &str) -> &'static str {
    let parts: Vec<&str> = title.split(": ").skip(1).collect();
    [
        ("autovacuum", "autovacuum"),
        ("walwriter", "walwriter"),
        ("checkpointer", "checkpointer"),
        ("background writer", "bgwriter"),
        ("logical replication", "other"),
        ("walsender", "other"),
        ("archiver", "other"),
        ("stats collector", "other"),
    ]
    .into_iter()
    .find(|(prefix, _)| parts.iter().any(|p| p.starts_with(prefix)))
    .map_or("backends", |(_, role)| role)
}

/// Bytes from 0/0 to where the server's WAL insert position stands.
pub(crate) async fn wal_position(store: &Store) -> Option<i64> {
    sqlx::query_scalar("SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint")
        .fetch_one(store.pool())
        .await
        .ok()
}

/// The WAL position every 10 ms while it lives (for a peer, which times
/// its own drain): one small query on one connection each time.
pub(crate) struct WalSampler {
    readings: Arc<Mutex<Vec<(f64, i64)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl WalSampler {
    pub(crate) fn start(store: &Store) -> WalSampler {
        let readings = Arc::new(Mutex::new(Vec::new()));
        let task = {
            let (store, readings) = (store.clone(), readings.clone());
            tokio::spawn(async move {
                loop {
                    if let (Some(at), Ok(mut all)) = (wal_position(&store).await, readings.lock()) {
                        all.push((crate::cpu::unix_now(), at));
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
        };
        WalSampler { readings, task }
    }

    /// Stop, and the WAL written over `[from, to]` (wall-clock seconds):
    /// from the last reading at or before `from` to the first at or after
    /// `to`.
    pub(crate) fn window(self, from: f64, to: f64) -> Option<i64> {
        self.task.abort();
        let all = self.readings.lock().ok()?;
        let first = all.iter().rev().find(|r| r.0 <= from)?;
        let last = all.iter().find(|r| r.0 >= to)?;
        last.1.checked_sub(first.1)
    }
}

impl Drop for WalSampler {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_parent_command_and_times() {
        let stat = "4242 (postgres: bench) S 2241 4242 4242 0 -1 4194560 100 0 0 0 \
                    123 45 7 8 20 0 1 0 1000 0 0";
        let f = stat_fields(stat).unwrap();
        assert_eq!(f[1], "2241");
        assert_eq!((f[11], f[12], f[13], f[14]), ("123", "45", "7", "8"));
        assert_eq!(stat_comm(stat), Some("postgres: bench"));
        assert_eq!(schedstat_ns("34509069 2006453 49\n"), Some(34_509_069));
        assert_eq!(schedstat_ns(""), None);
    }

    #[test]
    fn tells_the_server_processes_apart_by_title() {
        assert_eq!(role_of("postgres: walwriter   "), "walwriter");
        assert_eq!(
            role_of("postgres: 15/main: autovacuum worker bench"),
            "autovacuum"
        );
        assert_eq!(role_of("postgres: 15/main: checkpointer"), "checkpointer");
        assert_eq!(
            role_of("postgres: postgres autovacuum_db 127.0.0.1(5312) idle"),
            "backends"
        );
        assert_eq!(
            role_of("postgres: 15/main: postgres bench [local] SELECT"),
            "backends"
        );
    }

    #[test]
    fn a_child_that_exits_is_counted_from_the_reaped_time() {
        let from = Processes {
            postmaster_ns: 10,
            reaped_ns: 1_000,
            live: vec![(1, "backends", 500), (2, "autovacuum", 300)],
        };
        // 2 exits having run 450 in all; 3 starts and runs 40
        let to = Processes {
            postmaster_ns: 15,
            reaped_ns: 1_450,
            live: vec![(1, "backends", 800), (3, "walwriter", 40)],
        };
        let roles = from.by_role(&to);
        assert_eq!(roles["backends"], 300);
        assert_eq!(roles["walwriter"], 40);
        assert_eq!(roles["exited"], 150);
        assert_eq!(roles["other"], 5);
        assert_eq!(roles.values().sum::<u64>(), to.total_ns() - from.total_ns());
    }
}

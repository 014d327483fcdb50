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
        server.cpu_ns().map(|_| server)
    }

    /// Nanoseconds of CPU the server's processes have used: the postmaster
    /// and its live children (schedstat), and the children it has reaped
    /// (its cutime + cstime, in clock ticks).
    pub(crate) fn cpu_ns(&self) -> Option<u64> {
        let pm = self.postmaster;
        let stat = std::fs::read_to_string(format!("/proc/{pm}/stat")).ok()?;
        let fields = stat_fields(&stat)?;
        // cutime and cstime are fields 16 and 17
        let reaped_ticks: u64 =
            fields.get(13)?.parse::<u64>().ok()? + fields.get(14)?.parse::<u64>().ok()?;
        let mut ns = (reaped_ticks as f64 / USER_HZ * 1e9) as u64;
        ns += schedstat_ns(&std::fs::read_to_string(format!("/proc/{pm}/schedstat")).ok()?)?;
        let children = std::fs::read_to_string(format!("/proc/{pm}/task/{pm}/children")).ok()?;
        for child in children.split_whitespace() {
            // a child that exited since the listing is in the reaped time
            // once the postmaster has waited for it
            if let Some(n) = std::fs::read_to_string(format!("/proc/{child}/schedstat"))
                .ok()
                .as_deref()
                .and_then(schedstat_ns)
            {
                ns += n;
            }
        }
        Some(ns)
    }
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
}

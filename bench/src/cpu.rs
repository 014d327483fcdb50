//! The machine's CPU over a drain: how much of it a system used per job.
//!
//! On a machine where the queue, Postgres and the receiver share the cores,
//! a drain that keeps them busy is bound by what each job costs the whole
//! machine, whoever spends it. So beside each drain rate the bench reports
//! the CPU time all processes spent during the drain (from `/proc/stat`)
//! divided by its jobs, how busy the machine was, and the part of it spent
//! by the bench process itself (the receiver, mostly), by the Postgres
//! server's processes (crate::server) and, for the relay, by the relay
//! processes. Linux only; elsewhere the figures are absent.
//!
//! A peer times its own drain, so the sampler keeps a reading every 10 ms
//! while a peer runs, and the peer's reported window (wall-clock times)
//! picks the readings around it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::server::{Processes, Server};

/// CPU use over one drain.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CpuUse {
    /// The window the figures cover.
    pub seconds: f64,
    /// Busy share of all the machine's CPUs over the window (0 to 1).
    pub busy_share: f64,
    /// CPU time of every process on the machine over the window, per job.
    pub machine_us_per_job: f64,
    /// Of that, the bench process's (the receiver's threads, mostly).
    pub bench_us_per_job: f64,
    /// Of that, the relay processes' (for the relay's drains).
    pub relay_us_per_job: Option<f64>,
    /// Of that, the Postgres server's processes' (crate::server).
    pub postgres_us_per_job: Option<f64>,
    /// WAL the server wrote over the window, per job.
    pub wal_bytes_per_job: Option<f64>,
    /// The server's CPU per job by what its processes do: `backends` (the
    /// clients' connections), `autovacuum`, `walwriter`, `checkpointer`,
    /// `bgwriter`, `exited` (children that ended in the window, mostly
    /// autovacuum workers) and `other`.
    pub postgres_us_by_role: Option<BTreeMap<String, f64>>,
}

/// One reading: wall-clock seconds, the machine's busy and total ticks
/// (all CPUs), how many CPUs they are summed over, and this process's
/// ticks.
#[derive(Debug, Clone)]
pub(crate) struct Reading {
    unix: f64,
    busy: u64,
    total: u64,
    cpus: f64,
    own: u64,
    /// The CPU the Postgres server's processes have used, process by
    /// process.
    postgres: Option<Processes>,
}

/// Seconds since the epoch, as the peers report theirs.
pub(crate) fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// The machine's ticks from the first line of /proc/stat: busy (user, nice,
/// system, irq, softirq) and total (those, idle, iowait and steal: time a
/// hypervisor took is nobody's here).
fn machine_ticks(stat: &str) -> Option<(u64, u64)> {
    let line = stat.lines().next()?;
    let mut fields = line.split_whitespace();
    if fields.next()? != "cpu" {
        return None;
    }
    let v: Vec<u64> = fields
        .take(8)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    let [user, nice, system, idle, iowait, irq, softirq, steal] = v[..] else {
        return None;
    };
    let busy = user + nice + system + irq + softirq;
    Some((busy, busy + idle + iowait + steal))
}

/// utime + stime of a process from its /proc/PID/stat text (the fields
/// after the parenthesised command name, which may hold spaces).
fn process_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // state is field 3 of the whole line, utime 14 and stime 15
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// Ticks a process has used, or `None` when it cannot be read.
pub(crate) fn ticks_of(pid: u32) -> Option<u64> {
    process_ticks(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// A reading of the machine, this process and, when given, the server.
pub(crate) fn read(server: Option<&Server>) -> Option<Reading> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let (busy, total) = machine_ticks(&stat)?;
    let own = process_ticks(&std::fs::read_to_string("/proc/self/stat").ok()?)?;
    let postgres = server.and_then(Server::processes);
    Some(Reading {
        unix: unix_now(),
        busy,
        total,
        cpus: cpus(&stat)?,
        own,
        postgres,
    })
}

/// The machine's CPUs, as /proc/stat counts them (its `cpuN` lines).
fn cpus(stat: &str) -> Option<f64> {
    let n = stat
        .lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .count();
    (n > 0).then_some(n as f64)
}

/// CPU use between two readings, for `jobs` jobs; `relay_ticks` is what the
/// relay processes used between them, when they were measured.
pub(crate) fn between(
    from: &Reading,
    to: &Reading,
    jobs: usize,
    relay_ticks: Option<u64>,
) -> Option<CpuUse> {
    let seconds = to.unix - from.unix;
    let total = to.total.checked_sub(from.total)?;
    if seconds <= 0.0 || total == 0 || jobs == 0 {
        return None;
    }
    // ticks per CPU-second, from the readings themselves
    let hz = total as f64 / (to.cpus * seconds);
    let us_per_job = |ticks: u64| ticks as f64 / hz * 1e6 / jobs as f64;
    let busy = to.busy.checked_sub(from.busy)?;
    Some(CpuUse {
        seconds,
        busy_share: busy as f64 / total as f64,
        machine_us_per_job: us_per_job(busy),
        bench_us_per_job: us_per_job(to.own.checked_sub(from.own)?),
        relay_us_per_job: relay_ticks.map(us_per_job),
        postgres_us_per_job: to
            .postgres
            .as_ref()
            .zip(from.postgres.as_ref())
            .and_then(|(to, from)| to.total_ns().checked_sub(from.total_ns()))
            .map(|ns| ns as f64 / 1e3 / jobs as f64),
        wal_bytes_per_job: None,
        postgres_us_by_role: from
            .postgres
            .as_ref()
            .zip(to.postgres.as_ref())
            .map(|(a, b)| {
                a.by_role(b)
                    .into_iter()
                    .map(|(role, ns)| (role.to_string(), ns as f64 / 1e3 / jobs as f64))
                    .collect()
            }),
    })
}

impl CpuUse {
    /// With the WAL written over the same window.
    pub(crate) fn with_wal(mut self, bytes: Option<i64>, jobs: usize) -> CpuUse {
        self.wal_bytes_per_job = bytes.filter(|_| jobs > 0).map(|b| b as f64 / jobs as f64);
        self
    }
}

/// Readings every 10 ms on a thread of its own, while it lives.
pub(crate) struct Sampler {
    readings: Arc<Mutex<Vec<Reading>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    server: Option<Server>,
}

impl Sampler {
    pub(crate) fn start(server: Option<Server>) -> Sampler {
        // the first reading before the thread runs, and (in `window`) the
        // last after it stops: a starved thread still leaves both ends
        let readings = Arc::new(Mutex::new(
            read(server.as_ref()).into_iter().collect::<Vec<_>>(),
        ));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (readings, stop) = (readings.clone(), stop.clone());
            std::thread::Builder::new()
                .name("bench-cpu".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        if let (Some(r), Ok(mut all)) = (read(server.as_ref()), readings.lock()) {
                            all.push(r);
                        }
                        std::thread::sleep(Duration::from_millis(10));
                    }
                })
                .ok()
        };
        Sampler {
            readings,
            stop,
            thread,
            server,
        }
    }

    /// Stop, and the CPU use over `[from, to]` (wall-clock seconds): from
    /// the last reading at or before `from` to the first at or after `to`.
    pub(crate) fn window(mut self, from: f64, to: f64, jobs: usize) -> Option<CpuUse> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let mut all = self.readings.lock().ok()?;
        all.extend(read(self.server.as_ref()));
        let first = all.iter().rev().find(|r| r.unix <= from)?;
        let last = all.iter().find(|r| r.unix >= to)?;
        between(first, last, jobs, None)
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_machine_and_process_lines() {
        let stat = "cpu  100 5 50 800 20 3 2 7 0 0\ncpu0 50 2 25 400 10 1 1 3 0 0\n";
        assert_eq!(machine_ticks(stat), Some((160, 987)));
        assert_eq!(machine_ticks("intr 1 2 3\n"), None);
        assert_eq!(cpus(stat), Some(1.0));
        let proc = "4242 (tokio rt) worker) S 1 4242 4242 0 -1 4194560 100 0 0 0 \
                    123 45 0 0 20 0 9 0 1000 0 0";
        assert_eq!(process_ticks(proc), Some(168));
    }

    #[test]
    fn a_window_divides_the_machine_time_among_the_jobs() {
        let from = Reading {
            unix: 100.0,
            busy: 1_000,
            total: 10_000,
            cpus: 2.0,
            own: 10,
            postgres: Some(Processes::postmaster_only(1_000_000_000)),
        };
        // two seconds of two CPUs at 100 ticks per CPU-second: 400 ticks,
        // 300 of them busy
        let to = Reading {
            unix: 102.0,
            busy: 1_300,
            total: 10_400,
            cpus: 2.0,
            own: 60,
            postgres: Some(Processes::postmaster_only(1_250_000_000)),
        };
        let cpu = between(&from, &to, 1_000, Some(100)).unwrap();
        assert!((cpu.seconds - 2.0).abs() < 1e-9);
        assert!((cpu.busy_share - 0.75).abs() < 1e-9);
        // 3 CPU-seconds over 1,000 jobs
        assert!((cpu.machine_us_per_job - 3_000.0).abs() < 1e-6);
        assert!((cpu.bench_us_per_job - 500.0).abs() < 1e-6);
        assert!((cpu.relay_us_per_job.unwrap() - 1_000.0).abs() < 1e-6);
        // a quarter of a CPU-second over 1,000 jobs
        assert!((cpu.postgres_us_per_job.unwrap() - 250.0).abs() < 1e-6);
        let cpu = cpu.with_wal(Some(2_000_000), 1_000);
        assert_eq!(cpu.wal_bytes_per_job, Some(2_000.0));
        assert!(between(&to, &from, 1_000, None).is_none());
        assert!(between(&from, &to, 0, None).is_none());
    }
}

//! One supervisor for the relay's long-running tasks.
//!
//! Every task the daemon runs (claim loop, completer, sweeper, listener,
//! heartbeat, schedules, retention, gauges, the HTTP listener) is started
//! here under a name and stopped by the one stop signal. A task is expected
//! to run until that signal: one that ends before it, or panics, is a
//! broken relay, and so is a task that stops making progress (a check
//! reports it, such as a completion statement running longer than a
//! lease). [`Supervisor::failure`] resolves with the first such problem;
//! the engine then makes the relay unready, hands back what it can and
//! exits non-zero, so that whatever supervises the process restarts it.

use std::future::Future;
use std::time::Duration;

use futures_util::future::select_all;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A long-running task to start: a name for logs and `/readyz`, and the
/// future that runs until the stop signal.
pub struct Service {
    pub name: &'static str,
    pub run: futures_util::future::BoxFuture<'static, ()>,
    /// Runs through the shutdown (the HTTP listener, so `/readyz` keeps
    /// answering 503 until the process exits): watched like the others,
    /// not waited for at the stop, ended last.
    pub lasting: bool,
}

impl Service {
    pub fn new(name: &'static str, run: impl Future<Output = ()> + Send + 'static) -> Service {
        Service {
            name,
            run: Box::pin(run),
            lasting: false,
        }
    }

    /// A service that outlives the stop signal (see [`Service::lasting`]).
    pub fn lasting(name: &'static str, run: impl Future<Output = ()> + Send + 'static) -> Service {
        Service {
            lasting: true,
            ..Service::new(name, run)
        }
    }
}

/// A progress check: `Some(problem)` when the task it watches is stuck.
pub type Check = Box<dyn Fn() -> Option<String> + Send + Sync>;

/// The message a panic carried (`panic!("...")` gives a `&str` or a
/// `String`), for logs and reasons.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".into())
}

enum Event {
    Ended(usize, Result<(), tokio::task::JoinError>),
    Tick,
}

/// Watches named tasks until the stop signal.
pub struct Supervisor {
    tasks: Vec<(&'static str, JoinHandle<()>)>,
    /// Names of the tasks started with [`Service::lasting`].
    lasting: Vec<&'static str>,
    checks: Vec<(&'static str, Check)>,
    stop: watch::Receiver<bool>,
    /// How often the progress checks run.
    every: Duration,
}

impl Supervisor {
    pub fn new(stop: watch::Receiver<bool>) -> Supervisor {
        Supervisor {
            tasks: Vec::new(),
            lasting: Vec::new(),
            checks: Vec::new(),
            stop,
            every: Duration::from_secs(1),
        }
    }

    /// Start `service` on the runtime and watch it.
    pub fn start(&mut self, service: Service) {
        if service.lasting {
            self.lasting.push(service.name);
        }
        let handle = tokio::spawn(service.run);
        self.tasks.push((service.name, handle));
    }

    /// Watch a task started elsewhere.
    pub fn adopt(&mut self, name: &'static str, handle: JoinHandle<()>) {
        self.tasks.push((name, handle));
    }

    /// Run `check` every second while the relay runs.
    pub fn check(&mut self, name: &'static str, check: Check) {
        self.checks.push((name, check));
    }

    /// The names of the tasks watched.
    pub fn names(&self) -> Vec<&'static str> {
        self.tasks.iter().map(|t| t.0).collect()
    }

    /// Resolves with the first problem: a task that ended or panicked
    /// before the stop signal, or a failed progress check. Never resolves
    /// while all is well (nor after the stop signal).
    pub async fn failure(&mut self) -> String {
        let mut tick = tokio::time::interval(self.every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if self.tasks.is_empty() {
                std::future::pending::<()>().await;
            }
            let event = {
                let ended = select_all(self.tasks.iter_mut().map(|t| &mut t.1));
                tokio::select! {
                    (result, i, _) = ended => Event::Ended(i, result),
                    _ = tick.tick() => Event::Tick,
                }
            };
            if *self.stop.borrow() {
                if let Event::Ended(i, _) = event {
                    self.tasks.remove(i);
                }
                continue;
            }
            match event {
                Event::Ended(i, result) => {
                    let (name, _) = self.tasks.remove(i);
                    return match result {
                        Ok(()) => format!("task {name} ended unexpectedly"),
                        Err(e) if e.is_panic() => {
                            let what = panic_message(&*e.into_panic());
                            format!("task {name} panicked: {what}")
                        }
                        Err(_) => format!("task {name} was cancelled"),
                    };
                }
                Event::Tick => {
                    for (name, check) in &self.checks {
                        if let Some(problem) = check() {
                            return format!("task {name} is stuck: {problem}");
                        }
                    }
                }
            }
        }
    }

    /// After the stop signal: wait up to `deadline` for every task to end,
    /// then abort the ones still running, and the lasting ones. Returns the
    /// names of the tasks that did not stop in time.
    pub async fn join(self, deadline: Duration) -> Vec<&'static str> {
        let until = tokio::time::Instant::now() + deadline;
        let mut late = Vec::new();
        let mut lasting = Vec::new();
        for (name, mut handle) in self.tasks {
            if self.lasting.contains(&name) {
                lasting.push(handle);
            } else if tokio::time::timeout_at(until, &mut handle).await.is_err() {
                handle.abort();
                late.push(name);
            }
        }
        for handle in lasting {
            handle.abort();
        }
        late
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    fn forever(stop: watch::Receiver<bool>) -> impl Future<Output = ()> + Send + 'static {
        let mut stop = stop;
        async move {
            let _ = stop.wait_for(|s| *s).await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_panicking_task_is_named() {
        let (tx, rx) = watch::channel(false);
        let mut sup = Supervisor::new(rx.clone());
        sup.start(Service::new("steady", forever(rx.clone())));
        sup.start(Service::new("sweeper", async {
            tokio::time::sleep(Duration::from_secs(3)).await;
            panic!("boom");
        }));
        let failure = sup.failure().await;
        assert_eq!(failure, "task sweeper panicked: boom");
        let _ = tx.send(true);
        assert!(sup.join(Duration::from_secs(1)).await.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_that_ends_before_the_stop_is_a_failure() {
        let (_tx, rx) = watch::channel(false);
        let mut sup = Supervisor::new(rx);
        sup.start(Service::new("gauges", async {}));
        assert_eq!(sup.failure().await, "task gauges ended unexpectedly");
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_check_is_a_failure_and_tasks_that_stop_on_the_signal_are_not() {
        let (tx, rx) = watch::channel(false);
        let mut sup = Supervisor::new(rx.clone());
        sup.start(Service::new("claim loop", forever(rx.clone())));
        let stuck = Arc::new(AtomicBool::new(false));
        let flag = stuck.clone();
        sup.check(
            "completer",
            Box::new(move || {
                flag.load(Ordering::SeqCst)
                    .then(|| "a statement has run for 61s".to_string())
            }),
        );
        let quiet = tokio::time::timeout(Duration::from_secs(10), sup.failure()).await;
        assert!(quiet.is_err(), "nothing is wrong yet");
        stuck.store(true, Ordering::SeqCst);
        assert_eq!(
            sup.failure().await,
            "task completer is stuck: a statement has run for 61s"
        );
        // after the stop signal, ending is what tasks are meant to do
        stuck.store(false, Ordering::SeqCst);
        let _ = tx.send(true);
        let after = tokio::time::timeout(Duration::from_secs(5), sup.failure()).await;
        assert!(after.is_err(), "a stopped task is no failure");
    }

    #[tokio::test(start_paused = true)]
    async fn join_aborts_what_does_not_stop() {
        let (tx, rx) = watch::channel(false);
        let mut sup = Supervisor::new(rx);
        sup.start(Service::new("stubborn", std::future::pending::<()>()));
        let _ = tx.send(true);
        assert_eq!(sup.join(Duration::from_secs(2)).await, ["stubborn"]);
    }
}

//! Expansions in batches: the events being expanded at once go to the
//! database together, in one statement (`outbox.expand_events`).
//!
//! Each expansion asks the batcher's task and waits for its answer. The
//! task takes every request waiting, sends them as one statement, answers
//! each, and takes the next: while one statement runs, the next batch
//! gathers, so a relay expanding many events makes few statements and one
//! expanding a single event waits for no one. A batch holds at most
//! [`MOST_EVENTS`] events, and fewer when the last statement's events
//! matched many subscriptions each, so that one statement stays within
//! [`PAIRS`] deliveries.

use std::sync::{Arc, OnceLock};

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::{Expand, ExpandError, Expanded};

/// The most events one statement expands.
pub const MOST_EVENTS: usize = 100;

/// About the most deliveries one statement makes.
pub const PAIRS: usize = 5_000;

type Answer = Result<Expanded, ExpandError>;

struct Request {
    event: i64,
    deadline: Instant,
    answer: oneshot::Sender<Answer>,
}

/// Gathers expansions into statements (see the module's docs).
pub struct Batcher {
    expander: Arc<dyn Expand>,
    /// The task's queue, made on the first expansion (the task needs the
    /// runtime); the task ends when the batcher is dropped.
    queue: OnceLock<mpsc::UnboundedSender<Request>>,
}

impl Batcher {
    pub fn new(expander: Arc<dyn Expand>) -> Batcher {
        Batcher {
            expander,
            queue: OnceLock::new(),
        }
    }

    /// Expand `event`, answered by `deadline`.
    pub async fn expand(&self, event: i64, deadline: Instant) -> Answer {
        let queue = self.queue.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(run(self.expander.clone(), rx));
            tx
        });
        let (answer, answered) = oneshot::channel();
        let request = Request {
            event,
            deadline,
            answer,
        };
        if queue.send(request).is_err() {
            return Err(ExpandError::NotDone(
                "the expansions' task has ended".into(),
            ));
        }
        answered.await.unwrap_or_else(|_| {
            Err(ExpandError::Unknown(
                "the expansions' task ended while the expansion ran".into(),
            ))
        })
    }
}

async fn run(expander: Arc<dyn Expand>, mut queue: mpsc::UnboundedReceiver<Request>) {
    let mut most = MOST_EVENTS;
    while let Some(first) = queue.recv().await {
        let mut batch = vec![first];
        while batch.len() < most {
            match queue.try_recv() {
                Ok(request) => batch.push(request),
                Err(_) => break,
            }
        }
        // one past its deadline is not sent: nothing was written for it
        let now = Instant::now();
        let (late, batch): (Vec<_>, Vec<_>) = batch.into_iter().partition(|r| r.deadline <= now);
        for r in late {
            let _ = r.answer.send(Err(ExpandError::NotDone(
                "its time ran out before the expansion began (event.timeout)".into(),
            )));
        }
        let Some(deadline) = batch.iter().map(|r| r.deadline).min() else {
            continue;
        };
        let events: Vec<i64> = batch.iter().map(|r| r.event).collect();
        match expander.expand(&events, deadline - now).await {
            Ok(answers) => {
                let matched: usize = answers
                    .iter()
                    .map(|(_, a)| a.map_or(0, |e| e.matched as usize))
                    .sum();
                most = (PAIRS * events.len() / matched.max(1)).clamp(1, MOST_EVENTS);
                for r in batch {
                    let answer = match answers.iter().find(|(id, _)| *id == r.event) {
                        Some((_, Some(expanded))) => Ok(*expanded),
                        Some((_, None)) | None => Err(ExpandError::NoEvent(format!(
                            "outbox.expand_events: no event has id {}",
                            r.event
                        ))),
                    };
                    let _ = r.answer.send(answer);
                }
            }
            Err(err) => {
                // a statement that failed may have held one event too many
                most = (batch.len() / 2).max(1);
                for r in batch {
                    let _ = r.answer.send(Err(err.clone()));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use super::*;

    /// Each statement's events; every event matches `per_event`
    /// subscriptions, except 0, which is no event.
    struct Fake {
        statements: Mutex<Vec<Vec<i64>>>,
        per_event: u32,
        fail: bool,
    }

    #[async_trait::async_trait]
    impl Expand for Fake {
        async fn expand(
            &self,
            events: &[i64],
            _budget: Duration,
        ) -> Result<Vec<(i64, Option<Expanded>)>, ExpandError> {
            self.statements.lock().unwrap().push(events.to_vec());
            tokio::time::sleep(Duration::from_millis(20)).await;
            if self.fail {
                return Err(ExpandError::Unknown("lost".into()));
            }
            Ok(events
                .iter()
                .map(|&e| {
                    let expanded = (e != 0).then_some(Expanded {
                        matched: self.per_event,
                        created: self.per_event,
                    });
                    (e, expanded)
                })
                .collect())
        }
    }

    fn fake(per_event: u32, fail: bool) -> Arc<Fake> {
        Arc::new(Fake {
            statements: Mutex::new(Vec::new()),
            per_event,
            fail,
        })
    }

    async fn expand_all(batcher: &Arc<Batcher>, events: impl Iterator<Item = i64>) -> Vec<Answer> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let tasks: Vec<_> = events
            .map(|e| {
                let b = batcher.clone();
                tokio::spawn(async move { b.expand(e, deadline).await })
            })
            .collect();
        let mut answers = Vec::new();
        for t in tasks {
            answers.push(t.await.unwrap());
        }
        answers
    }

    #[tokio::test]
    async fn expansions_at_once_share_statements_and_each_gets_its_answer() {
        let f = fake(2, false);
        let batcher = Arc::new(Batcher::new(f.clone()));
        let answers = expand_all(&batcher, (0..250).map(|e| e as i64)).await;
        let statements = f.statements.lock().unwrap().clone();
        assert!(
            statements.len() < 50,
            "250 expansions took {} statements",
            statements.len()
        );
        assert!(statements.iter().all(|s| s.len() <= MOST_EVENTS));
        assert!(matches!(&answers[0], Err(ExpandError::NoEvent(_))));
        for a in &answers[1..] {
            assert_eq!(
                a.as_ref().unwrap(),
                &Expanded {
                    matched: 2,
                    created: 2
                }
            );
        }
    }

    #[tokio::test]
    async fn events_that_match_many_subscriptions_go_fewer_to_a_statement() {
        let f = fake(2_500, false);
        let batcher = Arc::new(Batcher::new(f.clone()));
        expand_all(&batcher, 1..=1).await;
        expand_all(&batcher, 1..=20).await;
        let statements = f.statements.lock().unwrap().clone();
        assert!(
            statements[1..].iter().all(|s| s.len() <= 2),
            "{statements:?}"
        );
    }

    #[tokio::test]
    async fn a_failed_statement_is_each_ones_answer_and_one_out_of_time_is_not_sent() {
        let f = fake(1, true);
        let batcher = Arc::new(Batcher::new(f.clone()));
        let answers = expand_all(&batcher, 1..=3).await;
        assert!(answers
            .iter()
            .all(|a| matches!(a, Err(ExpandError::Unknown(r)) if r == "lost")));
        let late = batcher.expand(9, Instant::now()).await;
        assert!(matches!(late, Err(ExpandError::NotDone(_))), "{late:?}");
        assert!(!f.statements.lock().unwrap().iter().any(|s| s.contains(&9)));
    }
}

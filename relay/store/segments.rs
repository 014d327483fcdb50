//! The segments of the log (schemas 0042 and 0043): `outbox.intent_log`
//! and `outbox.log_outcomes` are partitioned by range of id, and retention
//! retires a whole segment instead of deleting its intents one by one.
//! Each step is a function of the schema's, one short transaction per call,
//! which takes its locks at most 100 ms at a time and answers `busy` when it
//! could not; the next pass tries again. Relays may run them side by side:
//! a step that finds another relay's running answers `busy`.

use std::time::Duration;

use super::Store;

/// How long after the sequence moved on a segment may close: a statement
/// that took its id in it just before and inserts after it closed fails
/// with a serialization failure, which the application retries.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// How long one pass may keep taking steps: a segment's retirement copies
/// 50,000 intents a step (about half a second), so a pass retires a few
/// million intents and leaves the rest to the next.
const PASS_BUDGET: Duration = Duration::from_secs(20);

/// What one pass over the segments did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SegmentPass {
    /// Segments made ahead of time (attached, empty).
    pub made: u32,
    /// Segments that joined the open views, and that the sequence moved into.
    pub opened: u32,
    /// Segments that left the open views.
    pub closed: u32,
    /// Steps of retirement that copied up to 50,000 intents delivered at
    /// the first attempt into the ledger.
    pub copied: u32,
    /// Segments dropped.
    pub dropped: u32,
    /// A step could not take its lock or found another relay's step running.
    pub busy: bool,
    /// The oldest closed segment is kept: it holds an intent with neither
    /// its delivery nor a row, which must not be (the database logged a
    /// warning naming it).
    pub kept: bool,
}

impl SegmentPass {
    /// Whether the pass changed anything.
    pub fn changed(&self) -> bool {
        self.made + self.opened + self.closed + self.copied + self.dropped > 0
    }
}

impl Store {
    /// Rotate, close and retire the log's segments as far as each can go
    /// now: a new segment after `span` (or once the sequence is past the
    /// last 2^31 ids of one), retirement `older_than` after a segment
    /// closes (`None`: never).
    pub async fn maintain_log_segments(
        &self,
        span: Duration,
        older_than: Option<Duration>,
    ) -> Result<SegmentPass, sqlx::Error> {
        let started = std::time::Instant::now();
        let mut pass = SegmentPass::default();
        let mut steps = vec![("rotate_log", span), ("close_log_segment", CLOSE_GRACE)];
        if let Some(age) = older_than {
            steps.push(("retire_log_segment", age));
        }
        // a step that fails (a deadlock, a lost connection) leaves the
        // other kinds of step to go on; the first error is the pass's
        let mut failed = None;
        for (function, argument) in steps {
            while started.elapsed() < PASS_BUDGET {
                let step: String = match sqlx::query_scalar(&format!(
                    "SELECT outbox.{function}($1 * interval '1 millisecond')"
                ))
                .bind(argument.as_millis() as i64)
                .fetch_one(&self.pool)
                .await
                {
                    Ok(step) => step,
                    Err(err) => {
                        failed.get_or_insert(err);
                        break;
                    }
                };
                match step.as_str() {
                    "made" => pass.made += 1,
                    // the sequence moves in the call after the views change
                    "opened" => {}
                    "moved" => pass.opened += 1,
                    "closed" => pass.closed += 1,
                    "copied" => pass.copied += 1,
                    "dropped" => pass.dropped += 1,
                    "busy" => {
                        pass.busy = true;
                        break;
                    }
                    "kept" => {
                        pass.kept = true;
                        break;
                    }
                    _ => break,
                }
            }
        }
        match failed {
            Some(err) => Err(err),
            None => Ok(pass),
        }
    }
}

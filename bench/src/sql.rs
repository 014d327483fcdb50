//! The bench's own SQL beside the engine's: claim + complete rounds with no
//! network (the ceiling), enqueueing workloads, the blocked-key and history
//! measurements, and the wait for delivery.

use std::time::{Duration, Instant};

use chrono::Utc;
use outbox_relay::state::{AttemptOutcome, IntentState};
use outbox_relay::store::{enqueue, ClaimQuery, Completion, NewIntent, Store};

use crate::report::{BlockedBacklog, HistoryPoint, SmallClaims};

/// Empties the log, the intents' keys, the claims' rows and what belongs to
/// an intent (its row, attempts, actions and event deliveries, which no
/// foreign key ties to the log) between a bench's phases.
pub(crate) const EMPTY_LOG: &str =
    "TRUNCATE outbox.intent_log, outbox.intent_keys, outbox.log_batches, outbox.log_outcomes,
              outbox.intent_rows, outbox.attempts, outbox.operator_actions, outbox.event_deliveries";

/// Claim + complete rounds of 100 over 5,000 fresh intents, in ms per
/// round; then the same beside `behind` intents queued behind one dead
/// ordering-key head (enqueued through `outbox.enqueue`, as an application
/// would). Before waiting intents were kept out of the claim index, every
/// claim walked that backlog.
pub(crate) async fn blocked_backlog(
    store: &Store,
    behind: u64,
    payload: &impl Fn(usize) -> serde_json::Value,
) -> anyhow::Result<Option<BlockedBacklog>> {
    if behind == 0 {
        return Ok(None);
    }
    let buffers = |plan: Vec<String>| {
        plan.iter()
            .find_map(|l| l.trim().strip_prefix("Buffers: shared hit="))
            .and_then(|v| v.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    run_sql(store, EMPTY_LOG).await?;
    enqueue_batched(store, 5_000, "unblocked", payload).await?;
    run_sql(
        store,
        "VACUUM ANALYZE outbox.intent_log, outbox.intent_rows",
    )
    .await?;
    let claim_buffers_alone = buffers(store.explain_claim(100).await?);
    let alone = 100.0 / claim_complete_rate(store, 100).await? * 1000.0;
    eprintln!("bench: blocked backlog: {behind} intents behind one dead ordering-key head");
    sqlx::query(
        "SELECT outbox.enqueue('blocked-head', 'webhook', '{\"url\": \"http://127.0.0.1:9/\", \"body\": 0}',
                               NULL, now(), 'blocked')",
    )
    .execute(store.pool())
    .await?;
    run_sql(
        store,
        "UPDATE outbox.intents SET state = 'dead' WHERE key = 'blocked-head'",
    )
    .await?;
    let mut queued = 0u64;
    while queued < behind {
        let chunk = (behind - queued).min(10_000);
        sqlx::query(
            "SELECT outbox.enqueue('blocked-' || g, 'webhook',
                                   jsonb_build_object('url', 'http://127.0.0.1:9/', 'body', g),
                                   NULL, now(), 'blocked')
               FROM generate_series($1::bigint + 1, $1::bigint + $2::bigint) g",
        )
        .bind(queued as i64)
        .bind(chunk as i64)
        .execute(store.pool())
        .await?;
        queued += chunk;
    }
    enqueue_batched(store, 5_000, "beside", payload).await?;
    run_sql(
        store,
        "VACUUM ANALYZE outbox.intent_log, outbox.intent_rows",
    )
    .await?;
    let claim_buffers_beside = buffers(store.explain_claim(100).await?);
    let t = Instant::now();
    store.stats_for_gauges().await?;
    let gauges_ms = t.elapsed().as_secs_f64() * 1000.0;
    let t = Instant::now();
    store.blocked_ordering_keys().await?;
    let blocked_keys_ms = t.elapsed().as_secs_f64() * 1000.0;
    let rate = claim_complete_rate(store, 100).await?;
    let beside = 100.0 / rate * 1000.0;
    Ok(Some(BlockedBacklog {
        behind,
        round_ms_alone: alone,
        round_ms_beside: beside,
        ratio: beside / alone,
        claim_buffers_alone,
        claim_buffers_beside,
        gauges_ms,
        blocked_keys_ms,
    }))
}

/// Claim + complete rounds at each history size; the point is their median.
const HISTORY_ROUNDS: usize = 3;

/// Grow the delivered history (intents delivered at their first attempt) to each size
/// in turn; at each, EXPLAIN one claim and measure claim + complete of
/// 5,000 fresh intents, [`HISTORY_ROUNDS`] times. Flat figures mean history
/// costs the hot path nothing.
pub(crate) async fn history_scale(
    store: &Store,
    sizes: &[u64],
    payload: &impl Fn(usize) -> serde_json::Value,
) -> anyhow::Result<Vec<HistoryPoint>> {
    let mut points: Vec<HistoryPoint> = Vec::new();
    if sizes.is_empty() {
        return Ok(points);
    }
    run_sql(store, EMPTY_LOG).await?;
    let mut sizes = sizes.to_vec();
    sizes.sort_unstable();
    let mut have: u64 = 0;
    for (round, &size) in sizes.iter().enumerate() {
        eprintln!("bench: history: growing delivered history to {size} rows");
        while have < size {
            let chunk = (size - have).min(250_000);
            sqlx::query(
                // delivered at the first attempt, kept on the row as a
                // relay keeps it (schema 0018)
                "INSERT INTO outbox.intents (key, kind, payload, state, attempts, fence,
                                             provider_ref, delivered_at, updated_at, created_at,
                                             first_attempt_started_at, first_attempt_finished_at,
                                             first_attempt_owner, first_attempt_status,
                                             first_attempt_replayed)
                 SELECT 'history-' || g, 'webhook',
                        jsonb_build_object('url', 'http://127.0.0.1:9/hook', 'body',
                                           jsonb_build_object('order_id', g, 'note', repeat('x', 200))),
                        'delivered', 1, 1, 'msg_' || g,
                        now() - interval '1 day', now() - interval '1 day', now() - interval '1 day',
                        now() - interval '1 day', now() - interval '1 day', 'history', 200, false
                   FROM generate_series($1::bigint + 1, $1::bigint + $2::bigint) g",
            )
            .bind(have as i64)
            .bind(chunk as i64)
            .execute(store.pool())
            .await?;
            have += chunk;
        }
        run_sql(
            store,
            "VACUUM ANALYZE outbox.intent_log, outbox.intent_rows",
        )
        .await?;
        run_sql(store, "VACUUM ANALYZE outbox.attempts").await?;
        let mut plan = Vec::new();
        let mut rounds = Vec::with_capacity(HISTORY_ROUNDS);
        for rep in 0..HISTORY_ROUNDS {
            enqueue_batched(store, 5_000, &format!("fresh{round}-{rep}"), payload).await?;
            if rep == 0 {
                plan = store.explain_claim(100).await?;
            }
            rounds.push(claim_complete_rate(store, 100).await?);
        }
        let mut sorted = rounds.clone();
        sorted.sort_by(f64::total_cmp);
        let rate = sorted[sorted.len() / 2];
        let relative = points
            .first()
            .map_or(1.0, |p| rate / p.claim_complete_per_s);
        points.push(HistoryPoint {
            history_rows: size,
            claim_complete_per_s: rate,
            rounds,
            relative,
            claim_plan: plan,
        });
        // the fresh intents join the history
        have += 5_000 * HISTORY_ROUNDS as u64;
    }
    Ok(points)
}

/// Claim everything due in batches of `batch` and complete each batch as
/// delivered, as the engine does (its claim statement, one per relay), with
/// no network call: the rate at which this database runs the engine's own
/// SQL. Returns intents per second.
pub(crate) async fn claim_complete_rate(store: &Store, batch: i64) -> anyhow::Result<f64> {
    claim_complete_rate_as(store, &ClaimQuery::new(batch, &[]), batch).await
}

/// [`claim_complete_rate`] with claims of `n` through `query`.
async fn claim_complete_rate_as(store: &Store, query: &ClaimQuery, n: i64) -> anyhow::Result<f64> {
    const OWNER: &str = "bench-ceiling";
    let t = Instant::now();
    let mut done = 0;
    loop {
        let claims = store.claim_with(query, OWNER, n, 60_000).await?;
        if claims.is_empty() {
            break;
        }
        let now = Utc::now();
        let batch: Vec<Completion> = claims
            .into_iter()
            .map(|c| Completion {
                id: c.id,
                kind: c.kind,
                delivered_before: false,
                operator_replay: false,
                fence: c.fence,
                attempt: c.attempt,
                key_generation: c.key_generation,
                started_at: now,
                finished_at: now,
                outcome: AttemptOutcome::Delivered,
                status: Some(200),
                provider_ref: Some(format!("msg_{}", c.id)),
                error: None,
                replayed: false,
                uncounted: false,
                state: IntentState::Delivered,
                run_after: None,
                response: None,
                log_batch: c.log_batch,
            })
            .collect();
        done += store.complete(OWNER, &batch).await?.accepted.len();
    }
    Ok(done as f64 / t.elapsed().as_secs_f64())
}

/// Claims of few intents, each size run through the ladder of claim
/// statements of a relay whose `batch_size` is `cap` and through the one
/// statement limited to `cap` ([`ClaimQuery::single`]), over `n` fresh
/// intents per run, in two rounds alternating the two.
pub(crate) async fn small_claims(
    store: &Store,
    sizes: &[i64],
    cap: i64,
    n: usize,
    payload: &impl Fn(usize) -> serde_json::Value,
) -> anyhow::Result<Vec<SmallClaims>> {
    let (ladder, single) = (ClaimQuery::new(cap, &[]), ClaimQuery::single(cap, &[]));
    let mut points = Vec::new();
    for &size in sizes {
        let size = size.clamp(1, cap);
        let (mut ladder_per_s, mut single_per_s) = (Vec::new(), Vec::new());
        for round in 1..=2 {
            for (form, query, rates) in [
                ("ladder", &ladder, &mut ladder_per_s),
                ("single", &single, &mut single_per_s),
            ] {
                enqueue_statements(store, n, &format!("small{size}-{round}-{form}"), payload)
                    .await?;
                run_sql(
                    store,
                    "VACUUM ANALYZE outbox.intent_log, outbox.intent_rows",
                )
                .await?;
                eprintln!("bench: claims of {size} ({form}, round {round}, {n})");
                rates.push(claim_complete_rate_as(store, query, size).await?);
                all_delivered(store, &format!("claims of {size} ({form})")).await?;
                run_sql(store, EMPTY_LOG).await?;
            }
        }
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
        points.push(SmallClaims {
            claim: size,
            ratio: mean(&ladder_per_s) / mean(&single_per_s),
            ladder_per_s,
            single_per_s,
        });
    }
    Ok(points)
}

/// Fails, naming `what`, when an intent was left undelivered.
pub(crate) async fn all_delivered(store: &Store, what: &str) -> anyhow::Result<()> {
    let left: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox.intents WHERE state <> 'delivered'")
            .fetch_one(store.pool())
            .await?;
    anyhow::ensure!(left == 0, "{what}: {left} intents were left undelivered");
    Ok(())
}

pub(crate) async fn enqueue_batched(
    store: &Store,
    n: usize,
    prefix: &str,
    payload: &impl Fn(usize) -> serde_json::Value,
) -> anyhow::Result<()> {
    for rows in hundreds(n) {
        let mut tx = store.pool().begin().await?;
        for j in rows {
            enqueue(
                &mut *tx,
                &NewIntent::new(format!("{prefix}-{j}"), "webhook", payload(j)),
            )
            .await?;
        }
        tx.commit().await?;
    }
    Ok(())
}

/// Run one statement that returns nothing (the bench's TRUNCATEs and VACUUMs).
pub(crate) async fn run_sql(store: &Store, statement: &str) -> Result<(), sqlx::Error> {
    sqlx::query(statement)
        .execute(store.pool())
        .await
        .map(|_| ())
}

/// `0..n` in consecutive ranges of 100 (the last may be shorter).
pub(crate) fn hundreds(n: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    (0..n).step_by(100).map(move |i| i..(i + 100).min(n))
}

/// Enqueue `n` intents 100 per statement: the arrays go in one round trip
/// and `outbox.enqueue` runs once per row (what an application that has many
/// intents at once should do).
pub(crate) async fn enqueue_statements(
    store: &Store,
    n: usize,
    prefix: &str,
    payload: &impl Fn(usize) -> serde_json::Value,
) -> anyhow::Result<()> {
    for range in hundreds(n) {
        let keys: Vec<String> = range.clone().map(|j| format!("{prefix}-{j}")).collect();
        let payloads: Vec<serde_json::Value> = range.map(payload).collect();
        let ids: Vec<i64> = sqlx::query_scalar(
            "SELECT e.id FROM unnest($1::text[], $2::jsonb[]) AS u(key, payload)
                     CROSS JOIN LATERAL outbox.enqueue(u.key, 'webhook', u.payload) e",
        )
        .bind(&keys)
        .bind(&payloads)
        .fetch_all(store.pool())
        .await?;
        anyhow::ensure!(
            ids.len() == keys.len(),
            "enqueue returned {} ids for {} keys",
            ids.len(),
            keys.len()
        );
    }
    Ok(())
}

/// Enqueue `n` webhook intents with `outbox.enqueue_many`, `per` rows a
/// statement (each its own commit): the set-based bulk API.
pub(crate) async fn enqueue_many_statements(
    store: &Store,
    n: usize,
    per: usize,
    prefix: &str,
    payload: &impl Fn(usize) -> serde_json::Value,
) -> anyhow::Result<()> {
    // One connection for every statement, as an application's loop (and
    // each peer's client, which hands its one busy connection back and
    // takes it again) would use: the pool hands out its idle connections
    // in turn, and each one's first call pays for preparing the statement
    // and compiling the function.
    let mut conn = store.pool().acquire().await?;
    let mut start = 0;
    while start < n {
        let end = (start + per).min(n);
        let keys: Vec<String> = (start..end).map(|j| format!("{prefix}-{j}")).collect();
        let kinds = vec!["webhook"; keys.len()];
        let payloads: Vec<serde_json::Value> = (start..end).map(payload).collect();
        let rows: Vec<(i32, i64, bool)> =
            sqlx::query_as("SELECT ord, id, duplicate FROM outbox.enqueue_many($1, $2, $3)")
                .bind(&keys)
                .bind(&kinds)
                .bind(&payloads)
                .fetch_all(&mut *conn)
                .await?;
        anyhow::ensure!(
            rows.len() == keys.len() && rows.iter().all(|r| !r.2),
            "enqueue_many answered {} rows for {} new keys",
            rows.len(),
            keys.len()
        );
        start = end;
    }
    Ok(())
}

/// Whether any intent whose key starts with `prefix` is open (pending or
/// claimed): through the view's partial indexes, not the delivered ones.
async fn any_open(store: &Store, prefix: &str) -> anyhow::Result<bool> {
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM outbox.intents
                         WHERE state = 'pending' AND NOT waiting AND key LIKE $1 || '%')
             OR EXISTS (SELECT 1 FROM outbox.intents
                         WHERE state = 'pending' AND waiting AND key LIKE $1 || '%')
             OR EXISTS (SELECT 1 FROM outbox.intents
                         WHERE state = 'claimed' AND key LIKE $1 || '%')",
    )
    .bind(prefix)
    .fetch_one(store.pool())
    .await?)
}

/// How long [`wait_delivered`] waits while nothing is written before it
/// gives up (60 s, or `BENCH_STALL_SECONDS`): a completion the database
/// keeps refusing would otherwise hold a bench for its whole deadline.
fn stall() -> Duration {
    let secs = std::env::var("BENCH_STALL_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    Duration::from_secs(secs)
}

/// Wait until `n` intents whose key starts with `prefix` are delivered.
/// Polls for open (pending or claimed) intents, which reads only those rows
/// through the partial indexes (due, waiting, leases), and counts the delivered ones only when
/// none is open: the watching must not load the database it measures. It
/// fails after 10 minutes, or as soon as the relay has written nothing
/// (no outcome, no row, no attempt: the server's own counts of the tables'
/// writes) for [`stall`]'s time while intents are open.
pub(crate) async fn wait_delivered(store: &Store, prefix: &str, n: i64) -> anyhow::Result<()> {
    wait_delivered_marking(store, prefix, n, || {}).await
}

/// [`wait_delivered`], calling `before_check` just before each check for
/// open intents: its last call comes before the check that found none,
/// so a drain's readings taken there leave out the bench's own checks.
pub(crate) async fn wait_delivered_marking(
    store: &Store,
    prefix: &str,
    n: i64,
    mut before_check: impl FnMut(),
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut progress = (writes(store).await?, Instant::now());
    let mut checked = Instant::now();
    loop {
        before_check();
        if !any_open(store, prefix).await? {
            let done: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM outbox.intents WHERE state = 'delivered' AND key LIKE $1 || '%'",
            )
            .bind(prefix)
            .fetch_one(store.pool())
            .await?;
            if done >= n {
                return Ok(());
            }
            if Instant::now() > deadline {
                anyhow::bail!("only {done} of {n} delivered after 10 minutes");
            }
        } else if Instant::now() > deadline {
            anyhow::bail!("intents still open after 10 minutes");
        } else if checked.elapsed() > Duration::from_secs(5) {
            checked = Instant::now();
            let now = writes(store).await?;
            if now != progress.0 {
                progress = (now, Instant::now());
            }
            let stall = stall();
            anyhow::ensure!(
                progress.1.elapsed() < stall,
                "intents still open and nothing written for {}s: the relay's completions may be \
                 failing (BENCH_RELAY_LOG=warn shows its warnings)",
                stall.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Rows the server has counted written (inserted, updated, deleted) into
/// the tables a relay's claims and completions write (the outcomes in
/// their segments), from its cumulative statistics: one read of a catalog
/// view, none of the tables.
async fn writes(store: &Store) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0)::int8
           FROM pg_stat_user_tables
          WHERE schemaname = 'outbox'
            AND (relname IN ('log_outcomes', 'log_batches', 'intent_rows', 'attempts')
                 OR relname ~ '^log_outcomes_[0-9]+$')",
    )
    .fetch_one(store.pool())
    .await?)
}

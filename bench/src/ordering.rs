//! `--ordering-keys N`: what the sweeper's ordering pass costs beside N
//! ordering keys with a follower waiting behind a live head each. In a
//! scratch database: N heads scheduled for tomorrow and N followers
//! enqueued through `outbox.enqueue` (as an application would), then the
//! pass timed when nothing was noted since the last one, and after a
//! burst of new followers with one key stranded by the documented race
//! (its head cancelled while the follower's transaction was open), on a
//! key that sorts after all the others. Also the full count `stats` and
//! the gauge read, and what noting a waiting intent adds to its enqueue.

use std::time::{Duration, Instant};

use outbox_relay::store::Store;
use serde::Serialize;
use sqlx::Executor;

#[derive(Debug, Serialize)]
pub struct OrderingReport {
    pub keys: u64,
    /// The pass with nothing noted since the last one (median of 21).
    pub idle_pass_ms: f64,
    /// The pass after `burst` new followers and one stranded key.
    pub burst: u64,
    pub burst_pass_ms: f64,
    pub burst_promoted: u64,
    /// The stranded key's intent was promoted by that one pass.
    pub stranded_promoted: bool,
    /// `stats`' and the gauge's count of intents waiting with nothing
    /// live ahead (one pass over every waiting intent).
    pub stranded_count_ms: f64,
    /// The whole gauge refresh query set.
    pub gauges_ms: f64,
    /// Enqueueing a waiting follower, µs per intent, with its note and
    /// with the noting trigger disabled (best of three alternating rounds
    /// of 20,000).
    pub waiting_enqueue_us: f64,
    pub waiting_enqueue_us_unnoted: f64,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

async fn followers(
    store: &Store,
    tag: &str,
    from: u64,
    n: u64,
    keys: u64,
) -> anyhow::Result<Duration> {
    let t = Instant::now();
    sqlx::query(
        "SELECT outbox.enqueue($1 || g, 'webhook', jsonb_build_object('url', 'http://127.0.0.1:9/', 'body', g),
                               NULL, now(), 'A' || lpad((g % $4)::text, 7, '0'))
           FROM generate_series($2::bigint, $2::bigint + $3::bigint - 1) g",
    )
    .bind(tag)
    .bind(from as i64)
    .bind(n as i64)
    .bind(keys as i64)
    .execute(store.pool())
    .await?;
    Ok(t.elapsed())
}

async fn measure(store: &Store, keys: u64, burst: u64) -> anyhow::Result<OrderingReport> {
    eprintln!("bench: ordering: {keys} heads scheduled for tomorrow, a follower behind each");
    sqlx::query(
        "SELECT outbox.enqueue('head-' || g, 'webhook', jsonb_build_object('url', 'http://127.0.0.1:9/', 'body', g),
                               NULL, now() + interval '1 day', 'A' || lpad(g::text, 7, '0'))
           FROM generate_series(0, $1::bigint - 1) g",
    )
    .bind(keys as i64)
    .execute(store.pool())
    .await?;
    followers(store, "next-", 0, keys, keys).await?;
    // statistics first (as autovacuum would have them after such a load:
    // planned without any, the pass reads the table by id, about 7 ms a
    // key), then the notes of the setup
    store
        .pool()
        .execute("VACUUM ANALYZE outbox.intent_log, outbox.intent_rows")
        .await?;
    store.promote_stranded_heads(500).await?;
    store
        .pool()
        .execute("VACUUM ANALYZE outbox.ordering_rechecks")
        .await?;

    // what noting costs an enqueue behind a live head: three alternating
    // rounds each way, the best of each
    let n = 20_000.min(keys);
    let (mut noted, mut unnoted) = (Duration::MAX, Duration::MAX);
    for round in 0..3 {
        noted = noted.min(followers(store, &format!("noted-{round}-"), 0, n, keys).await?);
        store
            .pool()
            .execute("ALTER TABLE outbox.intent_rows DISABLE TRIGGER intents_note_waiting_insert")
            .await?;
        let without = followers(store, &format!("unnoted-{round}-"), 0, n, keys).await;
        store
            .pool()
            .execute("ALTER TABLE outbox.intent_rows ENABLE TRIGGER intents_note_waiting_insert")
            .await?;
        unnoted = unnoted.min(without?);
    }
    store.promote_stranded_heads(500).await?;

    let mut idle = Vec::new();
    for _ in 0..21 {
        let t = Instant::now();
        store.promote_stranded_heads(500).await?;
        idle.push(t.elapsed());
    }
    idle.sort();

    eprintln!("bench: ordering: {burst} new followers and one stranded key, then one pass");
    followers(store, "burst-", 0, burst, keys).await?;
    sqlx::query("SELECT outbox.enqueue('z-head', 'webhook', '{\"url\": \"http://127.0.0.1:9/\", \"body\": 0}', NULL, now() + interval '1 day', 'Zlast')")
        .execute(store.pool())
        .await?;
    let mut app = store.pool().begin().await?;
    sqlx::query("SELECT outbox.enqueue('r-next', 'webhook', '{\"url\": \"http://127.0.0.1:9/\", \"body\": 1}', NULL, now(), 'Zlast')")
        .execute(&mut *app)
        .await?;
    store.cancel("z-head").await?;
    app.commit().await?;
    let t = Instant::now();
    let burst_pass = store.promote_stranded_heads(500).await?;
    let burst_ms = ms(t.elapsed());
    let stranded_promoted: bool =
        sqlx::query_scalar("SELECT NOT waiting FROM outbox.intents WHERE key = 'r-next'")
            .fetch_one(store.pool())
            .await?;

    let t = Instant::now();
    let left = store.stranded_ordering_intents().await?;
    let stranded_count_ms = ms(t.elapsed());
    anyhow::ensure!(
        left == 0,
        "{left} intents still wait with nothing live ahead"
    );
    let t = Instant::now();
    store.stats_for_gauges().await?;
    let gauges_ms = ms(t.elapsed());
    Ok(OrderingReport {
        keys,
        idle_pass_ms: ms(idle[idle.len() / 2]),
        burst,
        burst_pass_ms: burst_ms,
        burst_promoted: burst_pass.promoted,
        stranded_promoted,
        stranded_count_ms,
        gauges_ms,
        waiting_enqueue_us: noted.as_secs_f64() * 1e6 / n as f64,
        waiting_enqueue_us_unnoted: unnoted.as_secs_f64() * 1e6 / n as f64,
    })
}

pub async fn run(
    server_url: &str,
    keys: u64,
    burst: u64,
    keep: bool,
) -> anyhow::Result<OrderingReport> {
    crate::scratch::with_database(server_url, "ordering", 4, keep, |store| async move {
        measure(&store, keys, burst).await
    })
    .await
}

pub fn print(r: &OrderingReport) {
    println!(
        "ordering keys: {} keys, a follower waiting behind a live head in each (one run):",
        r.keys
    );
    println!(
        "  sweep pass, nothing noted since the last:        {:.2} ms (median of 21)",
        r.idle_pass_ms
    );
    println!(
        "  sweep pass after {} new followers + 1 stranded: {:.1} ms, promoted {} (the stranded one: {})",
        r.burst, r.burst_pass_ms, r.burst_promoted, r.stranded_promoted
    );
    println!(
        "  count of intents waiting with nothing ahead:   {:.1} ms (stats, gauge)",
        r.stranded_count_ms
    );
    println!(
        "  gauge refresh queries:                          {:.1} ms",
        r.gauges_ms
    );
    println!(
        "  enqueue behind a live head: {:.1} µs/intent with its note, {:.1} without",
        r.waiting_enqueue_us, r.waiting_enqueue_us_unnoted
    );
}

//! Rate limits: one held across three relays, a 429 storm that slows the
//! whole destination, and the buckets in use.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_holds_in_every_five_second_window_across_three_relays() {
    let db = TestDb::new().await;
    let rx = Receiver::ok().await;
    let origin = format!("http://{}", rx.addr);
    let other = Receiver::ok().await;
    let cfg = relay_config(&format!(
        r#"
[retry]
schedule = ["50ms"]
jitter = 0.0

[limits]
"{origin}" = "50/s"
"#
    ));
    const N: usize = 500;
    for n in 0..N {
        db.enqueue(
            &format!("limited:{n}"),
            "webhook",
            json!({"url": rx.url("/hook"), "body": {"n": n}}),
        )
        .await;
    }
    for n in 0..100 {
        db.enqueue(
            &format!("other:{n}"),
            "webhook",
            json!({"url": other.url("/hook"), "body": {"n": n}}),
        )
        .await;
    }
    let began = Instant::now();
    let mut relays: Vec<_> = (0..3)
        .map(|r| common::spawn_relay(&db, &cfg, &format!("limit-{r}")))
        .collect();
    // another destination is not slowed by the limited one
    assert!(
        common::wait_for(Duration::from_secs(5), || async {
            db.count("key LIKE 'other:%' AND state = 'delivered'").await == 100
        })
        .await,
        "the unlimited destination went at once"
    );
    assert!(
        common::wait_for(Duration::from_secs(40), || async {
            db.count("key LIKE 'limited:%' AND state = 'delivered'")
                .await
                == N as i64
        })
        .await,
        "the limited destination drained: {}",
        db.count("key LIKE 'limited:%' AND state = 'delivered'")
            .await
    );
    let took = began.elapsed();
    for r in &mut relays {
        common::terminate(r).await;
    }
    let mut at: Vec<Instant> = rx.requests().iter().map(|r| r.at).collect();
    at.sort();
    assert_eq!(at.len(), N, "one request per intent");
    let first = at[0];
    let mut per_second = vec![0usize; 1 + (at[N - 1] - first).as_secs() as usize];
    for t in &at {
        per_second[(*t - first).as_secs() as usize] += 1;
    }
    eprintln!("requests per second: {per_second:?}");
    // the most requests in any 5 s window
    let window = Duration::from_secs(5);
    let busiest = (0..at.len())
        .map(|i| at[i..].iter().take_while(|t| **t < at[i] + window).count())
        .max()
        .unwrap();
    let attempts = db.count("key LIKE 'limited:%' AND attempts <> 1").await;
    eprintln!(
        "rate limit 50/s, 3 relays: {N} requests in {took:?}, at most {busiest} in any 5 s window \
         (limit 250, +10% = 275); {attempts} intents took more than one attempt"
    );
    assert!(busiest <= 275, "{busiest} requests in one 5 s window");
    // and it is not starved either: the whole drain ran near the rate
    let span = (at[N - 1] - at[0]).as_secs_f64();
    assert!(
        (N as f64 / span) > 40.0,
        "the drain ran at {:.1}/s",
        N as f64 / span
    );
    assert_eq!(attempts, 0, "a held-back intent spends no attempt");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_storm_slows_the_whole_destination_and_no_intent_dies() {
    let db = TestDb::new().await;
    let storm_ends = Instant::now() + Duration::from_secs(3);
    let rx = Receiver::start(move |_, _| {
        if Instant::now() < storm_ends {
            Reply::status(429).header("retry-after", "1")
        } else {
            Reply::status(200)
        }
    })
    .await;
    for n in 0..200 {
        db.enqueue(
            &format!("storm:{n}"),
            "webhook",
            json!({"url": rx.url("/hook"), "body": {"n": n}}),
        )
        .await;
    }
    let mut cfg = config();
    cfg.retry.max_attempts = 5;
    cfg.retry.schedule = vec![Dur(Duration::from_millis(50))];
    common::run_until(
        engine(db.store.clone(), &cfg),
        Duration::from_secs(30),
        || async { db.count("state IN ('delivered', 'dead')").await == 200 },
    )
    .await;
    assert_eq!(db.count("state = 'dead'").await, 0, "no intent went dead");
    let storm: usize = rx.requests().iter().filter(|r| r.at < storm_ends).count();
    eprintln!("429 storm of 3 s: {storm} requests answered 429 for 200 intents");
    // one 429 slows every intent of the destination: a few waves, not
    // every intent on its own schedule (about 3 each, 600 in all)
    assert!(storm < 150, "{storm} requests during the storm");
}

/// A rate limit's bucket in use is touched at every take, so that the
/// pruning of idle destinations never drops it (and its tokens).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_in_use_is_touched_by_every_take_and_never_pruned() {
    let db = TestDb::new().await;
    let name = "https://limited.example";
    db.store.take_tokens(name, 1.0, 5.0, 5).await.unwrap();
    sqlx::query("UPDATE outbox.destinations SET updated_at = now() - interval '40 days'")
        .execute(db.pool())
        .await
        .unwrap();
    assert_eq!(db.store.take_tokens(name, 1.0, 5.0, 5).await.unwrap(), 0);
    let age: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM now() - updated_at)::float8 FROM outbox.destinations WHERE name = $1",
    )
    .bind(name)
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert!(age < 60.0, "updated {age}s ago");
    db.store
        .prune_destinations(Duration::from_secs(30 * 24 * 3600))
        .await
        .unwrap();
    assert_eq!(
        rows(&db, "outbox.destinations WHERE tokens IS NOT NULL").await,
        1,
        "the bucket in use is kept, its tokens spent"
    );
}

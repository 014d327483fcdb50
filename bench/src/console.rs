//! `--console-history N`: how fast the console's pages answer beside a
//! long delivered history. In a scratch database: N delivered intents with
//! their attempts (spread over the last day, so the charts have a day to
//! read), four dead failure groups of 500 and 500 failing intents; then the
//! real console (`outbox_relay::console`) on loopback, and each page fetched
//! over HTTP, warm, 30 times.

use std::time::{Duration, Instant};

use outbox_relay::config::Config;
use outbox_relay::console::App;
use outbox_relay::store::Store;
use serde::Serialize;
use sqlx::Executor;

/// One page's timings, in milliseconds.
#[derive(Debug, Serialize)]
pub struct PageTiming {
    pub page: String,
    /// The first fetch (the console's caches empty: the day chart reads a
    /// day of attempts once).
    pub first_ms: f64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub max_ms: f64,
    pub bytes: usize,
}

#[derive(Debug, Serialize)]
pub struct ConsoleReport {
    pub history_rows: u64,
    pub pages: Vec<PageTiming>,
}

async fn seed(store: &Store, history: u64) -> anyhow::Result<()> {
    let mut have = 0u64;
    while have < history {
        let chunk = (history - have).min(250_000);
        eprintln!("bench: console: history {}/{history}", have + chunk);
        sqlx::query(
            // delivered at the first attempt, kept on the row as a relay
            // keeps it (schema 0018)
            "INSERT INTO outbox.intents (key, kind, payload, state, attempts, fence, provider_ref,
                                         delivered_at, updated_at, created_at,
                                         first_attempt_started_at, first_attempt_finished_at,
                                         first_attempt_owner, first_attempt_status,
                                         first_attempt_replayed)
             SELECT 'history-' || g, 'webhook',
                    jsonb_build_object('url', 'http://127.0.0.1:9/hook', 'body',
                        jsonb_build_object('order_id', g, 'customer', 'cus_' || (g % 5000),
                                           'note', repeat('x', 200))),
                    'delivered', 1, 1, 'msg_' || g, t, t, t, t, t, 'history', 200, false
               FROM generate_series($1::bigint + 1, $1::bigint + $2::bigint) g,
                    LATERAL (SELECT now() - (($3::bigint - g) % 86400) * interval '1 second' AS t) x",
        )
        .bind(have as i64)
        .bind(chunk as i64)
        .bind(history as i64)
        .execute(store.pool())
        .await?;
        have += chunk;
    }
    for (group, (port, error)) in [
        (9001, "receiver answered HTTP 503"),
        (9002, "receiver answered HTTP 500"),
        (9003, "POST http://127.0.0.1:9003/hook timed out after 15s"),
        (
            9004,
            "POST http://127.0.0.1:9004/hook: could not connect: connection refused",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        sqlx::query(
            "INSERT INTO outbox.intents (key, kind, payload, state, attempts, last_error)
             SELECT 'dead-' || $1 || '-' || g, 'webhook',
                    jsonb_build_object('url', 'http://127.0.0.1:' || $2 || '/hook', 'body',
                                       jsonb_build_object('order_id', g)),
                    'dead', 10, $3
               FROM generate_series(1, 500) g",
        )
        .bind(group as i32)
        .bind(port)
        .bind(error)
        .execute(store.pool())
        .await?;
    }
    sqlx::query(
        "INSERT INTO outbox.intents (key, kind, payload, state, attempts, last_error, run_after)
         SELECT 'failing-' || g, 'webhook',
                jsonb_build_object('url', 'http://127.0.0.1:9005/hook', 'body', jsonb_build_object('n', g)),
                'pending', 2, 'receiver answered HTTP 502', now() + interval '1 hour'
           FROM generate_series(1, 500) g",
    )
    .execute(store.pool())
    .await?;
    for table in ["outbox.intent_log", "outbox.intent_rows", "outbox.attempts"] {
        store
            .pool()
            .execute(format!("VACUUM ANALYZE {table}").as_str())
            .await?;
    }
    Ok(())
}

async fn time_page(http: &reqwest::Client, base: &str, page: &str) -> anyhow::Result<PageTiming> {
    let url = format!("{base}{page}");
    let mut bytes = 0;
    let mut first = None;
    for _ in 0..3 {
        let t = Instant::now();
        let r = http.get(&url).send().await?;
        anyhow::ensure!(r.status().is_success(), "{page}: HTTP {}", r.status());
        bytes = r.bytes().await?.len();
        first.get_or_insert(t.elapsed());
    }
    let mut times = Vec::with_capacity(30);
    for _ in 0..30 {
        let t = Instant::now();
        let r = http.get(&url).send().await?;
        let _ = r.bytes().await?;
        times.push(t.elapsed());
    }
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    Ok(PageTiming {
        page: page.to_string(),
        first_ms: ms(first.unwrap_or_default()),
        p50_ms: ms(times[times.len() / 2]),
        p95_ms: ms(times[times.len() * 95 / 100]),
        max_ms: ms(times[times.len() - 1]),
        bytes,
    })
}

pub async fn run(
    server_url: &str,
    config: &Config,
    history: u64,
    keep: bool,
) -> anyhow::Result<ConsoleReport> {
    crate::scratch::with_database(server_url, "console", 8, keep, |store| async move {
        seed(&store, history).await?;
        let mut config = config.clone();
        config.console.users.clear();
        let app = App::new(store.clone(), config)?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let base = format!("http://{}", listener.local_addr()?);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(outbox_relay::console::serve(listener, app, async {
            let _ = stopped.await;
        }));
        let http = reqwest::Client::new();
        let detail = format!("/intents/{}", history / 2);
        let pages = [
            "/intents",
            "/intents?state=dead",
            "/intents?state=delivered&kind=webhook",
            "/intents?payload=%7B%22body%22%3A%7B%22customer%22%3A%22cus_42%22%7D%7D",
            "/intents?host=127.0.0.1%3A9001",
            "/failures",
            "/",
            detail.as_str(),
            "/lookup?key=history-7",
            "/api/v1/intents",
            "/api/v1/failures",
        ];
        let mut timings = Vec::new();
        for page in pages {
            eprintln!("bench: console: {page}");
            timings.push(time_page(&http, &base, page).await?);
        }
        let _ = stop.send(());
        let _ = server.await;
        Ok(ConsoleReport {
            history_rows: history,
            pages: timings,
        })
    })
    .await
}

pub fn print(r: &ConsoleReport) {
    println!(
        "console pages beside {} delivered history rows (the first fetch, then 30 warm ones; one run):",
        r.history_rows
    );
    println!(
        "{:<75} {:>9} {:>8} {:>8} {:>8} {:>9}",
        "page", "first ms", "p50 ms", "p95 ms", "max ms", "bytes"
    );
    for p in &r.pages {
        println!(
            "{:<75} {:>9.1} {:>8.1} {:>8.1} {:>8.1} {:>9}",
            p.page, p.first_ms, p.p50_ms, p.p95_ms, p.max_ms, p.bytes
        );
    }
}

//! The CLI and the guide's example enqueue with a trace context.

use super::*;

#[tokio::test]
async fn the_cli_enqueues_with_a_trace_context() {
    let db = TestDb::new().await;
    let payload = p(1).to_string();
    let out = common::cli(
        &db,
        &[
            "enqueue",
            "--key",
            "cli:traced",
            "--kind",
            "webhook",
            "--payload",
            &payload,
            "--traceparent",
            TP,
            "--tracestate",
            TS,
        ],
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(context(&db, "cli:traced").await, ctx(Some(TP), Some(TS)));
    // `show` names the trace and where it came from
    let shown = common::cli(&db, &["show", "cli:traced"]).await;
    let shown = String::from_utf8_lossy(&shown.stdout);
    let trace_line = shown
        .lines()
        .find(|l| l.starts_with("trace "))
        .unwrap_or_default();
    assert!(
        trace_line.contains(&TP[3..35]) && trace_line.contains(&format!("(traceparent {TP})")),
        "{shown}"
    );
    let out = common::cli(
        &db,
        &[
            "enqueue",
            "--key",
            "cli:malformed",
            "--kind",
            "webhook",
            "--payload",
            &payload,
            "--traceparent",
            "garbage",
        ],
    )
    .await;
    assert!(
        out.status.success(),
        "a malformed traceparent does not fail: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(context(&db, "cli:malformed").await, ctx(None, None));
    let shown = common::cli(&db, &["show", "cli:malformed"]).await;
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.contains("(derived from the key)"), "{shown}");
}

#[tokio::test]
async fn the_guides_example_stores_what_it_says() {
    let page = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/guides/enqueue.md"
    ))
    .unwrap();
    let section = &page[page
        .find("## Attaching a trace context")
        .expect("the guide's section")..];
    let start = section.find("```sql\n").expect("a SQL example") + "```sql\n".len();
    let example = &section[start..start + section[start..].find("```").unwrap()];
    assert!(
        example.contains("SET LOCAL outbox.traceparent"),
        "{example}"
    );
    assert!(example.contains("p_traceparent =>"), "{example}");
    let db = TestDb::new().await;
    sqlx::raw_sql(example)
        .execute(db.pool())
        .await
        .unwrap_or_else(|e| panic!("{e}:\n{example}"));
    assert_eq!(
        context(&db, "order:43:confirmation").await,
        ctx(Some(TP), Some("rojo=00f067aa0ba902b7"))
    );
    assert_eq!(
        context(&db, "order:43:invoice").await,
        ctx(
            Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
            None
        )
    );
}

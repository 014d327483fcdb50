//! The claim that sets nothing aside and the deliveries at the first
//! attempt run on their connection's cached generic plan
//! (`GENERIC_PLAN_SETTINGS`): planned once per connection, not on every
//! call, and probing by index whatever the tables held when it was made.

use outbox_relay::store::{Completion, Store, GENERIC_PLAN_SETTINGS};

use crate::common::TestDb;
use crate::intent_log::{delivered, enqueue_unanswered};

/// Claims of five and their completions, eight times over a store of two
/// connections: every call runs its connection's generic plan, made once.
#[tokio::test]
async fn the_claim_and_the_first_deliveries_are_planned_once_per_connection() {
    let db = TestDb::new().await;
    enqueue_unanswered(&db, "planned", 40).await;
    let store = Store::connect(&db.url, 1).await.unwrap();
    for _ in 0..8 {
        let claimed = store.claim("planner", 5, 60_000, &[]).await.unwrap();
        assert_eq!(claimed.len(), 5);
        let completions: Vec<Completion> = claimed.iter().map(delivered).collect();
        let written = store.complete("planner", &completions).await.unwrap();
        assert_eq!(written.accepted.len(), 5);
    }
    assert_eq!(db.count("state = 'delivered'").await, 40);
    // the prepared statements of the store's connections (at most two:
    // both held at once)
    let mut prepared: Vec<(String, i64, i64)> = Vec::new();
    let mut first = store.pool().acquire().await.unwrap();
    let mut second = store.pool().acquire().await.unwrap();
    for conn in [&mut first, &mut second] {
        prepared.extend(
            sqlx::query_as::<_, (String, i64, i64)>(
                "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements",
            )
            .fetch_all(&mut **conn)
            .await
            .unwrap(),
        );
    }
    for (name, marker) in [
        ("the claim", "FROM outbox.intent_log_open l"),
        ("the completion", "INSERT INTO outbox.log_outcomes AS o"),
    ] {
        let (generic, custom) = prepared
            .iter()
            .filter(|(sql, _, _)| sql.contains(marker))
            .fold((0, 0), |(g, c), (_, generic, custom)| {
                (g + generic, c + custom)
            });
        assert_eq!(
            (generic, custom),
            (8, 0),
            "{name}: every call on the generic plan"
        );
    }
}

/// The generic plans as a relay's connection makes them on a database
/// just migrated, beside an empty log, no outcome, no batch and no row:
/// every probe is by index. Without sequential scans turned off, the
/// planner reads the empty outcomes, batches and rows whole, and a plan
/// kept for the life of the connection would go on reading them whole as
/// they grow.
#[tokio::test]
async fn the_generic_plans_probe_by_index_beside_empty_tables() {
    let db = TestDb::new().await;
    let claim = outbox_relay::store::ClaimQuery::new(100, &[]);
    let complete = outbox_relay::store::statement("log_complete").unwrap();
    let mut tx = db.pool().begin().await.unwrap();
    sqlx::raw_sql(GENERIC_PLAN_SETTINGS)
        .execute(&mut *tx)
        .await
        .unwrap();
    let mut plans = Vec::new();
    for (prepare, execute) in [
        (
            format!(
                "PREPARE plain_claim(bigint, text, bigint) AS {}",
                claim.log_plain_sql()
            ),
            "EXPLAIN EXECUTE plain_claim(100, 'explain', 60000)".to_string(),
        ),
        (
            format!(
                "PREPARE first_deliveries(bigint[], timestamptz[], timestamptz[], int[],
                                          text[], bool[], text, bigint[]) AS {complete}"
            ),
            "EXPLAIN EXECUTE first_deliveries('{1,2}', ARRAY[now(), now()], ARRAY[now(), now()],
                                              '{200,200}', '{NULL,NULL}', '{f,f}', 'explain',
                                              '{1}')"
                .to_string(),
        ),
    ] {
        sqlx::query(&prepare).execute(&mut *tx).await.unwrap();
        let plan: Vec<String> = sqlx::query_scalar(&execute)
            .fetch_all(&mut *tx)
            .await
            .unwrap();
        plans.push(plan.join("\n"));
    }
    tx.rollback().await.unwrap();
    let (claim, complete) = (&plans[0], &plans[1]);
    for (name, plan, probes) in [
        (
            "the claim",
            claim,
            &[
                "Index Scan using intent_log_0_xid on intent_log_0",
                "using intents_pkey on intent_rows",
                "using log_outcomes_0_pkey on log_outcomes_0",
                "on log_batches_ids",
            ][..],
        ),
        (
            "the completion",
            complete,
            &[
                "using intent_log_0_pkey on intent_log_0",
                "using intents_pkey on intent_rows",
                "using log_outcomes_0_pkey on log_outcomes_0",
                "on log_batches_pkey",
                // the outcomes it wrote, looked up in a hash: not compared
                // one by one with every id of the batches
                "NOT (hashed SubPlan",
            ][..],
        ),
    ] {
        assert!(
            !plan.contains("Seq Scan"),
            "{name} reads a table whole:\n{plan}"
        );
        assert!(!plan.contains("JIT"), "{name} is compiled:\n{plan}");
        for probe in probes {
            assert!(plan.contains(probe), "{name} lacks {probe}:\n{plan}");
        }
    }
}

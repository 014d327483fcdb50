//! The plans Postgres makes for the relay's prepared statements.

use super::TestDb;

/// EXPLAIN a prepared statement as Postgres plans it per call and as its
/// cached generic plan (`prepare` creates it, `execute` runs it).
pub async fn plans_both_ways(
    db: &TestDb,
    prepare: &str,
    execute: &str,
) -> Vec<(&'static str, String)> {
    let mut conn = db.pool().acquire().await.unwrap();
    sqlx::query(prepare).execute(&mut *conn).await.unwrap();
    let mut plans = Vec::new();
    for mode in ["force_custom_plan", "force_generic_plan"] {
        sqlx::query(&format!("SET plan_cache_mode = {mode}"))
            .execute(&mut *conn)
            .await
            .unwrap();
        let plan: Vec<String> = sqlx::query_scalar(&format!("EXPLAIN {execute}"))
            .fetch_all(&mut *conn)
            .await
            .unwrap();
        plans.push((mode, plan.join("\n")));
    }
    plans
}

/// `plan` without the lines that read the tail of the log or of the
/// outcomes (`outbox.intent_log_tail`, `outbox.log_outcomes_tail`: the ids
/// above the segments, empty unless an application moved the sequence on),
/// which the planner reads whole while they are empty, at no cost.
pub fn beside_the_tail(plan: &str) -> String {
    plan.lines()
        .filter(|l| !l.contains(" on intent_log_tail ") && !l.contains(" on log_outcomes_tail "))
        .collect::<Vec<_>>()
        .join("\n")
}

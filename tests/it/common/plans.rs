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

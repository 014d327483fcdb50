//! Upgrading the enqueue functions keeps their owner, their grants and
//! the released migrations' comments.

use super::*;

/// The old signatures, as 0015 left them.
const OLD_ENQUEUE: &str = "outbox.enqueue(text, text, jsonb, text, timestamptz, text, text)";
const OLD_MANY: &str =
    "outbox.enqueue_many(text[], text[], jsonb[], text[], timestamptz[], text[], text)";
const NEW_ENQUEUE: &str =
    "outbox.enqueue(text, text, jsonb, text, timestamptz, text, text, text, text)";
const NEW_MANY: &str =
    "outbox.enqueue_many(text[], text[], jsonb[], text[], timestamptz[], text[], text, text[], text[])";

/// A database at the released migrations (up to 0015), from the files
/// themselves.
async fn released_schema() -> TestDb {
    let (db, copied) = common::schema_at::schema_up_to(15).await;
    assert_eq!(copied, 14, "0001 to 0015 (0014 was never released)");
    db
}

/// A deployment whose enqueue functions belong to a role other than the
/// one that migrates: the new ones, and the validators they call (which
/// PUBLIC may not execute), belong to it too, so enqueues with and without
/// a context keep working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_keeps_the_enqueue_functions_owner() {
    let db = released_schema().await;
    let owner = "t_trace_upgrade_owner";
    sqlx::raw_sql(&format!(
        "DO $$ BEGIN CREATE ROLE {owner} NOLOGIN NOSUPERUSER;
         EXCEPTION WHEN duplicate_object THEN NULL; END $$;
         GRANT USAGE ON SCHEMA outbox TO {owner};
         GRANT ALL ON ALL TABLES IN SCHEMA outbox TO {owner};
         GRANT ALL ON ALL SEQUENCES IN SCHEMA outbox TO {owner};
         GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA outbox TO {owner};
         ALTER FUNCTION {OLD_ENQUEUE} OWNER TO {owner};
         ALTER FUNCTION {OLD_MANY} OWNER TO {owner};"
    ))
    .execute(db.pool())
    .await
    .unwrap();
    db.store.migrate().await.unwrap();
    for f in [
        NEW_ENQUEUE,
        NEW_MANY,
        "outbox.valid_traceparent(text)",
        "outbox.valid_tracestate(text)",
    ] {
        let owned_by: String = sqlx::query_scalar(&format!(
            "SELECT pg_get_userbyid(proowner)::text FROM pg_proc WHERE oid = '{f}'::regprocedure"
        ))
        .fetch_one(db.pool())
        .await
        .unwrap();
        assert_eq!(owned_by, owner, "{f}");
    }
    enqueue_with(db.pool(), "owned:1", Some(TP), Some(TS)).await;
    assert_eq!(context(&db, "owned:1").await, ctx(Some(TP), Some(TS)));
    let rows: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox.enqueue_many(ARRAY['owned:2'], ARRAY['webhook'], ARRAY[$1::jsonb])",
    )
    .bind(p(1))
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(rows, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_keeps_the_execute_grants_made_on_the_old_signatures() {
    let db = released_schema().await;

    // a deployment's own role, granted EXECUTE on the old signatures (one
    // of them with the grant option), as deploy/sql/roles.sql did
    let role = "t_trace_upgrade_app";
    sqlx::raw_sql(&format!(
        "DO $$ BEGIN CREATE ROLE {role} LOGIN;
         EXCEPTION WHEN duplicate_object THEN NULL; END $$;
         GRANT USAGE ON SCHEMA outbox TO {role};
         GRANT EXECUTE ON FUNCTION {OLD_ENQUEUE} TO {role} WITH GRANT OPTION;
         GRANT EXECUTE ON FUNCTION {OLD_MANY} TO {role};"
    ))
    .execute(db.pool())
    .await
    .unwrap();
    // an application of the earlier version, mid-flight
    sqlx::query("SELECT * FROM outbox.enqueue('before', 'webhook', '{}')")
        .execute(db.pool())
        .await
        .unwrap();
    // and this version's Rust API without a context: the call it made
    // before the new parameters, so it works on the schema before them
    let plain = |key: &str| NewIntent::new(key, "webhook", p(1));
    assert!(
        !enqueue(db.pool(), &plain("before:rust"))
            .await
            .unwrap()
            .duplicate
    );
    let mut conn = db.pool().acquire().await.unwrap();
    enqueue_many(&mut conn, &[plain("before:batch")])
        .await
        .unwrap();
    drop(conn);

    let migrated = db.store.migrate().await.unwrap();
    // 0016 and every migration after it
    let from_16: Vec<i64> = outbox_relay::store::MIGRATOR
        .iter()
        .filter(|m| !m.migration_type.is_down_migration() && m.version >= 16)
        .map(|m| m.version)
        .collect();
    assert_eq!(
        migrated.applied.iter().map(|(v, _)| *v).collect::<Vec<_>>(),
        from_16
    );

    let old_gone: (Option<String>, Option<String>) = sqlx::query_as(&format!(
        "SELECT to_regprocedure('{OLD_ENQUEUE}')::text, to_regprocedure('{OLD_MANY}')::text"
    ))
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(old_gone, (None, None), "the old signatures are gone");
    let grants: (bool, bool, bool, bool, bool, bool, bool) = sqlx::query_as(&format!(
        "SELECT has_function_privilege('{role}', '{NEW_ENQUEUE}', 'EXECUTE'),
                has_function_privilege('{role}', '{NEW_ENQUEUE}', 'EXECUTE WITH GRANT OPTION'),
                has_function_privilege('{role}', '{NEW_MANY}', 'EXECUTE'),
                has_function_privilege('{role}', '{NEW_MANY}', 'EXECUTE WITH GRANT OPTION'),
                has_function_privilege('public', '{NEW_ENQUEUE}', 'EXECUTE'),
                has_function_privilege('public', '{NEW_MANY}', 'EXECUTE'),
                has_function_privilege('public', 'outbox.valid_traceparent(text)', 'EXECUTE')"
    ))
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(
        grants,
        (true, true, true, false, false, false, false),
        "(role: enqueue, its grant option, enqueue_many, its grant option; \
         PUBLIC: enqueue, enqueue_many, valid_traceparent)"
    );
    let (definer, config): (bool, Vec<String>) = sqlx::query_as(&format!(
        "SELECT prosecdef, proconfig FROM pg_proc WHERE oid = '{NEW_MANY}'::regprocedure"
    ))
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert!(definer);
    assert_eq!(config, ["search_path=pg_catalog, outbox, pg_temp"]);

    // the role enqueues, with a context and with the earlier 7-argument
    // call, without any right on the tables
    let mut url = reqwest::Url::parse(&db.url).unwrap();
    url.set_username(role).unwrap();
    let mut app = sqlx::PgConnection::connect(url.as_str()).await.unwrap();
    enqueue_with(&mut app, "after", Some(TP), Some(TS)).await;
    sqlx::query(
        "SELECT * FROM outbox.enqueue('after:7', 'webhook', '{}', NULL, now(), NULL, 'old-app')",
    )
    .execute(&mut app)
    .await
    .expect("the 7-argument call resolves to the new function");
    let mut tx = app.begin().await.unwrap();
    set_local(&mut tx, Some(TP2), None).await;
    sqlx::query("SELECT * FROM outbox.enqueue_many($1, $2, $3)")
        .bind(["after:many"])
        .bind(["webhook"])
        .bind([p(1)])
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    app.close().await.unwrap();
    // the pool's statements prepared before the upgrade still run
    assert!(
        !enqueue(db.pool(), &plain("after:rust"))
            .await
            .unwrap()
            .duplicate
    );
    let mut conn = db.pool().acquire().await.unwrap();
    enqueue_many(&mut conn, &[plain("after:batch")])
        .await
        .unwrap();
    drop(conn);
    assert_eq!(db.count("key LIKE 'before%' OR key LIKE 'after%'").await, 8);
    assert_eq!(context(&db, "before").await, ctx(None, None));
    assert_eq!(context(&db, "after").await, ctx(Some(TP), Some(TS)));
    assert_eq!(context(&db, "after:7").await, ctx(None, None));
    assert_eq!(context(&db, "after:many").await, ctx(Some(TP2), None));
}

/// A database that ran the released migrations as first worded upgrades:
/// their reworded comments are accepted, nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_accepts_the_reworded_comments_of_released_migrations() {
    let db = released_schema().await;
    // as the first texts of 0005, 0006, 0007, 0008 and 0010 recorded them
    let earlier = [
        (5, "a3148e17ffc7d6d734288c5b3803cb8b8b204287061df52eba9f8b011af2fe4083e58301588f04c5b3eda1c6643d55ac"),
        (8, "e2e72c78a7c159edb69f7878f2b59bf2d36319d3b5ef50d875d68784fef45c1b7f90f7b651756b326f52183cc84079d0"),
    ];
    for (version, checksum) in earlier {
        sqlx::query("UPDATE _sqlx_migrations SET checksum = decode($1, 'hex') WHERE version = $2")
            .bind(checksum)
            .bind(version)
            .execute(db.pool())
            .await
            .unwrap();
    }
    db.store.migrate().await.unwrap();
    assert!(db.store.migrations_current().await.unwrap());
    // any other text is still refused, as sqlx refuses it
    let other = TestDb::new().await;
    sqlx::query("UPDATE _sqlx_migrations SET checksum = '\\x00' WHERE version = 5")
        .execute(other.pool())
        .await
        .unwrap();
    sqlx::query("DELETE FROM _sqlx_migrations WHERE version = 16")
        .execute(other.pool())
        .await
        .unwrap();
    let err = other.store.migrate().await.unwrap_err();
    assert!(format!("{err:#}").contains("modified"), "{err:#}");
}

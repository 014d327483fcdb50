//! Malformed contexts are not stored and never fail an enqueue; valid
//! ones at the edges are stored as given.

use super::*;

/// Malformed traceparents, each with a valid tracestate (which must not be
/// stored without a valid traceparent).
const BAD_TRACEPARENTS: &[(&str, &str)] = &[
    (
        "one character short",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
    ),
    (
        "version 00 with more after it",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
    ),
    (
        "a later version with more, not after a dash",
        "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
    ),
    (
        "uppercase hex",
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",
    ),
    (
        "version ff",
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    ),
    (
        "all-zero trace-id",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
    ),
    (
        "all-zero parent-id",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
    ),
    (
        "a dash moved (31 and 17 digits)",
        "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
    ),
    (
        "not hex",
        "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
    ),
    (
        "spaces around it",
        " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    ),
    ("garbage", "not a traceparent"),
    ("empty", ""),
];

/// Malformed tracestates, each with a valid traceparent (which is stored).
fn bad_tracestates() -> Vec<(&'static str, String)> {
    vec![
        ("over 512 characters", format!("rojo={}", "x".repeat(508))),
        ("a member without '='", "rojo=1,congo".into()),
        ("a key with an uppercase letter", "Rojo=1".into()),
        ("a key beginning with '_'", "_rojo=1".into()),
        ("a key with a space", "ro jo=1".into()),
        ("a value with '='", "rojo=a=b".into()),
        ("an empty value", "rojo=".into()),
        ("not printable ASCII", "rojo=caf\u{e9}".into()),
        ("a tab", "rojo=1\tcongo=2".into()),
        (
            "33 members",
            (0..33)
                .map(|i| format!("k{i}=v"))
                .collect::<Vec<_>>()
                .join(","),
        ),
        ("garbage", "{\"not\": \"a tracestate\"}".into()),
        ("no member", " , ".into()),
        ("empty", String::new()),
    ]
}

#[tokio::test]
async fn malformed_values_are_not_stored_and_never_fail_the_enqueue() {
    let db = TestDb::new().await;
    for (i, (why, tp)) in BAD_TRACEPARENTS.iter().enumerate() {
        let key = format!("tp:{i}");
        let (_, dup) = enqueue_with(db.pool(), &key, Some(tp), Some(TS)).await;
        assert!(!dup, "{why}");
        assert_eq!(context(&db, &key).await, ctx(None, None), "{why}: {tp:?}");
        // the same from the setting
        let key = format!("tp-set:{i}");
        let mut tx = db.pool().begin().await.unwrap();
        set_local(&mut tx, Some(tp), Some(TS)).await;
        db_enqueue(&mut tx, &key).await;
        tx.commit().await.unwrap();
        assert_eq!(context(&db, &key).await, ctx(None, None), "{why} (setting)");
    }
    for (i, (why, ts)) in bad_tracestates().iter().enumerate() {
        let key = format!("ts:{i}");
        enqueue_with(db.pool(), &key, Some(TP), Some(ts.as_str())).await;
        assert_eq!(
            context(&db, &key).await,
            ctx(Some(TP), None),
            "{why}: {ts:?}"
        );
        let key = format!("ts-set:{i}");
        let mut tx = db.pool().begin().await.unwrap();
        set_local(&mut tx, Some(TP), Some(ts.as_str())).await;
        db_enqueue(&mut tx, &key).await;
        tx.commit().await.unwrap();
        assert_eq!(
            context(&db, &key).await,
            ctx(Some(TP), None),
            "{why} (setting)"
        );
    }
    let total = (BAD_TRACEPARENTS.len() + bad_tracestates().len()) as i64 * 2;
    assert_eq!(db.count("true").await, total, "every enqueue went through");
}

#[tokio::test]
async fn valid_values_at_the_edges_are_stored_as_given() {
    let db = TestDb::new().await;
    let max_state = format!("rojo={}", "x".repeat(507));
    assert_eq!(max_state.len(), 512);
    let members = (0..32)
        .map(|i| format!("k{i}=v"))
        .collect::<Vec<_>>()
        .join(",");
    let cases: Vec<(&str, &str, String)> = vec![
        (
            "a later version, longer after a dash",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes-next",
            TS.into(),
        ),
        (
            "a later version, 55 characters",
            "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-09",
            TS.into(),
        ),
        ("flags 00", TP2, "1tenant@sys-id=x y".into()),
        ("512 characters", TP, max_state),
        ("32 members", TP, members),
        (
            "empty members and spaces",
            TP,
            " rojo=1 ,, congo=b*/_- ,".into(),
        ),
    ];
    for (i, (why, tp, ts)) in cases.iter().enumerate() {
        let key = format!("edge:{i}");
        enqueue_with(db.pool(), &key, Some(tp), Some(ts.as_str())).await;
        // a later version keeps the fields this version knows, no more
        assert_eq!(
            context(&db, &key).await,
            ctx(Some(&tp[..55]), Some(ts.as_str())),
            "{why}"
        );
    }
    // what follows them is never stored, so it never reaches a header
    let smuggled =
        "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x\r\nNats-Msg-Id: forged";
    enqueue_with(db.pool(), "edge:smuggled", Some(smuggled), None).await;
    assert_eq!(
        context(&db, "edge:smuggled").await,
        ctx(Some(&smuggled[..55]), None)
    );
}

#[tokio::test]
async fn a_tracestate_without_a_traceparent_is_not_stored() {
    let db = TestDb::new().await;
    enqueue_with(db.pool(), "explicit", None, Some(TS)).await;
    assert_eq!(context(&db, "explicit").await, ctx(None, None));
    let mut tx = db.pool().begin().await.unwrap();
    set_local(&mut tx, None, Some(TS)).await;
    db_enqueue(&mut tx, "setting").await;
    sqlx::query("SELECT * FROM outbox.enqueue_many($1, $2, $3, p_tracestates => $4)")
        .bind(["many"])
        .bind(["webhook"])
        .bind([p(1)])
        .bind([TS])
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO outbox.outbox (key, kind, payload, tracestate)
         VALUES ('view', 'webhook', $1, $2)",
    )
    .bind(p(1))
    .bind(TS)
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    for key in ["setting", "many", "view"] {
        assert_eq!(context(&db, key).await, ctx(None, None), "{key}");
    }
}

//! Released migrations whose comments were reworded after release. sqlx
//! records each applied migration's checksum (SHA-384 of its file) and
//! refuses to migrate further when a file no longer matches; a database
//! that ran the earlier text of one of these files has its recorded
//! checksum brought up to date first, only when it is exactly that earlier
//! text's. Nothing but comments changed in them: the schema they made is
//! the same.

/// (version, SHA-384 of the file as first released, in hex).
pub const EARLIER_TEXTS: &[(i64, &str)] = &[
    (5, "a3148e17ffc7d6d734288c5b3803cb8b8b204287061df52eba9f8b011af2fe4083e58301588f04c5b3eda1c6643d55ac"),
    (6, "d2f998140305a1c76ef5e9232582792c44126b182dc02ebb4f35fd40db9c2d9cbce6aeb892114fcd0371552ef446387c"),
    (7, "afe3145ea08c5c21455da6975e67a7b5fad52d547898cb866f3554f4cee76853c3b28bc3dd9a74325e8d2f329b7c2aa6"),
    (8, "e2e72c78a7c159edb69f7878f2b59bf2d36319d3b5ef50d875d68784fef45c1b7f90f7b651756b326f52183cc84079d0"),
    (10, "3e837a2ac091838e7dddaf1c3f18855828840049e3cbea911effc5b01f20c94c0637c98c38b61adc1780cc72451b22e5"),
];

/// Bring the recorded checksums of reworded migrations up to date (see
/// above); a no-op on a database that never ran their earlier texts.
pub async fn accept(pool: &sqlx::PgPool) -> Result<(), sqlx::Error> {
    for (version, earlier) in EARLIER_TEXTS {
        let Some(now) = super::MIGRATOR.iter().find(|m| m.version == *version) else {
            continue;
        };
        sqlx::query(
            "UPDATE _sqlx_migrations SET checksum = $1
              WHERE version = $2 AND checksum = decode($3, 'hex')",
        )
        .bind(now.checksum.as_ref())
        .bind(version)
        .bind(earlier)
        .execute(pool)
        .await?;
    }
    Ok(())
}

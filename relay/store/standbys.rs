//! What `relay.wait_for_standbys` reads and reports: the streaming
//! standbys' flushed positions, and each relay's wait in `outbox.relays`.

use serde::Serialize;
use sqlx::FromRow;

use super::claims::RELAY_TTL_SECS;
use super::Store;

/// The physical standbys streaming from the database, as
/// `outbox.standby_flush_positions(names)` reads them: only the walsenders a
/// failover may promote (`relay.standby_names`; unset, every one but a WAL
/// archiver's or a base backup's).
#[derive(Debug, Clone, Default, PartialEq, Eq, FromRow)]
pub struct StandbyPositions {
    /// The server's timeline.
    pub timeline: i32,
    /// Standbys in the `streaming` state.
    pub streaming: i32,
    /// Walsenders whose state the function's owner may not read.
    pub hidden: i32,
    /// The streaming standbys' flushed WAL positions (bytes), highest first.
    pub flushed: Vec<i64>,
    /// The application_names of streaming walsenders not counted as
    /// standbys (archivers, base backups, names not in the list).
    pub ignored: Vec<String>,
}

/// A live relay whose deliveries wait for standbys.
#[derive(Debug, Clone, Serialize, FromRow)]
pub struct StandbyWait {
    pub owner: String,
    /// `relay.wait_for_standbys` of that relay.
    pub needed: i32,
    /// Standbys streaming when it last looked (unknown when unreadable).
    pub streaming: Option<i32>,
    /// Deliveries waiting.
    pub waiting: i32,
    /// How long they have been held up.
    pub behind_seconds: f64,
}

impl StandbyWait {
    /// One line for `stats` and the console.
    pub fn describe(&self) -> String {
        let streaming = self
            .streaming
            .map_or_else(|| "an unknown number of".to_string(), |n| n.to_string());
        format!(
            "{} deliveries on relay {} wait for their commits to reach {} standby(s) \
             (relay.wait_for_standbys); {streaming} streaming; held up for {:.0}s",
            self.waiting, self.owner, self.needed, self.behind_seconds
        )
    }
}

impl Store {
    /// The standbys' positions: those whose application_name is in `names`
    /// (compared case-insensitively), or, when None, every physical
    /// walsender but those named pg_receivewal, pg_basebackup or
    /// barman_receive_wal (schema 0023).
    pub async fn standby_positions(
        &self,
        names: Option<&[String]>,
    ) -> Result<StandbyPositions, sqlx::Error> {
        sqlx::query_as(
            "SELECT timeline, streaming, hidden, flushed, ignored
               FROM outbox.standby_flush_positions($1::text[])",
        )
        .bind(names)
        .fetch_one(&self.pool)
        .await
    }

    /// Record this relay's wait: `behind_seconds` is how long deliveries
    /// have been held up (None: they are not).
    pub async fn report_standby_wait(
        &self,
        owner: &str,
        needed: i32,
        streaming: Option<i32>,
        waiting: i32,
        behind_seconds: Option<f64>,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "UPDATE outbox.relays
                SET standbys_needed = $2, standbys_streaming = $3, standby_waits = $4,
                    standbys_behind_since = now() - make_interval(secs => $5)
              WHERE owner = $1",
        )
        .bind(owner)
        .bind(needed)
        .bind(streaming)
        .bind(waiting)
        .bind(behind_seconds)
        .execute(&self.pool)
        .await
        .map(|_| ())
    }

    /// Live relays whose deliveries are held up waiting for standbys.
    pub async fn standby_waits(&self) -> Result<Vec<StandbyWait>, sqlx::Error> {
        sqlx::query_as(&format!(
            "SELECT owner, standbys_needed AS needed, standbys_streaming AS streaming,
                    standby_waits AS waiting,
                    extract(epoch FROM now() - standbys_behind_since)::float8 AS behind_seconds
               FROM outbox.relays
              WHERE standbys_behind_since IS NOT NULL AND stopped_at IS NULL
                AND heartbeat_at > now() - interval '{RELAY_TTL_SECS} seconds'
              ORDER BY owner"
        ))
        .fetch_all(&self.pool)
        .await
    }
}

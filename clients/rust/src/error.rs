//! What `outbox.enqueue` (and `outbox.publish`, through it) refuses, typed.

/// Why an intent (or an event) was not written.
#[derive(Debug)]
pub enum EnqueueError {
    /// SQLSTATE OB409: the key exists with a different kind, destination or
    /// payload. A client bug: never a replay, never a new effect.
    Conflict {
        key: String,
        message: String,
        detail: Option<String>,
    },
    /// SQLSTATE OB413: the payload's JSON text (`payload::text`) is over
    /// the limit (1 MiB). The message names the key, the size and the limit.
    PayloadTooLarge {
        message: String,
        hint: Option<String>,
    },
    /// The input was refused by `outbox.enqueue` (22023: empty key, key
    /// over 512 characters, bad kind name, NULL payload, nesting 64 levels
    /// deep, a number beyond ±1e308, arrays of different lengths), by
    /// `outbox.publish` (22023: an event type that is not a dotted name, a
    /// tenant of 0 or over 200 characters) or could
    /// not be read as jsonb (22P02 not JSON, 22P05 `\u0000` in a string,
    /// 54001 nested too deep to parse).
    Invalid { sqlstate: String, message: String },
    /// Anything else, as sqlx reported it: a connection lost or ended by
    /// the server or a statement cancelled (SQLSTATE class 08 or 57, such
    /// as 57P01 from `pg_terminate_backend`), a permission (42501), a lock
    /// timeout. [`EnqueueError::sqlstate`] tells the database's code.
    Database(sqlx::Error),
}

impl EnqueueError {
    /// The SQLSTATE the database answered with, if it answered.
    pub fn sqlstate(&self) -> Option<String> {
        match self {
            EnqueueError::Conflict { .. } => Some("OB409".into()),
            EnqueueError::PayloadTooLarge { .. } => Some("OB413".into()),
            EnqueueError::Invalid { sqlstate, .. } => Some(sqlstate.clone()),
            EnqueueError::Database(e) => e
                .as_database_error()
                .and_then(|d| d.code())
                .map(|c| c.into_owned()),
        }
    }

    /// Map a database error of an enqueue of `keys`: an OB409 names the
    /// key it is about (one of `keys`, as the server's message spells it).
    pub(crate) fn of(err: sqlx::Error, keys: &[&str]) -> EnqueueError {
        let Some(db) = err.as_database_error() else {
            return EnqueueError::Database(err);
        };
        let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
        let message = db.message().to_string();
        let pg = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>();
        match code.as_str() {
            "OB409" => EnqueueError::Conflict {
                key: conflicting_key(&message, keys).unwrap_or_default(),
                detail: pg.and_then(|e| e.detail().map(str::to_string)),
                message,
            },
            // 54000: the size limit as schemas before 0004 raised it
            "OB413" | "54000" => EnqueueError::PayloadTooLarge {
                hint: pg.and_then(|e| e.hint().map(str::to_string)),
                message,
            },
            "22023" | "22P02" | "22P05" | "54001" | "23514" => EnqueueError::Invalid {
                sqlstate: code,
                message,
            },
            _ => EnqueueError::Database(err),
        }
    }
}

/// The key an OB409 is about: the one the message names
/// (`outbox.enqueue: key K was already used for a different intent`).
fn conflicting_key(message: &str, keys: &[&str]) -> Option<String> {
    keys.iter()
        .find(|k| {
            message == format!("outbox.enqueue: key {k} was already used for a different intent")
        })
        .or_else(|| (keys.len() == 1).then(|| &keys[0]))
        .map(|k| k.to_string())
}

impl std::fmt::Display for EnqueueError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EnqueueError::Conflict {
                message, detail, ..
            } => match detail {
                Some(d) => write!(f, "{message} ({d})"),
                None => f.write_str(message),
            },
            EnqueueError::PayloadTooLarge { message, hint } => match hint {
                Some(h) => write!(f, "{message} ({h})"),
                None => f.write_str(message),
            },
            EnqueueError::Invalid { message, .. } => f.write_str(message),
            EnqueueError::Database(e) => write!(f, "database error: {e}"),
        }
    }
}

impl std::error::Error for EnqueueError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            EnqueueError::Database(e) => Some(e),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::conflicting_key;

    #[test]
    fn a_conflict_names_the_key_the_server_named() {
        let msg = "outbox.enqueue: key b:2 was already used for a different intent";
        assert_eq!(
            conflicting_key(msg, &["a:1", "b:2"]).as_deref(),
            Some("b:2")
        );
        assert_eq!(conflicting_key("other", &["a:1"]).as_deref(), Some("a:1"));
        assert_eq!(conflicting_key("other", &["a:1", "b:2"]), None);
    }
}

//! The filter as query parameters (contract: `state`, `kind`, `key`,
//! `host`, `error`, `since`, `until`, `payload`, and `class`, `id`), read
//! into a [`Search`] with errors that say what is wrong, and written back
//! into links.

use chrono::{DateTime, NaiveDate, NaiveDateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::state::IntentState;
use crate::store::console::Search;

/// `host=(none)`: intents without a destination.
pub const NO_DESTINATION: &str = "(none)";

/// The filter as a form or query string sends it; empty fields are absent.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(default)]
pub struct FilterParams {
    /// A state, or several separated by commas.
    #[serde(skip_serializing_if = "blank")]
    pub state: Option<String>,
    #[serde(skip_serializing_if = "blank")]
    pub kind: Option<String>,
    /// A key prefix.
    #[serde(skip_serializing_if = "blank")]
    pub key: Option<String>,
    #[serde(skip_serializing_if = "blank")]
    pub host: Option<String>,
    #[serde(skip_serializing_if = "blank")]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "blank")]
    pub class: Option<String>,
    /// RFC 3339, `YYYY-MM-DD[THH:MM]` (UTC), or a duration ago (`90m`).
    #[serde(skip_serializing_if = "blank")]
    pub since: Option<String>,
    #[serde(skip_serializing_if = "blank")]
    pub until: Option<String>,
    /// A JSON object the payload must contain.
    #[serde(skip_serializing_if = "blank")]
    pub payload: Option<String>,
    /// One intent.
    #[serde(skip_serializing_if = "blank")]
    pub id: Option<String>,
}

fn blank(v: &Option<String>) -> bool {
    v.as_deref().is_none_or(|s| s.trim().is_empty())
}

fn given(v: &Option<String>) -> Option<&str> {
    v.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

impl FilterParams {
    /// The search these parameters ask for.
    pub fn search(&self) -> Result<Search, String> {
        let mut states = Vec::new();
        if let Some(text) = given(&self.state) {
            for name in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                states.push(IntentState::parse(name).ok_or_else(|| {
                    format!(
                        "state {name:?} is not one of {}",
                        crate::store::STATES.join(", ")
                    )
                })?);
            }
        }
        let payload = match given(&self.payload) {
            None => None,
            Some(text) => {
                let value: serde_json::Value = serde_json::from_str(text)
                    .map_err(|e| format!("payload filter is not JSON: {e}"))?;
                if !value.is_object() {
                    return Err("payload filter must be a JSON object, like {\"order\": 42}".into());
                }
                Some(value)
            }
        };
        let id = match given(&self.id) {
            None => None,
            Some(text) => Some(
                text.parse::<i64>()
                    .map_err(|_| format!("id {text:?} is not a number"))?,
            ),
        };
        Ok(Search {
            states,
            kind: given(&self.kind).map(String::from),
            key_prefix: given(&self.key).map(String::from),
            host: given(&self.host)
                .filter(|h| *h != NO_DESTINATION)
                .map(String::from),
            host_names: Vec::new(),
            no_destination: given(&self.host) == Some(NO_DESTINATION),
            error: given(&self.error).map(String::from),
            // a class is matched as it is: a trimmed one would match nothing
            class: self.class.clone().filter(|c| !c.is_empty()),
            since: given(&self.since).map(time).transpose()?,
            until: given(&self.until).map(time).transpose()?,
            payload,
            id,
        })
    }

    /// The parameters as a query string (`state=dead&kind=webhook`), without `?`.
    pub fn query(&self) -> String {
        serde_urlencoded::to_string(self).unwrap_or_default()
    }

    /// The parameters of a search (for a failure group's links).
    pub fn of(search: &Search) -> FilterParams {
        FilterParams {
            state: (!search.states.is_empty()).then(|| {
                search
                    .states
                    .iter()
                    .map(|s| s.as_sql())
                    .collect::<Vec<_>>()
                    .join(",")
            }),
            kind: search.kind.clone(),
            key: search.key_prefix.clone(),
            host: if search.no_destination {
                Some(NO_DESTINATION.into())
            } else {
                search.host.clone()
            },
            error: search.error.clone(),
            class: search.class.clone(),
            since: search.since.map(|t| t.to_rfc3339()),
            until: search.until.map(|t| t.to_rfc3339()),
            payload: search.payload.as_ref().map(|p| p.to_string()),
            id: search.id.map(|i| i.to_string()),
        }
    }

    /// What the filter says, for a confirmation ("state dead, kind webhook").
    pub fn describe(&self) -> String {
        let parts: Vec<String> = [
            ("id", &self.id),
            ("state", &self.state),
            ("kind", &self.kind),
            ("key prefix", &self.key),
            ("destination", &self.host),
            ("error contains", &self.error),
            ("error class", &self.class),
            ("created since", &self.since),
            ("created until", &self.until),
            ("payload contains", &self.payload),
        ]
        .into_iter()
        .filter_map(|(name, v)| given(v).map(|v| format!("{name} {v}")))
        .collect();
        if parts.is_empty() {
            "every intent".into()
        } else {
            parts.join(", ")
        }
    }
}

/// A point in time: RFC 3339, a date or date and minute (UTC), or a
/// duration ago.
pub fn time(text: &str) -> Result<DateTime<Utc>, String> {
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Ok(t.with_timezone(&Utc));
    }
    for format in ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M"] {
        if let Ok(t) = NaiveDateTime::parse_from_str(text, format) {
            return Ok(t.and_utc());
        }
    }
    if let Ok(d) = NaiveDate::parse_from_str(text, "%Y-%m-%d") {
        return Ok(d.and_time(chrono::NaiveTime::MIN).and_utc());
    }
    if let Ok(ago) = crate::config::parse_duration(text) {
        let ago = chrono::Duration::from_std(ago).map_err(|e| e.to_string())?;
        return Ok(Utc::now() - ago);
    }
    Err(format!(
        "{text:?} is not a time: write 2026-12-01T09:30:00Z, 2026-12-01, or a duration ago like 90m"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_parse_and_round_trip() {
        let p: FilterParams = serde_urlencoded::from_str(
            "state=dead,ambiguous&kind=webhook&key=&payload=%7B%22order%22%3A42%7D&since=2026-12-01",
        )
        .unwrap();
        let s = p.search().unwrap();
        assert_eq!(s.states, vec![IntentState::Dead, IntentState::Ambiguous]);
        assert_eq!(s.kind.as_deref(), Some("webhook"));
        assert_eq!(s.key_prefix, None, "an empty field is no filter");
        assert_eq!(s.payload, Some(serde_json::json!({"order": 42})));
        assert_eq!(s.since.unwrap().to_rfc3339(), "2026-12-01T00:00:00+00:00");
        assert_eq!(FilterParams::of(&s).search().unwrap(), s);
        assert!(!p.query().contains("key="), "{}", p.query());
        assert_eq!(FilterParams::default().describe(), "every intent");
    }

    #[test]
    fn bad_filters_say_why() {
        let bad = |q: &str| {
            serde_urlencoded::from_str::<FilterParams>(q)
                .unwrap()
                .search()
                .unwrap_err()
        };
        assert!(bad("state=gone").contains("not one of"));
        assert!(bad("payload=%5B1%5D").contains("JSON object"));
        assert!(bad("payload=%7B").contains("not JSON"));
        assert!(bad("since=yesterday").contains("not a time"));
        assert!(bad("id=x").contains("not a number"));
        let ago = serde_urlencoded::from_str::<FilterParams>("since=90m")
            .unwrap()
            .search()
            .unwrap()
            .since
            .unwrap();
        assert!((Utc::now() - ago).num_minutes() == 90);
    }
}

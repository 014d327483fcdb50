//! `[[schedule]]`: each entry, parsed and checked, and each payload
//! checked the way its provider will.

use std::str::FromStr;

use anyhow::bail;
use chrono::Utc;
use serde::Deserialize;
use serde_json::Value;

use super::Config;
use crate::kinds::{Check, Kind};

/// `[[schedule]]`: one intent per tick, key `schedule:<name>:<tick>`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleEntry {
    pub name: String,
    /// With seconds first, as the cron crate reads it: "0 0 9 * * *".
    pub cron: String,
    pub kind: String,
    #[serde(default)]
    pub destination: Option<String>,
    pub payload: serde_json::Value,
    /// Missed ticks enqueued after downtime, most recent first (default 1).
    #[serde(default = "one")]
    pub catch_up: u32,
}

fn one() -> u32 {
    1
}

impl Config {
    /// Each schedule's kind is one this product delivers and its payload is
    /// one that kind's provider accepts, checked the way the provider will:
    /// otherwise every tick would enqueue an intent that can only end
    /// `rejected`. Email payloads without `from` are checked against
    /// `email.from` where email is configured (elsewhere another relay's
    /// `email.from` applies).
    pub(super) fn check_schedule_payloads(&self) -> anyhow::Result<()> {
        let email = self.email.provider_config()?;
        for s in &self.schedules {
            let Some(kind) = Kind::parse(&s.kind) else {
                bail!(
                    "schedule {:?}: kind {:?} is not one this relay delivers ({})",
                    s.name,
                    s.kind,
                    Kind::names().join(", ")
                );
            };
            let checked = kind.check(
                &s.payload,
                &Check {
                    destination: s.destination.as_deref(),
                    endpoints: &self.webhook.endpoints,
                    email_from: email.as_ref().map(|c| c.from.as_ref()),
                },
            );
            checked.map_err(|e| anyhow::anyhow!("schedule {:?}: payload: {e}", s.name))?;
        }
        Ok(())
    }
}

/// A `[[schedule]]` entry, checked and parsed.
#[derive(Debug, Clone)]
pub struct Schedule {
    pub name: String,
    pub expression: String,
    /// The parsed `cron`.
    pub cron: cron::Schedule,
    pub kind: String,
    pub destination: Option<String>,
    pub payload: Value,
    pub catch_up: usize,
}

impl Schedule {
    pub fn from_entry(e: &ScheduleEntry) -> Result<Schedule, String> {
        let name_ok = !e.name.is_empty()
            && e.name.len() <= 64
            && e.name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
        if !name_ok {
            return Err(format!(
                "schedule name {:?} must be 1-64 letters, digits, '_', '.' or '-'",
                e.name
            ));
        }
        let cron = cron::Schedule::from_str(&e.cron).map_err(|err| {
            format!(
                "schedule {:?}: cron {:?} is invalid ({}); it has 6 or 7 fields, seconds first, e.g. \"0 0 9 * * *\"",
                e.name,
                e.cron,
                cron_reason(&err.to_string(), &e.cron)
            )
        })?;
        if cron.upcoming(Utc).next().is_none() {
            return Err(format!(
                "schedule {:?}: cron {:?} never fires",
                e.name, e.cron
            ));
        }
        if !(1..=1000).contains(&e.catch_up) {
            return Err(format!(
                "schedule {:?}: catch_up must be between 1 and 1000",
                e.name
            ));
        }
        if !e.payload.is_object() {
            return Err(format!("schedule {:?}: payload must be a table", e.name));
        }
        Ok(Schedule {
            name: e.name.clone(),
            expression: e.cron.clone(),
            cron,
            kind: e.kind.clone(),
            destination: e.destination.clone(),
            payload: e.payload.clone(),
            catch_up: e.catch_up as usize,
        })
    }
}

/// The cron crate's parse error on one line. It echoes the expression, a
/// caret under the failing position and, sometimes, a reason.
fn cron_reason(message: &str, expression: &str) -> String {
    let lines: Vec<&str> = message.lines().collect();
    let caret = lines
        .iter()
        .find(|l| l.trim() == "^")
        .and_then(|l| l.find('^'));
    let reason = lines
        .iter()
        .rev()
        .map(|l| l.trim())
        .find(|l| !l.is_empty() && *l != "^" && *l != expression.trim());
    match (reason, caret) {
        (Some(r), _) => r.to_string(),
        (None, Some(c)) if c >= expression.trim_end().len() => "too few fields".to_string(),
        (None, Some(c)) => format!("unexpected text at character {}", c + 1),
        (None, None) => message.split_whitespace().collect::<Vec<_>>().join(" "),
    }
}

//! Units of the configuration: durations as it writes them, "200ms", "5s",
//! "1h 30m".

use std::time::Duration;

use serde::Deserialize;

/// A duration written as a string like "200ms", "5s" or "2h".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dur(pub Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d).map_err(|_| {
            serde::de::Error::custom("a duration must be a string like \"200ms\", \"5s\" or \"2h\"")
        })?;
        parse_duration(&text)
            .map(Dur)
            .map_err(serde::de::Error::custom)
    }
}

/// Parse "200ms", "5s", "2h", "1h 30m"; refuses absurd values (over 30 days).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(text.trim()).map_err(|e| {
        format!("invalid duration {text:?}: {e} (write e.g. \"200ms\", \"5s\", \"2h\")")
    })?;
    if d > Duration::from_secs(366 * 24 * 3600) {
        return Err(format!("duration {text:?} is longer than a year"));
    }
    Ok(d)
}

pub(crate) fn dur(text: &str) -> Dur {
    Dur(parse_duration(text).expect("valid default"))
}

//! What pages show, computed outside the templates: masked payloads, ages,
//! the bars of the attempt charts.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;

use crate::config::destinations::origin;
use crate::store::console::Bucket;

/// What a masked field's value is shown as.
pub const MASKED: &str = "••• masked •••";

fn normal(name: &str) -> String {
    name.chars()
        .filter(|c| *c != '_' && *c != '-')
        .flat_map(char::to_lowercase)
        .collect()
}

/// `value` with the value of every field named in `fields` (at any depth,
/// ignoring case, `-` and `_`) replaced by [`MASKED`].
pub fn mask(value: &Value, fields: &[String]) -> Value {
    let names: Vec<String> = fields.iter().map(|f| normal(f)).collect();
    fn walk(v: &Value, names: &[String]) -> Value {
        match v {
            Value::Object(map) => Value::Object(
                map.iter()
                    .map(|(k, v)| {
                        let shown = if names.contains(&normal(k)) {
                            Value::String(MASKED.into())
                        } else {
                            walk(v, names)
                        };
                        (k.clone(), shown)
                    })
                    .collect(),
            ),
            Value::Array(items) => Value::Array(items.iter().map(|i| walk(i, names)).collect()),
            other => other.clone(),
        }
    }
    walk(value, &names)
}

/// A webhook payload's `url` as every shown URL is shown, its secrets
/// (credentials, the path after its first segment, the query's values)
/// redacted.
pub fn redact_url(payload: &mut Value) {
    if let Some(Value::String(url)) = payload.get_mut("url") {
        *url = outbox_providers::redact::urls_in(url);
    }
}

/// The first object key in `value` (at any depth) that `fields` masks.
pub fn masked_field_in(value: &Value, fields: &[String]) -> Option<String> {
    let names: Vec<String> = fields.iter().map(|f| normal(f)).collect();
    fn walk(v: &Value, names: &[String]) -> Option<String> {
        match v {
            Value::Object(map) => map.iter().find_map(|(k, v)| {
                if names.contains(&normal(k)) {
                    Some(k.clone())
                } else {
                    walk(v, names)
                }
            }),
            Value::Array(items) => items.iter().find_map(|i| walk(i, names)),
            _ => None,
        }
    }
    walk(value, &names)
}

/// The forms a `host` filter may give an origin in: the origin, without
/// its scheme, and its host alone (lowercase).
pub fn host_forms(origin: &str) -> [String; 3] {
    let origin = origin.to_lowercase();
    let no_scheme = origin
        .split_once("://")
        .map_or(origin.as_str(), |(_, rest)| rest)
        .to_string();
    let host = match no_scheme.rsplit_once(':') {
        Some((h, port)) if port.chars().all(|c| c.is_ascii_digit()) => h.to_string(),
        _ => no_scheme.clone(),
    };
    [origin, no_scheme, host]
}

/// A `host` filter in the form the relay names origins in
/// (`outbox.destination_of`): an origin however spelt
/// (`HTTP://LocalHost.:8080/x` is `http://localhost:8080`), `host:port` or
/// a host alone (`LocalHost.`, `0x7f.1:08080`) likewise without its scheme;
/// anything else (an endpoint name, `smtp`) in lowercase.
pub fn host_filter(text: &str) -> String {
    let text = text.trim();
    if text.contains("://") {
        return origin(text).unwrap_or_else(|| text.to_lowercase());
    }
    let (host, port) = match text.rsplit_once(':') {
        Some((h, p)) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => (h, Some(p)),
        _ => (text, None),
    };
    match origin(&format!("http://{host}")) {
        Some(o) => {
            let host = o.trim_start_matches("http://");
            match port.map(|p| p.trim_start_matches('0')) {
                Some("") => format!("{host}:0"),
                Some(p) => format!("{host}:{p}"),
                None => host.to_string(),
            }
        }
        None => text.to_lowercase(),
    }
}

/// Pretty-printed JSON (escaped by the template like any text).
pub fn pretty(value: &Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
}

/// "4s", "3m", "2h", "5d": how long since `t`.
pub fn ago(t: DateTime<Utc>) -> String {
    seconds((Utc::now() - t).num_seconds().max(0) as f64)
}

/// A duration in its largest whole unit.
pub fn seconds(s: f64) -> String {
    let s = s.max(0.0) as i64;
    match s {
        0..=119 => format!("{s}s"),
        120..=7_199 => format!("{}m", s / 60),
        7_200..=172_799 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

/// A time as pages show it (UTC, to the second).
pub fn when(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S").to_string()
}

/// One bar of a chart: delivered stacked on failed, in SVG units.
#[derive(Debug, Clone, Serialize)]
pub struct Bar {
    pub x: f64,
    pub width: f64,
    pub failed_y: f64,
    pub failed_h: f64,
    pub delivered_y: f64,
    pub delivered_h: f64,
    /// The tooltip: time and counts.
    pub title: String,
}

/// A stacked bar chart of attempts per bucket, drawn as inline SVG.
#[derive(Debug, Clone, Serialize)]
pub struct Chart {
    pub title: String,
    pub bars: Vec<Bar>,
    pub width: f64,
    pub height: f64,
    /// The largest bucket, per minute, for the axis label.
    pub peak_per_minute: String,
    pub delivered: i64,
    pub failed: i64,
}

impl Chart {
    pub fn new(title: &str, buckets: &[Bucket], step_secs: i64) -> Chart {
        let (width, height) = (600.0, 80.0);
        let peak = buckets
            .iter()
            .map(|b| b.delivered + b.failed)
            .max()
            .unwrap_or(0)
            .max(1) as f64;
        let w = width / buckets.len().max(1) as f64;
        let minutes = step_secs as f64 / 60.0;
        let bars = buckets
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let failed_h = b.failed as f64 / peak * height;
                let delivered_h = b.delivered as f64 / peak * height;
                Bar {
                    x: i as f64 * w,
                    width: (w - 1.0).max(0.5),
                    failed_y: height - failed_h,
                    failed_h,
                    delivered_y: height - failed_h - delivered_h,
                    delivered_h,
                    title: format!(
                        "{}: {} delivered, {} failed",
                        b.at.format("%H:%M"),
                        b.delivered,
                        b.failed
                    ),
                }
            })
            .collect();
        let peak_per_minute = peak / minutes;
        Chart {
            title: title.into(),
            bars,
            width,
            height,
            peak_per_minute: if peak_per_minute >= 10.0 {
                format!("{peak_per_minute:.0}")
            } else {
                format!("{peak_per_minute:.1}")
            },
            delivered: buckets.iter().map(|b| b.delivered).sum(),
            failed: buckets.iter().map(|b| b.failed).sum(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn masking_reaches_every_depth_and_spelling() {
        let fields = vec!["api_key".to_string(), "password".to_string()];
        let v = json!({"url": "x", "headers": {"API-Key": "k1", "Accept": "a"},
                       "body": {"users": [{"Password": "p", "name": "n"}]}});
        let m = mask(&v, &fields);
        assert_eq!(m["headers"]["API-Key"], MASKED);
        assert_eq!(m["headers"]["Accept"], "a");
        assert_eq!(m["body"]["users"][0]["Password"], MASKED);
        assert_eq!(m["body"]["users"][0]["name"], "n");
        assert!(!pretty(&m).contains("k1"));
    }

    #[test]
    fn masked_fields_are_found_and_origins_have_three_forms() {
        let fields = vec!["cvc".to_string()];
        assert_eq!(
            masked_field_in(&json!({"body": {"card": {"CVC": "1"}}}), &fields).as_deref(),
            Some("CVC")
        );
        assert_eq!(masked_field_in(&json!({"body": {"n": 1}}), &fields), None);
        assert_eq!(
            host_forms("https://Pay.Example:8443"),
            [
                "https://pay.example:8443",
                "pay.example:8443",
                "pay.example"
            ]
            .map(String::from)
        );
    }

    #[test]
    fn a_host_filter_names_an_origin_as_the_relay_does() {
        for (typed, want) in [
            ("HTTP://LocalHost.:8080/x", "http://localhost:8080"),
            ("http://0x7f.1:8080", "http://127.0.0.1:8080"),
            ("LocalHost.:08080", "localhost:8080"),
            ("LocalHost.", "localhost"),
            ("0x7f.1", "127.0.0.1"),
            ("[::ffff:127.0.0.1]:8080", "127.0.0.1:8080"),
            ("[::1]:8080", "[::1]:8080"),
            ("h:0", "h:0"),
            ("Billing", "billing"),
            ("smtp", "smtp"),
            ("not a host", "not a host"),
        ] {
            assert_eq!(host_filter(typed), want, "{typed}");
        }
    }

    #[test]
    fn charts_stack_and_scale() {
        let t = Utc::now();
        let b = |d, f| Bucket {
            at: t,
            delivered: d,
            failed: f,
        };
        let c = Chart::new("hour", &[b(0, 0), b(30, 10), b(10, 0)], 60);
        assert_eq!(c.bars.len(), 3);
        assert_eq!(c.bars[1].failed_h + c.bars[1].delivered_h, 80.0);
        assert_eq!(c.bars[1].delivered_y, 0.0);
        assert_eq!(c.bars[0].delivered_h, 0.0);
        assert_eq!(c.peak_per_minute, "40");
        assert_eq!((c.delivered, c.failed), (40, 10));
        assert_eq!(seconds(59.0), "59s");
        assert_eq!(seconds(3600.0), "60m");
        assert_eq!(seconds(86_400.0 * 3.0), "3d");
    }
}

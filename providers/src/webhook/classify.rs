//! Mapping HTTP answers and transport errors to outcomes.

use std::time::Duration;

use serde_json::json;

use super::client::{Answer, SendError};
use super::WebhookConfig;
use crate::Outcome;

/// What a status code means on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusClass {
    Delivered,
    Rejected,
    Transient,
}

/// 2xx delivers. 4xx is a deliberate refusal (400, 401, 403, 404, 410, 422,
/// ...) except the ones that ask to come back later (408 timeout, 409
/// conflict, 425 too early, 429 slow down). 3xx is not followed and, like 5xx
/// and anything else, is transient: never terminal.
pub fn status_class(status: u16) -> StatusClass {
    match status {
        200..=299 => StatusClass::Delivered,
        408 | 409 | 425 | 429 => StatusClass::Transient,
        400..=499 => StatusClass::Rejected,
        _ => StatusClass::Transient,
    }
}

/// `Retry-After` as delta-seconds or an HTTP date, capped at `max`.
pub fn retry_after(value: &str, now: std::time::SystemTime, max: Duration) -> Option<Duration> {
    let value = value.trim();
    let wait = if let Ok(secs) = value.parse::<u64>() {
        Duration::from_secs(secs)
    } else {
        let at = httpdate::parse_http_date(value).ok()?;
        at.duration_since(now).unwrap_or(Duration::ZERO)
    };
    Some(wait.min(max))
}

/// The outcome of an answer: its status, with `Retry-After`, the replay
/// header and an excerpt of a refusal's body.
pub fn response(answer: Answer, id: String, config: &WebhookConfig) -> Outcome {
    let Answer {
        status,
        headers,
        excerpt,
    } = answer;
    let replayed = ["idempotent-replayed", "idempotency-replayed"]
        .iter()
        .any(|h| {
            headers
                .get(*h)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.eq_ignore_ascii_case("true"))
        });
    let wait = headers
        .get(http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| retry_after(v, std::time::SystemTime::now(), config.max_retry_after));
    let class = status_class(status);
    // a 2xx stays delivered even when its body could not be read whole:
    // the receiver has answered
    let excerpt = String::from_utf8_lossy(&excerpt).into_owned();
    match class {
        StatusClass::Delivered => Outcome::Delivered {
            reference: Some(id),
            replayed,
            status: Some(status),
        },
        StatusClass::Rejected => Outcome::Rejected {
            reason: format!("receiver refused the webhook with HTTP {status}"),
            status: Some(status),
            response: Some(json!({"status": status, "body": excerpt})),
        },
        StatusClass::Transient => Outcome::Transient {
            reason: if (300..400).contains(&status) {
                format!("receiver answered HTTP {status} (redirects are not followed)")
            } else {
                format!("receiver answered HTTP {status}")
            },
            status: Some(status),
            retry_after: wait,
        },
    }
}

/// How far a failed request got, as far as the HTTP client can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// The destination guard refused the address: nothing was sent, and
    /// nothing ever will be.
    Refused,
    /// Provably nothing sent: the request could not be built, the name did
    /// not resolve, or the connection (or its TLS handshake) was refused,
    /// reset or timed out before it was made.
    NotSent,
    /// The connection was made and the request may have been written: no
    /// answer within the timeout, or the connection failed before the
    /// answer was complete.
    MaybeSent { timed_out: bool },
}

/// The destination guard's refusal, when that is what stopped the request.
fn refusal(err: &SendError) -> Option<&super::resolve::Refused> {
    let mut source = err.client_error();
    while let Some(e) = source {
        if let Some(refused) = e.downcast_ref::<super::resolve::Refused>() {
            return Some(refused);
        }
        source = e.source();
    }
    None
}

/// Place a transport error on either side of "may have reached the
/// receiver".
pub fn stage(err: &SendError) -> Stage {
    if refusal(err).is_some() {
        Stage::Refused
    } else if err.is_connect() {
        Stage::NotSent
    } else {
        Stage::MaybeSent {
            timed_out: matches!(err, SendError::TimedOut),
        }
    }
}

/// A transport error's outcome. A refusal by the destination guard is a
/// rejection; a failure before anything was sent is transient; a timeout or
/// a broken connection after the request may have been sent is ambiguous:
/// a timeout is an absence of information, not a failure, and the kind's
/// `on_ambiguous` policy settles it.
pub fn error(err: &SendError, target: &str, timeout: Duration) -> Outcome {
    match refusal(err) {
        Some(refused) => Outcome::invalid(refused.to_string()),
        None => failure(stage(err), target, &chain(err), timeout),
    }
}

/// [`error`]'s decision, pure: the outcome of a failure at `stage`.
pub fn failure(stage: Stage, target: &str, detail: &str, timeout: Duration) -> Outcome {
    match stage {
        Stage::Refused => Outcome::invalid(format!("POST {target}: {detail}")),
        Stage::NotSent => Outcome::Transient {
            reason: format!("POST {target}: could not connect (nothing was sent): {detail}"),
            status: None,
            retry_after: None,
        },
        Stage::MaybeSent { timed_out: true } => Outcome::Ambiguous {
            reason: format!(
                "POST {target}: no answer within {}; the request may have reached the receiver",
                humanize(timeout)
            ),
            status: None,
        },
        Stage::MaybeSent { timed_out: false } => Outcome::Ambiguous {
            reason: format!(
                "POST {target}: the connection failed before the answer was complete ({detail}); the request may have reached the receiver"
            ),
            status: None,
        },
    }
}

/// The error's causes, without the client's own wrapper when it has a
/// cause ("client error (Connect)" says less than what it wraps). The URL,
/// which may carry tokens in its query, is in none of them.
fn chain(err: &SendError) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut source = err.client_error();
    while let Some(e) = source {
        let text = e.to_string();
        if parts.last() != Some(&text) {
            parts.push(text);
        }
        source = e.source();
    }
    if parts.len() > 1 {
        parts.remove(0);
    }
    if parts.is_empty() {
        "request failed".to_string()
    } else {
        parts.join(": ")
    }
}

/// `3s`, `1500ms`; within 10 ms of whole seconds (a timeout cut to a
/// deadline taken a moment before the request) it reads as the seconds.
fn humanize(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1000.0;
    let secs = (ms / 1000.0).round();
    if secs >= 1.0 && (ms - secs * 1000.0).abs() <= 10.0 {
        format!("{secs}s")
    } else {
        format!("{}ms", ms.round() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{SystemTime, UNIX_EPOCH};

    #[test]
    fn status_table() {
        use StatusClass::*;
        for (status, class) in [
            (200, Delivered),
            (201, Delivered),
            (204, Delivered),
            (299, Delivered),
            (100, Transient),
            (301, Transient),
            (302, Transient),
            (304, Transient),
            (400, Rejected),
            (401, Rejected),
            (403, Rejected),
            (404, Rejected),
            (405, Rejected),
            (410, Rejected),
            (413, Rejected),
            (422, Rejected),
            (408, Transient),
            (409, Transient),
            (425, Transient),
            (429, Transient),
            (500, Transient),
            (502, Transient),
            (503, Transient),
            (504, Transient),
        ] {
            assert_eq!(status_class(status), class, "HTTP {status}");
        }
    }

    #[test]
    fn transport_failure_table() {
        let t = Duration::from_secs(3);
        for (stage, class) in [
            (Stage::Refused, "rejected"),
            (Stage::NotSent, "transient"),
            (Stage::MaybeSent { timed_out: true }, "ambiguous"),
            (Stage::MaybeSent { timed_out: false }, "ambiguous"),
        ] {
            assert_eq!(
                failure(stage, "http://h/", "x", t).class(),
                class,
                "{stage:?}"
            );
        }
        let reason = failure(Stage::MaybeSent { timed_out: true }, "http://h/", "", t);
        assert!(
            reason.reason().unwrap().contains("no answer within 3s"),
            "{reason:?}"
        );
        assert_eq!(humanize(Duration::from_micros(2_999_700)), "3s");
        assert_eq!(humanize(Duration::from_millis(400)), "400ms");
        assert_eq!(humanize(Duration::from_millis(1500)), "1500ms");
    }

    #[test]
    fn retry_after_forms() {
        let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let max = Duration::from_secs(3600);
        assert_eq!(retry_after("7", now, max), Some(Duration::from_secs(7)));
        assert_eq!(retry_after(" 0 ", now, max), Some(Duration::ZERO));
        assert_eq!(retry_after("999999", now, max), Some(max));
        let later = httpdate::fmt_http_date(now + Duration::from_secs(120));
        assert_eq!(
            retry_after(&later, now, max),
            Some(Duration::from_secs(120))
        );
        let past = httpdate::fmt_http_date(now - Duration::from_secs(120));
        assert_eq!(retry_after(&past, now, max), Some(Duration::ZERO));
        assert_eq!(retry_after("soon", now, max), None);
        assert_eq!(retry_after("-5", SystemTime::now(), max), None);
    }
}

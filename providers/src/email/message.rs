//! An email intent's payload → a lettre message, before any network call.
//!
//! lettre parses every address and encodes every header, so CR/LF in a
//! subject or an address can never add a header or a recipient.

use lettre::message::header::{HeaderName, HeaderValue};
use lettre::message::{Mailbox, MultiPart, SinglePart};
use lettre::Message;
use serde_json::Value;

use crate::keys;
use crate::webhook::request::type_name;
use crate::TraceHeaders;

/// Recipients (to, cc and bcc together) of one message at most: the number
/// every SMTP server must accept (RFC 5321 4.5.3.1.8). Beyond it a server
/// may answer 452 to each attempt until the intent dies.
pub const MAX_RECIPIENTS: usize = 100;

/// A message ready to send: the envelope, the bytes, and its Message-ID.
pub struct Prepared {
    pub envelope: lettre::address::Envelope,
    pub bytes: Vec<u8>,
    pub message_id: String,
}

/// The Message-ID for an intent: derived from its key, the same on every
/// attempt, so a receiving system that dedupes on Message-ID can.
pub fn message_id(key: &str, generation: i32, from: &Mailbox) -> String {
    let k = keys::effect_key(key, "email", generation);
    format!("<{}@{}>", &k[..32], from.email.domain())
}

/// Parse `{"from"?, "to": [...], "cc"?, "bcc"?, "reply_to"?, "subject",
/// "text"?, "html"?}` and build the message.
pub fn prepare(
    payload: &Value,
    key: &str,
    generation: i32,
    default_from: Option<&Mailbox>,
) -> Result<Prepared, String> {
    prepare_traced(payload, key, generation, default_from, None)
}

/// [`prepare`], with the attempt's trace context as the message's
/// `traceparent` and `tracestate` headers (each only when it is printable
/// ASCII), so that a receiving system's spans can join the trace. The
/// Message-ID does not depend on it.
pub fn prepare_traced(
    payload: &Value,
    key: &str,
    generation: i32,
    default_from: Option<&Mailbox>,
    trace: Option<TraceHeaders<'_>>,
) -> Result<Prepared, String> {
    let obj = payload.as_object().ok_or_else(|| {
        format!(
            "email payload must be a JSON object, not {}",
            type_name(payload)
        )
    })?;
    if let Some(unknown) = obj.keys().find(|k| {
        !matches!(
            k.as_str(),
            "from" | "to" | "cc" | "bcc" | "reply_to" | "subject" | "text" | "html"
        )
    }) {
        return Err(format!(
            "email payload has an unknown field {unknown:?} (expected from, to, cc, bcc, reply_to, subject, text, html)"
        ));
    }
    let from = match obj.get("from") {
        Some(v) => mailbox("from", v)?,
        None => default_from
            .cloned()
            .ok_or("email payload has no \"from\" and email.from is not configured")?,
    };
    let to = mailboxes("to", obj.get("to"))?;
    if to.is_empty() {
        return Err("email \"to\" must list at least one address".into());
    }
    let cc = mailboxes("cc", obj.get("cc"))?;
    let bcc = mailboxes("bcc", obj.get("bcc"))?;
    let recipients = to.len() + cc.len() + bcc.len();
    if recipients > MAX_RECIPIENTS {
        return Err(format!(
            "email has {recipients} recipients (to, cc and bcc); the limit is {MAX_RECIPIENTS}"
        ));
    }
    let subject = match obj.get("subject") {
        Some(Value::String(s)) => s.clone(),
        Some(other) => {
            return Err(format!(
                "email \"subject\" must be a string, not {}",
                type_name(other)
            ))
        }
        None => return Err("email payload has no \"subject\"".into()),
    };
    let text = optional_string(obj.get("text"), "text")?;
    let html = optional_string(obj.get("html"), "html")?;

    let id = message_id(key, generation, &from);
    let mut builder = Message::builder()
        .message_id(Some(id.clone()))
        .from(from)
        .subject(subject);
    for m in to {
        builder = builder.to(m);
    }
    for m in cc {
        builder = builder.cc(m);
    }
    for m in bcc {
        builder = builder.bcc(m);
    }
    if let Some(v) = obj.get("reply_to") {
        builder = builder.reply_to(mailbox("reply_to", v)?);
    }
    if let Some(trace) = trace {
        const TRACEPARENT: HeaderName = HeaderName::new_from_ascii_str("traceparent");
        const TRACESTATE: HeaderName = HeaderName::new_from_ascii_str("tracestate");
        if crate::span::printable(trace.traceparent) {
            builder =
                builder.raw_header(HeaderValue::new(TRACEPARENT, trace.traceparent.to_string()));
        }
        if let Some(state) = trace.tracestate.filter(|s| crate::span::printable(s)) {
            builder = builder.raw_header(HeaderValue::new(TRACESTATE, state.to_string()));
        }
    }
    let message = match (text, html) {
        (Some(t), Some(h)) => builder.multipart(MultiPart::alternative_plain_html(t, h)),
        (Some(t), None) => builder.singlepart(SinglePart::plain(t)),
        (None, Some(h)) => builder.singlepart(SinglePart::html(h)),
        (None, None) => return Err("email payload needs \"text\" or \"html\"".into()),
    }
    .map_err(|e| format!("email cannot be built: {e}"))?;
    Ok(Prepared {
        envelope: message.envelope().clone(),
        bytes: message.formatted(),
        message_id: id,
    })
}

fn optional_string(v: Option<&Value>, field: &str) -> Result<Option<String>, String> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(format!(
            "email \"{field}\" must be a string, not {}",
            type_name(other)
        )),
    }
}

/// One address, `a@example.com` or `Name <a@example.com>`.
pub fn mailbox(field: &str, v: &Value) -> Result<Mailbox, String> {
    let Value::String(s) = v else {
        return Err(format!(
            "email \"{field}\" must be an address string, not {}",
            type_name(v)
        ));
    };
    if s.contains(['\r', '\n']) {
        return Err(format!("email \"{field}\" address contains a line break"));
    }
    s.parse::<Mailbox>()
        .map_err(|e| format!("email \"{field}\" address {s:?} is invalid: {e}"))
}

fn mailboxes(field: &str, v: Option<&Value>) -> Result<Vec<Mailbox>, String> {
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items.iter().map(|i| mailbox(field, i)).collect(),
        Some(single @ Value::String(_)) => Ok(vec![mailbox(field, single)?]),
        Some(other) => Err(format!(
            "email \"{field}\" must be a list of addresses, not {}",
            type_name(other)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn text(p: &Prepared) -> String {
        String::from_utf8(p.bytes.clone()).unwrap()
    }

    #[test]
    fn builds_the_contract_shape() {
        let p = prepare(
            &json!({"from": "Shop <shop@example.com>", "to": ["a@example.com", "B <b@example.org>"],
                    "cc": ["c@example.com"], "bcc": ["hidden@example.com"], "reply_to": "help@example.com",
                    "subject": "Your order", "text": "Thanks!", "html": "<p>Thanks!</p>"}),
            "order:1", 0, None,
        )
        .unwrap();
        let t = text(&p);
        assert!(t.contains("Subject: Your order"), "{t}");
        assert!(t.contains(&format!("Message-ID: {}", p.message_id)), "{t}");
        assert!(!t.contains("hidden@example.com"), "Bcc is not a header");
        assert_eq!(p.envelope.to().len(), 4, "but it is a recipient");
        assert!(p.message_id.ends_with("@example.com>"));
        assert_eq!(p.message_id, prepare(&json!({"from": "shop@example.com", "to": ["x@example.com"], "subject": "s", "text": "t"}), "order:1", 0, None).unwrap().message_id);
        assert_ne!(
            p.message_id,
            message_id("order:1", 1, &"shop@example.com".parse().unwrap())
        );
    }

    #[test]
    fn header_injection_cannot_add_headers_or_recipients() {
        let p = prepare(
            &json!({"from": "shop@example.com", "to": ["a@example.com"],
                    "subject": "hi\r\nBcc: victim@example.com\r\nX-Evil: 1", "text": "t"}),
            "k",
            0,
            None,
        )
        .unwrap();
        let t = text(&p);
        assert!(!t.contains("\r\nBcc:") && !t.contains("\r\nX-Evil:"), "{t}");
        assert_eq!(p.envelope.to().len(), 1);
        for bad in ["a@example.com\r\nBcc: v@example.com", "a@example.com\nX: y"] {
            let err = prepare(
                &json!({"from": "shop@example.com", "to": [bad], "subject": "s", "text": "t"}),
                "k",
                0,
                None,
            )
            .err()
            .unwrap();
            assert!(err.contains("line break"), "{err}");
        }
    }

    #[test]
    fn the_trace_context_goes_as_headers_and_never_adds_one() {
        let payload = json!({"from": "shop@example.com", "to": ["a@example.com"], "subject": "s", "text": "t"});
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let trace = TraceHeaders {
            traceparent: tp,
            tracestate: Some("vendor=a1,other=b2"),
        };
        let p = prepare_traced(&payload, "k", 0, None, Some(trace)).unwrap();
        let t = text(&p);
        assert!(t.contains(&format!("\r\ntraceparent: {tp}\r\n")), "{t}");
        assert!(t.contains("\r\ntracestate: vendor=a1,other=b2\r\n"), "{t}");
        let plain = prepare(&payload, "k", 0, None).unwrap();
        assert_eq!(p.message_id, plain.message_id, "the same effect");
        assert!(!text(&plain).contains("traceparent"));

        let smuggling = TraceHeaders {
            traceparent: "00-x\r\nBcc: victim@example.com",
            tracestate: Some("a=b\nX-Evil: 1"),
        };
        let p = prepare_traced(&payload, "k", 0, None, Some(smuggling)).unwrap();
        let t = text(&p);
        assert!(
            !t.contains("traceparent") && !t.contains("tracestate"),
            "{t}"
        );
        assert!(!t.contains("Bcc:") && !t.contains("X-Evil"), "{t}");
        assert_eq!(p.envelope.to().len(), 1);
    }

    #[test]
    fn refuses_bad_payloads_with_a_reason() {
        let from: Mailbox = "shop@example.com".parse().unwrap();
        for (payload, needle) in [
            (json!("x"), "must be a JSON object"),
            (
                json!({"to": ["a@example.com"], "subject": "s", "text": "t"}),
                "no \"from\"",
            ),
            (
                json!({"from": "not an address", "to": ["a@example.com"], "subject": "s", "text": "t"}),
                "\"from\" address",
            ),
            (
                json!({"to": [], "subject": "s", "text": "t"}),
                "at least one address",
            ),
            (
                json!({"to": ["@nope"], "subject": "s", "text": "t"}),
                "invalid",
            ),
            (
                json!({"to": [5], "subject": "s", "text": "t"}),
                "must be an address string",
            ),
            (
                json!({"to": {"a": 1}, "subject": "s", "text": "t"}),
                "must be a list",
            ),
            (
                json!({"to": ["a@example.com"], "text": "t"}),
                "no \"subject\"",
            ),
            (
                json!({"to": ["a@example.com"], "subject": 1, "text": "t"}),
                "\"subject\" must be a string",
            ),
            (
                json!({"to": ["a@example.com"], "subject": "s"}),
                "needs \"text\" or \"html\"",
            ),
            (
                json!({"to": ["a@example.com"], "subject": "s", "text": "t", "attachments": []}),
                "unknown field",
            ),
            (
                json!({"to": (0..60).map(|i| format!("t{i}@example.com")).collect::<Vec<_>>(),
                       "bcc": (0..41).map(|i| format!("b{i}@example.com")).collect::<Vec<_>>(),
                       "subject": "s", "text": "t"}),
                "101 recipients (to, cc and bcc); the limit is 100",
            ),
        ] {
            let needs_default = payload.get("from").is_none() && needle != "no \"from\"";
            let err = prepare(&payload, "k", 0, needs_default.then_some(&from))
                .err()
                .unwrap_or_default();
            assert!(
                err.contains(needle),
                "{payload}: {err:?} should mention {needle:?}"
            );
        }
    }
}

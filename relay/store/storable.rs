//! Making provider text storable.
//!
//! What a provider answers is foreign input: a webhook receiver's 4xx body,
//! a charge API's decline message, an SMTP server's reply. Postgres refuses
//! a NUL character in `text` (SQLSTATE 22021) and the escape `\u0000` in
//! `jsonb` (22P05), and one refused row fails the whole completion
//! statement it travels in. So everything the completer writes passes
//! through here first: NUL becomes the visible escape `\u0000`, other
//! control characters but tab and newline become `\u{..}`-style escapes, and
//! every field is capped so a hostile answer cannot make `last_error` a copy
//! of itself. (Invalid UTF-8 cannot reach this point: providers decode bytes
//! lossily, and a Rust `String` is always valid UTF-8.)

use serde_json::Value;

/// The longest error text stored, in characters.
pub const MAX_ERROR_CHARS: usize = 2000;
/// The longest provider reference stored, in characters.
pub const MAX_REF_CHARS: usize = 500;
/// The largest provider answer (`response`) stored, in bytes of JSON text.
pub const MAX_RESPONSE_BYTES: usize = 16 * 1024;

/// `s` with NUL and other control characters escaped, cut to `max` chars
/// (keeping the beginning and the end, where the reason's fix usually is).
pub fn text(s: &str, max: usize) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\0' => out.push_str("\\u0000"),
            '\t' | '\n' => out.push(c),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    cut_middle(out, max)
}

/// `s` cut to at most `max` characters by removing its middle.
pub fn cut_middle(s: String, max: usize) -> String {
    let total = s.chars().count();
    if total <= max {
        return s;
    }
    let marker = format!(" … ({} characters cut) … ", total.saturating_sub(max));
    let room = max.saturating_sub(marker.chars().count());
    let head = room * 2 / 3;
    let tail = room - head;
    let start: String = s.chars().take(head).collect();
    let end: String = s.chars().skip(total - tail).collect();
    format!("{start}{marker}{end}")
}

/// A JSON value Postgres will store as `jsonb`: strings and keys escaped as
/// in [`text`] (without the cap), and the whole replaced by a note when its
/// text is larger than [`MAX_RESPONSE_BYTES`].
pub fn json(v: &Value) -> Value {
    let clean = escape_json(v);
    let size = clean.to_string().len();
    if size <= MAX_RESPONSE_BYTES {
        return clean;
    }
    serde_json::json!({
        "truncated": true,
        "bytes": size,
        "excerpt": text(&clean.to_string(), 2000),
    })
}

fn escape_json(v: &Value) -> Value {
    match v {
        Value::String(s) => Value::String(text(s, usize::MAX)),
        Value::Array(a) => Value::Array(a.iter().map(escape_json).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, v)| (text(k, usize::MAX), escape_json(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn nul_and_controls_are_escaped_visibly() {
        assert_eq!(text("a\0b", 100), "a\\u0000b");
        assert_eq!(text("bell\u{7}", 100), "bell\\u0007");
        assert_eq!(text("line\nnext\ttab", 100), "line\nnext\ttab");
        assert_eq!(text("plain é", 100), "plain é");
    }

    #[test]
    fn long_text_keeps_its_beginning_and_end() {
        let long = format!("start {} the fix is here", "x".repeat(10_000));
        let cut = text(&long, 200);
        assert!(cut.chars().count() <= 200, "{}", cut.chars().count());
        assert!(cut.starts_with("start xxx"), "{cut}");
        assert!(cut.ends_with("the fix is here"), "{cut}");
        assert!(cut.contains("characters cut"), "{cut}");
    }

    #[test]
    fn json_is_made_storable() {
        let v = json!({"body": "bad\u{0}byte", "k\u{0}": ["\u{0}"], "n": 1});
        let s = json(&v);
        assert_eq!(
            s,
            json!({"body": "bad\\u0000byte", "k\\u0000": ["\\u0000"], "n": 1})
        );
        let huge = json!({"body": "y".repeat(100_000)});
        let s = json(&huge);
        assert_eq!(s["truncated"], json!(true));
        assert!(s.to_string().len() < 3000);
    }
}

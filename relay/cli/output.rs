//! Tables for people, JSON for scripts.

use serde::Serialize;

/// Print `rows` as a left-aligned table with a header.
pub fn table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let mut out = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<w$}  "));
            }
        }
        println!("{}", out.trim_end());
    };
    line(header.iter().map(|s| s.to_string()).collect());
    for row in rows {
        line(row.clone());
    }
}

pub fn json<T: Serialize>(value: &T) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).expect("serializable")
    );
}

/// At most `n` characters, with an ellipsis when cut.
pub fn clip(text: &str, n: usize) -> String {
    if text.chars().count() <= n {
        text.to_string()
    } else {
        let cut: String = text.chars().take(n.saturating_sub(1)).collect();
        format!("{cut}…")
    }
}

/// At most `n` characters, cut from the middle when longer: the beginning
/// and the end stay, with an ellipsis between. For error messages, whose
/// end is usually the fix ("…; add it to webhook.allowed_networks to allow
/// it"), so cutting off the end would hide the useful part.
pub fn clip_middle(text: &str, n: usize) -> String {
    let count = text.chars().count();
    if count <= n {
        return text.to_string();
    }
    let keep = n.saturating_sub(1);
    let tail = keep / 2;
    let head = keep - tail;
    let start: String = text.chars().take(head).collect();
    let end: String = text.chars().skip(count - tail).collect();
    format!("{start}…{end}")
}

pub fn opt(v: Option<impl ToString>) -> String {
    v.map(|v| v.to_string()).unwrap_or_else(|| "-".into())
}

pub fn time(t: chrono::DateTime<chrono::Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S%.3fZ").to_string()
}

#[cfg(test)]
mod tests {
    use super::{clip, clip_middle};

    #[test]
    fn clip_keeps_the_beginning() {
        assert_eq!(clip("abcdef", 6), "abcdef");
        assert_eq!(clip("abcdefg", 6), "abcde…");
    }

    #[test]
    fn clip_middle_keeps_both_ends() {
        let reason = "destination address 127.0.0.1 is loopback (127.0.0.0/8); \
                      add it to webhook.allowed_networks to allow it";
        for (text, n, want) in [
            ("", 5, ""),
            ("abcdef", 6, "abcdef"),
            ("abcdefg", 6, "abc…fg"),
            ("abcdefg", 5, "ab…fg"),
            ("abcdefg", 2, "a…"),
            ("abcdefg", 1, "…"),
            ("abcdefg", 0, "…"),
            // characters, not bytes
            ("ääääääää", 5, "ää…ää"),
            (
                reason,
                60,
                "destination address 127.0.0.1 ….allowed_networks to allow it",
            ),
            (
                reason,
                80,
                "destination address 127.0.0.1 is loopbac…to webhook.allowed_networks to allow it",
            ),
        ] {
            assert_eq!(clip_middle(text, n), want, "{text:?} at {n}");
            assert!(clip_middle(text, n).chars().count() <= n.max(1));
        }
    }
}

//! The one rule for showing a URL anywhere outside the request itself: a
//! span's attributes and status, `last_error`, the logs, the console and
//! the CLI. A webhook URL often carries its secret (Slack's, Discord's and
//! many another in the path, others in the query), so what is shown keeps
//! the URL's shape and loses its secrets:
//!
//! - credentials (`user:password@`) and the fragment are dropped;
//! - the first path segment stays, every later one reads `REDACTED`;
//! - a query item `name=value` reads `name=REDACTED`; an item without a
//!   name or a value (`?SECRET`, `?SECRET=`) reads `REDACTED`;
//! - a URL that does not parse (a bad port, say) reads `scheme://REDACTED`,
//!   or `REDACTED` with no scheme before its `://`.

/// What is shown in place of a secret.
pub const REDACTED: &str = "REDACTED";

/// `url` with its secrets taken out (see the module docs).
pub fn redacted_url(url: &url::Url) -> String {
    let mut out = url.clone();
    let _ = out.set_username("");
    let _ = out.set_password(None);
    out.set_fragment(None);
    let segments: Vec<String> = url
        .path_segments()
        .map(|s| s.map(str::to_string).collect())
        .unwrap_or_default();
    if segments.len() > 1 {
        let kept: Vec<&str> = std::iter::once(segments[0].as_str())
            .chain(
                segments[1..]
                    .iter()
                    .map(|s| if s.is_empty() { "" } else { REDACTED }),
            )
            .collect();
        out.set_path(&kept.join("/"));
    }
    let query = url.query().map(|q| {
        q.split('&')
            .filter(|item| !item.is_empty())
            .map(|item| match item.split_once('=') {
                Some((name, value)) if !name.is_empty() && !value.is_empty() => {
                    format!("{name}={REDACTED}")
                }
                _ => REDACTED.to_string(),
            })
            .collect::<Vec<_>>()
            .join("&")
    });
    out.set_query(query.as_deref().filter(|q| !q.is_empty()));
    out.to_string()
}

/// Whether showing `url` as it stands could show a secret.
fn has_secrets(url: &url::Url) -> bool {
    !url.username().is_empty()
        || url.password().is_some()
        || url.query().is_some()
        || url.fragment().is_some()
        || url
            .path_segments()
            .is_some_and(|s| s.filter(|s| !s.is_empty()).count() > 1)
}

/// `text` with every URL in it (`scheme://…`, up to the next space or
/// quote) shown by [`redacted_url`]; a URL with nothing to hide (an
/// origin, `https://host/hook`) stays as it was written.
pub fn urls_in(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        // the scheme before `://`
        let start = rest[..at]
            .char_indices()
            .rev()
            .take_while(|(_, c)| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
            .last()
            .map_or(at, |(i, _)| i);
        let start = rest[start..at]
            .find(|c: char| c.is_ascii_alphabetic())
            .map_or(at, |i| start + i);
        let len = rest[start..]
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '<' | '>' | '`'))
            .unwrap_or(rest.len() - start);
        let token = rest[start..start + len].trim_end_matches(['.', ',', ';', ':', ')', ']', '}']);
        let end = start + token.len().max(at - start + 3);
        out.push_str(&rest[..start]);
        match url::Url::parse(token) {
            Ok(url) if start < at && has_secrets(&url) => out.push_str(&redacted_url(&url)),
            Ok(_) => out.push_str(&rest[start..end]),
            // nothing after `://`: nothing to hide
            Err(_) if token.len() <= at - start + 3 => out.push_str(&rest[start..end]),
            // what does not parse cannot be taken apart: only its scheme
            // is shown
            Err(_) if start < at => {
                out.push_str(&rest[start..at]);
                out.push_str("://");
                out.push_str(REDACTED);
            }
            Err(_) => out.push_str(REDACTED),
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(text: &str) -> String {
        redacted_url(&url::Url::parse(text).unwrap())
    }

    #[test]
    fn secrets_in_the_path_the_query_and_the_userinfo_are_not_shown() {
        for (url, want) in [
            (
                "https://user:pw@hooks.example:8443/in/7?token=s3cret&v=2#frag",
                "https://hooks.example:8443/in/REDACTED?token=REDACTED&v=REDACTED",
            ),
            (
                "https://hooks.slack.com/services/T0001/B0002/XXXXsecret",
                "https://hooks.slack.com/services/REDACTED/REDACTED/REDACTED",
            ),
            (
                "http://127.0.0.1:9/hook?SECRET",
                "http://127.0.0.1:9/hook?REDACTED",
            ),
            (
                "http://h/a?SECRET=&x=1&&=SECRET2",
                "http://h/a?REDACTED&x=REDACTED&REDACTED",
            ),
            ("http://SECRETUSER@h/", "http://h/"),
            ("http://h/a#SECRET", "http://h/a"),
            ("http://127.0.0.1:9/hook", "http://127.0.0.1:9/hook"),
            ("https://h/a/?", "https://h/a/"),
        ] {
            assert_eq!(shown(url), want, "{url}");
            assert!(!shown(url).contains("SECRET"), "{url}");
        }
    }

    #[test]
    fn every_url_in_a_text_is_shown_redacted() {
        let text = "POST http://127.0.0.1:9/services/T0001/B0002/SECRET?SECRETQ: could not \
                    connect (nothing was sent); before: 'https://u:SECRETPW@h/x?token=SECRETT', \
                    resume http://127.0.0.1:8080 or https://h/hook.";
        assert_eq!(
            urls_in(text),
            "POST http://127.0.0.1:9/services/REDACTED/REDACTED/REDACTED?REDACTED: could not \
             connect (nothing was sent); before: 'https://h/x?token=REDACTED', \
             resume http://127.0.0.1:8080 or https://h/hook."
        );
        assert_eq!(
            urls_in(&urls_in(text)),
            urls_in(text),
            "redacting twice changes nothing"
        );
        for plain in ["no url here", "a :// alone", "x://", "ends with http://"] {
            assert_eq!(urls_in(plain), plain);
        }
    }

    #[test]
    fn a_url_that_does_not_parse_shows_only_its_scheme() {
        let text = "POST http://h:99999/T/B/SECRET?token=SECRETQ: bad port; \
                    also https://u:SECRETPW@[::1/x and ://SECRETBARE, then http://h/a.";
        let shown = urls_in(text);
        assert_eq!(
            shown,
            "POST http://REDACTED: bad port; also https://REDACTED and REDACTED, then http://h/a."
        );
        assert!(!shown.contains("SECRET"), "{shown}");
        assert_eq!(urls_in(&shown), shown, "redacting twice changes nothing");
    }
}

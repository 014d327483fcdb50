//! The book (`docs/`, an mdBook) and the README hold together: every page
//! is in `docs/SUMMARY.md`, every relative link names a file that exists
//! and, with a `#fragment`, a heading on that page; and no text of the
//! product speaks of sessions or issues by number (the history is in git).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

use crate::common::files_under;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

#[test]
fn every_page_of_the_book_is_in_its_summary() {
    let docs = Path::new(ROOT).join("docs");
    let summary = std::fs::read_to_string(docs.join("SUMMARY.md")).unwrap();
    let listed: BTreeSet<PathBuf> = links(&summary)
        .into_iter()
        .map(|l| normal(&docs.join(l.split('#').next().unwrap_or(""))))
        .collect();
    let missing: Vec<String> = files_under(&docs, "md")
        .into_iter()
        .filter(|p| !p.ends_with("SUMMARY.md") && !listed.contains(&normal(p)))
        .map(|p| p.display().to_string())
        .collect();
    assert!(
        missing.is_empty(),
        "pages not in docs/SUMMARY.md: {missing:?}"
    );
}

#[test]
fn every_relative_link_of_the_book_and_the_readme_resolves() {
    let root = Path::new(ROOT);
    let mut pages = files_under(&root.join("docs"), "md");
    pages.push(root.join("README.md"));
    let mut anchors: BTreeMap<PathBuf, BTreeSet<String>> = BTreeMap::new();
    let mut broken = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        for link in links(&text) {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            let (path, fragment) = match link.split_once('#') {
                Some((p, f)) => (p, Some(f)),
                None => (link.as_str(), None),
            };
            let target = if path.is_empty() {
                page.clone()
            } else {
                normal(&page.parent().unwrap().join(path))
            };
            if !target.exists() {
                broken.push(format!("{}: {link} (no such file)", page.display()));
                continue;
            }
            let Some(fragment) = fragment.filter(|_| target.extension().is_some_and(|e| e == "md"))
            else {
                continue;
            };
            let known = anchors
                .entry(target.clone())
                .or_insert_with(|| headings(&std::fs::read_to_string(&target).unwrap()));
            if !known.contains(fragment) {
                broken.push(format!(
                    "{}: {link} (no heading #{fragment} in {})",
                    page.display(),
                    target.display()
                ));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn no_text_of_the_product_speaks_of_sessions_or_issues_by_number() {
    let root = Path::new(ROOT);
    let mut found = Vec::new();
    let mut texts = vec![root.join("README.md"), root.join("Cargo.toml")];
    for dir in [
        "docs",
        "relay",
        "providers",
        "deploy",
        "bench",
        "tests",
        "schema",
        ".ci",
        ".config",
    ] {
        for ext in [
            "md", "rs", "sh", "toml", "sql", "py", "js", "html", "css", "yml", "yaml", "json",
            "txt",
        ] {
            texts.extend(files_under(&root.join(dir), ext));
        }
    }
    texts.extend(files_under(&root.join(".ci"), ""));
    for file in texts {
        if file.ends_with("tests/it/book.rs") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            if numbered_mention(line) {
                found.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "say what is, without sessions or issue numbers:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_checks_see_a_numbered_mention_and_a_heading() {
    // the words spelled apart here, so that this file passes its own kind
    // of check
    let (session, issue) = ("Sess".to_owned() + "ion", "iss".to_owned() + "ue");
    assert!(numbered_mention(&format!(
        "measured in {session} 10, on a slow day"
    )));
    assert!(numbered_mention(&format!(
        "-- Hardening ({issue} #14): the ledger"
    )));
    assert!(!numbered_mention("a session cookie lasts 12 hours"));
    assert!(!numbered_mention("sessions evict the oldest visitors"));
    let h = headings("# The Console\n```\n# not a heading\n```\n## What `it` promises, honestly\n## Same\n## Same\n");
    for id in ["the-console", "what-it-promises-honestly", "same", "same-1"] {
        assert!(h.contains(id), "{id} in {h:?}");
    }
    assert!(!h.contains("not-a-heading"));
    assert_eq!(
        links("[a](x.md) `[b](y.md)` ![c](img.png)\n```\n[d](z.md)\n```\n"),
        ["x.md", "img.png"]
    );
}

/// One of the two words, then a number: a session or an issue named by it.
fn numbered_mention(line: &str) -> bool {
    let lower = line.to_lowercase();
    ["session", "issue"].iter().any(|word| {
        lower.match_indices(word).any(|(i, _)| {
            let before = lower[..i].chars().next_back();
            let rest = lower[i + word.len()..].trim_start_matches([' ', '#']);
            before.is_none_or(|c| !c.is_alphanumeric())
                && lower[i + word.len()..].starts_with([' ', '#'])
                && rest.starts_with(|c: char| c.is_ascii_digit())
        })
    })
}

/// The targets of the Markdown links and images of a page, outside code.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fence = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fence = !fence;
            continue;
        }
        if fence {
            continue;
        }
        // drop inline code spans
        let plain: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = plain.as_str();
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let end = after.find(')').unwrap_or(after.len());
            let target = after[..end].split_whitespace().next().unwrap_or("");
            if !target.is_empty() {
                out.push(target.to_string());
            }
            rest = &after[end.min(after.len())..];
        }
    }
    out
}

/// The anchors of a page's headings, as mdBook and GitHub make them:
/// lowercase, letters, digits, `-` and `_` kept, spaces as `-`, the rest
/// dropped; a repeated one gets `-1`, `-2`, ...
fn headings(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    let mut fence = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fence = !fence;
            continue;
        }
        let Some(title) = line.strip_prefix('#').filter(|_| !fence) else {
            continue;
        };
        let title = title.trim_start_matches('#');
        if !title.starts_with(' ') {
            continue;
        }
        let id: String = title
            .trim()
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect();
        let n = seen.entry(id.clone()).or_insert(0);
        out.insert(if *n == 0 {
            id.clone()
        } else {
            format!("{id}-{n}")
        });
        *n += 1;
    }
    out
}

/// `a/b/../c` as `a/c`, without touching the file system.
fn normal(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

//! The book's Reference chapter (docs/reference/) held to the code: each
//! page lists what the code has, no less and no more. Every test derives
//! the code's side from the code itself (the clap command tree, the
//! configuration's own deserializer, the relay's source, the migrated
//! schema) and reads the page's side from its Markdown tables, then fails
//! naming what is missing on either side.
//!
//! The pages' format, shared by all of them: a GitHub-flavoured Markdown
//! table (a header row, a `|---|` row, then one row a line; a `|` inside a
//! cell is written `\|`), outside code fences. A test reads only the tables
//! whose first header cell it names (`key`, `usage`, `metric`, ...), and of
//! each row the first code span (the text between the first two backticks)
//! of the first cell: the name. Each module says its page's columns.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use proc_macro2::{Delimiter, TokenStream, TokenTree};

mod cli;
mod config;
mod http;
mod metrics;
mod schema;
mod sql;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// A table of a page: the heading above it, its header and its rows.
#[derive(Debug)]
pub struct Table {
    pub heading: String,
    pub header: Vec<String>,
    pub rows: Vec<Row>,
}

/// One row: its line in the page (1-based) and its cells, trimmed.
#[derive(Debug)]
pub struct Row {
    pub line: usize,
    pub cells: Vec<String>,
}

impl Row {
    /// The first code span of cell `i`.
    pub fn code(&self, i: usize) -> Option<&str> {
        self.cells.get(i).and_then(|c| code_span(c))
    }

    /// The name: the first code span of the first cell.
    pub fn name(&self, page: &str) -> String {
        self.code(0)
            .unwrap_or_else(|| {
                panic!(
                    "{page}:{}: the first cell names nothing in backticks: {:?}",
                    self.line, self.cells
                )
            })
            .to_string()
    }
}

/// The text of docs/reference/`name`.
pub fn page(name: &str) -> String {
    let path = Path::new(ROOT).join("docs/reference").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The tables of `markdown` (none inside ``` fences).
pub fn tables(markdown: &str) -> Vec<Table> {
    let lines: Vec<&str> = markdown.lines().collect();
    let mut out = Vec::new();
    let mut heading = String::new();
    let mut fenced = false;
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i].trim();
        if line.starts_with("```") {
            fenced = !fenced;
        } else if fenced {
        } else if line.starts_with('#') {
            heading = line.trim_start_matches('#').trim().to_string();
        } else if line.starts_with('|') && lines.get(i + 1).is_some_and(|l| is_separator(l)) {
            let header = cells(line);
            let mut rows = Vec::new();
            i += 2;
            while i < lines.len() && lines[i].trim().starts_with('|') {
                rows.push(Row {
                    line: i + 1,
                    cells: cells(lines[i].trim()),
                });
                i += 1;
            }
            out.push(Table {
                heading: heading.clone(),
                header,
                rows,
            });
            continue;
        }
        i += 1;
    }
    out
}

/// The rows of the tables whose first header cell is `first`, at least one.
pub fn rows_of<'a>(tables: &'a [Table], first: &str, page: &str) -> Vec<&'a Row> {
    let rows: Vec<&Row> = tables
        .iter()
        .filter(|t| t.header.first().is_some_and(|h| h == first))
        .flat_map(|t| &t.rows)
        .collect();
    assert!(!rows.is_empty(), "{page} has no table headed `| {first} |`");
    rows
}

fn is_separator(line: &str) -> bool {
    let line = line.trim();
    line.starts_with('|')
        && line.contains('-')
        && line.chars().all(|c| matches!(c, '|' | '-' | ':' | ' '))
}

/// The cells of a table line, split at every `|` not written `\|`.
fn cells(line: &str) -> Vec<String> {
    let inner = line.trim().trim_start_matches('|');
    let inner = inner.strip_suffix('|').unwrap_or(inner);
    let mut out = Vec::new();
    let mut cell = String::new();
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                cell.push('|');
                chars.next();
            }
            '|' => out.push(std::mem::take(&mut cell).trim().to_string()),
            c => cell.push(c),
        }
    }
    out.push(cell.trim().to_string());
    out
}

/// The text between the first two backticks of `cell`.
pub fn code_span(cell: &str) -> Option<&str> {
    let (_, rest) = cell.split_once('`')?;
    let (span, _) = rest.split_once('`')?;
    Some(span)
}

/// Every code span of `cell`.
pub fn code_spans(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

/// Fail unless `documented` (from `page`) and `code` hold the same names;
/// `what` names the things compared. Names the page lists twice fail too.
pub fn same(what: &str, page: &str, code: &BTreeSet<String>, documented: &[String]) {
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let twice: Vec<&String> = documented
        .iter()
        .filter(|n| !seen.insert(n.to_string()))
        .collect();
    let missing: Vec<&String> = code.difference(&seen).collect();
    let extra: Vec<&String> = seen.difference(code).collect();
    let mut problems = Vec::new();
    if !missing.is_empty() {
        problems.push(format!(
            "{what} in the code but not in docs/reference/{page}: {missing:?}"
        ));
    }
    if !extra.is_empty() {
        problems.push(format!(
            "{what} in docs/reference/{page} but not in the code: {extra:?}"
        ));
    }
    if !twice.is_empty() {
        problems.push(format!(
            "{what} listed more than once in docs/reference/{page}: {twice:?}"
        ));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The Rust files under `relay/`, sorted.
pub fn relay_files() -> Vec<PathBuf> {
    crate::common::files_under(&Path::new(ROOT).join("relay"), "rs")
}

/// A Rust file as tokens (inside macros too, which a syntax tree leaves
/// unparsed).
pub fn tokens_of(path: &Path) -> Vec<TokenTree> {
    let text = std::fs::read_to_string(path).unwrap();
    let stream: TokenStream = text
        .parse()
        .unwrap_or_else(|e| panic!("{} does not tokenize: {e:?}", path.display()));
    stream.into_iter().collect()
}

/// Call `f` with every token sequence of `tokens`, top level and inside
/// every group, recursively.
pub fn each_sequence(tokens: &[TokenTree], f: &mut dyn FnMut(&[TokenTree])) {
    f(tokens);
    for t in tokens {
        if let TokenTree::Group(g) = t {
            let inner: Vec<TokenTree> = g.stream().into_iter().collect();
            each_sequence(&inner, f);
        }
    }
}

/// The value of a string literal token (`"a"` gives `a`); None for any
/// other token. Only plain literals without escapes are read.
pub fn string_literal(t: &TokenTree) -> Option<String> {
    let TokenTree::Literal(l) = t else {
        return None;
    };
    let text = l.to_string();
    let inner = text.strip_prefix('"')?.strip_suffix('"')?;
    (!inner.contains('\\')).then(|| inner.to_string())
}

pub fn is_ident(t: &TokenTree, name: &str) -> bool {
    matches!(t, TokenTree::Ident(i) if i == name)
}

pub fn is_punct(t: &TokenTree, c: char) -> bool {
    matches!(t, TokenTree::Punct(p) if p.as_char() == c)
}

/// The tokens inside `t` when it is a group delimited by `delimiter`.
pub fn group(t: &TokenTree, delimiter: Delimiter) -> Option<Vec<TokenTree>> {
    match t {
        TokenTree::Group(g) if g.delimiter() == delimiter => Some(g.stream().into_iter().collect()),
        _ => None,
    }
}

#[test]
fn the_table_reader_reads_what_the_pages_write() {
    let md = "# Page\n\nintro\n\n## Keys\n\n| key | meaning |\n|---|:--|\n\
              | `a.b` | one \\| two |\n| `c` (also `d`) | three |\n\n\
              ```\n| `fenced` | no |\n|---|---|\n```\n| other | x |\n| --- | --- |\n| `e` | f |\n";
    let t = tables(md);
    assert_eq!(t.len(), 2, "{t:?}");
    assert_eq!(t[0].heading, "Keys");
    assert_eq!(t[0].header, ["key", "meaning"]);
    assert_eq!(t[0].rows[0].cells, ["`a.b`", "one | two"]);
    assert_eq!(t[0].rows[0].line, 9);
    assert_eq!(t[0].rows[1].name("x"), "c");
    assert_eq!(code_spans(&t[0].rows[1].cells[0]), ["c", "d"]);
    assert_eq!(rows_of(&t, "other", "x").len(), 1);
    let code: BTreeSet<String> = ["a".to_string()].into();
    let caught = std::panic::catch_unwind(|| same("names", "x.md", &code, &["b".to_string()]));
    assert!(caught.is_err(), "a difference fails");
    same("names", "x.md", &code, &["a".to_string()]);
}

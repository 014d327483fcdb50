//! docs/reference/http.md against the HTTP routes the relay and the
//! console serve.
//!
//! Page format: tables headed `| request | ... |`, a row per method and
//! path: `` `GET /metrics` ``, a path parameter as `{name}`. Which listener
//! a table describes is said by the heading above it, which names
//! `relay.metrics_addr` (the relay's listener) or `console.addr` (the
//! console).
//!
//! The code's side is every `.route(PATH, HANDLER)` in relay/ (read as
//! tokens): the methods are the `get(..)`, `post(..)`, ... calls of the
//! handler, or of the body of the function it calls (`lookup::route(..)`);
//! a router that another `.nest(PREFIX, module::router())` mounts has its
//! paths under that prefix. The routes of files under relay/console/ are
//! the console's, every other route is the relay listener's. A wildcard
//! `{*key}` is written `{key}`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use proc_macro2::{Delimiter, TokenTree};

use super::{group, is_ident, is_punct, page, relay_files, rows_of, same, string_literal};

const PAGE: &str = "http.md";
const METHODS: [&str; 5] = ["get", "post", "put", "patch", "delete"];

/// One `.route(...)` or `.nest(...)` call: its path and the tokens after
/// the path's comma.
struct Call {
    path: String,
    rest: Vec<TokenTree>,
}

/// The `.NAME(...)` calls of `tokens`, at any depth.
fn calls(tokens: &[TokenTree], name: &str) -> Vec<Call> {
    let mut out = Vec::new();
    super::each_sequence(tokens, &mut |seq| {
        for w in seq.windows(3) {
            if !(is_punct(&w[0], '.') && is_ident(&w[1], name)) {
                continue;
            }
            let Some(args) = group(&w[2], Delimiter::Parenthesis) else {
                continue;
            };
            let Some(path) = args.first().and_then(string_literal) else {
                continue;
            };
            assert!(
                is_punct(&args[1], ','),
                ".{name}({path:?} ...) without a handler"
            );
            out.push(Call {
                path,
                rest: args[2..].to_vec(),
            });
        }
    });
    out
}

/// The methods called at the top level of `tokens`: `get(..).post(..)`.
fn methods_called(tokens: &[TokenTree]) -> BTreeSet<String> {
    tokens
        .windows(2)
        .filter_map(|w| match (&w[0], &w[1]) {
            (TokenTree::Ident(i), TokenTree::Group(g))
                if g.delimiter() == Delimiter::Parenthesis
                    && METHODS.contains(&i.to_string().as_str()) =>
            {
                Some(i.to_string().to_uppercase())
            }
            _ => None,
        })
        .collect()
}

/// The function a handler expression calls (`a::b::f(..)`), as path
/// segments, if it is a call of a path.
fn called_path(tokens: &[TokenTree]) -> Option<Vec<String>> {
    let mut segments = Vec::new();
    let mut i = 0;
    loop {
        let TokenTree::Ident(id) = tokens.get(i)? else {
            return None;
        };
        segments.push(id.to_string());
        i += 1;
        match tokens.get(i)? {
            TokenTree::Group(g) if g.delimiter() == Delimiter::Parenthesis => {
                return Some(segments)
            }
            t if is_punct(t, ':') && tokens.get(i + 1).is_some_and(|t| is_punct(t, ':')) => i += 2,
            _ => return None,
        }
    }
}

/// The file of module path `segments` (all but the function's name), seen
/// from `file`: `crate::a::b` from relay/, `b` from `file`'s own folder.
fn module_file(file: &Path, segments: &[String]) -> PathBuf {
    let (mut dir, rest) = match segments.first().map(String::as_str) {
        Some("crate") => (Path::new(super::ROOT).join("relay"), &segments[1..]),
        _ => (file.parent().unwrap().to_path_buf(), segments),
    };
    let (last, dirs) = rest.split_last().expect("a module path");
    for d in dirs {
        dir = dir.join(d);
    }
    let flat = dir.join(format!("{last}.rs"));
    if flat.exists() {
        flat
    } else {
        dir.join(last).join("mod.rs")
    }
}

/// The body of `fn name` in `file`.
fn function_body(file: &Path, name: &str) -> Vec<TokenTree> {
    let tokens = super::tokens_of(file);
    let start = tokens
        .windows(2)
        .position(|w| is_ident(&w[0], "fn") && is_ident(&w[1], name))
        .unwrap_or_else(|| panic!("no fn {name} in {}", file.display()));
    tokens[start..]
        .iter()
        .find_map(|t| group(t, Delimiter::Brace))
        .unwrap_or_else(|| panic!("fn {name} in {} has no body", file.display()))
}

/// The methods a route's handler answers.
fn methods_of(file: &Path, handler: &[TokenTree], path: &str) -> BTreeSet<String> {
    let direct = methods_called(handler);
    if !direct.is_empty() {
        return direct;
    }
    let called = called_path(handler)
        .unwrap_or_else(|| panic!("{path}: cannot tell the methods of {handler:?}"));
    let (name, module) = called.split_last().unwrap();
    let body = function_body(&module_file(file, module), name);
    let methods = methods_called(&body);
    assert!(!methods.is_empty(), "{path}: fn {name} names no method");
    methods
}

/// (listener, "METHOD /path") of every route the relay's source serves.
fn code_routes() -> BTreeSet<(String, String)> {
    let files = relay_files();
    // the routers other routers mount, by file, with their prefixes
    let mut prefixes: Vec<(PathBuf, String)> = Vec::new();
    for file in &files {
        for nest in calls(&super::tokens_of(file), "nest") {
            let called = called_path(&nest.rest).expect("a nested router is a call");
            let (_, module) = called.split_last().unwrap();
            prefixes.push((module_file(file, module), nest.path));
        }
    }
    let mut out = BTreeSet::new();
    for file in &files {
        let prefix = prefixes
            .iter()
            .find(|(f, _)| f == file)
            .map_or("", |(_, p)| p.as_str());
        let listener = if file.starts_with(Path::new(super::ROOT).join("relay/console")) {
            "console"
        } else {
            "relay"
        };
        for route in calls(&super::tokens_of(file), "route") {
            let path = format!("{prefix}{}", route.path).replace("{*", "{");
            for method in methods_of(file, &route.rest, &path) {
                out.insert((listener.to_string(), format!("{method} {path}")));
            }
        }
    }
    out
}

#[test]
fn every_route_is_in_the_reference_and_no_other() {
    let text = page(PAGE);
    let tables = super::tables(&text);
    rows_of(&tables, "request", PAGE);
    let mut documented = Vec::new();
    for table in tables
        .iter()
        .filter(|t| t.header.first().is_some_and(|h| h == "request"))
    {
        let listener = if table.heading.contains("`relay.metrics_addr`") {
            "relay"
        } else if table.heading.contains("`console.addr`") {
            "console"
        } else {
            panic!(
                "docs/reference/{PAGE}: the heading {:?} above a request table names neither \
                 `relay.metrics_addr` nor `console.addr`",
                table.heading
            );
        };
        for row in &table.rows {
            documented.push(format!("{listener} {}", row.name(PAGE)));
        }
    }
    let code = code_routes();
    for (listener, route) in [
        ("relay", "GET /v1/intents/{key}"),
        ("console", "POST /actions"),
        ("console", "GET /api/v1/actions/{job}"),
    ] {
        assert!(
            code.contains(&(listener.to_string(), route.to_string())),
            "the scan missed {listener} {route}: {code:?}"
        );
    }
    let code: BTreeSet<String> = code.into_iter().map(|(l, r)| format!("{l} {r}")).collect();
    same("routes", PAGE, &code, &documented);
}

//! docs/reference/metrics.md against the metrics the relay records.
//!
//! Page format: tables headed `| metric | type | labels | meaning |`, a
//! row per metric: `` `outbox_delivered_total` ``, its type (`counter`,
//! `gauge` or `histogram`), its label names each in backticks (none: `—`),
//! and one line of meaning.
//!
//! The code's side is every `counter!`, `gauge!` and `histogram!` in
//! relay/ (read as tokens, so also those inside other macros): the metric
//! name (its first argument), the macro as its type, and the label names
//! (each `"label" => value`) over all of its uses.

use std::collections::{BTreeMap, BTreeSet};

use proc_macro2::{Delimiter, TokenTree};

use super::{code_spans, group, is_punct, page, relay_files, rows_of, same, string_literal};

const PAGE: &str = "metrics.md";
const TYPES: [&str; 3] = ["counter", "gauge", "histogram"];

/// Name → (type, label names) of `tokens`' metric macros, into `out`.
fn metrics_in(tokens: &[TokenTree], out: &mut BTreeMap<String, (String, BTreeSet<String>)>) {
    super::each_sequence(tokens, &mut |seq| {
        for w in seq.windows(3) {
            let TokenTree::Ident(macro_name) = &w[0] else {
                continue;
            };
            let kind = macro_name.to_string();
            if !TYPES.contains(&kind.as_str()) || !is_punct(&w[1], '!') {
                continue;
            }
            let Some(args) = group(&w[2], Delimiter::Parenthesis) else {
                continue;
            };
            let Some(name) = args.first().and_then(string_literal) else {
                panic!("a {kind}! whose first argument is not a string literal: {args:?}");
            };
            let entry = out
                .entry(name.clone())
                .or_insert_with(|| (kind.clone(), BTreeSet::new()));
            assert_eq!(
                entry.0, kind,
                "{name} is recorded as a {} and a {kind}",
                entry.0
            );
            for l in args.windows(3) {
                if is_punct(&l[1], '=') && is_punct(&l[2], '>') {
                    if let Some(label) = string_literal(&l[0]) {
                        entry.1.insert(label);
                    }
                }
            }
        }
    });
}

fn code_metrics() -> BTreeMap<String, (String, BTreeSet<String>)> {
    let mut out = BTreeMap::new();
    for file in relay_files() {
        metrics_in(&super::tokens_of(&file), &mut out);
    }
    out
}

#[test]
fn every_metric_is_in_the_reference_with_its_type_and_labels_and_no_other() {
    let text = page(PAGE);
    let tables = super::tables(&text);
    let rows = rows_of(&tables, "metric", PAGE);
    let documented: Vec<String> = rows.iter().map(|r| r.name(PAGE)).collect();
    let code = code_metrics();
    for (name, kind) in [
        ("outbox_delivered_total", "counter"),
        ("outbox_destination_state", "gauge"),
        ("outbox_schedule_standing_aside", "gauge"),
        ("outbox_claim_batch_size", "histogram"),
    ] {
        assert_eq!(
            code.get(name).map(|m| m.0.as_str()),
            Some(kind),
            "the scan missed {name}"
        );
    }
    same(
        "metrics",
        PAGE,
        &code.keys().cloned().collect(),
        &documented,
    );
    let mut wrong = Vec::new();
    for row in rows {
        let name = row.name(PAGE);
        let (kind, labels) = &code[&name];
        let cell = |i: usize| row.cells.get(i).map_or("", String::as_str);
        if cell(1) != kind {
            wrong.push(format!("{name} is a {kind}, the page says {:?}", cell(1)));
        }
        let documented: BTreeSet<String> =
            code_spans(cell(2)).into_iter().map(String::from).collect();
        if &documented != labels {
            wrong.push(format!(
                "{name} has the labels {labels:?}, the page says {documented:?}"
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "docs/reference/{PAGE}:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_metric_scan_reads_names_types_and_labels() {
    let src = r#"fn f() { tokio::select! { _ = a => { metrics::counter!("x_total", "kind" => k, "why" => "w").increment(1); } }
                 metrics::gauge!("y").set(1.0); counter!("x_total", "kind" => k); }"#;
    let tokens: Vec<TokenTree> = src
        .parse::<proc_macro2::TokenStream>()
        .unwrap()
        .into_iter()
        .collect();
    let mut out = BTreeMap::new();
    metrics_in(&tokens, &mut out);
    assert_eq!(out["x_total"].0, "counter");
    assert_eq!(
        out["x_total"].1,
        ["kind".to_string(), "why".to_string()].into()
    );
    assert_eq!(out["y"], ("gauge".to_string(), BTreeSet::new()));
}

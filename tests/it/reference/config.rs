//! docs/reference/config.md against the configuration.
//!
//! Page format:
//! - tables headed `| key | default | environment | meaning |`, a row per
//!   key: `` `section.key` `` (`` `database_url` `` at the top level); an
//!   entry of a table whose keys you choose is written with a placeholder
//!   in angle brackets (`` `limits.<destination>` ``,
//!   `` `breaker.overrides.<destination>.failures` ``), a field of an array
//!   of tables with `[]` (`` `console.users[].name` ``). Where
//!   deploy/config.example.toml sets a key, the default cell's first code
//!   span is that value in TOML (`` `"60s"` ``, `` `64` ``). The
//!   environment cell of a plain key names its `OUTBOX_RELAY__...`
//!   variable.
//! - tables headed `| variable | sets | meaning |`, a row per environment
//!   variable the relay reads by name (`` `STRIPE_API_KEY` ``); a row whose
//!   name holds `<` is a pattern (`OUTBOX_RELAY__<SECTION>__<KEY>`) and is
//!   not compared.
//!
//! The code's keys come from the configuration's deserializer: a probe key
//! set through the environment under a path makes it name the fields it
//! knows there ("unknown field `zzprobe`, expected one of ..."), or say
//! that the path holds a value (a leaf) or a table of names you choose (a
//! map); arrays of tables are probed with `[{zzprobe = 1}]`. The variables
//! are the string literals of relay/ shaped like one (`A_B`), but the
//! compiler's `CARGO_*`, plus `RUST_LOG` where the log filter is read from
//! the environment (`EnvFilter::from_default_env`).

use std::collections::BTreeSet;

use outbox_relay::config::Config;

use super::{page, relay_files, rows_of, same, string_literal, tables, tokens_of};

const PAGE: &str = "config.md";
const PROBE: &str = "zzprobe";

/// What the deserializer says a path holds.
#[derive(Debug, PartialEq)]
enum Shape {
    /// A table with these fields.
    Fields(Vec<String>),
    /// A table whose keys the user chooses.
    Map,
    /// A value (a scalar, a list of scalars, anything a field takes whole).
    Leaf,
}

/// The error `Config::load` gives for these variables, as one line.
fn load_error(vars: Vec<(String, String)>) -> String {
    match Config::load(None, vars.clone()) {
        Ok(_) => format!("accepted {vars:?}"),
        Err(e) => format!("{e:#}"),
    }
}

fn variable(path: &[String]) -> String {
    std::iter::once("OUTBOX_RELAY")
        .chain(path.iter().map(String::as_str))
        .collect::<Vec<_>>()
        .join("__")
        .to_uppercase()
}

/// The fields an "unknown field `zzprobe`" error names, if it is one.
fn fields_named(err: &str) -> Option<Vec<String>> {
    let (_, after) = err.split_once(&format!("unknown field `{PROBE}`"))?;
    let (_, expected) = after.split_once("expected")?;
    let expected = expected.split(['\n']).next().unwrap_or("");
    Some(
        super::code_spans(expected)
            .into_iter()
            .map(String::from)
            .collect(),
    )
}

/// The key a deserialization error is about: "invalid configuration:
/// KEY: message".
fn error_key(err: &str) -> Option<&str> {
    let (_, rest) = err.split_once("invalid configuration: ")?;
    rest.split_once(": ").map(|(k, _)| k)
}

fn shape(path: &[String]) -> Shape {
    let mut probe = path.to_vec();
    probe.push(PROBE.into());
    let err = load_error(vec![(variable(&probe), "1".into())]);
    if let Some(fields) = fields_named(&err) {
        return Shape::Fields(fields);
    }
    let here = path.join(".");
    match error_key(&err) {
        Some(k) if k == here => Shape::Leaf,
        Some(k) if k.starts_with(&format!("{here}.")) => Shape::Map,
        _ => panic!("probing {here}: an unexpected answer: {err}"),
    }
}

/// The fields of the tables in the array at `path`, when it holds tables.
fn array_fields(path: &[String]) -> Option<Vec<String>> {
    let err = load_error(vec![(variable(path), format!("[{{{PROBE} = 1}}]"))]);
    fields_named(&err)
}

/// Every key under `path` (segments; `*` for a name you choose, `x[]` for
/// an array of tables `x`), into `out`.
fn keys_under(path: &mut Vec<String>, shown: &mut Vec<String>, out: &mut BTreeSet<String>) {
    match shape(path) {
        Shape::Fields(fields) => {
            assert!(!fields.is_empty(), "no fields at {path:?}");
            for f in fields {
                path.push(f.clone());
                shown.push(f);
                keys_under(path, shown, out);
                path.pop();
                shown.pop();
            }
        }
        Shape::Map => {
            // the probe's name stands for any name
            path.push("x".into());
            shown.push("*".into());
            keys_under(path, shown, out);
            path.pop();
            shown.pop();
        }
        Shape::Leaf => match array_fields(path) {
            Some(fields) => {
                let last = shown.pop().unwrap();
                for f in fields {
                    out.insert(format!("{}.{f}", dotted(shown, &format!("{last}[]"))));
                }
                shown.push(last);
            }
            None => {
                out.insert(shown.join("."));
            }
        },
    }
}

fn dotted(prefix: &[String], last: &str) -> String {
    prefix
        .iter()
        .map(String::as_str)
        .chain([last])
        .collect::<Vec<_>>()
        .join(".")
}

/// Every configuration key, as the page writes it with `<...>` read as `*`.
fn code_keys() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    keys_under(&mut Vec::new(), &mut Vec::new(), &mut out);
    out
}

/// A page key with each `<placeholder>` segment as `*`.
fn normalised(key: &str) -> String {
    key.split('.')
        .map(|s| {
            if s.starts_with('<') && s.ends_with('>') {
                "*"
            } else {
                s
            }
        })
        .collect::<Vec<_>>()
        .join(".")
}

/// The environment variables the relay reads by name.
fn code_variables() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut filter_from_env = false;
    for file in relay_files() {
        if std::fs::read_to_string(&file)
            .unwrap()
            .contains("from_default_env")
        {
            filter_from_env = true;
        }
        super::each_sequence(&tokens_of(&file), &mut |seq| {
            for t in seq {
                let Some(s) = string_literal(t) else { continue };
                let shaped = s.contains('_')
                    && s.starts_with(|c: char| c.is_ascii_uppercase())
                    && s.chars()
                        .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
                // OUTBOX_RELAY__<SECTION>__<KEY> is the pattern the page
                // writes once; CARGO_* are read by the compiler
                if shaped && !s.starts_with("OUTBOX_RELAY__") && !s.starts_with("CARGO_") {
                    out.insert(s);
                }
            }
        });
    }
    if filter_from_env {
        out.insert(tracing_subscriber::EnvFilter::DEFAULT_ENV.to_string());
    }
    out
}

/// A TOML value as the page writes it in a default cell.
fn toml_value(text: &str) -> Option<toml::Value> {
    toml::from_str::<toml::Table>(&format!("v = {text}"))
        .ok()?
        .remove("v")
}

#[test]
fn every_configuration_key_is_in_the_reference_and_no_other() {
    let text = page(PAGE);
    let tables = tables(&text);
    let rows = rows_of(&tables, "key", PAGE);
    let documented: Vec<String> = rows.iter().map(|r| normalised(&r.name(PAGE))).collect();
    let code = code_keys();
    // the probe reads what it should
    for key in [
        "database_url",
        "relay.concurrency",
        "retry.webhook.schedule",
        "webhook.endpoints.*",
        "limits.*",
        "breaker.overrides.*.cooldown",
        "console.users[].password_hash",
        "schedule[].catch_up",
    ] {
        assert!(code.contains(key), "the probe missed {key}: {code:?}");
    }
    same("configuration keys", PAGE, &code, &documented);

    // defaults: the example's values, which are the defaults (the config
    // tests hold the example to them); environment: the key's variable
    let example: toml::Table = toml::from_str(
        &std::fs::read_to_string(format!("{}/deploy/config.example.toml", super::ROOT)).unwrap(),
    )
    .unwrap();
    let mut wrong = Vec::new();
    for row in &rows {
        let key = row.name(PAGE);
        if key.contains(['<', '[']) {
            continue;
        }
        let segments: Vec<String> = key.split('.').map(String::from).collect();
        let mut node = Some(&example);
        let mut value = None;
        for (i, s) in segments.iter().enumerate() {
            let Some(t) = node else { break };
            match t.get(s) {
                Some(toml::Value::Table(inner)) if i + 1 < segments.len() => node = Some(inner),
                Some(v) if i + 1 == segments.len() => value = Some(v),
                _ => node = None,
            }
        }
        if let Some(value) = value {
            let cell = row.code(1).and_then(toml_value);
            if cell.as_ref() != Some(value) {
                wrong.push(format!(
                    "line {}: {key}'s default is {value} in deploy/config.example.toml, the page says {:?}",
                    row.line,
                    row.cells.get(1)
                ));
            }
        }
        let var = variable(&segments);
        if !super::code_spans(row.cells.get(2).map_or("", String::as_str)).contains(&var.as_str()) {
            wrong.push(format!(
                "line {}: {key}'s environment cell does not name `{var}`",
                row.line
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
fn every_environment_variable_the_relay_reads_is_in_the_reference_and_no_other() {
    let text = page(PAGE);
    let tables = tables(&text);
    let documented: Vec<String> = rows_of(&tables, "variable", PAGE)
        .iter()
        .map(|r| r.name(PAGE))
        .filter(|n| !n.contains('<'))
        .collect();
    let code = code_variables();
    for v in [
        "DATABASE_URL",
        "STRIPE_API_KEY",
        "OUTBOX_RELAY_LOOKUP_TOKEN",
        "RUST_LOG",
    ] {
        assert!(code.contains(v), "the scan missed {v}: {code:?}");
    }
    same("environment variables", PAGE, &code, &documented);
}

#[test]
fn the_key_probe_tells_fields_maps_and_leaves_apart() {
    let s = |p: &[&str]| shape(&p.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    assert!(matches!(s(&[]), Shape::Fields(f) if f.contains(&"relay".to_string())));
    assert_eq!(s(&["relay", "lease"]), Shape::Leaf);
    assert_eq!(s(&["limits"]), Shape::Map);
    assert_eq!(s(&["webhook", "endpoints", "x"]), Shape::Leaf);
    assert_eq!(array_fields(&["retry".into(), "schedule".into()]), None);
    assert!(array_fields(&["schedule".into()]).is_some_and(|f| f.contains(&"cron".to_string())));
    assert_eq!(
        normalised("breaker.overrides.<destination>.failures"),
        "breaker.overrides.*.failures"
    );
}

//! docs/reference/cli.md against the `outbox-relay` command.
//!
//! Page format: tables headed `| usage | ... |`, a row per command, option
//! and positional argument. The first cell's code span is a command line
//! without `outbox-relay`: the command's words, then the item, e.g.
//! `` `destinations pause` `` (a command), `` `retry --state <STATE>` `` (an
//! option of `retry`; what follows the option is its value and is not
//! compared), `` `show <REFERENCE>` `` (a positional argument, by its value
//! name), `` `--config <FILE>` `` (a global option: no command words).
//!
//! The code's side is the clap command tree (`Cli::command()`): every
//! subcommand, and every argument of each but the `--help` and `--version`
//! that clap adds itself.

use std::collections::BTreeSet;

use clap::CommandFactory;
use outbox_relay::cli::Cli;

use super::{page, rows_of, same, tables};

const PAGE: &str = "cli.md";

/// How the page names an argument: `--long`, `-s`, or `<VALUE_NAME>`.
fn item(arg: &clap::Arg) -> String {
    if arg.is_positional() {
        let name = arg
            .get_value_names()
            .and_then(|n| n.first())
            .map(|n| n.to_string())
            .unwrap_or_else(|| arg.get_id().as_str().to_uppercase());
        format!("<{name}>")
    } else if let Some(long) = arg.get_long() {
        format!("--{long}")
    } else {
        format!(
            "-{}",
            arg.get_short().expect("an option has a long or short name")
        )
    }
}

fn walk(cmd: &clap::Command, words: &mut Vec<String>, out: &mut BTreeSet<String>) {
    for arg in cmd.get_arguments() {
        if arg.is_hide_set() || ["help", "version"].contains(&arg.get_id().as_str()) {
            continue;
        }
        let mut line = words.clone();
        line.push(item(arg));
        out.insert(line.join(" "));
    }
    for sub in cmd.get_subcommands() {
        if sub.is_hide_set() || sub.get_name() == "help" {
            continue;
        }
        words.push(sub.get_name().to_string());
        out.insert(words.join(" "));
        walk(sub, words, out);
        words.pop();
    }
}

/// Every command, option and positional argument, as the page names them.
fn code_items() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    walk(&Cli::command(), &mut Vec::new(), &mut out);
    out
}

/// The item a page's command line names: its command words and its first
/// option or positional argument (without the option's value).
fn documented_item(line: &str) -> String {
    let mut out = Vec::new();
    for word in line.split_whitespace() {
        if word.starts_with('-') {
            out.push(word.split('=').next().unwrap().to_string());
            break;
        }
        if word.starts_with('<') {
            let end = word.find('>').map_or(word.len(), |i| i + 1);
            out.push(word[..end].to_string());
            break;
        }
        out.push(word.to_string());
    }
    out.join(" ")
}

#[test]
fn every_command_and_option_is_in_the_reference_and_no_other() {
    let text = page(PAGE);
    let tables = tables(&text);
    let documented: Vec<String> = rows_of(&tables, "usage", PAGE)
        .iter()
        .map(|r| documented_item(&r.name(PAGE)))
        .collect();
    let code = code_items();
    for item in [
        "--database-url",
        "run --once",
        "destinations pause <DESTINATION>",
        "resolve --ref",
    ] {
        assert!(code.contains(item), "the walk missed {item}: {code:?}");
    }
    same("commands and options", PAGE, &code, &documented);
}

#[test]
fn a_command_line_names_its_item() {
    assert_eq!(documented_item("retry --state <STATE>"), "retry --state");
    assert_eq!(documented_item("--log-format=json"), "--log-format");
    assert_eq!(
        documented_item("retry <REFERENCES>..."),
        "retry <REFERENCES>"
    );
    assert_eq!(documented_item("destinations pause"), "destinations pause");
}

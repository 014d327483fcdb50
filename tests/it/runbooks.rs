//! The alert rules (deploy/prometheus/alerts.yml) and their runbooks in the
//! book (docs/operating/alerts.md) are one for one: each rule's
//! `runbook_url` names its own section, every section is a rule's, and the
//! production page's what-to-page-on table lists every rule.

use std::collections::BTreeSet;
use std::path::Path;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn read(path: &str) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Each rule's name and its `runbook_url`, in file order.
fn rules(yaml: &str) -> Vec<(String, Option<String>)> {
    let mut rules: Vec<(String, Option<String>)> = Vec::new();
    for line in yaml.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix("- alert:") {
            rules.push((name.trim().to_string(), None));
        } else if let Some(url) = line.strip_prefix("runbook_url:") {
            let rule = rules.last_mut().expect("a runbook_url outside a rule");
            assert!(rule.1.is_none(), "{}: two runbook_url", rule.0);
            rule.1 = Some(url.trim().trim_matches('"').to_string());
        }
    }
    rules
}

#[test]
fn every_alert_links_its_runbook_in_the_book_and_every_runbook_is_an_alerts() {
    let rules = rules(&read("deploy/prometheus/alerts.yml"));
    assert!(rules.len() >= 10, "alerts.yml holds {} rules", rules.len());
    for (name, url) in &rules {
        assert_eq!(
            url.as_deref(),
            Some(format!("operating/alerts.html#{}", name.to_lowercase()).as_str()),
            "{name}: its runbook_url"
        );
    }
    let names: BTreeSet<&str> = rules.iter().map(|(n, _)| n.as_str()).collect();
    let runbooks = read("docs/operating/alerts.md");
    let sections: BTreeSet<&str> = runbooks
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .map(str::trim)
        .collect();
    assert_eq!(
        sections, names,
        "the sections of docs/operating/alerts.md and the rules of alerts.yml"
    );
    let production = read("docs/operating/production.md");
    for name in &names {
        assert!(
            production.contains(&format!("| [{name}](alerts.md#{})", name.to_lowercase())),
            "docs/operating/production.md: the what-to-page-on table has no row for {name}"
        );
    }
}

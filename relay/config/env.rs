//! Environment overrides (`OUTBOX_RELAY__<SECTION>__<KEY>`) and secrets
//! read from files (`..._FILE`).

use anyhow::{bail, Context};

/// The variable that may hold `relay.lookup_token`, like `STRIPE_API_KEY`
/// for `charge.api_key`.
pub const LOOKUP_TOKEN_VAR: &str = "OUTBOX_RELAY_LOOKUP_TOKEN";

/// Secrets with a variable of their own, taken as they are (never as TOML).
const PLAIN_SECRET_VARS: &[&str] = &["STRIPE_API_KEY", LOOKUP_TOKEN_VAR];

/// Replace every `OUTBOX_RELAY__…_FILE`, `STRIPE_API_KEY_FILE` and
/// `OUTBOX_RELAY_LOOKUP_TOKEN_FILE` variable
/// by the variable without the suffix, holding the file's contents (a
/// trailing newline dropped): how container platforms hand out secrets.
/// The value is always a string, except for a list key (`signing_secrets`),
/// where each non-empty line is one item. Errors name the file, never its
/// contents.
pub fn read_secret_files(env: Vec<(String, String)>) -> anyhow::Result<Vec<(String, String)>> {
    let mut out = Vec::with_capacity(env.len());
    for (name, value) in &env {
        let Some(base) = name.strip_suffix("_FILE") else {
            out.push((name.clone(), value.clone()));
            continue;
        };
        if !(base.starts_with("OUTBOX_RELAY__") || PLAIN_SECRET_VARS.contains(&base)) {
            out.push((name.clone(), value.clone()));
            continue;
        }
        if env.iter().any(|(k, _)| k == base) {
            bail!("both {base} and {name} are set; set one");
        }
        let contents = read_secret_file(name, value)?;
        let toml_value = if base.to_ascii_lowercase().ends_with("__signing_secrets") {
            toml::Value::Array(
                contents
                    .lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .map(|l| toml::Value::String(l.to_string()))
                    .collect(),
            )
        } else {
            toml::Value::String(contents)
        };
        // STRIPE_API_KEY, the lookup token and secret keys are taken as they are (see
        // `apply_env`); anything else is read as TOML, so quote it
        let last = base
            .rsplit("__")
            .next()
            .unwrap_or(base)
            .to_ascii_lowercase();
        let raw = match toml_value.as_str() {
            Some(text) if PLAIN_SECRET_VARS.contains(&base) || is_secret_key(&last) => {
                text.to_string()
            }
            _ => toml_value.to_string(),
        };
        out.push((base.to_string(), raw));
    }
    Ok(out)
}

/// The contents of the file a `*_FILE` variable names, without the trailing
/// newline. An empty file is an error.
pub fn read_secret_file(var: &str, path: &str) -> anyhow::Result<String> {
    let contents =
        std::fs::read_to_string(path).with_context(|| format!("{var}: cannot read {path}"))?;
    let contents = contents.trim_end_matches(['\n', '\r']).to_string();
    if contents.trim().is_empty() {
        bail!("{var}: {path} is empty");
    }
    Ok(contents)
}

/// Keys whose environment values are taken as they are, never read as TOML.
fn is_secret_key(key: &str) -> bool {
    matches!(
        key,
        "password" | "api_key" | "database_url" | "lookup_token" | "secret_key"
    )
}

/// Which environment variable set which key (`relay.concurrency` ←
/// `OUTBOX_RELAY__RELAY__CONCURRENCY`), so that an error about a key the
/// environment set names the variable rather than the config file.
pub(super) struct EnvSources(Vec<(String, String)>);

impl EnvSources {
    /// From the variables as given and as read (`…_FILE` replaced by the
    /// variable without the suffix).
    pub(super) fn new(given: &[(String, String)], read: &[(String, String)]) -> Self {
        let mut sources = EnvSources(Vec::new());
        for (name, _) in read {
            if let Some(path) = name.strip_prefix("OUTBOX_RELAY__") {
                let key = path.split("__").collect::<Vec<_>>().join(".");
                sources.add(&key.to_ascii_lowercase(), name, given);
            }
        }
        sources
    }

    /// `key` was set by `name` (or by `name_FILE`, when that is what was given).
    pub(super) fn add(&mut self, key: &str, name: &str, given: &[(String, String)]) {
        let var = if given.iter().any(|(k, _)| k == name) {
            name.to_string()
        } else {
            format!("{name}_FILE")
        };
        self.0.push((key.to_string(), var));
    }

    /// The variable that set `key` or a section holding it (`retry.schedule`
    /// for `retry.schedule[0]`), the most specific one.
    pub(super) fn setting(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .filter(|(k, _)| {
                key.strip_prefix(k.as_str())
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
            })
            .max_by_key(|(k, _)| k.len())
            .map(|(_, v)| v.as_str())
    }

    /// The variables whose keys `message` names, as whole keys.
    pub(super) fn named_in(&self, message: &str) -> Vec<&str> {
        let part = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '.';
        let mut vars: Vec<&str> = self
            .0
            .iter()
            .filter(|(key, _)| {
                message.match_indices(key.as_str()).any(|(at, _)| {
                    let before = message[..at].chars().next_back();
                    let after = message[at + key.len()..].chars().next();
                    !before.is_some_and(part) && !after.is_some_and(|c| part(c) && c != '.')
                })
            })
            .map(|(_, v)| v.as_str())
            .collect();
        vars.dedup();
        vars
    }
}

/// Merge `OUTBOX_RELAY__A__B=value` into the table at `a.b`.
pub(super) fn apply_env(
    table: &mut toml::Table,
    env: impl IntoIterator<Item = (String, String)>,
) -> anyhow::Result<()> {
    for (name, raw) in env {
        let Some(path) = name.strip_prefix("OUTBOX_RELAY__") else {
            continue;
        };
        let keys: Vec<String> = path.split("__").map(|k| k.to_ascii_lowercase()).collect();
        if keys.iter().any(|k| k.is_empty()) {
            bail!("environment variable {name} has an empty key segment");
        }
        // A secret is taken as it is: read as TOML, a password like 12345
        // would become a number, and the type error would quote it.
        let value = if keys.last().is_some_and(|k| is_secret_key(k)) {
            toml::Value::String(raw.clone())
        } else {
            toml::from_str::<toml::Table>(&format!("v = {raw}"))
                .ok()
                .and_then(|mut t| t.remove("v"))
                .unwrap_or_else(|| toml::Value::String(raw.clone()))
        };
        let (last, parents) = keys.split_last().expect("non-empty");
        let mut node = &mut *table;
        for k in parents {
            let entry = node
                .entry(k.clone())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            node = entry
                .as_table_mut()
                .ok_or_else(|| anyhow::anyhow!("{name}: {k} is not a section"))?;
        }
        node.insert(last.clone(), value);
    }
    Ok(())
}

//! Logging: human-readable by default, JSON with `--log-format json`.
//! Level from `RUST_LOG` (default `info`). Payload bodies and secrets are
//! never logged: spans carry the intent id, key, kind and attempt only.
//! Colour only when stderr is a terminal and `NO_COLOR` is unset or empty
//! (<https://no-color.org>), so a log file or pipe gets plain text.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Default)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

pub fn init(format: LogFormat) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn"));
    let colour = use_colour(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// Colour codes belong on a terminal only, and never when `NO_COLOR` is set
/// to anything but the empty string.
fn use_colour(stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::use_colour;
    use std::ffi::OsStr;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        for (terminal, no_color, want) in [
            (true, None, true),
            (true, Some(""), true),
            (true, Some("1"), false),
            (true, Some("0"), false),
            (false, None, false),
            (false, Some(""), false),
            (false, Some("1"), false),
        ] {
            assert_eq!(
                use_colour(terminal, no_color.map(OsStr::new)),
                want,
                "terminal {terminal}, NO_COLOR {no_color:?}"
            );
        }
    }
}

//! The configuration reference: a Markdown table of every flag of `spur-operator run`,
//! generated from the clap definitions themselves, so docs/operating.md cannot drift from
//! the binary (a test compares them).

use clap::Command;

/// Where the table sits in docs/operating.md (the names are older than the move).
pub const README_BEGIN: &str = "<!-- config-table:begin (spur-operator config-table) -->";
pub const README_END: &str = "<!-- config-table:end -->";

/// One row a flag of `command` (built, so global flags are included): flag, environment
/// variable, default, and the help text that carries the default's reason.
pub fn config_table(command: &Command) -> String {
    let mut out = String::from(
        "| flag | environment | default | what, and why the default |\n|---|---|---|---|\n",
    );
    for arg in command.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if matches!(long, "help" | "version") || arg.is_hide_set() {
            continue;
        }
        // Upstream's names for the same flag, shown beside ours so its users find theirs.
        let aliases: String = arg
            .get_visible_aliases()
            .unwrap_or_default()
            .iter()
            .map(|a| format!(" (`--{a}`)"))
            .collect();
        let env = arg
            .get_env()
            .map(|e| format!("`{}`", e.to_string_lossy()))
            .unwrap_or_default();
        let defaults: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|v| v.to_string_lossy().into_owned())
            .collect();
        let default = if defaults.is_empty() {
            "(unset)".to_owned()
        } else {
            format!("`{}`", defaults.join(","))
        };
        let help = arg
            .get_long_help()
            .or_else(|| arg.get_help())
            .map(|h| h.to_string())
            .unwrap_or_default();
        let help = help
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .replace('|', "\\|");
        out.push_str(&format!(
            "| `--{long}`{aliases} | {env} | {default} | {help} |\n"
        ));
    }
    out
}

/// `readme` (the text of docs/operating.md) with the text between the markers replaced by
/// `table`; `None` when the markers are missing.
pub fn splice(readme: &str, table: &str) -> Option<String> {
    let begin = readme.find(README_BEGIN)? + README_BEGIN.len();
    let end = readme[begin..].find(README_END)? + begin;
    Some(format!("{}\n{}{}", &readme[..begin], table, &readme[end..]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Arg, ArgAction};

    #[test]
    fn a_row_names_flag_environment_default_and_reason() {
        let command = Command::new("x")
            .arg(
                Arg::new("retry")
                    .long("retry")
                    .env("X_RETRY")
                    .default_value("1s")
                    .help("Retry after this long | at most.\nBecause reasons."),
            )
            .arg(Arg::new("token").long("token").action(ArgAction::Set))
            .arg(
                Arg::new("listen")
                    .long("agent-listen")
                    .visible_alias("listen"),
            )
            .arg(Arg::new("quota").long("enable-quota").hide(true));
        let table = config_table(&command);
        assert!(
            table.contains("| `--retry` | `X_RETRY` | `1s` | Retry after this long \\| at most. Because reasons. |"),
            "{table}"
        );
        assert!(table.contains("| `--token` |  | (unset) |  |"), "{table}");
        assert!(
            table.contains("| `--agent-listen` (`--listen`) |"),
            "{table}"
        );
        assert!(!table.contains("enable-quota"), "{table}");
        assert!(!table.contains("--help"));
    }

    #[test]
    fn splice_replaces_only_between_the_markers() {
        let readme = format!("intro\n{README_BEGIN}\nold\n{README_END}\noutro\n");
        let spliced = splice(&readme, "new\n").unwrap();
        assert_eq!(
            spliced,
            format!("intro\n{README_BEGIN}\nnew\n{README_END}\noutro\n")
        );
        assert_eq!(splice("no markers", "t"), None);
    }
}

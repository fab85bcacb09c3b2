//! Logging set-up: `tracing` with fields, as text or JSON.

use clap::ValueEnum;
use tracing_subscriber::EnvFilter;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object a line, for log collectors.
    Json,
}

/// Installs the global subscriber. The filter comes from `RUST_LOG`, else `level` (the
/// `--log-level` flag), else `default_level`; a `level` that does not parse is an error.
pub fn init(
    format: LogFormat,
    level: Option<&str>,
    default_level: &str,
) -> Result<(), tracing_subscriber::filter::ParseError> {
    let filter = match (EnvFilter::try_from_default_env(), level) {
        (Ok(filter), _) => filter,
        (Err(_), Some(level)) => EnvFilter::try_new(level)?,
        (Err(_), None) => EnvFilter::new(default_level),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    Ok(())
}

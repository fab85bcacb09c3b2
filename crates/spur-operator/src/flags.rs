//! What every module's flags share: durations that may be switched off, ranges, the
//! duration parser, reading a file a flag names, and the error that names a bad flag.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

/// A duration that may be switched off: `10s`, `1m30s`, `500ms`, or `off`.
///
/// Used for the channel's bounds, so the simulation's `unbounded` profile (the operator as
/// it was before the seed's fix) is a configuration, not a code path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bound(pub Option<Duration>);

impl Bound {
    pub const OFF: Bound = Bound(None);

    pub const fn of(duration: Duration) -> Bound {
        Bound(Some(duration))
    }
}

impl FromStr for Bound {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if matches!(s, "off" | "none") {
            return Ok(Bound::OFF);
        }
        let duration = parse_duration(s)?;
        if duration.is_zero() {
            return Err("a bound of zero would fail every call; use `off` to disable it".into());
        }
        Ok(Bound::of(duration))
    }
}

impl fmt::Display for Bound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(d) => write!(f, "{}", humantime::format_duration(d)),
            None => f.write_str("off"),
        }
    }
}

/// A range of durations (`250ms..1s`), or `off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryRange(pub Option<(Duration, Duration)>);

pub(crate) fn parse_range(s: &str) -> Result<RetryRange, String> {
    if matches!(s.trim(), "off" | "none") {
        return Ok(RetryRange(None));
    }
    let (low, high) = s
        .split_once("..")
        .ok_or_else(|| format!("`{s}` is not a range such as 250ms..1s, or off"))?;
    let (low, high) = (parse_duration(low)?, parse_duration(high)?);
    if low.is_zero() || low > high {
        return Err(format!(
            "`{s}`: the low end must be above zero and at most the high end"
        ));
    }
    Ok(RetryRange(Some((low, high))))
}

/// Parses a human-readable duration (`10s`, `1m 30s`, `250ms`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("`{s}` is not a duration such as 10s, 500ms or 1m30s ({e})"))
}

/// A bad flag value, named.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{flag}: cannot read {path}: {source}")]
    ReadFile {
        flag: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{flag}: {reason}")]
    Invalid { flag: &'static str, reason: String },
}

pub(crate) fn read_file(flag: &'static str, path: &Path) -> Result<Vec<u8>, ConfigError> {
    std::fs::read(path).map_err(|source| ConfigError::ReadFile {
        flag,
        path: path.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transient_retry_range_parses() {
        assert_eq!(
            parse_range("250ms..1s"),
            Ok(RetryRange(Some((
                Duration::from_millis(250),
                Duration::from_secs(1)
            ))))
        );
        assert_eq!(parse_range("off"), Ok(RetryRange(None)));
        assert!(parse_range("2s..1s").is_err() && parse_range("1s").is_err());
    }
}

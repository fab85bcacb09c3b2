//! Kubernetes label selectors in their string form (`a=b,c!=d,e in (f,g),!h`).
//!
//! kube-rs passes selectors to the API server as opaque strings, so a typo in
//! `--node-selector` would surface only as an API error on every watch retry. Parsing
//! it here turns that into a one-line start-up error.

use std::collections::BTreeMap;
use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

/// A parsed selector: every requirement must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selector(pub Vec<Requirement>);

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{input}` is not a label selector: {reason}")]
pub struct SelectorError {
    pub input: String,
    pub reason: String,
}

impl Selector {
    pub fn parse(input: &str) -> Result<Selector, SelectorError> {
        let fail = |reason: String| SelectorError {
            input: input.to_owned(),
            reason,
        };
        let mut requirements = Vec::new();
        for part in split_top_level(input).map_err(fail)? {
            let part = part.trim();
            if part.is_empty() {
                if input.trim().is_empty() {
                    continue;
                }
                return Err(fail("an empty requirement (two commas in a row?)".into()));
            }
            requirements.push(parse_requirement(part).map_err(fail)?);
        }
        Ok(Selector(requirements))
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| match r {
            Requirement::Equals(k, v) => labels.get(k) == Some(v),
            Requirement::NotEquals(k, v) => labels.get(k) != Some(v),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::DoesNotExist(k) => !labels.contains_key(k),
        })
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .0
            .iter()
            .map(|r| match r {
                Requirement::Equals(k, v) => format!("{k}={v}"),
                Requirement::NotEquals(k, v) => format!("{k}!={v}"),
                Requirement::In(k, vs) => format!("{k} in ({})", vs.join(",")),
                Requirement::NotIn(k, vs) => format!("{k} notin ({})", vs.join(",")),
                Requirement::Exists(k) => k.clone(),
                Requirement::DoesNotExist(k) => format!("!{k}"),
            })
            .collect();
        f.write_str(&parts.join(","))
    }
}

/// Splits on commas outside parentheses.
fn split_top_level(input: &str) -> Result<Vec<&str>, String> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in input.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.checked_sub(1).ok_or("a `)` without its `(`")?,
            ',' if depth == 0 => {
                parts.push(&input[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("a `(` without its `)`".into());
    }
    parts.push(&input[start..]);
    Ok(parts)
}

fn parse_requirement(part: &str) -> Result<Requirement, String> {
    if let Some(key) = part.strip_prefix('!') {
        return Ok(Requirement::DoesNotExist(key_of(key.trim())?));
    }
    for (op, make) in [
        (
            "!=",
            Requirement::NotEquals as fn(String, String) -> Requirement,
        ),
        ("==", Requirement::Equals),
        ("=", Requirement::Equals),
    ] {
        if let Some((key, value)) = part.split_once(op) {
            return Ok(make(key_of(key.trim())?, value_of(value.trim())?));
        }
    }
    let words: Vec<&str> = part.splitn(2, char::is_whitespace).collect();
    if let [key, rest] = words.as_slice() {
        let rest = rest.trim();
        let (negated, list) = if let Some(list) = rest.strip_prefix("notin") {
            (true, list)
        } else if let Some(list) = rest.strip_prefix("in") {
            (false, list)
        } else {
            return Err(format!("`{part}`: expected =, ==, !=, in or notin"));
        };
        let list = list
            .trim()
            .strip_prefix('(')
            .and_then(|l| l.strip_suffix(')'))
            .ok_or_else(|| format!("`{part}`: the values go in parentheses"))?;
        let values = list
            .split(',')
            .map(|v| value_of(v.trim()))
            .collect::<Result<Vec<_>, _>>()?;
        let key = key_of(key)?;
        return Ok(if negated {
            Requirement::NotIn(key, values)
        } else {
            Requirement::In(key, values)
        });
    }
    Ok(Requirement::Exists(key_of(part)?))
}

fn key_of(key: &str) -> Result<String, String> {
    let name = match key.split_once('/') {
        Some((prefix, name)) => {
            if prefix.is_empty()
                || prefix.len() > 253
                || !prefix
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
            {
                return Err(format!("`{key}`: `{prefix}` is not a DNS prefix"));
            }
            name
        }
        None => key,
    };
    if name.is_empty() || name.len() > 63 || !name.chars().all(label_char) {
        return Err(format!(
            "`{key}` is not a label key (up to 63 letters, digits, `-`, `_`, `.`)"
        ));
    }
    Ok(key.to_owned())
}

fn value_of(value: &str) -> Result<String, String> {
    if value.len() > 63 || !value.chars().all(label_char) {
        return Err(format!(
            "`{value}` is not a label value (up to 63 letters, digits, `-`, `_`, `.`)"
        ));
    }
    Ok(value.to_owned())
}

fn label_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn parses_every_operator_and_matches() {
        let s = Selector::parse(
            "spur.amd.com/managed=true, tier==gpu,zone!=b,pool in (a, c),rack notin (r9),ssd,!cordoned",
        )
        .unwrap();
        assert_eq!(s.0.len(), 7);
        let good = labels(&[
            ("spur.amd.com/managed", "true"),
            ("tier", "gpu"),
            ("zone", "a"),
            ("pool", "c"),
            ("ssd", ""),
        ]);
        assert!(s.matches(&good));
        for (k, v) in [
            ("zone", "b"),
            ("pool", "x"),
            ("rack", "r9"),
            ("cordoned", "1"),
        ] {
            let mut bad = good.clone();
            bad.insert(k.into(), v.into());
            assert!(!s.matches(&bad), "{k}={v} should not match");
        }
        assert_eq!(
            s.to_string(),
            "spur.amd.com/managed=true,tier=gpu,zone!=b,pool in (a,c),rack notin (r9),ssd,!cordoned"
        );
        assert_eq!(Selector::parse("").unwrap(), Selector::default());
    }

    #[test]
    fn refuses_malformed_selectors_with_a_reason() {
        for (input, reason) in [
            ("a=b,,c=d", "empty requirement"),
            ("pool in (a", "without its `)`"),
            ("pool in a,b", "parentheses"),
            ("pool within (a)", "expected =, ==, !=, in or notin"),
            ("bad key=1", "`bad key` is not a label key"),
            ("a=b c", "not a label value"),
            ("Example.COM/x=1", "not a DNS prefix"),
            ("=1", "not a label key"),
        ] {
            let err = Selector::parse(input).unwrap_err();
            assert!(err.to_string().contains(reason), "{input}: {err}");
            assert!(err.to_string().starts_with(&format!("`{input}`")), "{err}");
        }
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Any text is a selector or an error that quotes it; never a panic.
        #[test]
        fn any_text_is_a_selector_or_a_named_error(
            text in "[a-z0-9./_!=,() -]{0,40}|(notin|in|!)?\\PC{0,30}"
        ) {
            if let Err(e) = Selector::parse(&text) {
                prop_assert!(e.to_string().contains("is not a label selector"), "{e}");
            }
        }
    }
}

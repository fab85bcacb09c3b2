//! `labelSelector` and `fieldSelector` parsing and matching.

use std::collections::BTreeSet;

use serde_json::Value;

use super::error::{ApiError, ApiResult};

/// One requirement of a label selector.
#[derive(Clone, Debug, PartialEq, Eq)]
enum LabelReq {
    Equals(String, String),
    NotEquals(String, String),
    In(String, BTreeSet<String>),
    NotIn(String, BTreeSet<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector: all requirements must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector(Vec<LabelReq>);

impl LabelSelector {
    /// Parses `a=b,c!=d,e in (f,g),h notin (i),j,!k`.
    pub fn parse(text: &str) -> ApiResult<Self> {
        let bad = |why: &str| {
            ApiError::bad_request(format!(
                "unable to parse requirement: {why} in labelSelector {text:?}"
            ))
        };
        let mut reqs = Vec::new();
        for term in split_terms(text) {
            let term = term.trim();
            if term.is_empty() {
                continue;
            }
            let req = if let Some(key) = term.strip_prefix('!') {
                LabelReq::NotExists(valid_key(key.trim()).ok_or_else(|| bad("bad key"))?)
            } else if let Some((key, value)) = term.split_once("!=") {
                LabelReq::NotEquals(
                    valid_key(key.trim()).ok_or_else(|| bad("bad key"))?,
                    value.trim().to_owned(),
                )
            } else if let Some((key, value)) =
                term.split_once("==").or_else(|| term.split_once('='))
            {
                LabelReq::Equals(
                    valid_key(key.trim()).ok_or_else(|| bad("bad key"))?,
                    value.trim().to_owned(),
                )
            } else if let Some((key, set)) = set_term(term, " notin ") {
                LabelReq::NotIn(
                    valid_key(key).ok_or_else(|| bad("bad key"))?,
                    set.ok_or_else(|| bad("bad set"))?,
                )
            } else if let Some((key, set)) = set_term(term, " in ") {
                LabelReq::In(
                    valid_key(key).ok_or_else(|| bad("bad key"))?,
                    set.ok_or_else(|| bad("bad set"))?,
                )
            } else {
                LabelReq::Exists(valid_key(term).ok_or_else(|| bad("bad key"))?)
            };
            reqs.push(req);
        }
        Ok(Self(reqs))
    }

    /// Whether an object (its `metadata.labels`) satisfies every requirement.
    pub fn matches(&self, object: &Value) -> bool {
        let labels = &object["metadata"]["labels"];
        let get = |k: &str| labels.get(k).and_then(Value::as_str);
        self.0.iter().all(|req| match req {
            LabelReq::Equals(k, v) => get(k) == Some(v.as_str()),
            LabelReq::NotEquals(k, v) => get(k) != Some(v.as_str()),
            LabelReq::In(k, set) => get(k).is_some_and(|v| set.contains(v)),
            LabelReq::NotIn(k, set) => get(k).is_none_or(|v| !set.contains(v)),
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::NotExists(k) => get(k).is_none(),
        })
    }
}

/// Splits on commas outside parentheses.
fn split_terms(text: &str) -> Vec<&str> {
    let mut terms = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                terms.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    terms.push(&text[start..]);
    terms
}

/// `key op (a,b)`: the key and the set, `None` as set when the parentheses are wrong.
fn set_term<'a>(term: &'a str, op: &str) -> Option<(&'a str, Option<BTreeSet<String>>)> {
    let (key, rest) = term.split_once(op)?;
    let set = rest
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .map(|inner| {
            inner
                .split(',')
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
                .collect()
        });
    Some((key.trim(), set))
}

fn valid_key(key: &str) -> Option<String> {
    let ok = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    ok.then(|| key.to_owned())
}

/// A parsed field selector: `path=value`, `path==value` or `path!=value` terms, where the
/// path is a dotted path into the object (`metadata.name`, `spec.nodeName`, ...).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSelector(Vec<(Vec<String>, bool, String)>);

impl FieldSelector {
    /// Parses `metadata.name=a,metadata.namespace!=b`.
    pub fn parse(text: &str) -> ApiResult<Self> {
        let mut terms = Vec::new();
        for term in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (path, equal, value) = if let Some((p, v)) = term.split_once("!=") {
                (p, false, v)
            } else if let Some((p, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                (p, true, v)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid field selector term {term:?}: expected an operator"
                )));
            };
            let path: Vec<String> = path.trim().split('.').map(str::to_owned).collect();
            if path.iter().any(String::is_empty) {
                return Err(ApiError::bad_request(format!(
                    "invalid field selector term {term:?}"
                )));
            }
            terms.push((path, equal, value.trim().to_owned()));
        }
        Ok(Self(terms))
    }

    /// Whether an object satisfies every term (a missing field is the empty string).
    pub fn matches(&self, object: &Value) -> bool {
        self.0.iter().all(|(path, equal, value)| {
            let field = path.iter().try_fold(object, |v, p| v.get(p));
            let text = match field {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Null) | None => String::new(),
                Some(other) => other.to_string(),
            };
            (text == *value) == *equal
        })
    }
}

/// Everything a list or watch filters on.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    /// Only this namespace (`None`: all).
    pub namespace: Option<String>,
    /// Label requirements.
    pub labels: LabelSelector,
    /// Field requirements.
    pub fields: FieldSelector,
}

impl Filter {
    /// Whether an object passes the filter.
    pub fn matches(&self, object: &Value) -> bool {
        self.namespace
            .as_deref()
            .is_none_or(|ns| object["metadata"]["namespace"].as_str() == Some(ns))
            && self.labels.matches(object)
            && self.fields.matches(object)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "n1", "namespace": "ns", "labels": labels}, "spec": {"nodeName": "a"}})
    }

    #[test]
    fn label_operators() {
        let o = obj(json!({"app": "web", "tier": "front"}));
        let m = |s: &str| LabelSelector::parse(s).unwrap().matches(&o);
        assert!(m("app=web"));
        assert!(m("app==web,tier=front"));
        assert!(!m("app=db"));
        assert!(m("app!=db"));
        assert!(m("missing!=x"));
        assert!(m("app in (db, web)"));
        assert!(!m("app in (db)"));
        assert!(m("app notin (db)"));
        assert!(m("missing notin (db)"));
        assert!(!m("app notin (web,db)"));
        assert!(m("app"));
        assert!(!m("missing"));
        assert!(m("!missing"));
        assert!(!m("!app"));
        assert!(m("app in (web),tier,!x"));
        assert!(m(""));
    }

    #[test]
    fn bad_label_selector_is_400() {
        assert_eq!(LabelSelector::parse("app in web").unwrap_err().code, 400);
        assert_eq!(LabelSelector::parse("a b c").unwrap_err().code, 400);
    }

    #[test]
    fn field_selector() {
        let o = obj(json!({}));
        let m = |s: &str| FieldSelector::parse(s).unwrap().matches(&o);
        assert!(m("metadata.name=n1"));
        assert!(m("metadata.namespace==ns,metadata.name!=n2"));
        assert!(!m("metadata.name=n2"));
        assert!(m("spec.nodeName=a"));
        assert!(m("status.phase="));
        assert_eq!(FieldSelector::parse("metadata.name").unwrap_err().code, 400);
    }
}

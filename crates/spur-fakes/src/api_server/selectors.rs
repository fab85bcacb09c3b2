//! `labelSelector` and `fieldSelector` parsing and matching.

use std::collections::BTreeMap;

use serde_json::Value;
use spur_operator::Selector;

use super::error::{ApiError, ApiResult};

/// A parsed label selector: the operator's own parser ([`Selector`]), so the API server
/// and the operator never disagree on what a selector means (an empty requirement, `a=b,`,
/// is refused by both, as Kubernetes refuses it). A selector that does not parse is a 400.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector(Selector);

impl LabelSelector {
    /// Parses `a=b,c!=d,e in (f,g),h notin (i),j,!k`.
    pub fn parse(text: &str) -> ApiResult<Self> {
        Selector::parse(text)
            .map(Self)
            .map_err(|e| ApiError::bad_request(format!("unable to parse requirement: {e}")))
    }

    /// Whether an object (its `metadata.labels`) satisfies every requirement.
    pub fn matches(&self, object: &Value) -> bool {
        if self.0.0.is_empty() {
            return true;
        }
        let labels: BTreeMap<String, String> = object["metadata"]["labels"]
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
            .collect();
        self.0.matches(&labels)
    }
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
        // An empty requirement, as Kubernetes (and the operator) refuse it.
        assert_eq!(LabelSelector::parse("app=web,").unwrap_err().code, 400);
        assert_eq!(LabelSelector::parse("a=b,,c=d").unwrap_err().code, 400);
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

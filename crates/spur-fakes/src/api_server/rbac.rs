//! Kubernetes' RBAC authorizer, pure: a request's attributes from its method and path, and
//! whether the Roles, ClusterRoles and their bindings allow them (no I/O; the server hands
//! in the objects it holds).
//!
//! As Kubernetes decides, knowingly without: aggregated ClusterRoles (`aggregationRule` is
//! ignored, only `rules` count) and the escalation check on writes of roles and bindings
//! (the operator writes neither, so nothing here needs it). Built in: `system:masters` may
//! do everything, and any authenticated user may read discovery (the bootstrap
//! `system:discovery` and `system:public-info-viewer` roles).

use std::collections::BTreeMap;

use serde_json::Value;

use super::auth::UserInfo;
use super::error::ApiError;

/// The group Kubernetes lets do everything without consulting RBAC.
pub const MASTERS_GROUP: &str = "system:masters";
/// The group every authenticated user is in.
pub const AUTHENTICATED_GROUP: &str = "system:authenticated";
/// Non-resource paths any authenticated user may get (`system:discovery` and
/// `system:public-info-viewer`).
const DISCOVERY_URLS: [&str; 11] = [
    "/api",
    "/api/*",
    "/apis",
    "/apis/*",
    "/healthz",
    "/livez",
    "/readyz",
    "/version",
    "/version/",
    "/openapi",
    "/openapi/*",
];

/// What a request asks to do, as Kubernetes' `RequestInfo` names it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Attributes {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`.
    pub verb: String,
    /// A request for an API resource (else a non-resource path such as `/version`).
    pub resource_request: bool,
    /// The request's path (what a non-resource rule matches).
    pub path: String,
    /// API group, `""` for the core group.
    pub api_group: String,
    /// Plural resource name, `""` for a non-resource request.
    pub resource: String,
    /// `status`, `log`, `exec`, ... or `""`.
    pub subresource: String,
    /// Namespace, `""` at the cluster scope.
    pub namespace: String,
    /// The object's name, `""` for a collection.
    pub name: String,
}

impl Attributes {
    /// The attributes of `method path?query`; `upgrade` when the request asks to switch to
    /// a WebSocket, which makes a `pods/exec`, `pods/attach` or `pods/portforward` GET a
    /// `create` (as newer Kubernetes releases authorise it, and as SPDY's POST always was;
    /// older ones authorised it as `get`). A proxy's verb is its method's (`get` for GET),
    /// its name the path's `name[:port]`, as Kubernetes' request info reads it.
    pub fn of_request(
        method: &str,
        path: &str,
        query: &BTreeMap<String, String>,
        upgrade: bool,
    ) -> Self {
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let (group, rest) = match segments.as_slice() {
            ["api", _version, rest @ ..] if !rest.is_empty() => ("", rest),
            ["apis", group, _version, rest @ ..] if !rest.is_empty() => (*group, rest),
            _ => return Self::non_resource(method, path),
        };
        let (namespace, parts) = match rest {
            ["namespaces", ns] => (*ns, rest),
            ["namespaces", ns, tail @ ..] => (*ns, tail),
            _ => ("", rest),
        };
        let (resource, name, subresource) = match parts {
            [resource] => (*resource, "", ""),
            [resource, name] => (*resource, *name, ""),
            [resource, name, sub, ..] => (*resource, *name, *sub),
            [] => ("", "", ""),
        };
        let mut name = name.to_owned();
        let streaming = matches!(subresource, "exec" | "attach" | "portforward");
        let verb = verb_of(method, &name, query, upgrade && streaming);
        if name.is_empty() && matches!(verb, "list" | "watch") {
            // A list or watch of one object by field selector is authorised as that name.
            name = field_selected_name(query).unwrap_or_default();
        }
        Self {
            verb: verb.to_owned(),
            resource_request: true,
            path: path.to_owned(),
            api_group: group.to_owned(),
            resource: resource.to_owned(),
            subresource: subresource.to_owned(),
            namespace: namespace.to_owned(),
            name,
        }
    }

    fn non_resource(method: &str, path: &str) -> Self {
        Self {
            verb: method.to_ascii_lowercase(),
            path: path.to_owned(),
            ..Self::default()
        }
    }

    /// `resource` or `resource/subresource`, as rules and messages name it.
    pub fn combined_resource(&self) -> String {
        if self.subresource.is_empty() {
            self.resource.clone()
        } else {
            format!("{}/{}", self.resource, self.subresource)
        }
    }
}

fn verb_of(
    method: &str,
    name: &str,
    query: &BTreeMap<String, String>,
    exec_upgrade: bool,
) -> &'static str {
    let watch = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
    match (method, name.is_empty()) {
        ("GET" | "HEAD", _) if exec_upgrade => "create",
        ("GET" | "HEAD", true) if watch => "watch",
        ("GET" | "HEAD", true) => "list",
        ("GET" | "HEAD", false) => "get",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "deletecollection",
        ("DELETE", false) => "delete",
        _ => "",
    }
}

fn field_selected_name(query: &BTreeMap<String, String>) -> Option<String> {
    query.get("fieldSelector")?.split(',').find_map(|term| {
        let (field, value) = term.split_once('=')?;
        (field == "metadata.name").then(|| value.trim_start_matches('=').to_owned())
    })
}

/// One rule of a Role or ClusterRole.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PolicyRule {
    pub verbs: Vec<String>,
    pub api_groups: Vec<String>,
    pub resources: Vec<String>,
    pub resource_names: Vec<String>,
    pub non_resource_urls: Vec<String>,
}

impl PolicyRule {
    /// The rule as a Role's `rules[]` entry holds it.
    pub fn from_json(rule: &Value) -> Self {
        let list = |key: &str| -> Vec<String> {
            rule[key]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        };
        Self {
            verbs: list("verbs"),
            api_groups: list("apiGroups"),
            resources: list("resources"),
            resource_names: list("resourceNames"),
            non_resource_urls: list("nonResourceURLs"),
        }
    }

    /// Whether this rule allows `attrs` (Kubernetes' `RuleAllows`).
    pub fn allows(&self, attrs: &Attributes) -> bool {
        let any = |list: &[String], want: &str| list.iter().any(|v| v == "*" || v == want);
        if !any(&self.verbs, &attrs.verb) {
            return false;
        }
        if !attrs.resource_request {
            return self
                .non_resource_urls
                .iter()
                .any(|url| url_matches(url, &attrs.path));
        }
        any(&self.api_groups, &attrs.api_group)
            && self.resources.iter().any(|r| resource_matches(r, attrs))
            && (self.resource_names.is_empty() || self.resource_names.contains(&attrs.name))
    }
}

/// `*`, the exact `resource[/subresource]`, `*/subresource`, or `resource/*` (any of its
/// subresources, not the resource itself).
fn resource_matches(rule: &str, attrs: &Attributes) -> bool {
    let combined = attrs.combined_resource();
    if rule == "*" || rule == combined {
        return true;
    }
    if attrs.subresource.is_empty() {
        return false;
    }
    rule.strip_prefix("*/") == Some(attrs.subresource.as_str())
        || rule
            .strip_suffix('*')
            .is_some_and(|prefix| prefix.ends_with('/') && combined.starts_with(prefix))
}

fn url_matches(rule: &str, path: &str) -> bool {
    rule == "*"
        || rule == path
        || rule
            .strip_suffix('*')
            .is_some_and(|prefix| path.starts_with(prefix))
}

/// A subject of a binding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subject {
    /// `User`, `Group` or `ServiceAccount`.
    pub kind: String,
    pub name: String,
    /// A ServiceAccount's namespace (a RoleBinding's own when empty).
    pub namespace: String,
}

impl Subject {
    /// Whether `user` is this subject, for a binding in `binding_ns` (`""` for a
    /// ClusterRoleBinding).
    pub fn applies_to(&self, user: &UserInfo, binding_ns: &str) -> bool {
        match self.kind.as_str() {
            "User" => user.name == self.name,
            "Group" => user.groups.contains(&self.name),
            "ServiceAccount" => {
                let ns = if self.namespace.is_empty() {
                    binding_ns
                } else {
                    &self.namespace
                };
                !ns.is_empty() && user.name == super::auth::service_account_user(ns, &self.name)
            }
            _ => false,
        }
    }
}

/// A RoleBinding (with its namespace) or a ClusterRoleBinding (namespace `""`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Binding {
    pub namespace: String,
    /// `Role` or `ClusterRole`.
    pub role_kind: String,
    pub role_name: String,
    pub subjects: Vec<Subject>,
}

impl Binding {
    /// A binding as the API server stores it.
    pub fn from_json(binding: &Value) -> Self {
        let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        Self {
            namespace: text(&binding["metadata"]["namespace"]),
            role_kind: text(&binding["roleRef"]["kind"]),
            role_name: text(&binding["roleRef"]["name"]),
            subjects: binding["subjects"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|s| Subject {
                    kind: text(&s["kind"]),
                    name: text(&s["name"]),
                    namespace: text(&s["namespace"]),
                })
                .collect(),
        }
    }
}

/// Every Role, ClusterRole and binding the server holds.
#[derive(Clone, Debug, Default)]
pub struct Policy {
    /// ClusterRoles' rules by name.
    pub cluster_roles: BTreeMap<String, Vec<PolicyRule>>,
    /// Roles' rules by (namespace, name).
    pub roles: BTreeMap<(String, String), Vec<PolicyRule>>,
    pub cluster_role_bindings: Vec<Binding>,
    pub role_bindings: Vec<Binding>,
}

/// A decision and, for a refusal, the reason Kubernetes appends (a binding whose role is
/// missing).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Allow,
    Deny(Option<String>),
}

impl Policy {
    /// Adds a Role or ClusterRole as stored (its `rules`; `aggregationRule` is ignored).
    pub fn add_role(&mut self, role: &Value) {
        let rules: Vec<PolicyRule> = role["rules"]
            .as_array()
            .into_iter()
            .flatten()
            .map(PolicyRule::from_json)
            .collect();
        let name = role["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        match role["metadata"]["namespace"].as_str() {
            Some(ns) if role["kind"] == "Role" => {
                self.roles.insert((ns.to_owned(), name), rules);
            }
            _ => {
                self.cluster_roles.insert(name, rules);
            }
        }
    }

    /// Kubernetes' RBAC decision (after the `system:masters` short cut and discovery).
    pub fn authorize(&self, user: &UserInfo, attrs: &Attributes) -> Decision {
        if user.groups.iter().any(|g| g == MASTERS_GROUP) {
            return Decision::Allow;
        }
        if !attrs.resource_request
            && attrs.verb == "get"
            && user.groups.iter().any(|g| g == AUTHENTICATED_GROUP)
            && DISCOVERY_URLS
                .iter()
                .any(|url| url_matches(url, &attrs.path))
        {
            return Decision::Allow;
        }
        let mut missing = Vec::new();
        let cluster = self.cluster_role_bindings.iter();
        let local = self
            .role_bindings
            .iter()
            .filter(|b| !attrs.namespace.is_empty() && b.namespace == attrs.namespace);
        for binding in cluster.chain(local) {
            if !binding
                .subjects
                .iter()
                .any(|s| s.applies_to(user, &binding.namespace))
            {
                continue;
            }
            match self.rules_of(binding) {
                Ok(rules) if rules.iter().any(|r| r.allows(attrs)) => return Decision::Allow,
                Ok(_) => {}
                Err(reason) => missing.push(reason),
            }
        }
        Decision::Deny(match missing.len() {
            0 => None,
            1 => Some(format!("RBAC: {}", missing[0])),
            _ => Some(format!("RBAC: [{}]", missing.join(", "))),
        })
    }

    /// The rules a binding grants; a RoleBinding may name a ClusterRole (its rules then
    /// apply in the binding's namespace only, which the caller's filter ensures).
    fn rules_of(&self, binding: &Binding) -> Result<&[PolicyRule], String> {
        let found = match binding.role_kind.as_str() {
            "ClusterRole" => self.cluster_roles.get(&binding.role_name),
            "Role" if !binding.namespace.is_empty() => self
                .roles
                .get(&(binding.namespace.clone(), binding.role_name.clone())),
            _ => None,
        };
        found.map(Vec::as_slice).ok_or_else(|| {
            let kind = binding.role_kind.to_lowercase();
            format!(
                "{kind}.rbac.authorization.k8s.io \"{}\" not found",
                binding.role_name
            )
        })
    }
}

/// The 403 Kubernetes answers a refused request with, worded as its authorizer words it.
pub fn forbidden(user: &UserInfo, attrs: &Attributes, reason: Option<&str>) -> ApiError {
    let mut why = if !attrs.resource_request {
        format!(
            "User {:?} cannot {} path {:?}",
            user.name, attrs.verb, attrs.path
        )
    } else {
        let scope = if attrs.namespace.is_empty() {
            "at the cluster scope".to_owned()
        } else {
            format!("in the namespace {:?}", attrs.namespace)
        };
        format!(
            "User {:?} cannot {} resource {:?} in API group {:?} {scope}",
            user.name,
            attrs.verb,
            attrs.combined_resource(),
            attrs.api_group
        )
    };
    if let Some(reason) = reason {
        why = format!("{why}: {reason}");
    }
    ApiError::forbidden(&attrs.api_group, &attrs.resource, &attrs.name, &why)
}

#[cfg(test)]
mod tests;

//! Why an election cannot run, said in one line that names what to add: a refusal by RBAC
//! (which rule, for whom, in which namespace) or a namespace that does not exist.

use super::lock::LockKind;

/// An API call on a lock object that RBAC refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub kind: LockKind,
    /// The verb the operator asked for.
    pub verb: &'static str,
    /// The user the API server named in its refusal.
    pub user: Option<String>,
}

impl Refusal {
    /// Reads the user out of Kubernetes' refusal, `... User "system:serviceaccount:ns:name"
    /// cannot get resource ...`; the message is the only place the API server names it.
    pub fn from_message(kind: LockKind, verb: &'static str, message: &str) -> Refusal {
        let user = message
            .split_once("User \"")
            .and_then(|(_, rest)| rest.split_once('"'))
            .map(|(user, _)| user.to_owned());
        Refusal { kind, verb, user }
    }

    /// The subject a RoleBinding names for this user.
    fn subject(&self) -> String {
        match self.user.as_deref() {
            Some(user) => match user.strip_prefix("system:serviceaccount:") {
                Some(account) => match account.split_once(':') {
                    Some((namespace, name)) => format!("ServiceAccount {namespace}/{name}"),
                    None => format!("User {user}"),
                },
                None => format!("User {user}"),
            },
            None => "the operator's ServiceAccount".to_owned(),
        }
    }
}

/// Why this replica cannot take part in the election.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Blocked {
    /// Neither lock kind may be used.
    Forbidden {
        namespace: String,
        lease: Refusal,
        config_map: Refusal,
    },
    /// The namespace the lock goes in does not exist.
    NamespaceMissing { namespace: String },
}

impl Blocked {
    /// One line: what is wrong and the exact rule or setting that fixes it.
    pub fn line(&self) -> String {
        match self {
            Blocked::Forbidden {
                namespace,
                lease,
                config_map,
            } => format!(
                "cannot elect the acting replica: {subject} may not {lease_verb} leases \
                 (apiGroup coordination.k8s.io) nor {map_verb} configmaps in namespace \
                 \"{namespace}\"; add a Role in \"{namespace}\" with apiGroups \
                 [coordination.k8s.io], resources [leases], verbs [get, create, update] and a \
                 RoleBinding of it to {subject} (or grant configmaps get, create, update there, \
                 which the operator then uses as its lock)",
                subject = lease.subject(),
                lease_verb = lease.verb,
                map_verb = config_map.verb,
            ),
            Blocked::NamespaceMissing { namespace } => format!(
                "cannot elect the acting replica: namespace \"{namespace}\", where its Lease \
                 goes, does not exist; set POD_NAMESPACE from the Downward API \
                 (fieldPath: metadata.namespace) or --namespace to the operator's own namespace"
            ),
        }
    }
}

/// The line logged once when the operator elects with a ConfigMap because the Lease was
/// refused: still safe, and what to add to use the Lease.
pub fn fallback_line(namespace: &str, name: &str, lease: &Refusal) -> String {
    format!(
        "electing with ConfigMap {namespace}/{name} (annotation \
         control-plane.alpha.kubernetes.io/leader): {subject} may not {verb} leases in \
         \"{namespace}\"; to use a Lease, add a Role there with apiGroups [coordination.k8s.io], \
         resources [leases], verbs [get, create, update] bound to {subject}",
        subject = lease.subject(),
        verb = lease.verb,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const REFUSED: &str = "leases.coordination.k8s.io \"spur-operator\" is forbidden: User \
        \"system:serviceaccount:spur:default\" cannot get resource \"leases\" in API group \
        \"coordination.k8s.io\" in the namespace \"spur\"";

    #[test]
    fn a_refusal_names_the_service_account_the_rule_and_the_namespace() {
        let lease = Refusal::from_message(LockKind::Lease, "get", REFUSED);
        assert_eq!(
            lease.user.as_deref(),
            Some("system:serviceaccount:spur:default")
        );
        let config_map = Refusal::from_message(LockKind::ConfigMap, "create", "no user here");
        let line = Blocked::Forbidden {
            namespace: "spur".into(),
            lease,
            config_map,
        }
        .line();
        for part in [
            "ServiceAccount spur/default may not get leases",
            "nor create configmaps in namespace \"spur\"",
            "resources [leases], verbs [get, create, update]",
            "RoleBinding of it to ServiceAccount spur/default",
        ] {
            assert!(line.contains(part), "{part:?} missing from: {line}");
        }
        assert!(!line.contains('\n'));
    }

    #[test]
    fn a_missing_namespace_names_it_and_how_to_set_the_right_one() {
        let line = Blocked::NamespaceMissing {
            namespace: "spur-system".into(),
        }
        .line();
        assert!(line.contains("namespace \"spur-system\""), "{line}");
        assert!(line.contains("POD_NAMESPACE"), "{line}");
    }
}

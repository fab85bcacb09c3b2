use serde_json::json;

use super::*;

fn attrs(method: &str, path: &str) -> Attributes {
    attrs_q(method, path, &[])
}

fn attrs_q(method: &str, path: &str, query: &[(&str, &str)]) -> Attributes {
    let query = query
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    Attributes::of_request(method, path, &query, false)
}

fn sa() -> UserInfo {
    UserInfo::service_account("spur", "default")
}

/// A policy with one ClusterRole `r` holding `rules`, bound cluster-wide to `subject`.
fn cluster_policy(rules: serde_json::Value, subject: serde_json::Value) -> Policy {
    let mut policy = Policy::default();
    policy.add_role(&json!({"kind": "ClusterRole", "metadata": {"name": "r"}, "rules": rules}));
    policy
        .cluster_role_bindings
        .push(Binding::from_json(&json!({
            "metadata": {"name": "b"},
            "roleRef": {"kind": "ClusterRole", "name": "r"},
            "subjects": [subject],
        })));
    policy
}

fn sa_subject() -> serde_json::Value {
    json!({"kind": "ServiceAccount", "name": "default", "namespace": "spur"})
}

fn allowed(policy: &Policy, user: &UserInfo, method: &str, path: &str) -> bool {
    policy.authorize(user, &attrs(method, path)) == Decision::Allow
}

#[test]
fn verbs_come_from_the_method_and_whether_a_name_is_given() {
    let pods = "/api/v1/namespaces/spur/pods";
    let cases = [
        ("GET", format!("{pods}/x"), "get"),
        ("GET", pods.to_owned(), "list"),
        ("POST", pods.to_owned(), "create"),
        ("PUT", format!("{pods}/x"), "update"),
        ("PATCH", format!("{pods}/x"), "patch"),
        ("DELETE", format!("{pods}/x"), "delete"),
        ("DELETE", pods.to_owned(), "deletecollection"),
    ];
    for (method, path, verb) in cases {
        assert_eq!(attrs(method, &path).verb, verb, "{method} {path}");
    }
    assert_eq!(attrs_q("GET", pods, &[("watch", "true")]).verb, "watch");
    assert_eq!(attrs_q("GET", pods, &[("watch", "1")]).verb, "watch");
}

#[test]
fn attributes_name_group_resource_subresource_namespace_and_name() {
    let a = attrs(
        "PATCH",
        "/apis/spur.amd.com/v1alpha1/namespaces/team/spurjobs/j/status",
    );
    let want = Attributes {
        verb: "patch".into(),
        resource_request: true,
        path: "/apis/spur.amd.com/v1alpha1/namespaces/team/spurjobs/j/status".into(),
        api_group: "spur.amd.com".into(),
        resource: "spurjobs".into(),
        subresource: "status".into(),
        namespace: "team".into(),
        name: "j".into(),
    };
    assert_eq!(a, want);
    let node = attrs("GET", "/api/v1/nodes/n1");
    assert_eq!((node.namespace.as_str(), node.name.as_str()), ("", "n1"));
    let ns = attrs("GET", "/api/v1/namespaces/team");
    assert_eq!(
        (ns.resource.as_str(), ns.name.as_str()),
        ("namespaces", "team")
    );
    assert!(!attrs("GET", "/apis/spur.amd.com/v1alpha1").resource_request);
    assert!(!attrs("GET", "/version").resource_request);
}

#[test]
fn an_upgraded_exec_is_create_and_a_list_by_name_carries_the_name() {
    let exec = "/api/v1/namespaces/spur/pods/p/exec";
    let no_query = BTreeMap::new();
    assert_eq!(
        Attributes::of_request("GET", exec, &no_query, true).verb,
        "create"
    );
    assert_eq!(
        Attributes::of_request("POST", exec, &no_query, false).verb,
        "create"
    );
    let log = Attributes::of_request("GET", "/api/v1/namespaces/spur/pods/p/log", &no_query, true);
    assert_eq!(
        (log.verb.as_str(), log.subresource.as_str()),
        ("get", "log")
    );
    let listed = attrs_q(
        "GET",
        "/apis/coordination.k8s.io/v1/namespaces/spur/leases",
        &[("fieldSelector", "metadata.name=l")],
    );
    assert_eq!((listed.verb.as_str(), listed.name.as_str()), ("list", "l"));
}

#[test]
fn wildcards_match_every_verb_group_and_resource() {
    let policy = cluster_policy(
        json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]),
        sa_subject(),
    );
    assert!(allowed(&policy, &sa(), "DELETE", "/api/v1/nodes/n"));
    assert!(allowed(
        &policy,
        &sa(),
        "PATCH",
        "/apis/spur.amd.com/v1alpha1/namespaces/a/spurjobs/j/status"
    ));
    assert!(
        !allowed(&policy, &sa(), "GET", "/metrics"),
        "resources are not paths"
    );
    let exact = cluster_policy(
        json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]),
        sa_subject(),
    );
    assert!(allowed(&exact, &sa(), "GET", "/api/v1/namespaces/a/pods/p"));
    assert!(!allowed(&exact, &sa(), "GET", "/api/v1/namespaces/a/pods"));
    assert!(!allowed(
        &exact,
        &sa(),
        "GET",
        "/apis/apps/v1/namespaces/a/pods/p"
    ));
    assert!(!allowed(
        &exact,
        &sa(),
        "GET",
        "/api/v1/namespaces/a/pods/p/log"
    ));
}

#[test]
fn subresource_forms_match_as_kubernetes_matches_them() {
    let policy = cluster_policy(
        json!([{"apiGroups": ["*"], "resources": ["*/status", "pods/*"], "verbs": ["get", "patch"]}]),
        sa_subject(),
    );
    let job = "/apis/spur.amd.com/v1alpha1/namespaces/a/spurjobs/j";
    assert!(allowed(&policy, &sa(), "PATCH", &format!("{job}/status")));
    assert!(!allowed(&policy, &sa(), "PATCH", job));
    assert!(allowed(
        &policy,
        &sa(),
        "GET",
        "/api/v1/namespaces/a/pods/p/log"
    ));
    assert!(!allowed(
        &policy,
        &sa(),
        "GET",
        "/api/v1/namespaces/a/pods/p"
    ));
    let status = cluster_policy(
        json!([{"apiGroups": ["spur.amd.com"], "resources": ["spurjobs/status"], "verbs": ["patch"]}]),
        sa_subject(),
    );
    assert!(allowed(&status, &sa(), "PATCH", &format!("{job}/status")));
    assert!(!allowed(&status, &sa(), "PATCH", job));
}

#[test]
fn resource_names_limit_named_requests_and_never_match_create_or_a_collection() {
    let policy = cluster_policy(
        json!([{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                "resourceNames": ["mine"], "verbs": ["get", "update", "create", "list"]}]),
        sa_subject(),
    );
    let leases = "/apis/coordination.k8s.io/v1/namespaces/spur/leases";
    assert!(allowed(&policy, &sa(), "GET", &format!("{leases}/mine")));
    assert!(allowed(&policy, &sa(), "PUT", &format!("{leases}/mine")));
    assert!(!allowed(&policy, &sa(), "GET", &format!("{leases}/theirs")));
    assert!(!allowed(&policy, &sa(), "POST", leases));
    assert!(!allowed(&policy, &sa(), "GET", leases));
    let by_name = attrs_q("GET", leases, &[("fieldSelector", "metadata.name=mine")]);
    assert_eq!(policy.authorize(&sa(), &by_name), Decision::Allow);
}

#[test]
fn discovery_is_open_to_the_authenticated_and_masters_may_do_anything() {
    let policy = Policy::default();
    for path in [
        "/api",
        "/api/v1",
        "/apis",
        "/apis/spur.amd.com/v1alpha1",
        "/version",
        "/openapi/v2",
    ] {
        assert!(allowed(&policy, &sa(), "GET", path), "{path}");
    }
    assert!(!allowed(&policy, &sa(), "GET", "/metrics"));
    assert!(!allowed(&policy, &sa(), "POST", "/apis"));
    let anonymous = UserInfo {
        name: "system:anonymous".into(),
        groups: vec![],
    };
    assert!(!allowed(&policy, &anonymous, "GET", "/api"));
    assert!(allowed(
        &policy,
        &UserInfo::admin(),
        "DELETE",
        "/api/v1/nodes/n"
    ));
    let urls = cluster_policy(
        json!([{"nonResourceURLs": ["/metrics", "/logs/*"], "verbs": ["get"]}]),
        sa_subject(),
    );
    assert!(allowed(&urls, &sa(), "GET", "/metrics"));
    assert!(allowed(&urls, &sa(), "GET", "/logs/kube"));
    assert!(!allowed(&urls, &sa(), "GET", "/api/v1/namespaces/a/pods"));
}

#[test]
fn subjects_are_users_groups_and_service_accounts() {
    let rules = json!([{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}]);
    let nodes = "/api/v1/nodes";
    let alice = UserInfo {
        name: "alice".into(),
        groups: vec!["devs".into()],
    };
    let user = cluster_policy(rules.clone(), json!({"kind": "User", "name": "alice"}));
    assert!(allowed(&user, &alice, "GET", nodes));
    assert!(!allowed(&user, &sa(), "GET", nodes));
    let group = cluster_policy(
        rules.clone(),
        json!({"kind": "Group", "name": "system:serviceaccounts:spur"}),
    );
    assert!(allowed(&group, &sa(), "GET", nodes));
    assert!(!allowed(&group, &alice, "GET", nodes));
    let other_ns = cluster_policy(
        rules.clone(),
        json!({"kind": "ServiceAccount", "name": "default", "namespace": "kube-system"}),
    );
    assert!(!allowed(&other_ns, &sa(), "GET", nodes));
    // A ServiceAccount subject without a namespace is the RoleBinding's own.
    let mut local = Policy::default();
    local.add_role(
        &json!({"kind": "Role", "metadata": {"name": "r", "namespace": "spur"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]}),
    );
    local.role_bindings.push(Binding::from_json(&json!({
        "metadata": {"name": "b", "namespace": "spur"},
        "roleRef": {"kind": "Role", "name": "r"},
        "subjects": [{"kind": "ServiceAccount", "name": "default"}],
    })));
    assert!(allowed(
        &local,
        &sa(),
        "GET",
        "/api/v1/namespaces/spur/pods"
    ));
    assert!(!allowed(
        &local,
        &sa(),
        "GET",
        "/api/v1/namespaces/other/pods"
    ));
    assert!(!allowed(&local, &sa(), "GET", "/api/v1/pods"));
}

#[test]
fn a_role_binding_to_a_cluster_role_grants_in_its_namespace_only() {
    let mut policy = Policy::default();
    policy.add_role(
        &json!({"kind": "ClusterRole", "metadata": {"name": "pod-reader"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]}),
    );
    policy.role_bindings.push(Binding::from_json(&json!({
        "metadata": {"name": "b", "namespace": "spur"},
        "roleRef": {"kind": "ClusterRole", "name": "pod-reader"},
        "subjects": [sa_subject()],
    })));
    assert!(allowed(
        &policy,
        &sa(),
        "GET",
        "/api/v1/namespaces/spur/pods/p"
    ));
    assert!(!allowed(
        &policy,
        &sa(),
        "GET",
        "/api/v1/namespaces/other/pods/p"
    ));
    assert!(
        !allowed(&policy, &sa(), "GET", "/api/v1/pods"),
        "not across namespaces"
    );
}

#[test]
fn a_binding_to_a_missing_role_is_the_refusals_reason() {
    let mut policy = Policy::default();
    policy.role_bindings.push(Binding::from_json(&json!({
        "metadata": {"name": "b", "namespace": "spur"},
        "roleRef": {"kind": "Role", "name": "gone"},
        "subjects": [sa_subject()],
    })));
    let a = attrs("GET", "/api/v1/namespaces/spur/pods/p");
    let Decision::Deny(reason) = policy.authorize(&sa(), &a) else {
        panic!("allowed without a role");
    };
    assert_eq!(
        reason.as_deref(),
        Some("RBAC: role.rbac.authorization.k8s.io \"gone\" not found")
    );
}

#[test]
fn refusals_are_worded_as_kubernetes_words_them() {
    let user = sa();
    let status =
        |method: &str, path: &str| forbidden(&user, &attrs(method, path), None).to_status();
    let named = status("GET", "/api/v1/namespaces/spur/pods/x");
    assert_eq!(
        named["message"],
        "pods \"x\" is forbidden: User \"system:serviceaccount:spur:default\" cannot get resource \"pods\" in API group \"\" in the namespace \"spur\""
    );
    assert_eq!(
        (named["code"].clone(), named["reason"].clone()),
        (json!(403), json!("Forbidden"))
    );
    assert_eq!(named["details"], json!({"name": "x", "kind": "pods"}));
    let listed = status("GET", "/api/v1/namespaces/spur/pods");
    assert_eq!(
        listed["message"],
        "pods is forbidden: User \"system:serviceaccount:spur:default\" cannot list resource \"pods\" in API group \"\" in the namespace \"spur\""
    );
    assert_eq!(listed["details"], json!({"kind": "pods"}));
    let exec = status("POST", "/api/v1/namespaces/spur/pods/x/exec");
    assert!(
        exec["message"].as_str().unwrap().ends_with(
            "cannot create resource \"pods/exec\" in API group \"\" in the namespace \"spur\""
        ),
        "{exec}"
    );
    let node = status("GET", "/api/v1/nodes");
    assert_eq!(
        node["message"],
        "nodes is forbidden: User \"system:serviceaccount:spur:default\" cannot list resource \"nodes\" in API group \"\" at the cluster scope"
    );
    let job = status(
        "PATCH",
        "/apis/spur.amd.com/v1alpha1/namespaces/a/spurjobs/j/status",
    );
    assert_eq!(
        job["message"],
        "spurjobs.spur.amd.com \"j\" is forbidden: User \"system:serviceaccount:spur:default\" cannot patch resource \"spurjobs/status\" in API group \"spur.amd.com\" in the namespace \"a\""
    );
    assert_eq!(
        job["details"],
        json!({"name": "j", "group": "spur.amd.com", "kind": "spurjobs"})
    );
    let path = status("GET", "/metrics");
    assert_eq!(
        path["message"],
        "forbidden: User \"system:serviceaccount:spur:default\" cannot get path \"/metrics\""
    );
}

#[test]
fn port_forward_and_proxy_are_subresources_with_their_verbs() {
    let no_query = BTreeMap::new();
    let forward = "/api/v1/namespaces/spur/pods/p/portforward";
    let upgraded = Attributes::of_request("GET", forward, &no_query, true);
    assert_eq!(
        (
            upgraded.verb.as_str(),
            upgraded.combined_resource().as_str()
        ),
        ("create", "pods/portforward")
    );
    let proxy = attrs(
        "GET",
        "/api/v1/namespaces/spur-system/services/op:http/proxy/readyz",
    );
    assert_eq!(
        (
            proxy.verb.as_str(),
            proxy.combined_resource().as_str(),
            proxy.name.as_str()
        ),
        ("get", "services/proxy", "op:http")
    );
    let posted = attrs("POST", "/api/v1/namespaces/a/pods/p:8080/proxy/x");
    assert_eq!(
        (posted.verb.as_str(), posted.subresource.as_str()),
        ("create", "proxy")
    );
    let logs_only = cluster_policy(
        json!([{"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]}]),
        sa_subject(),
    );
    assert!(allowed(
        &logs_only,
        &sa(),
        "GET",
        "/api/v1/namespaces/a/pods/p/log"
    ));
    assert!(!allowed(
        &logs_only,
        &sa(),
        "GET",
        "/api/v1/namespaces/a/pods/p:8080/proxy/metrics"
    ));
    let proxies = cluster_policy(
        json!([{"apiGroups": [""], "resources": ["services/proxy"], "verbs": ["get"]}]),
        sa_subject(),
    );
    assert!(allowed(
        &proxies,
        &sa(),
        "GET",
        "/api/v1/namespaces/a/services/s:http/proxy/readyz"
    ));
    assert!(!allowed(
        &proxies,
        &sa(),
        "GET",
        "/api/v1/namespaces/a/pods/p/proxy/readyz"
    ));
}

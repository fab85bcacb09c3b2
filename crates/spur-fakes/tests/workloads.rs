//! The workload kinds and controllers (`spur_fakes::workloads`), driven pass by pass
//! against the in-memory API server.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::{
    apps::v1::StatefulSet,
    core::v1::{PersistentVolumeClaim, Secret},
};
use kube::{
    Api,
    api::{ListParams, PostParams},
};
use serde_json::{Value, json};
use spur_fakes::api_server::{
    ApiServer, ApiServerConfig, ClientOptions, resources::base64_decode, store::StoreConfig,
};
use spur_fakes::clock::{Clock, TimeSource};
use spur_fakes::workloads::{HASH_LABEL, POD_INDEX_LABEL, POD_NAME_LABEL, Workloads};

const EPOCH: u64 = 1_767_225_600;

fn server() -> ApiServer {
    ApiServer::new(ApiServerConfig {
        clock: Some(TimeSource::from_fn(|| {
            k8s_openapi::jiff::Timestamp::from_second(EPOCH as i64).unwrap()
        })),
        store: StoreConfig {
            seed: 7,
            ..StoreConfig::default()
        },
        ..ApiServerConfig::default()
    })
}

fn workloads(api: &ApiServer) -> Workloads {
    let clock = Clock {
        elapsed: || Duration::ZERO,
        wall: || SystemTime::UNIX_EPOCH + Duration::from_secs(EPOCH),
    };
    Workloads::new(api.clone(), clock)
}

fn steps(w: &mut Workloads, n: usize) {
    for _ in 0..n {
        w.step();
    }
}

fn name(o: &Value) -> &str {
    o["metadata"]["name"].as_str().unwrap()
}

/// The live pods whose name starts with `prefix`, in name order.
fn pods(api: &ApiServer, prefix: &str) -> Vec<Value> {
    let mut pods: Vec<Value> = api
        .list("v1", "Pod")
        .unwrap()
        .into_iter()
        .filter(|p| name(p).starts_with(prefix) && p["metadata"]["deletionTimestamp"].is_null())
        .collect();
    pods.sort_by(|a, b| name(a).cmp(name(b)));
    pods
}

fn set_ready(api: &ApiServer, pod: &str, ip: &str, ready: bool) {
    let status = if ready { "True" } else { "False" };
    let patch = json!({"status": {"phase": "Running", "podIP": ip,
        "conditions": [{"type": "Ready", "status": status}]}});
    api.merge_patch("v1", "Pod", Some("default"), pod, &patch, true)
        .unwrap();
}

/// Marks every pod under `prefix` Ready, each with its own IP.
fn all_ready(api: &ApiServer, prefix: &str) {
    for (i, pod) in pods(api, prefix).iter().enumerate() {
        set_ready(api, name(pod), &format!("10.0.0.{}", i + 1), true);
    }
}

fn get(api: &ApiServer, api_version: &str, kind: &str, name: &str) -> Value {
    api.get(api_version, kind, Some("default"), name).unwrap()
}

fn deployment(replicas: i64, image: &str) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": image}]}}}})
}

#[tokio::test]
async fn secret_string_data_is_stored_as_base64_data() {
    let api = server();
    api.create(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "s", "namespace": "default"},
        "data": {"kept": "eA=="}, "stringData": {"password": "hunter2"}}))
        .unwrap();
    let stored = get(&api, "v1", "Secret", "s");
    assert!(stored.get("stringData").is_none(), "{stored}");
    assert_eq!(stored["type"], "Opaque");
    assert_eq!(stored["data"]["password"], "aHVudGVyMg==");
    assert_eq!(stored["data"]["kept"], "eA==");
    // An update's stringData merges too, over the same key in data.
    let patch = json!({"stringData": {"kept": "y"}});
    api.merge_patch("v1", "Secret", Some("default"), "s", &patch, false)
        .unwrap();
    let stored = get(&api, "v1", "Secret", "s");
    assert_eq!(
        base64_decode(stored["data"]["kept"].as_str().unwrap()).unwrap(),
        b"y"
    );
    assert!(stored.get("stringData").is_none());

    // Over HTTP, through kube-rs, as kubectl would.
    let secrets: Api<Secret> = Api::namespaced(api.in_memory_client(), "default");
    let secret: Secret = serde_json::from_value(json!({"metadata": {"name": "t"},
        "type": "kubernetes.io/basic-auth", "stringData": {"username": "admin"}}))
    .unwrap();
    let created = secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    assert!(created.string_data.is_none());
    let got = secrets.get("t").await.unwrap();
    assert_eq!(got.type_.as_deref(), Some("kubernetes.io/basic-auth"));
    assert_eq!(got.data.unwrap()["username"].0, b"admin");
    let bad = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "bad", "namespace": "default"}, "data": {"k": "%%%"}});
    assert_eq!(
        api.create(bad).unwrap_err().code,
        422,
        "data must be base64"
    );
}

#[tokio::test]
async fn new_kinds_are_served_and_guarded_by_rbac() {
    let api = server();
    let client = api.in_memory_client();
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), "default");
    assert!(
        sets.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client, "default");
    assert!(
        claims
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    api.create(json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "reader", "namespace": "default"}}))
        .unwrap();
    let options = ClientOptions {
        bearer_token: Some(api.service_account_token("default", "reader").unwrap()),
        ..ClientOptions::default()
    };
    let secrets: Api<Secret> = Api::namespaced(api.in_memory_client_with(&options), "default");
    let kube::Error::Api(err) = secrets.list(&ListParams::default()).await.unwrap_err() else {
        panic!("not an API error");
    };
    assert_eq!(err.code, 403, "{}", err.message);
}

#[test]
fn deployment_makes_a_replicaset_and_pods_and_counts_them() {
    let api = server();
    api.seed_nodes(2).unwrap();
    let deploy = api.create(deployment(2, "web:1")).unwrap();
    let mut w = workloads(&api);
    // A pass makes the ReplicaSet and its pods; the next counts them into the
    // ReplicaSet's status, and the one after into the Deployment's.
    steps(&mut w, 3);
    let sets = api.list("apps/v1", "ReplicaSet").unwrap();
    assert_eq!(sets.len(), 1);
    let rs = &sets[0];
    let hash = rs["metadata"]["labels"][HASH_LABEL].as_str().unwrap();
    assert_eq!(name(rs), format!("web-{hash}"));
    assert_eq!(rs["spec"]["selector"]["matchLabels"][HASH_LABEL], hash);
    assert_eq!(rs["spec"]["replicas"], 2);
    let owner = &rs["metadata"]["ownerReferences"][0];
    assert_eq!(
        (owner["kind"].as_str(), owner["controller"].as_bool()),
        (Some("Deployment"), Some(true))
    );
    assert_eq!(owner["uid"], deploy["metadata"]["uid"]);
    let made = pods(&api, "web-");
    assert_eq!(made.len(), 2);
    let mut nodes = Vec::new();
    for pod in &made {
        let suffix = name(pod).strip_prefix(&format!("{}-", name(rs))).unwrap();
        assert_eq!(suffix.len(), 5);
        assert!(
            suffix
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        );
        assert_eq!(pod["metadata"]["labels"][HASH_LABEL], hash);
        assert_eq!(pod["metadata"]["labels"]["app"], "web");
        assert_eq!(
            pod["metadata"]["ownerReferences"][0]["uid"],
            rs["metadata"]["uid"]
        );
        assert_eq!(pod["metadata"]["ownerReferences"][0]["controller"], true);
        nodes.push(pod["spec"]["nodeName"].as_str().unwrap().to_owned());
    }
    nodes.sort();
    assert_eq!(
        nodes,
        ["node-0", "node-1"],
        "round-robin over the Ready nodes"
    );
    let status = &get(&api, "apps/v1", "Deployment", "web")["status"];
    assert_eq!(
        (
            status["replicas"].as_i64(),
            status["readyReplicas"].as_i64()
        ),
        (Some(2), Some(0))
    );
    assert_eq!(status["conditions"][0]["status"], "False", "{status}");

    set_ready(&api, name(&made[0]), "10.0.0.1", true);
    steps(&mut w, 3);
    let status = &get(&api, "apps/v1", "Deployment", "web")["status"];
    assert_eq!(status["readyReplicas"], 1);
    all_ready(&api, "web-");
    steps(&mut w, 3);
    let status = &get(&api, "apps/v1", "Deployment", "web")["status"];
    for field in [
        "replicas",
        "readyReplicas",
        "availableReplicas",
        "updatedReplicas",
    ] {
        assert_eq!(status[field], 2, "{field}: {status}");
    }
    assert_eq!(status["observedGeneration"], 1);
    assert_eq!(status["conditions"][0]["type"], "Available");
    assert_eq!(status["conditions"][0]["status"], "True");
    assert_eq!(status["conditions"][1]["reason"], "NewReplicaSetAvailable");
}

#[test]
fn a_replicaset_replaces_a_deleted_pod_and_scales_down() {
    let api = server();
    api.create(deployment(3, "web:1")).unwrap();
    let mut w = workloads(&api);
    steps(&mut w, 2);
    let made = pods(&api, "web-");
    assert_eq!(made.len(), 3);
    assert!(made[0]["spec"]["nodeName"].is_null(), "no node: unbound");
    api.delete("v1", "Pod", Some("default"), name(&made[0]))
        .unwrap();
    steps(&mut w, 1);
    assert_eq!(pods(&api, "web-").len(), 3);
    api.seed_nodes(1).unwrap();
    steps(&mut w, 1);
    assert!(
        pods(&api, "web-")
            .iter()
            .all(|p| p["spec"]["nodeName"] == "node-0")
    );
    api.merge_patch(
        "apps/v1",
        "Deployment",
        Some("default"),
        "web",
        &json!({"spec": {"replicas": 1}}),
        false,
    )
    .unwrap();
    steps(&mut w, 2);
    assert_eq!(pods(&api, "web-").len(), 1);
}

#[test]
fn a_template_change_rolls_without_losing_availability() {
    let api = server();
    api.seed_nodes(2).unwrap();
    api.create(deployment(2, "web:1")).unwrap();
    let mut w = workloads(&api);
    steps(&mut w, 2);
    all_ready(&api, "web-");
    steps(&mut w, 2);
    let old_rs = name(&api.list("apps/v1", "ReplicaSet").unwrap()[0]).to_owned();
    let patch = json!({"spec": {"template": {"spec": {"containers": [{"name": "web", "image": "web:2"}]}}}});
    api.merge_patch(
        "apps/v1",
        "Deployment",
        Some("default"),
        "web",
        &patch,
        false,
    )
    .unwrap();
    steps(&mut w, 2);
    let sets = api.list("apps/v1", "ReplicaSet").unwrap();
    assert_eq!(sets.len(), 2);
    let new_rs = name(sets.iter().find(|rs| name(rs) != old_rs).unwrap()).to_owned();
    assert_eq!(
        get(&api, "apps/v1", "ReplicaSet", &new_rs)["spec"]["replicas"],
        1,
        "maxSurge 25% of 2 is 1"
    );
    assert_eq!(
        pods(&api, &old_rs).len(),
        2,
        "old pods stay until new ones are Ready"
    );
    assert_eq!(pods(&api, &new_rs).len(), 1);
    steps(&mut w, 3);
    assert_eq!(
        pods(&api, &old_rs).len(),
        2,
        "still: the new pod is not Ready"
    );
    for round in 0..10 {
        for (i, pod) in pods(&api, &new_rs).iter().enumerate() {
            set_ready(&api, name(pod), &format!("10.1.0.{i}"), true);
        }
        w.step();
        let ready = pods(&api, "web-")
            .iter()
            .filter(|p| p["status"]["conditions"][0]["status"] == "True")
            .count();
        assert!(
            ready >= 2,
            "round {round}: {ready} Ready pods, maxUnavailable 0"
        );
    }
    assert!(pods(&api, &old_rs).is_empty());
    assert_eq!(pods(&api, &new_rs).len(), 2);
    assert_eq!(
        get(&api, "apps/v1", "ReplicaSet", &old_rs)["spec"]["replicas"],
        0
    );
    let d = get(&api, "apps/v1", "Deployment", "web");
    assert_eq!(d["status"]["updatedReplicas"], 2, "{}", d["status"]);
    assert_eq!(d["status"]["replicas"], 2);
    assert_eq!(d["status"]["observedGeneration"], 2);
    let rev = &get(&api, "apps/v1", "ReplicaSet", &new_rs)["metadata"]["annotations"];
    assert_eq!(rev["deployment.kubernetes.io/revision"], "2");
}

fn statefulset(policy: &str, replicas: i64) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "db", "namespace": "default"},
        "spec": {"replicas": replicas, "serviceName": "db-headless", "podManagementPolicy": policy,
            "selector": {"matchLabels": {"app": "db"}},
            "template": {"metadata": {"labels": {"app": "db"}},
                "spec": {"containers": [{"name": "db", "image": "db:1",
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]}},
            "volumeClaimTemplates": [{"metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}]}})
}

#[test]
fn ordered_ready_statefulset_waits_and_keeps_claims() {
    let api = server();
    api.seed_nodes(1).unwrap();
    api.create(statefulset("OrderedReady", 2)).unwrap();
    let mut w = workloads(&api);
    steps(&mut w, 3);
    let made = pods(&api, "db-");
    assert_eq!(
        made.iter().map(name).collect::<Vec<_>>(),
        ["db-0"],
        "db-1 waits for db-0"
    );
    let pod = &made[0];
    assert_eq!(pod["metadata"]["labels"][POD_NAME_LABEL], "db-0");
    assert_eq!(pod["metadata"]["labels"][POD_INDEX_LABEL], "0");
    assert_eq!(
        (
            pod["spec"]["hostname"].as_str(),
            pod["spec"]["subdomain"].as_str()
        ),
        (Some("db-0"), Some("db-headless"))
    );
    assert_eq!(
        pod["spec"]["volumes"],
        json!([{"name": "data", "persistentVolumeClaim": {"claimName": "data-db-0"}}])
    );
    assert_eq!(pod["metadata"]["ownerReferences"][0]["kind"], "StatefulSet");
    let claim = get(&api, "v1", "PersistentVolumeClaim", "data-db-0");
    assert_eq!(claim["metadata"]["labels"]["app"], "db");

    set_ready(&api, "db-0", "10.0.0.1", true);
    steps(&mut w, 1);
    assert_eq!(
        pods(&api, "db-").iter().map(name).collect::<Vec<_>>(),
        ["db-0", "db-1"]
    );
    set_ready(&api, "db-1", "10.0.0.2", true);
    steps(&mut w, 1);
    let status = &get(&api, "apps/v1", "StatefulSet", "db")["status"];
    for field in [
        "replicas",
        "readyReplicas",
        "currentReplicas",
        "availableReplicas",
    ] {
        assert_eq!(status[field], 2, "{field}: {status}");
    }

    let claim_uid =
        get(&api, "v1", "PersistentVolumeClaim", "data-db-1")["metadata"]["uid"].clone();
    let old_uid = get(&api, "v1", "Pod", "db-1")["metadata"]["uid"].clone();
    api.delete("v1", "Pod", Some("default"), "db-1").unwrap();
    steps(&mut w, 1);
    let again = get(&api, "v1", "Pod", "db-1");
    assert_ne!(
        again["metadata"]["uid"], old_uid,
        "a new pod under the same name"
    );
    assert_eq!(
        again["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"],
        "data-db-1"
    );
    assert_eq!(
        get(&api, "v1", "PersistentVolumeClaim", "data-db-1")["metadata"]["uid"],
        claim_uid
    );
    assert_eq!(
        get(&api, "apps/v1", "StatefulSet", "db")["status"]["readyReplicas"],
        1
    );
}

#[test]
fn parallel_statefulset_starts_all_and_scales_down_from_the_top() {
    let api = server();
    api.create(statefulset("Parallel", 3)).unwrap();
    let mut w = workloads(&api);
    steps(&mut w, 1);
    assert_eq!(
        pods(&api, "db-").iter().map(name).collect::<Vec<_>>(),
        ["db-0", "db-1", "db-2"]
    );
    api.merge_patch(
        "apps/v1",
        "StatefulSet",
        Some("default"),
        "db",
        &json!({"spec": {"replicas": 1}}),
        false,
    )
    .unwrap();
    steps(&mut w, 1);
    assert_eq!(
        pods(&api, "db-").iter().map(name).collect::<Vec<_>>(),
        ["db-0"]
    );
    assert!(
        api.get("v1", "PersistentVolumeClaim", Some("default"), "data-db-2")
            .is_ok(),
        "claims stay"
    );
}

fn web_pod(name: &str, app: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default", "labels": {"app": app}},
        "spec": {"containers": [{"name": "web", "image": "web", "ports": [{"name": "http", "containerPort": 8080}]}]}})
}

fn endpoints(api: &ApiServer) -> (Value, Vec<(String, bool)>) {
    let slices = api.list("discovery.k8s.io/v1", "EndpointSlice").unwrap();
    assert_eq!(slices.len(), 1, "{slices:?}");
    let slice = slices[0].clone();
    let mut listed: Vec<(String, bool)> = slice["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["addresses"][0].as_str().unwrap().to_owned(),
                e["conditions"]["ready"] == true,
            )
        })
        .collect();
    listed.sort();
    (slice, listed)
}

#[test]
fn endpoint_slices_follow_the_selected_pods() {
    let api = server();
    api.create(json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "default"},
        "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"},
            {"name": "admin", "port": 9000, "targetPort": 9001}]}}))
        .unwrap();
    for (pod, app) in [("a", "web"), ("b", "web"), ("c", "web"), ("other", "db")] {
        api.create(web_pod(pod, app)).unwrap();
    }
    set_ready(&api, "a", "10.0.0.1", true);
    set_ready(&api, "b", "10.0.0.2", true);
    set_ready(&api, "other", "10.0.0.9", true);
    let mut w = workloads(&api);
    steps(&mut w, 1);
    let (slice, listed) = endpoints(&api);
    let suffix = name(&slice).strip_prefix("web-").unwrap();
    assert_eq!(suffix.len(), 5);
    assert_eq!(
        slice["metadata"]["labels"]["kubernetes.io/service-name"],
        "web"
    );
    assert_eq!(slice["addressType"], "IPv4");
    assert_eq!(
        slice["ports"],
        json!([{"name": "http", "port": 8080, "protocol": "TCP"},
        {"name": "admin", "port": 9001, "protocol": "TCP"}])
    );
    assert_eq!(
        listed,
        [("10.0.0.1".into(), true), ("10.0.0.2".into(), true)],
        "c has no IP, other is not selected"
    );

    set_ready(&api, "b", "10.0.0.2", false);
    steps(&mut w, 1);
    let (same, listed) = endpoints(&api);
    assert_eq!(name(&same), name(&slice), "the slice is updated in place");
    assert_eq!(
        listed,
        [("10.0.0.1".into(), true), ("10.0.0.2".into(), false)],
        "b is no longer ready"
    );
    let rv = same["metadata"]["resourceVersion"].clone();
    steps(&mut w, 2);
    assert_eq!(
        endpoints(&api).0["metadata"]["resourceVersion"],
        rv,
        "nothing changed: no write"
    );

    api.merge_patch(
        "v1",
        "Service",
        Some("default"),
        "web",
        &json!({"spec": {"publishNotReadyAddresses": true}}),
        false,
    )
    .unwrap();
    steps(&mut w, 1);
    assert!(endpoints(&api).1.iter().all(|(_, ready)| *ready));
    api.delete("v1", "Pod", Some("default"), "a").unwrap();
    steps(&mut w, 1);
    assert_eq!(endpoints(&api).1, [("10.0.0.2".into(), true)]);
    api.delete("v1", "Service", Some("default"), "web").unwrap();
    assert!(
        api.list("discovery.k8s.io/v1", "EndpointSlice")
            .unwrap()
            .is_empty(),
        "owned by the Service"
    );
}

#[tokio::test]
async fn the_scale_subresource_sets_replicas() {
    use k8s_openapi::api::apps::v1::Deployment;
    use kube::api::{Patch, PatchParams};
    let api = server();
    api.create(deployment(2, "web:1")).unwrap();
    let deploys: Api<Deployment> = Api::namespaced(api.in_memory_client(), "default");
    let scale = deploys.get_scale("web").await.unwrap();
    assert_eq!(scale.spec.unwrap().replicas, Some(2));
    assert_eq!(scale.status.unwrap().selector.as_deref(), Some("app=web"));
    let patch = Patch::Merge(json!({"spec": {"replicas": 5}}));
    let scaled = deploys
        .patch_scale("web", &PatchParams::default(), &patch)
        .await
        .unwrap();
    assert_eq!(scaled.spec.unwrap().replicas, Some(5));
    assert_eq!(
        get(&api, "apps/v1", "Deployment", "web")["spec"]["replicas"],
        5
    );
    let negative = Patch::Merge(json!({"spec": {"replicas": -1}}));
    let kube::Error::Api(err) = deploys
        .patch_scale("web", &PatchParams::default(), &negative)
        .await
        .unwrap_err()
    else {
        panic!("not an API error");
    };
    assert_eq!(err.code, 422);
    let sets: Api<StatefulSet> = Api::namespaced(api.in_memory_client(), "default");
    api.create(statefulset("Parallel", 1)).unwrap();
    let patch = Patch::Merge(json!({"spec": {"replicas": 3}}));
    sets.patch_scale("db", &PatchParams::default(), &patch)
        .await
        .unwrap();
    let mut w = workloads(&api);
    steps(&mut w, 1);
    assert_eq!(pods(&api, "db-").len(), 3);
}

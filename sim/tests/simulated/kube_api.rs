//! The simulated API server, driven through a real `kube::Client` (and kube-runtime).

use std::{sync::Arc, time::Duration};

use crate::common;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::{
    coordination::v1::{Lease, LeaseSpec},
    core::v1::{ConfigMap, Node, Pod},
};
use kube::{
    Api, Client, CustomResource, CustomResourceExt, Resource, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams},
    core::{ObjectMeta, PartialObjectMeta, Status},
    runtime::{
        Controller,
        controller::Action,
        finalizer::{Event as FinalizerEvent, finalizer},
        watcher,
    },
};
use serde::{Deserialize, Serialize};
use serde_json::json;
use spur_fakes::api_server::{ApiServer, ApiServerConfig, ClientOptions, CutKind, OutageMode};
use tokio::time::timeout;

#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize)]
#[kube(
    group = "spur.amd.com",
    version = "v1alpha1",
    kind = "SpurJob",
    plural = "spurjobs",
    namespaced,
    status = "SpurJobStatus",
    schema = "disabled"
)]
pub struct SpurJobSpec {
    script: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SpurJobStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    spur_job_id: Option<u64>,
}

/// A server with the SpurJob CRD applied, and a client to it over in-memory pipes.
async fn setup() -> (ApiServer, Client) {
    let server = ApiServer::new(ApiServerConfig::default());
    let client = server.in_memory_client();
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(client.clone());
    crds.create(&PostParams::default(), &SpurJob::crd())
        .await
        .expect("the CRD is accepted");
    // As an operator does: wait for Established (a watch with a field selector).
    let established = kube::runtime::wait::await_condition(
        crds,
        "spurjobs.spur.amd.com",
        kube::runtime::wait::conditions::is_crd_established(),
    );
    timeout(Duration::from_secs(10), established)
        .await
        .expect("established in time")
        .unwrap();
    (server, client)
}

fn job(name: &str) -> SpurJob {
    SpurJob::new(
        name,
        SpurJobSpec {
            script: "echo hi".into(),
        },
    )
}

fn api_error(err: kube::Error) -> Status {
    match err {
        kube::Error::Api(status) => *status,
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn names<K: Resource>(items: &[K]) -> Vec<String> {
    items
        .iter()
        .map(|o| o.meta().name.clone().unwrap_or_default())
        .collect()
}

#[tokio::test(start_paused = true)]
async fn list_with_label_and_field_selectors_and_paging() {
    let server = ApiServer::new(ApiServerConfig::default());
    server.seed_nodes(7).unwrap();
    server
        .create(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "other", "labels": {"pool": "cpu"}}}))
        .unwrap();
    let nodes: Api<Node> = Api::all(server.in_memory_client());

    let managed = nodes
        .list(&ListParams::default().labels("spur.amd.com/managed=true"))
        .await
        .unwrap();
    assert_eq!(managed.items.len(), 7);
    assert_eq!(
        managed.metadata.resource_version,
        Some(server.resource_version().to_string())
    );
    let check = |sel: &'static str, want: &'static [&'static str]| {
        let nodes = nodes.clone();
        async move {
            let got = nodes
                .list(&ListParams::default().labels(sel))
                .await
                .unwrap();
            assert_eq!(names(&got.items), want, "labelSelector {sel}");
        }
    };
    check("pool==cpu", &["other"]).await;
    check("spur.amd.com/managed!=true", &["other"]).await;
    check("pool in (gpu,cpu)", &["other"]).await;
    check(
        "kubernetes.io/hostname notin (node-0,node-1,node-2,node-3,node-4,node-5)",
        &["node-6", "other"],
    )
    .await;
    check("pool", &["other"]).await;
    check("!pool,kubernetes.io/hostname in (node-3)", &["node-3"]).await;
    let by_name = nodes
        .list(&ListParams::default().fields("metadata.name=node-2"))
        .await
        .unwrap();
    assert_eq!(names(&by_name.items), ["node-2"]);

    // Paging: three pages of three, each page's continue token leads to the next.
    let mut seen = Vec::new();
    let mut params = ListParams::default().limit(3);
    let mut pages = 0;
    loop {
        let page = nodes.list(&params).await.unwrap();
        pages += 1;
        seen.extend(names(&page.items));
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(
        seen,
        [
            "node-0", "node-1", "node-2", "node-3", "node-4", "node-5", "node-6", "other"
        ]
    );

    // Namespaced: a namespace's list sees only its own.
    for ns in ["a", "b"] {
        server
            .create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))
            .unwrap();
    }
    let pods_a: Api<Pod> = Api::namespaced(nodes.clone().into_client(), "a");
    let pods_b: Api<Pod> = Api::namespaced(nodes.into_client(), "b");
    pods_a
        .create(&PostParams::default(), &pod("p1"))
        .await
        .unwrap();
    pods_b
        .create(&PostParams::default(), &pod("p2"))
        .await
        .unwrap();
    assert_eq!(
        names(&pods_a.list(&ListParams::default()).await.unwrap().items),
        ["p1"]
    );
    let all: Api<Pod> = Api::all(pods_a.clone().into_client());
    assert_eq!(
        names(&all.list(&ListParams::default()).await.unwrap().items),
        ["p1", "p2"]
    );
    // deletecollection removes what the selector picks, in one namespace only.
    pods_a
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .unwrap();
    assert_eq!(
        names(&all.list(&ListParams::default()).await.unwrap().items),
        ["p2"]
    );
}

fn pod(name: &str) -> Pod {
    serde_json::from_value(
        json!({"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "x"}]}}),
    )
    .unwrap()
}

#[tokio::test(start_paused = true)]
async fn watch_from_a_resource_version_sees_every_change_in_order() {
    let (_server, client) = setup().await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let mut before = ConfigMap {
        metadata: ObjectMeta {
            name: Some("before".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    cms.create(&PostParams::default(), &before).await.unwrap();
    let rv = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();

    let mut stream = cms
        .watch(&WatchParams::default().timeout(60), &rv)
        .await
        .unwrap()
        .boxed();
    before.metadata.name = Some("cm".into());
    cms.create(&PostParams::default(), &before).await.unwrap();
    for i in 0..3 {
        cms.patch(
            "cm",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"i": i.to_string()}})),
        )
        .await
        .unwrap();
    }
    cms.delete("cm", &DeleteParams::default()).await.unwrap();

    let mut seen = Vec::new();
    let mut last_rv = rv.parse::<u64>().unwrap();
    while seen.len() < 5 {
        let event = timeout(Duration::from_secs(30), stream.try_next())
            .await
            .expect("an event")
            .unwrap()
            .unwrap();
        let (kind, obj) = match event {
            WatchEvent::Added(o) => ("ADDED", o),
            WatchEvent::Modified(o) => ("MODIFIED", o),
            WatchEvent::Deleted(o) => ("DELETED", o),
            other => panic!("unexpected {other:?}"),
        };
        let obj_rv: u64 = obj.resource_version().unwrap().parse().unwrap();
        assert!(obj_rv > last_rv, "resourceVersions increase");
        last_rv = obj_rv;
        seen.push(format!(
            "{kind} {}",
            obj.data
                .as_ref()
                .and_then(|d| d.get("i"))
                .cloned()
                .unwrap_or_default()
        ));
    }
    assert_eq!(
        seen,
        [
            "ADDED ",
            "MODIFIED 0",
            "MODIFIED 1",
            "MODIFIED 2",
            "DELETED 2"
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn watcher_relists_after_an_in_stream_410() {
    let (server, client) = setup().await;
    let jobs: Api<SpurJob> = Api::namespaced(client, "default");
    jobs.create(&PostParams::default(), &job("first"))
        .await
        .unwrap();
    // Polled on its own task, so the watch is open when the fault strikes.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut stream = watcher(jobs.clone(), watcher::Config::default()).boxed();
    tokio::spawn(async move {
        while let Some(event) = stream.next().await {
            let _ = tx.send(event);
        }
    });
    let mut next = async || {
        timeout(Duration::from_secs(60), rx.recv())
            .await
            .expect("the watcher goes on")
            .expect("not ended")
    };
    assert!(matches!(next().await, Ok(watcher::Event::Init)));
    assert!(matches!(next().await, Ok(watcher::Event::InitApply(j)) if j.name_any() == "first"));
    assert!(matches!(next().await, Ok(watcher::Event::InitDone)));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(server.watch_counts(), (1, 1), "the watch is open");

    server.expire_resource_versions();
    let err = next().await.expect_err("the 410 surfaces");
    assert!(format!("{err:?}").contains("410"), "{err:?}");

    // The watcher lists again, then follows changes on a new watch.
    assert!(matches!(next().await, Ok(watcher::Event::Init)));
    assert!(matches!(next().await, Ok(watcher::Event::InitApply(j)) if j.name_any() == "first"));
    assert!(matches!(next().await, Ok(watcher::Event::InitDone)));
    jobs.create(&PostParams::default(), &job("second"))
        .await
        .unwrap();
    assert!(matches!(next().await, Ok(watcher::Event::Apply(j)) if j.name_any() == "second"));
    assert_eq!(server.watch_counts(), (2, 1));
}

#[derive(Debug, thiserror::Error)]
#[error("reconcile failed")]
struct ReconcileError;

#[tokio::test(start_paused = true)]
async fn watcher_resumes_after_a_cut_watch_without_missing_changes() {
    let (server, client) = setup().await;
    let jobs: Api<SpurJob> = Api::namespaced(client, "default");
    // The watcher only makes requests while polled: poll it on its own task.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut stream = watcher(jobs.clone(), watcher::Config::default()).boxed();
    tokio::spawn(async move {
        while let Some(event) = stream.next().await {
            let _ = tx.send(event);
        }
    });
    let mut next = async || {
        timeout(Duration::from_secs(60), rx.recv())
            .await
            .expect("goes on")
            .expect("not ended")
    };
    assert!(matches!(next().await, Ok(watcher::Event::Init)));
    assert!(matches!(next().await, Ok(watcher::Event::InitDone)));
    // Let the watch request reach the server before cutting it.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(server.watch_counts(), (1, 1));
    server.faults().cut_watches(CutKind::Abort);
    jobs.create(&PostParams::default(), &job("during-cut"))
        .await
        .unwrap();
    let mut applied = Vec::new();
    let mut errors = 0;
    while applied.is_empty() {
        match next().await {
            Ok(watcher::Event::Apply(j)) => applied.push(j.name_any()),
            Ok(other) => panic!("a cut watch resumes without a re-list, got {other:?}"),
            Err(_) => errors += 1,
        }
    }
    assert_eq!(applied, ["during-cut"]);
    // kube-rs takes the broken body for the end of the stream and watches again from the
    // last version it saw: no error, no re-list, nothing missed.
    assert_eq!(errors, 0);
    assert_eq!(
        server.watch_counts(),
        (2, 1),
        "one new watch replaced the cut one"
    );
    // A status write on a kind without a status subresource is a 404.
    let leases: Api<Lease> = Api::namespaced(jobs.into_client(), "default");
    let err = leases
        .patch_status("x", &PatchParams::default(), &Patch::Merge(json!({})))
        .await
        .unwrap_err();
    assert_eq!(api_error(err).code, 404);
}

#[tokio::test(start_paused = true)]
async fn finalizer_helper_adds_and_removes_its_finalizer() {
    const FINALIZER: &str = "spur.amd.com/cancel-job";
    let (_server, client) = setup().await;
    let jobs: Api<SpurJob> = Api::namespaced(client, "default");
    jobs.create(&PostParams::default(), &job("j"))
        .await
        .unwrap();
    let cleaned = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let run = |obj: SpurJob| {
        let jobs = jobs.clone();
        let cleaned = cleaned.clone();
        async move {
            finalizer(&jobs, FINALIZER, Arc::new(obj), |event| async move {
                match event {
                    FinalizerEvent::Apply(_) => Ok::<_, ReconcileError>(Action::await_change()),
                    FinalizerEvent::Cleanup(_) => {
                        cleaned.store(true, std::sync::atomic::Ordering::SeqCst);
                        Ok(Action::await_change())
                    }
                }
            })
            .await
        }
    };
    run(jobs.get("j").await.unwrap()).await.unwrap();
    assert_eq!(jobs.get("j").await.unwrap().finalizers(), [FINALIZER]);
    run(jobs.get("j").await.unwrap()).await.unwrap();
    assert!(!cleaned.load(std::sync::atomic::Ordering::SeqCst));

    jobs.delete("j", &DeleteParams::default()).await.unwrap();
    let deleting = jobs.get("j").await.unwrap();
    assert!(
        deleting.metadata.deletion_timestamp.is_some(),
        "the finalizer holds the object"
    );
    run(deleting).await.unwrap();
    assert!(cleaned.load(std::sync::atomic::Ordering::SeqCst));
    assert_eq!(
        api_error(jobs.get("j").await.unwrap_err()).code,
        404,
        "gone once the finalizer is removed"
    );
}

#[tokio::test(start_paused = true)]
async fn status_patch_does_not_bump_generation_and_status_conflicts_on_demand() {
    let (server, client) = setup().await;
    let jobs: Api<SpurJob> = Api::namespaced(client, "default");
    let created = jobs
        .create(&PostParams::default(), &job("j"))
        .await
        .unwrap();
    assert_eq!(created.metadata.generation, Some(1));

    let status = Patch::Merge(json!({"status": {"spurJobId": 7}}));
    let patched = jobs
        .patch_status("j", &PatchParams::default(), &status)
        .await
        .unwrap();
    assert_eq!(
        patched.status,
        Some(SpurJobStatus {
            spur_job_id: Some(7)
        })
    );
    assert_eq!(patched.metadata.generation, Some(1));
    assert_ne!(patched.resource_version(), created.resource_version());

    // Status through the main resource is ignored; a spec change bumps generation.
    let main = Patch::Merge(json!({"spec": {"script": "true"}, "status": {"spurJobId": 9}}));
    let patched = jobs
        .patch("j", &PatchParams::default(), &main)
        .await
        .unwrap();
    assert_eq!(patched.metadata.generation, Some(2));
    assert_eq!(
        patched.status,
        Some(SpurJobStatus {
            spur_job_id: Some(7)
        })
    );

    // A status subresource write changes nothing but status.
    let sneaky = Patch::Merge(json!({"spec": {"script": "rm"}, "status": {"spurJobId": 8}}));
    let patched = jobs
        .patch_status("j", &PatchParams::default(), &sneaky)
        .await
        .unwrap();
    assert_eq!(patched.spec.script, "true");
    assert_eq!(patched.metadata.generation, Some(2));

    server.faults().conflict_next_status_writes(1);
    let err = jobs
        .patch_status("j", &PatchParams::default(), &status)
        .await
        .unwrap_err();
    assert_eq!(api_error(err).code, 409);
    jobs.patch_status("j", &PatchParams::default(), &status)
        .await
        .expect("only the next write conflicts");

    // Server-side apply: a forced merge that creates when missing.
    let apply = PatchParams::apply("spur-operator").force();
    let mut applied = job("applied");
    applied.metadata.labels = Some([("a".to_owned(), "b".to_owned())].into());
    let out = jobs
        .patch("applied", &apply, &Patch::Apply(&applied))
        .await
        .unwrap();
    assert_eq!(out.labels().get("a").map(String::as_str), Some("b"));
}

#[tokio::test(start_paused = true)]
async fn stale_resource_version_gets_409() {
    let (_server, client) = setup().await;
    let jobs: Api<SpurJob> = Api::namespaced(client, "default");
    let old = jobs
        .create(&PostParams::default(), &job("j"))
        .await
        .unwrap();
    let mut fresh = old.clone();
    fresh.spec.script = "one".into();
    jobs.replace("j", &PostParams::default(), &fresh)
        .await
        .unwrap();
    let mut stale = old;
    stale.spec.script = "two".into();
    let err = api_error(
        jobs.replace("j", &PostParams::default(), &stale)
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
    let err = api_error(
        jobs.create(&PostParams::default(), &job("j"))
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (409, "AlreadyExists"));
    // A JSON patch whose `test` fails is refused and changes nothing.
    let test = Patch::<()>::Json(
        serde_json::from_value(json!([
            {"op": "test", "path": "/spec/script", "value": "two"},
            {"op": "replace", "path": "/spec/script", "value": "three"}
        ]))
        .unwrap(),
    );
    let err = api_error(
        jobs.patch("j", &PatchParams::default(), &test)
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 422);
    assert_eq!(jobs.get("j").await.unwrap().spec.script, "one");
}

#[tokio::test(start_paused = true)]
async fn lease_is_created_renewed_with_a_precondition_and_taken_over() {
    let (_server, client) = setup().await;
    let leases: Api<Lease> = Api::namespaced(client, "default");
    let lease = |holder: &str| Lease {
        metadata: ObjectMeta {
            name: Some("spur-operator".into()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(15),
            ..Default::default()
        }),
    };
    let held = leases
        .create(&PostParams::default(), &lease("a"))
        .await
        .unwrap();

    // a renews with its resourceVersion as a precondition.
    let mut renew = held.clone();
    renew.spec.as_mut().unwrap().renew_time =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
    let renewed = leases
        .replace("spur-operator", &PostParams::default(), &renew)
        .await
        .unwrap();
    assert_ne!(renewed.resource_version(), held.resource_version());

    // b, holding the old version, cannot take it...
    let mut grab = held.clone();
    grab.spec.as_mut().unwrap().holder_identity = Some("b".into());
    assert_eq!(
        api_error(
            leases
                .replace("spur-operator", &PostParams::default(), &grab)
                .await
                .unwrap_err()
        )
        .code,
        409
    );
    // ...until it reads the current one.
    let mut grab = leases.get("spur-operator").await.unwrap();
    grab.spec.as_mut().unwrap().holder_identity = Some("b".into());
    let taken = leases
        .replace("spur-operator", &PostParams::default(), &grab)
        .await
        .unwrap();
    assert_eq!(taken.spec.unwrap().holder_identity.as_deref(), Some("b"));
    // a's renewal from before the takeover now fails.
    assert_eq!(
        api_error(
            leases
                .replace("spur-operator", &PostParams::default(), &renewed)
                .await
                .unwrap_err()
        )
        .code,
        409
    );
}

#[tokio::test(start_paused = true)]
async fn object_with_a_finalizer_is_deleted_in_two_steps() {
    let (_server, client) = setup().await;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let mut p = pod("p");
    p.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    let created = pods.create(&PostParams::default(), &p).await.unwrap();
    let mut stream = pods
        .watch(
            &WatchParams::default(),
            &created.resource_version().unwrap(),
        )
        .await
        .unwrap()
        .boxed();

    let first = pods.delete("p", &DeleteParams::default()).await.unwrap();
    let held = first.left().expect("the object, still there");
    assert!(held.metadata.deletion_timestamp.is_some());
    assert!(pods.get("p").await.is_ok());
    // Deleting again changes nothing.
    pods.delete("p", &DeleteParams::default()).await.unwrap();

    let remove = Patch::<()>::Json(
        serde_json::from_value(json!([
            {"op": "test", "path": "/metadata/finalizers/0", "value": "example.com/hold"},
            {"op": "remove", "path": "/metadata/finalizers/0"}
        ]))
        .unwrap(),
    );
    pods.patch("p", &PatchParams::default(), &remove)
        .await
        .unwrap();
    assert_eq!(api_error(pods.get("p").await.unwrap_err()).code, 404);

    let mut kinds = Vec::new();
    while kinds.len() < 2 {
        match timeout(Duration::from_secs(30), stream.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            WatchEvent::Modified(p) => kinds.push(format!(
                "MODIFIED deleting={}",
                p.metadata.deletion_timestamp.is_some()
            )),
            WatchEvent::Deleted(_) => kinds.push("DELETED".into()),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(kinds, ["MODIFIED deleting=true", "DELETED"]);
}

#[tokio::test(start_paused = true)]
async fn controller_reconciles_an_object_created_after_it_started() {
    let (_server, client) = setup().await;
    let jobs: Api<SpurJob> = Api::namespaced(client.clone(), "default");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();

    struct Ctx {
        jobs: Api<SpurJob>,
        tx: tokio::sync::mpsc::UnboundedSender<String>,
    }
    async fn reconcile(job: Arc<SpurJob>, ctx: Arc<Ctx>) -> Result<Action, kube::Error> {
        let status = Patch::Merge(json!({"status": {"spurJobId": 1}}));
        ctx.jobs
            .patch_status(&job.name_any(), &PatchParams::default(), &status)
            .await?;
        let _ = ctx.tx.send(job.name_any());
        Ok(Action::await_change())
    }
    fn error_policy(_: Arc<SpurJob>, _: &kube::Error, _: Arc<Ctx>) -> Action {
        Action::requeue(Duration::from_secs(1))
    }
    let ctx = Arc::new(Ctx {
        jobs: jobs.clone(),
        tx,
    });
    tokio::spawn(
        Controller::new(jobs.clone(), watcher::Config::default())
            .run(reconcile, error_policy, ctx)
            .for_each(|_| async {}),
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    jobs.create(&PostParams::default(), &job("late"))
        .await
        .unwrap();
    let name = timeout(Duration::from_secs(30), rx.recv())
        .await
        .expect("reconciled in time")
        .unwrap();
    assert_eq!(name, "late");
    assert_eq!(
        jobs.get("late").await.unwrap().status,
        Some(SpurJobStatus {
            spur_job_id: Some(1)
        })
    );
}

#[tokio::test(start_paused = true)]
async fn metadata_only_list_and_watch() {
    let (_server, client) = setup().await;
    let jobs: Api<SpurJob> = Api::namespaced(client, "default");
    jobs.create(&PostParams::default(), &job("m"))
        .await
        .unwrap();
    let list = jobs.list_metadata(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    assert_eq!(list.items[0].metadata.name.as_deref(), Some("m"));

    // Api<PartialObjectMeta<K>> makes kube-runtime's watcher ask for metadata only.
    let metas: Api<PartialObjectMeta<SpurJob>> =
        Api::namespaced(jobs.clone().into_client(), "default");
    let mut events = watcher(metas, watcher::Config::default()).boxed();
    let mut names = Vec::new();
    while names.len() < 2 {
        match timeout(Duration::from_secs(30), events.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            watcher::Event::InitApply(m) | watcher::Event::Apply(m) => {
                names.push(m.metadata.name.unwrap())
            }
            watcher::Event::InitDone => {
                jobs.create(&PostParams::default(), &job("n"))
                    .await
                    .unwrap();
            }
            _ => {}
        }
    }
    assert_eq!(names, ["m", "n"]);
}

#[tokio::test(start_paused = true)]
async fn bad_input_gets_a_status_and_the_server_goes_on() {
    let (_server, client) = setup().await;
    let jobs: Api<SpurJob> = Api::namespaced(client.clone(), "default");
    jobs.create(&PostParams::default(), &job("j"))
        .await
        .unwrap();
    let send = |method: &str, uri: &str, content_type: &str, body: &str| {
        let req = http::Request::builder()
            .method(method)
            .uri(uri)
            .header("content-type", content_type)
            .body(body.as_bytes().to_vec())
            .unwrap();
        let client = client.clone();
        async move {
            let err = client
                .request::<serde_json::Value>(req)
                .await
                .expect_err("refused");
            api_error(err)
        }
    };
    let base = "/apis/spur.amd.com/v1alpha1/namespaces/default/spurjobs";
    let err = send(
        "PATCH",
        &format!("{base}/j"),
        "application/merge-patch+json",
        "{not json",
    )
    .await;
    assert_eq!((err.code, err.reason.as_str()), (400, "BadRequest"));
    let err = send(
        "PATCH",
        &format!("{base}/j"),
        "application/json-patch+json",
        "[{\"op\":\"jump\"}]",
    )
    .await;
    assert_eq!(err.code, 400);
    let err = send("PATCH", &format!("{base}/j"), "text/plain", "{}").await;
    assert_eq!(
        (err.code, err.reason.as_str()),
        (415, "UnsupportedMediaType")
    );
    let err = send("POST", base, "application/yaml", "metadata: {name: y}").await;
    assert_eq!(err.code, 415);
    let err = send("POST", base, "application/json", "metadata: {name: y}").await;
    assert_eq!(err.code, 400);
    let err = send(
        "GET",
        "/apis/spur.amd.com/v1alpha1/namespaces/default/widgets",
        "application/json",
        "",
    )
    .await;
    assert_eq!((err.code, err.reason.as_str()), (404, "NotFound"));
    let err = send(
        "GET",
        "/apis/nope.example.com/v1/things",
        "application/json",
        "",
    )
    .await;
    assert_eq!(err.code, 404);
    let err = send(
        "GET",
        &format!("{base}?labelSelector=a%20in%20b"),
        "application/json",
        "",
    )
    .await;
    assert_eq!(err.code, 400);
    // Still serving.
    assert_eq!(jobs.get("j").await.unwrap().name_any(), "j");
}

#[tokio::test(start_paused = true)]
async fn faults_outage_latency_and_cut_watches() {
    let (server, client) = setup().await;
    let jobs: Api<SpurJob> = Api::namespaced(client, "default");
    jobs.create(&PostParams::default(), &job("j"))
        .await
        .unwrap();

    // kube's default client rides out a short 503 outage by retrying...
    server
        .faults()
        .outage_for(OutageMode::Unavailable, Duration::from_secs(10));
    jobs.get("j").await.expect("retried until the outage ended");
    // ...and a client without retries sees the 503.
    let no_retry = ClientOptions {
        retry_server_errors: false,
        bearer_token: Some(server.admin_token()),
        ..ClientOptions::default()
    };
    let bare: Api<SpurJob> = Api::namespaced(server.in_memory_client_with(&no_retry), "default");
    server.faults().start_outage(OutageMode::Unavailable);
    assert_eq!(api_error(bare.get("j").await.unwrap_err()).code, 503);
    server.faults().end_outage();

    server.faults().start_outage(OutageMode::Hang);
    assert!(
        timeout(Duration::from_secs(10), jobs.get("j"))
            .await
            .is_err(),
        "a hung server never answers"
    );
    server
        .faults()
        .outage_for(OutageMode::Hang, Duration::from_secs(20));
    let start = tokio::time::Instant::now();
    jobs.get("j").await.expect("answers once the outage ends");
    assert!(start.elapsed() >= Duration::from_secs(20));

    server.faults().set_latency(Duration::from_secs(3));
    let start = tokio::time::Instant::now();
    jobs.get("j").await.unwrap();
    assert!(start.elapsed() >= Duration::from_secs(3));
    server.faults().set_latency(Duration::ZERO);

    let rv = jobs.get("j").await.unwrap().resource_version().unwrap();
    let mut stream = jobs
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    server.faults().cut_watches(CutKind::Abort);
    let end = timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("the cut is seen");
    assert!(matches!(end, Some(Err(_)) | None), "{end:?}");
    // A watch from an expired version gets an in-stream 410.
    server.expire_resource_versions();
    let mut stream = jobs
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    match timeout(Duration::from_secs(10), stream.try_next())
        .await
        .unwrap()
        .unwrap()
    {
        Some(WatchEvent::Error(e)) => assert_eq!(e.code, 410),
        other => panic!("expected a 410 event, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn same_seed_same_objects() {
    async fn run() -> Vec<serde_json::Value> {
        let server = ApiServer::new(ApiServerConfig::default());
        server.seed_nodes(3).unwrap();
        tokio::time::sleep(Duration::from_secs(42)).await;
        let client = server.in_memory_client();
        let pods: Api<Pod> = Api::namespaced(client, "default");
        let mut p = pod("");
        p.metadata.generate_name = Some("worker-".into());
        pods.create(&PostParams::default(), &p).await.unwrap();
        let mut all = server.list("v1", "Node").unwrap();
        all.extend(server.list("v1", "Pod").unwrap());
        all
    }
    let a = run().await;
    let b = run().await;
    assert_eq!(a, b);
    assert!(
        a[3]["metadata"]["name"]
            .as_str()
            .unwrap()
            .starts_with("worker-")
    );
    assert_eq!(
        a[3]["metadata"]["creationTimestamp"],
        "2026-01-01T00:00:42Z"
    );
}

#[tokio::test(start_paused = true)]
async fn watch_sends_bookmarks_and_ends_at_its_timeout() {
    let (_server, client) = setup().await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let rv = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let start = tokio::time::Instant::now();
    let mut stream = cms
        .watch(&WatchParams::default().timeout(150), &rv)
        .await
        .unwrap()
        .boxed();
    let mut bookmarks = Vec::new();
    while let Some(event) = stream.try_next().await.unwrap() {
        match event {
            WatchEvent::Bookmark(b) => {
                bookmarks.push((start.elapsed().as_secs(), b.metadata.resource_version))
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(bookmarks, [(60, rv.clone()), (120, rv)]);
    assert_eq!(
        start.elapsed().as_secs(),
        150,
        "the stream ends at timeoutSeconds"
    );
}

#[tokio::test(start_paused = true)]
async fn a_label_filtered_watch_sees_objects_move_in_and_out() {
    let (_server, client) = setup().await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let rv = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut stream = cms
        .watch(&WatchParams::default().labels("app=x"), &rv)
        .await
        .unwrap()
        .boxed();
    let label = |v: &str| Patch::Merge(json!({"metadata": {"labels": {"app": v}}}));
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some("cm".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    cms.create(&PostParams::default(), &cm).await.unwrap();
    for value in ["x", "y", "x"] {
        cms.patch("cm", &PatchParams::default(), &label(value))
            .await
            .unwrap();
    }
    cms.delete("cm", &DeleteParams::default()).await.unwrap();
    let mut seen = Vec::new();
    while seen.len() < 4 {
        match timeout(Duration::from_secs(30), stream.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            WatchEvent::Added(_) => seen.push("ADDED"),
            WatchEvent::Modified(_) => seen.push("MODIFIED"),
            WatchEvent::Deleted(_) => seen.push("DELETED"),
            WatchEvent::Bookmark(_) => {}
            WatchEvent::Error(e) => panic!("{e:?}"),
        }
    }
    assert_eq!(seen, ["ADDED", "DELETED", "ADDED", "DELETED"]);
}

#[tokio::test(start_paused = true)]
async fn kube_runtime_recorder_creates_then_patches_an_event_series() {
    use k8s_openapi::api::events::v1::Event as K8sEvent;
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    let (_server, client) = setup().await;
    let jobs: Api<SpurJob> = Api::namespaced(client.clone(), "default");
    let created = jobs
        .create(&PostParams::default(), &job("j"))
        .await
        .unwrap();
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "spur-operator".into(),
            instance: None,
        },
    );
    let event = Event {
        type_: EventType::Warning,
        reason: "SubmitFailed".into(),
        note: Some("controller unavailable".into()),
        action: "Submit".into(),
        secondary: None,
    };
    for _ in 0..2 {
        recorder
            .publish(&event, &created.object_ref(&()))
            .await
            .unwrap();
    }
    let events: Api<K8sEvent> = Api::namespaced(client, "default");
    let list = events.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    let recorded = &list.items[0];
    assert_eq!(recorded.reason.as_deref(), Some("SubmitFailed"));
    assert_eq!(
        recorded.regarding.as_ref().and_then(|r| r.name.as_deref()),
        Some("j")
    );
    assert_eq!(recorded.series.as_ref().map(|s| s.count), Some(2));
}

#[test]
fn a_client_on_another_turmoil_host_talks_to_the_server() {
    use spur_fakes::api_server::client_over_with;
    use spur_sim::net::BareTurmoilDialer;
    spur_sim::determinism::install_turmoil_host_world();
    let mut sim = turmoil::Builder::new()
        .simulation_duration(Duration::from_secs(120))
        .build();
    let server = ApiServer::new(ApiServerConfig::default());
    server.seed_nodes(2).unwrap();
    let options = ClientOptions {
        bearer_token: Some(server.admin_token()),
        ..ClientOptions::default()
    };
    sim.host("kube-api", move || {
        let server = server.clone();
        async move {
            let listener = spur_sim::net::SimListener::bind(6443).await?;
            server.serve(listener).await?;
            Ok(())
        }
    });
    sim.client("operator", async move {
        let client = client_over_with(BareTurmoilDialer, "kube-api", 6443, &options);
        let nodes: Api<Node> = Api::all(client.clone());
        let list = nodes
            .list(&ListParams::default().labels("spur.amd.com/managed=true"))
            .await?;
        assert_eq!(names(&list.items), ["node-0", "node-1"]);
        let cms: Api<ConfigMap> = Api::namespaced(client, "default");
        let mut events = watcher(cms.clone(), watcher::Config::default()).boxed();
        assert!(matches!(
            events.try_next().await?,
            Some(watcher::Event::Init)
        ));
        assert!(matches!(
            events.try_next().await?,
            Some(watcher::Event::InitDone)
        ));
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some("over-turmoil".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        cms.create(&PostParams::default(), &cm).await?;
        match events.try_next().await? {
            Some(watcher::Event::Apply(cm)) => assert_eq!(cm.name_any(), "over-turmoil"),
            other => panic!("unexpected {other:?}"),
        }
        // The created object carries simulated time, not the wall clock.
        let created = cms.get("over-turmoil").await?;
        let stamp = created.metadata.creation_timestamp.unwrap().0.to_string();
        assert!(stamp.starts_with("2026-01-01T00:00:0"), "{stamp}");
        Ok(())
    });
    sim.run().unwrap();
}

/// `spur-sim kube-api` over real TCP, driven by kubectl and by kube-rs from the kubeconfig it
/// writes.
#[tokio::test]
async fn kubectl_against_the_tcp_mode() {
    let server = common::kubectl::KubeApiProcess::start("kubectl", 2);
    let kubeconfig = server.kubeconfig.clone();
    let run = |args: &[&str], stdin: Option<&str>| server.kubectl(args, stdin);
    // The CRD goes first, so that kubectl finds SpurJob in discovery for the next call.
    let crd = serde_json::to_string(&SpurJob::crd()).unwrap();
    run(&["create", "-f", "-"], Some(&crd));
    let manifests = |holder: &str| {
        serde_json::to_string(&json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "spur.amd.com/v1alpha1", "kind": "SpurJob", "metadata": {"name": "hello"}, "spec": {"script": "true"}},
            {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "spur-operator"}, "spec": {"holderIdentity": holder}},
        ]}))
        .unwrap()
    };
    let created = run(&["apply", "-f", "-"], Some(&manifests("a")));
    assert!(
        created.contains("spurjob.spur.amd.com/hello created"),
        "{created}"
    );
    // A second apply patches (strategic merge) only what changed.
    let applied = run(&["apply", "-f", "-"], Some(&manifests("b")));
    assert!(
        applied.contains("lease.coordination.k8s.io/spur-operator configured"),
        "{applied}"
    );
    assert!(
        applied.contains("spurjob.spur.amd.com/hello unchanged"),
        "{applied}"
    );
    let holder = run(
        &[
            "get",
            "lease",
            "spur-operator",
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ],
        None,
    );
    assert_eq!(holder.trim(), "b");

    let names = run(&["get", "nodes,pods,leases,spurjobs", "-o", "name"], None);
    for want in [
        "node/node-0",
        "node/node-1",
        "lease.coordination.k8s.io/spur-operator",
        "spurjob.spur.amd.com/hello",
    ] {
        assert!(names.contains(want), "{want} missing from {names}");
    }
    let table = run(&["get", "nodes", "-l", "spur.amd.com/managed=true"], None);
    assert!(
        table.contains("NAME") && table.contains("node-1"),
        "{table}"
    );

    // kube-rs from the same kubeconfig sees kubectl's objects, and kubectl sees its writes.
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&kubeconfig).unwrap(),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    let jobs: Api<SpurJob> = Api::default_namespaced(Client::try_from(config).unwrap());
    let status = Patch::Merge(json!({"status": {"spurJobId": 42}}));
    jobs.patch_status("hello", &PatchParams::default(), &status)
        .await
        .unwrap();
    let id = run(
        &[
            "get",
            "spurjob",
            "hello",
            "-o",
            "jsonpath={.status.spurJobId}",
        ],
        None,
    );
    assert_eq!(id.trim(), "42");

    run(&["delete", "spurjob", "hello"], None);
    let left = run(&["get", "spurjobs"], None);
    assert!(left.contains("No resources found"), "{left}");
    assert_eq!(api_error(jobs.get("hello").await.unwrap_err()).code, 404);

    drop(server);
}

/// Every change of one turmoil run, as the observer sees it.
fn turmoil_trace(seed: u64) -> Vec<String> {
    use spur_fakes::api_server::{client_over_with, store::StoreConfig};
    use spur_sim::net::BareTurmoilDialer;
    let server = ApiServer::new(ApiServerConfig {
        store: StoreConfig {
            seed,
            ..StoreConfig::default()
        },
        clock: None,
        ..ApiServerConfig::default()
    });
    let options = ClientOptions {
        bearer_token: Some(server.admin_token()),
        ..ClientOptions::default()
    };
    let trace = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = trace.clone();
    server.observe(move |change| {
        let line = format!("{} {} {}", change.rv, change.kind.as_str(), change.object);
        sink.lock().unwrap().push(line);
    });
    spur_sim::determinism::install_turmoil_host_world();
    let mut sim = turmoil::Builder::new()
        .simulation_duration(Duration::from_secs(60))
        .rng_seed(seed)
        .build();
    let host_server = server.clone();
    sim.host("kube-api", move || {
        let server = host_server.clone();
        async move {
            server
                .serve(spur_sim::net::SimListener::bind(6443).await?)
                .await?;
            Ok(())
        }
    });
    sim.client("operator", async move {
        let client = client_over_with(BareTurmoilDialer, "kube-api", 6443, &options);
        let pods: Api<Pod> = Api::namespaced(client, "default");
        let mut template = pod("");
        template.metadata.generate_name = Some("worker-".into());
        let mut names = Vec::new();
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            names.push(
                pods.create(&PostParams::default(), &template)
                    .await?
                    .name_any(),
            );
        }
        pods.delete(&names[1], &DeleteParams::default()).await?;
        Ok(())
    });
    sim.run().unwrap();
    trace.lock().unwrap().clone()
}

#[test]
fn the_same_seed_gives_the_same_trace_under_turmoil() {
    let first = turmoil_trace(7);
    assert_eq!(first.len(), 4, "{first:#?}");
    assert!(
        first[2].contains("\"creationTimestamp\":\"2026-01-01T00:00:04Z\""),
        "{}",
        first[2]
    );
    assert_eq!(first, turmoil_trace(7));
    assert_ne!(
        first,
        turmoil_trace(8),
        "uids and generated names follow the seed"
    );
}

/// A dial that never completes, like a SYN the network drops.
#[derive(Clone)]
struct BlackHole;

impl spur_operator::net::Dialer for BlackHole {
    type Stream = tokio::io::DuplexStream;

    fn dial(
        &self,
        _host: &str,
        _port: u16,
    ) -> futures::future::BoxFuture<'static, std::io::Result<Self::Stream>> {
        Box::pin(futures::future::pending())
    }
}

#[tokio::test(start_paused = true)]
async fn connects_are_bounded_as_by_kubes_default_config() {
    use spur_fakes::api_server::client_over;
    let nodes: Api<Node> = Api::all(client_over(BlackHole, "kube-api", 6443));
    let start = tokio::time::Instant::now();
    let err = nodes.list(&ListParams::default()).await.unwrap_err();
    assert_eq!(start.elapsed(), Duration::from_secs(30), "{err:?}");
}

#[tokio::test]
async fn a_request_without_a_known_token_is_unauthorized() {
    let server = ApiServer::new(ApiServerConfig::default());
    for token in [None, Some("guessed".to_owned())] {
        let options = ClientOptions {
            bearer_token: token,
            ..ClientOptions::default()
        };
        let nodes: Api<Node> = Api::all(server.in_memory_client_with(&options));
        let err = api_error(nodes.list(&ListParams::default()).await.unwrap_err());
        assert_eq!(
            (err.code, err.reason.as_str(), err.message.as_str()),
            (401, "Unauthorized", "Unauthorized")
        );
    }
    let denials = server.denials();
    assert_eq!(denials.len(), 2);
    assert!(denials.iter().all(|d| d.code == 401 && d.user.is_none()));
}

#[tokio::test]
async fn a_service_account_may_do_what_its_bindings_grant_and_no_more() {
    let server = ApiServer::new(ApiServerConfig::default());
    for obj in [
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "spur"}}),
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "default", "namespace": "spur"}}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "pods", "namespace": "spur"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "pods", "namespace": "spur"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pods"},
            "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": "spur"}]}),
    ] {
        server.create(obj).unwrap();
    }
    let options = ClientOptions {
        bearer_token: Some(server.service_account_token("spur", "default").unwrap()),
        ..ClientOptions::default()
    };
    let client = server.in_memory_client_with(&options);
    // Allowed: the pod is only missing. Discovery is open to every authenticated user.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "spur");
    assert_eq!(api_error(pods.get("x").await.unwrap_err()).code, 404);
    client.apiserver_version().await.expect("discovery");
    let err = api_error(pods.list(&ListParams::default()).await.unwrap_err());
    assert_eq!(
        err.message,
        "pods is forbidden: User \"system:serviceaccount:spur:default\" cannot list resource \"pods\" in API group \"\" in the namespace \"spur\""
    );
    assert_eq!((err.code, err.reason.as_str()), (403, "Forbidden"));
    let elsewhere: Api<Pod> = Api::namespaced(client.clone(), "default");
    let err = api_error(elsewhere.get("x").await.unwrap_err());
    assert_eq!(
        err.message,
        "pods \"x\" is forbidden: User \"system:serviceaccount:spur:default\" cannot get resource \"pods\" in API group \"\" in the namespace \"default\""
    );
    let nodes: Api<Node> = Api::all(client);
    let err = api_error(nodes.get("n").await.unwrap_err());
    assert!(
        err.message.ends_with("at the cluster scope"),
        "{}",
        err.message
    );
    assert_eq!(server.denials().len(), 3);
    assert!(server.service_account_token("spur", "absent").is_err());
}

#[tokio::test]
async fn allow_all_serves_a_client_without_a_token() {
    let server = ApiServer::new(ApiServerConfig {
        authorization: spur_fakes::api_server::Authorization::AllowAll,
        ..ApiServerConfig::default()
    });
    server.seed_nodes(1).unwrap();
    let client = server.in_memory_client_with(&ClientOptions::default());
    let nodes: Api<Node> = Api::all(client);
    assert_eq!(
        nodes
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    assert_eq!(server.denials(), []);
}

//! The kubelet's loop: reads the pods bound to its node, admits new ones (finalizer,
//! address, namespaces), drives their containers and probes, writes their status, and
//! stops and finalizes the deleted ones.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use k8s_openapi::api::core::v1::{Container, Event, Pod};
use kube::api::{ListParams, Patch, PatchParams};
use serde_json::json;

use super::KubeletConfig;
use super::containers;
use super::mounts::{Bind, MountPlan};
use super::pod_net::{Addresses, Bridge, PodNet};
use super::pod_state::{ContainerRun, PodRun, now};
use super::volumes::{self, VolumeSources};

/// Everything the kubelet made; dropping it kills every process and removes every
/// namespace, veth and the bridge (pods first: the fields drop in order).
struct Node {
    pods: BTreeMap<String, PodRun>,
    addresses: Addresses,
    bridge: Bridge,
}

/// Runs the pods bound to `node_name` until the returned future is dropped; `Err` only when
/// the bridge cannot be made. Errors of the API server are logged and retried.
pub async fn run_kubelet(
    client: kube::Client,
    node_name: &str,
    config: KubeletConfig,
) -> anyhow::Result<()> {
    let addresses = Addresses::new(config.pod_cidr.0, config.pod_cidr.1);
    let bridge = Bridge::create(&config.bridge, addresses.gateway(), config.pod_cidr.1)?;
    std::fs::create_dir_all(&config.log_dir)?;
    let mut node = Node {
        pods: BTreeMap::new(),
        addresses,
        bridge,
    };
    let api = kube::Api::<Pod>::all(client.clone());
    let params = ListParams::default().fields(&format!("spec.nodeName={node_name}"));
    loop {
        match api.list(&params).await {
            Ok(list) => sync(&client, &mut node, list.items, &config).await,
            Err(e) => eprintln!("kubelet {node_name}: listing pods: {e}"),
        }
        tokio::time::sleep(config.sync_period).await;
    }
}

/// One pass over the node's pods.
async fn sync(client: &kube::Client, node: &mut Node, listed: Vec<Pod>, config: &KubeletConfig) {
    let by_uid: BTreeMap<String, Pod> = listed
        .into_iter()
        .filter_map(|p| Some((p.metadata.uid.clone()?, p)))
        .collect();
    for (uid, pod) in &by_uid {
        if !node.pods.contains_key(uid) && admissible(pod) {
            match admit(client, node, pod, config).await {
                Ok(run) => {
                    node.pods.insert(uid.clone(), run);
                }
                Err(e) => eprintln!("kubelet: admitting pod {uid}: {e:#}"),
            }
        }
    }
    let uids: Vec<String> = node.pods.keys().cloned().collect();
    for uid in uids {
        let current = by_uid.get(&uid);
        let deleting = current.is_none_or(|p| p.metadata.deletion_timestamp.is_some());
        let run = node.pods.get_mut(&uid).expect("listed above");
        if deleting {
            if terminate(client, run, current, config).await {
                let run = node.pods.remove(&uid).expect("listed above");
                node.addresses.give_back(run.net.ip);
            }
            continue;
        }
        if let Some(pod) = current {
            run.pod = pod.clone();
        }
        step(client, run, config).await;
    }
}

/// A pod this kubelet should start: not being deleted, not already ended.
fn admissible(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    pod.metadata.deletion_timestamp.is_none() && !matches!(phase, Some("Succeeded" | "Failed"))
}

/// Takes a pod on: its finalizer, then its address and namespaces, then its containers.
async fn admit(
    client: &kube::Client,
    node: &mut Node,
    pod: &Pod,
    config: &KubeletConfig,
) -> anyhow::Result<PodRun> {
    let namespace = pod
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let name = pod.metadata.name.clone().unwrap_or_default();
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    set_finalizer(client, pod, &config.finalizer, true).await?;
    let (ip, offset) = node
        .addresses
        .take()
        .ok_or_else(|| anyhow::anyhow!("the pod CIDR is full"))?;
    let net = match PodNet::create(
        &node.bridge,
        &name,
        ip,
        &format!("{}v{offset}", config.bridge),
    ) {
        Ok(net) => net,
        Err(e) => {
            node.addresses.give_back(ip);
            return Err(e);
        }
    };
    let dir = config.log_dir.join(format!("{namespace}_{name}_{uid}"));
    std::fs::create_dir_all(&dir)?;
    let containers = pod
        .spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .map(|c| ContainerRun::new(c.clone(), config))
        .collect();
    Ok(PodRun {
        namespace,
        name,
        uid,
        pod: pod.clone(),
        containers,
        net,
        host_ip: node.bridge.gateway,
        dir,
        start_time: now(),
        kill_at: None,
        written: serde_json::Value::Null,
        volumes: None,
        mount_error: None,
        freshness: Default::default(),
    })
}

/// Adds (or removes) the kubelet's finalizer, keeping everyone else's.
async fn set_finalizer(
    client: &kube::Client,
    pod: &Pod,
    finalizer: &str,
    present: bool,
) -> anyhow::Result<()> {
    let mut finalizers = pod.metadata.finalizers.clone().unwrap_or_default();
    finalizers.retain(|f| f != finalizer);
    if present {
        finalizers.push(finalizer.to_owned());
    }
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let api = kube::Api::<Pod>::namespaced(client.clone(), namespace);
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let patch = json!({"metadata": {"finalizers": finalizers}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// One pass over a running pod: exits, starts, probes, then its status if it changed.
async fn step(client: &kube::Client, run: &mut PodRun, config: &KubeletConfig) {
    let policy = run.policy();
    volumes::keep_fresh(client, run, config).await;
    for i in 0..run.containers.len() {
        if run.containers[i].reap(&policy, config) {
            let message = super::cgroup::oom_message(&run.containers[i].spec);
            warn(client, &run.pod, "OOMKilled", &message).await;
        }
        if run.containers[i].start_due() {
            start(client, run, i, &policy, config).await;
        }
        run.containers[i].show_backoff();
    }
    run.probe(config).await;
    let status = run.status();
    if status != run.written {
        let api = kube::Api::<Pod>::namespaced(client.clone(), &run.namespace);
        let patch = json!({"status": status});
        match api
            .patch_status(&run.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => run.written = status,
            Err(e) => eprintln!("kubelet: status of {}/{}: {e}", run.namespace, run.name),
        }
    }
}

/// Starts container `i`: its volumes (made once per pod), image's program, environment,
/// command line and filesystem.
async fn start(
    client: &kube::Client,
    run: &mut PodRun,
    i: usize,
    policy: &str,
    config: &KubeletConfig,
) {
    let spec = run.containers[i].spec.clone();
    let Some(volumes) = pod_volumes(client, run, i, config).await else {
        return;
    };
    let ip = run.net.ip.to_string();
    let mut env = match containers::environment(client, &run.pod, &spec, &ip).await {
        Ok(env) => env,
        Err(message) => return run.containers[i].waiting("CreateContainerConfigError", message),
    };
    for (name, value) in base_env(&run.pod, config) {
        env.entry(name).or_insert(value);
    }
    let command: Vec<String> = (spec.command.iter().flatten())
        .map(|w| containers::expand(w, &env))
        .collect();
    let image = spec.image.clone().unwrap_or_default();
    let resolved = match config.images.resolve(&image, &command) {
        Ok(resolved) => resolved,
        Err(why) => return run.containers[i].start_failed(why, policy, config),
    };
    let filesystem = match container_filesystem(run, &spec, &volumes, config) {
        Ok(filesystem) => filesystem,
        Err(message) => return run.containers[i].waiting("CreateContainerError", message),
    };
    let mut args = resolved.args;
    args.extend((spec.args.iter().flatten()).map(|w| containers::expand(w, &env)));
    let cgroups = config.memory_cgroups.as_deref();
    let cgroup = match super::cgroup::for_container(cgroups, &run.uid, &spec) {
        Ok(cgroup) => cgroup,
        Err(message) => return run.containers[i].waiting("CreateContainerError", message),
    };
    let (uid, gid) = containers::user_of(&run.pod, &spec);
    let sandbox = containers::Sandbox {
        netns: &run.net.netns,
        utsns: &run.net.utsns,
        uid,
        gid,
        groups: containers::groups_of(&run.pod),
        cgroup: cgroup.as_ref(),
        filesystem,
    };
    let process = containers::command(&sandbox, &resolved.program, &args, &env);
    let log = run.dir.join(format!("{}.log", spec.name));
    match containers::start(process, &log) {
        Ok(child) => {
            config.processes.started(&run.uid, &spec.name, child.id());
            run.containers[i].running(child, cgroup);
        }
        Err(e) => {
            let why = super::images::Unresolved::NoCommand(format!(
                "{}: {e}",
                resolved.program.display()
            ));
            run.containers[i].start_failed(why, policy, config);
        }
    }
}

/// What every container has before its own env: `HOSTNAME`, as the container runtime sets
/// it, and the API server's address, as the kubelet's service links give it.
fn base_env(pod: &Pod, config: &KubeletConfig) -> Vec<(String, String)> {
    let spec = pod.spec.as_ref();
    let hostname = (spec.and_then(|s| s.hostname.clone()))
        .or_else(|| pod.metadata.name.clone())
        .unwrap_or_default();
    let mut env = vec![("HOSTNAME".to_owned(), hostname)];
    let Some(issuer) = &config.service_accounts else {
        return env;
    };
    let (host, port) = (&issuer.host, issuer.port);
    env.extend([
        ("KUBERNETES_SERVICE_HOST".into(), host.clone()),
        ("KUBERNETES_SERVICE_PORT".into(), port.to_string()),
        ("KUBERNETES_SERVICE_PORT_HTTPS".into(), port.to_string()),
        ("KUBERNETES_PORT".into(), format!("tcp://{host}:{port}")),
    ]);
    env
}

/// The pod's volumes, made at the first start; `None` while one cannot be mounted: the
/// container waits in ContainerCreating, and each new reason is a FailedMount event.
async fn pod_volumes(
    client: &kube::Client,
    run: &mut PodRun,
    i: usize,
    config: &KubeletConfig,
) -> Option<BTreeMap<String, PathBuf>> {
    if let Some(volumes) = &run.volumes {
        return Some(volumes.clone());
    }
    let sources = VolumeSources {
        client,
        pod_dir: &run.dir,
        claims_dir: &config.claims_dir,
        service_accounts: config.service_accounts.as_ref(),
    };
    match volumes::prepare(&sources, &run.pod).await {
        Ok(volumes) => {
            run.volumes = Some(volumes.clone());
            Some(volumes)
        }
        Err(message) => {
            if run.mount_error.as_ref() != Some(&message) {
                warn(client, &run.pod, "FailedMount", &message).await;
                run.mount_error = Some(message.clone());
            }
            run.containers[i].waiting("ContainerCreating", message);
            run.containers[i].next_start = Instant::now() + config.mount_retry;
            None
        }
    }
}

/// The container's own filesystem: its binds, the pod's resolv.conf and the namespace's
/// hosts file, a read-only root if its securityContext asks, its working directory.
fn container_filesystem(
    run: &PodRun,
    spec: &Container,
    volumes: &BTreeMap<String, PathBuf>,
    config: &KubeletConfig,
) -> Result<containers::Filesystem, String> {
    let mut binds = volumes::binds(spec, volumes)?;
    let hosts = config.hosts_dir.as_ref().map(|d| d.join(&run.namespace));
    if let Some(hosts) = hosts.as_ref().filter(|h| !h.is_file()) {
        return Err(format!(
            "the cluster DNS has not written {} yet",
            hosts.display()
        ));
    }
    if hosts.is_some() {
        binds.push(resolver_bind(run)?);
    }
    let scratch = run.dir.join("rootfs").join(&spec.name);
    std::fs::create_dir_all(&scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
    let context = spec.security_context.as_ref();
    let read_only = context.and_then(|c| c.read_only_root_filesystem) == Some(true);
    let workdir = PathBuf::from(spec.working_dir.as_deref().unwrap_or("/"));
    let plan = MountPlan::new(&scratch, &binds, hosts.as_deref(), read_only, &workdir)
        .map_err(|e| format!("{e:#}"))?;
    Ok(containers::Filesystem::Built(plan))
}

/// The pod's `/etc/resolv.conf`, written in its directory, bound read-only.
fn resolver_bind(run: &PodRun) -> Result<Bind, String> {
    let source = run.dir.join("resolv.conf");
    std::fs::write(&source, super::dns::resolv_conf(&run.namespace))
        .map_err(|e| format!("{}: {e}", source.display()))?;
    Ok(Bind {
        source,
        target: PathBuf::from("/etc/resolv.conf"),
        read_only: true,
    })
}

/// A Warning event on `pod`, as a kubelet records one; a failure to record is only logged.
async fn warn(client: &kube::Client, pod: &Pod, reason: &str, message: &str) {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let event: Event = match serde_json::from_value(json!({
        "metadata": {"generateName": format!("{name}."), "namespace": namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": name,
            "namespace": namespace, "uid": pod.metadata.uid},
        "reason": reason, "message": message, "type": "Warning",
        "source": {"component": "kubelet", "host": pod.spec.as_ref().and_then(|s| s.node_name.clone())},
        "firstTimestamp": super::pod_state::now(), "lastTimestamp": super::pod_state::now(), "count": 1,
    })) {
        Ok(event) => event,
        Err(e) => return eprintln!("kubelet: event {reason}: {e}"),
    };
    let api = kube::Api::<Event>::namespaced(client.clone(), namespace);
    if let Err(e) = api.create(&Default::default(), &event).await {
        eprintln!("kubelet: event {reason} on {namespace}/{name}: {e}");
    }
}

/// A deleted pod: SIGTERM, SIGKILL after its grace, then its namespaces go and its
/// finalizer, which lets the API server remove it. Whether the pod is finished.
async fn terminate(
    client: &kube::Client,
    run: &mut PodRun,
    current: Option<&Pod>,
    config: &KubeletConfig,
) -> bool {
    let kill_at = *run.kill_at.get_or_insert_with(|| {
        for c in &run.containers {
            if let Some(child) = &c.child {
                containers::signal(child, libc::SIGTERM);
            }
        }
        let grace = run
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds)
            .map_or(config.default_grace, |s| {
                std::time::Duration::from_secs(s.max(0) as u64)
            });
        Instant::now() + grace
    });
    for c in &mut run.containers {
        if let Some(child) = &mut c.child
            && let Ok(Some(_)) = child.try_wait()
        {
            c.child = None;
        }
    }
    let running = run.containers.iter().any(|c| c.child.is_some());
    if running && Instant::now() < kill_at {
        return false;
    }
    // Dropping the containers SIGKILLs what is left and reaps it.
    run.containers.clear();
    config.processes.forget_pod(&run.uid);
    if let Some(pod) = current
        && let Err(e) = set_finalizer(client, pod, &config.finalizer, false).await
    {
        eprintln!("kubelet: finalizing {}/{}: {e}", run.namespace, run.name);
        return false;
    }
    true
}

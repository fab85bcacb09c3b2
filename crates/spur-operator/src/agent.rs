//! The virtual agent: serves `slurm.SlurmAgent` so spurctld can launch jobs on the nodes
//! the operator registered, as it would on a node running spurd. A launch becomes a pod
//! pinned to the target node.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kube::api::PostParams;
use kube::runtime::reflector::Store;
use kube::{Api, ResourceExt};
use spur_proto as pb;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::agent_auth::{AgentAuth, AgentAuthMode};
use crate::flags::parse_duration;
use crate::jobs::convert::uid_in_comment;
use crate::jobs::duplicates;
use crate::jobs::pods::{
    MAX_POD_GENERATIONS, Placement, build_pod, build_service, is_launched_pod, placement,
};
use crate::jobs::reconcile::{JobPods, delete_job_objects};
use crate::jobs::{LABEL_JOB_ID, SpurJob};
use crate::metrics::Metrics;
use crate::net::{Listener, incoming};
use crate::nodes::Registered;

/// GPU resource names, in the order they are looked for on a node.
const GPU_RESOURCES: [&str; 2] = ["amd.com/gpu", "nvidia.com/gpu"];

/// The largest LaunchJob the agent decodes: spurctld encodes LaunchJob up to 8 MiB
/// (tonic's default limit, 4 MiB, would refuse the larger ones it sends).
pub const MAX_LAUNCH_MESSAGE_BYTES: usize = 8 << 20;

/// The bound on one LaunchJob's Kubernetes work when none is configured (see
/// `--agent-launch-timeout`).
pub const DEFAULT_LAUNCH_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone)]
pub struct Agent {
    /// Fenced ([`crate::fence`]): each pod and Service create and delete is checked
    /// against the Lease when it is sent, not when the call started.
    kube: kube::Client,
    /// The SpurJobs, while this replica leads; `None` on a standby.
    jobs: watch::Receiver<Option<Store<SpurJob>>>,
    registered: Registered,
    /// How long a LaunchJob may wait on the Kubernetes API before it is answered
    /// UNAVAILABLE: spurctld waits on it without a bound of its own.
    launch_timeout: Duration,
    /// Bounds on an exec into a job's pod (`--agent-exec-*`).
    exec_limits: crate::job_io::ExecLimits,
    /// Counts the launches it refuses (`spur_operator_launch_failures_total`).
    metrics: Metrics,
    /// Cancels a duplicate it refused to launch ([`crate::jobs::duplicates`]); fenced, as
    /// CancelJob is a leader-only write. `None`: refused only (spurctld then holds the job
    /// after its dispatch retries).
    controller: Option<crate::controller::ControllerClient>,
    /// Held (shared) by every call while it runs: [`Agent::drained`] takes it exclusively,
    /// so a replica shutting down lets the launches in flight finish (their writes still
    /// pass the fence) before it closes the fence and releases the Lease.
    in_flight: std::sync::Arc<tokio::sync::RwLock<()>>,
}

impl Agent {
    pub fn new(
        kube: kube::Client,
        jobs: watch::Receiver<Option<Store<SpurJob>>>,
        registered: Registered,
    ) -> Agent {
        Agent {
            kube,
            jobs,
            registered,
            launch_timeout: DEFAULT_LAUNCH_TIMEOUT,
            exec_limits: crate::job_io::ExecLimits::default(),
            metrics: Metrics::new(),
            controller: None,
            in_flight: std::sync::Arc::default(),
        }
    }

    /// Cancels, through `controller`, each duplicate job it refuses to launch.
    pub fn with_controller(mut self, controller: crate::controller::ControllerClient) -> Agent {
        self.controller = Some(controller);
        self
    }

    /// Completes once no call is in flight. Calls that start after the replica stopped
    /// acting (the SpurJob store gone) are refused at once.
    pub async fn drained(&self) {
        drop(self.in_flight.write().await);
    }

    /// Bounds each LaunchJob's Kubernetes work by `timeout`.
    pub fn with_launch_timeout(mut self, timeout: Duration) -> Agent {
        self.launch_timeout = timeout;
        self
    }

    /// Counts refused launches in `metrics`.
    pub fn with_metrics(mut self, metrics: Metrics) -> Agent {
        self.metrics = metrics;
        self
    }

    /// Bounds each exec into a job's pod by `limits`.
    pub fn with_exec_limits(mut self, limits: crate::job_io::ExecLimits) -> Agent {
        self.exec_limits = limits;
        self
    }

    fn store(&self) -> Result<Store<SpurJob>, Status> {
        self.jobs
            .borrow()
            .clone()
            .ok_or_else(|| Status::unavailable("this operator replica is not the acting one"))
    }

    /// The SpurJob a launch belongs to: by the UID its comment carries, else by the id
    /// its status records.
    fn find_job(
        &self,
        store: &Store<SpurJob>,
        launch: &pb::LaunchJobRequest,
    ) -> Option<std::sync::Arc<SpurJob>> {
        let uid = launch
            .spec
            .as_ref()
            .and_then(|s| uid_in_comment(&s.comment))
            .map(str::to_owned);
        let mut matches: Vec<_> = store
            .state()
            .into_iter()
            .filter(|job| match &uid {
                Some(uid) => job.uid().as_deref() == Some(uid.as_str()),
                None => job.status.as_ref().and_then(|s| s.spur_job_id) == Some(launch.job_id),
            })
            .collect();
        matches.sort_by_key(|job| job.name_any());
        matches.into_iter().next()
    }

    /// Creates the launch's pod (and a multi-node job's Service); unbounded here, bounded
    /// by the caller.
    async fn launch(
        &self,
        job: &SpurJob,
        launch: &pb::LaunchJobRequest,
        placement: &Placement,
    ) -> Result<Response<pb::LaunchJobResponse>, Status> {
        let gpu_resource = self.gpu_resource(&launch.target_node).await;
        let namespace = job.namespace().unwrap_or_default();
        let pods: Api<Pod> = Api::namespaced(self.kube.clone(), &namespace);
        let uid = job.uid().unwrap_or_default();
        let mut launched = None;
        for generation in 0..MAX_POD_GENERATIONS {
            let pod = build_pod(job, launch, gpu_resource, generation)
                .map_err(Status::invalid_argument)?;
            let name = pod.name_any();
            match pods.create(&PostParams::default(), &pod).await {
                Ok(_) => {
                    tracing::info!(job_id = launch.job_id, node = %launch.target_node, pod = %name, "launched");
                    launched = Some(name);
                    break;
                }
                Err(kube::Error::Api(s)) if s.is_already_exists() => {}
                Err(e) => return Err(kube_status("creating the pod", e)),
            }
            // The name is taken: by this launch's own pod (a repeated LaunchJob), or by one
            // that is not this launch's: the cancelled dispatch's pod still terminating (a
            // retry keeps the run attempt), or another SpurJob's. Only the first is done.
            match pods.get_opt(&name).await {
                Ok(Some(existing)) if is_launched_pod(&existing, &uid, launch) => {
                    launched = Some(name);
                    break;
                }
                Ok(existing) => {
                    let why = match &existing {
                        Some(p) if p.metadata.deletion_timestamp.is_some() => "terminating",
                        Some(_) => "another launch's",
                        None => "deleted meanwhile",
                    };
                    tracing::info!(job_id = launch.job_id, node = %launch.target_node, pod = %name, why, "pod name taken; trying the next");
                }
                Err(e) => return Err(kube_status("reading the existing pod", e)),
            }
        }
        let Some(pod_name) = launched else {
            return Err(Status::unavailable(format!(
                "job {} on node {}: all {MAX_POD_GENERATIONS} pod names for run attempt {} are held by other pods (still terminating?); try again later",
                launch.job_id, launch.target_node, launch.run_attempt
            )));
        };
        if placement.nodes.len() > 1 {
            let services: Api<Service> = Api::namespaced(self.kube.clone(), &namespace);
            match services
                .create(&PostParams::default(), &build_service(job, launch.job_id))
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.is_already_exists() => {}
                Err(e) => return Err(kube_status("creating the job's Service", e)),
            }
        }
        Ok(Response::new(pb::LaunchJobResponse {
            success: true,
            error: String::new(),
            stdout_path: format!("pod/{namespace}/{pod_name}"),
            stderr_path: format!("pod/{namespace}/{pod_name}"),
        }))
    }

    /// A LaunchJob's checks and work; a refusal comes with its reason for
    /// `spur_operator_launch_failures_total`.
    async fn launch_job_checked(
        &self,
        launch: pb::LaunchJobRequest,
    ) -> Result<Response<pb::LaunchJobResponse>, (&'static str, Status)> {
        let _in_flight = self.in_flight.read().await;
        let store = self.store().map_err(|s| ("not_acting", s))?;
        if !self.registered.contains(&launch.target_node) {
            return Err((
                "not_registered",
                Status::permission_denied(format!(
                    "node {} is not one this operator registered",
                    launch.target_node
                )),
            ));
        }
        let Some(job) = self.find_job(&store, &launch) else {
            return Err((
                "no_spurjob",
                Status::not_found(format!("no SpurJob for job {}", launch.job_id)),
            ));
        };
        // A SpurJob being deleted gets no new pods: its cleanup may already have run.
        if job.metadata.deletion_timestamp.is_some() {
            return Err((
                "deleting",
                Status::failed_precondition(format!(
                    "SpurJob {} is being deleted; job {} is not launched",
                    job.name_any(),
                    launch.job_id
                )),
            ));
        }
        let recorded = job.status.as_ref().and_then(|s| s.spur_job_id);
        if duplicates::launch_is_duplicate(recorded, job.spec.array_spec.is_some(), &launch) {
            return Err(("duplicate", self.refuse_duplicate(&job, &launch, recorded)));
        }
        let placement = placement(&launch).map_err(|e| ("invalid", Status::invalid_argument(e)))?;
        // spurctld awaits every LaunchJob, one assignment after another, with no bound:
        // an API server that does not answer must not hold up all its scheduling.
        match tokio::time::timeout(self.launch_timeout, self.launch(&job, &launch, &placement))
            .await
        {
            Ok(answer) => answer.map_err(|status| {
                let reason = if status.code() == tonic::Code::InvalidArgument {
                    "invalid"
                } else {
                    "kubernetes_api"
                };
                (reason, status)
            }),
            Err(_) => {
                tracing::warn!(job_id = launch.job_id, node = %launch.target_node, timeout = ?self.launch_timeout, "LaunchJob timed out waiting on the Kubernetes API");
                Err((
                    "timeout",
                    Status::unavailable(format!(
                        "job {} on node {}: the Kubernetes API did not answer within {:?}; a retry finds a pod that was created meanwhile",
                        launch.job_id, launch.target_node, self.launch_timeout
                    )),
                ))
            }
        }
    }

    /// Refuses a duplicate's launch and cancels it in the background: the answer goes
    /// back at once (spurctld awaits it before it schedules anything else), and the
    /// cancel, a Raft write, is not made from inside spurctld's own dispatch.
    fn refuse_duplicate(
        &self,
        job: &SpurJob,
        launch: &pb::LaunchJobRequest,
        recorded: Option<u32>,
    ) -> Status {
        let job_id = launch.job_id;
        let spurjob = job.name_any();
        tracing::warn!(%spurjob, job_id, ?recorded, "LaunchJob for a second job of a SpurJob: refused, and the job cancelled");
        if let Some(controller) = self.controller.clone() {
            let metrics = self.metrics.clone();
            tokio::spawn(async move {
                match duplicates::cancel(&controller, job_id).await {
                    Ok(true) => metrics.duplicate_cancelled("launch"),
                    Ok(false) => {}
                    // spurctld's dispatch retries bring the launch, and this, back.
                    Err(error) => {
                        tracing::warn!(%spurjob, job_id, %error, "could not cancel a duplicate job; its next launch tries again")
                    }
                }
            });
        }
        Status::already_exists(format!(
            "job {job_id} is a second job of SpurJob {}, which runs as job {}; not launched, and cancelled",
            job.name_any(),
            recorded.unwrap_or_default()
        ))
    }

    async fn gpu_resource(&self, node: &str) -> &'static str {
        let nodes: Api<Node> = Api::all(self.kube.clone());
        let allocatable = nodes
            .get_opt(node)
            .await
            .ok()
            .flatten()
            .and_then(|n| n.status)
            .and_then(|s| s.allocatable)
            .unwrap_or_default();
        GPU_RESOURCES
            .into_iter()
            .find(|r| allocatable.contains_key(*r))
            .unwrap_or(GPU_RESOURCES[0])
    }
}

fn kube_status(what: &str, e: kube::Error) -> Status {
    Status::unavailable(format!("{what}: Kubernetes API: {e}"))
}

#[tonic::async_trait]
impl pb::SlurmAgent for Agent {
    async fn launch_job(
        &self,
        request: Request<pb::LaunchJobRequest>,
    ) -> Result<Response<pb::LaunchJobResponse>, Status> {
        let answer = self.launch_job_checked(request.into_inner()).await;
        if let Err((reason, _)) = &answer {
            self.metrics.launch_failed(reason);
        }
        answer.map_err(|(_, status)| status)
    }

    async fn cancel_job(
        &self,
        request: Request<pb::AgentCancelJobRequest>,
    ) -> Result<Response<()>, Status> {
        let job_id = request.into_inner().job_id;
        let _in_flight = self.in_flight.read().await;
        self.store()?;
        // The pods may be in any namespace: find them by label.
        let pods: Api<Pod> = Api::all(self.kube.clone());
        let listed = pods
            .list(&kube::api::ListParams::default().labels(&format!("{LABEL_JOB_ID}={job_id}")))
            .await
            .map_err(|e| kube_status("listing the job's pods", e))?;
        let mut namespaces: Vec<String> = listed.iter().filter_map(|p| p.namespace()).collect();
        namespaces.sort();
        namespaces.dedup();
        for namespace in namespaces {
            delete_job_objects(&self.kube, &namespace, job_id, JobPods::Unended)
                .await
                .map_err(|e| kube_status("deleting the job's pods", e))?;
        }
        tracing::info!(job_id, "cancelled at the controller's request");
        Ok(Response::new(()))
    }

    /// Accepted, as upstream's agent does: a pod cannot be paused, so the job's pods keep
    /// running while spurctld shows the job suspended (spurctld only logs a refusal, so
    /// refusing would change nothing but the log).
    async fn suspend_job(
        &self,
        request: Request<pb::AgentSuspendJobRequest>,
    ) -> Result<Response<()>, Status> {
        let request = request.into_inner();
        let what = if request.resume { "resume" } else { "suspend" };
        tracing::warn!(
            job_id = request.job_id,
            what,
            "spurctld asked to {what} the job; Kubernetes cannot pause a pod, so its pods run on"
        );
        Ok(Response::new(()))
    }

    /// What the nodes this agent serves offer in all (their registrations summed); `used`
    /// is left empty: spurctld keeps the allocations. spurctld does not call it today.
    async fn get_node_resources(
        &self,
        _request: Request<()>,
    ) -> Result<Response<pb::NodeResourcesResponse>, Status> {
        let nodes: Api<Node> = Api::all(self.kube.clone());
        let endpoint = crate::nodes::resources::AgentEndpoint {
            address: String::new(),
            port: 0,
        };
        let mut total = pb::ResourceSet::default();
        for (name, _) in self.registered.snapshot() {
            let Some(node) = nodes
                .get_opt(&name)
                .await
                .map_err(|e| kube_status("reading a registered node", e))?
            else {
                continue;
            };
            let (registration, _) = crate::nodes::resources::registration(&node, &endpoint, "");
            let resources = registration.resources.unwrap_or_default();
            total.cpus = total.cpus.saturating_add(resources.cpus);
            total.memory_mb = total.memory_mb.saturating_add(resources.memory_mb);
            total.gpus.extend(resources.gpus);
            for (name, count) in resources.generic {
                let sum = total.generic.entry(name).or_default();
                *sum = sum.saturating_add(count);
            }
        }
        Ok(Response::new(pb::NodeResourcesResponse {
            total: Some(total),
            used: Some(pb::ResourceAllocations::default()),
        }))
    }

    /// `spur exec`: runs the command in the job's first pod (see [`crate::job_io`]).
    async fn exec_in_job(
        &self,
        request: Request<pb::ExecInJobRequest>,
    ) -> Result<Response<pb::ExecInJobResponse>, Status> {
        let request = request.into_inner();
        self.store()?;
        let pod = crate::job_io::find_first_pod(&self.kube, request.job_id).await?;
        tracing::info!(job_id = request.job_id, pod = %pod.name_any(), user = %request.user, command = ?request.command, "exec into the job's pod");
        crate::job_io::exec(&self.kube, &pod, request.command, self.exec_limits)
            .await
            .map(Response::new)
    }

    /// `sattach`, `srun`: the job's first pod's log, followed until the container ends.
    async fn stream_job_output(
        &self,
        request: Request<pb::StreamJobOutputRequest>,
    ) -> Result<Response<tonic::codegen::BoxStream<pb::StreamJobOutputChunk>>, Status> {
        let request = request.into_inner();
        self.store()?;
        let pod = crate::job_io::find_first_pod(&self.kube, request.job_id).await?;
        let chunks = crate::job_io::output(&self.kube, &pod, &request.stream).await?;
        let chunks = futures::stream::unfold(chunks, |mut chunks| async move {
            chunks.recv().await.map(|chunk| (chunk, chunks))
        });
        Ok(Response::new(Box::pin(chunks)))
    }

    /// As upstream's agent: a job's pods start their own ranks (torchrun, mpirun) and
    /// meet through MASTER_ADDR; there is no PMIx server to prepare.
    async fn prepare_pmix(
        &self,
        request: Request<pb::PreparePmixRequest>,
    ) -> Result<Response<pb::PreparePmixResponse>, Status> {
        Err(Status::unimplemented(format!(
            "job {}: PMIx is not served by the Kubernetes agent; start the ranks in the pods (torchrun, mpirun), which rendezvous through MASTER_ADDR",
            request.into_inner().job_id
        )))
    }

    /// Nothing was prepared, so nothing to release.
    async fn release_pmix(
        &self,
        _request: Request<pb::ReleasePmixRequest>,
    ) -> Result<Response<pb::ReleasePmixResponse>, Status> {
        Ok(Response::new(pb::ReleasePmixResponse {}))
    }
}

/// Serves the agent on `listener` until `shutdown` completes; `auth` checks each call's
/// token before the agent sees it.
pub async fn serve<L: Listener>(
    agent: Agent,
    auth: AgentAuth,
    metrics: Metrics,
    listener: L,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let server =
        pb::SlurmAgentServer::new(agent).max_decoding_message_size(MAX_LAUNCH_MESSAGE_BYTES);
    tonic::transport::Server::builder()
        .add_service(tonic::service::interceptor::InterceptedService::new(
            server,
            auth.interceptor(metrics),
        ))
        .serve_with_incoming_shutdown(incoming(listener), shutdown)
        .await
}

/// The virtual agent: where it listens, how spurctld reaches it, its tokens and its
/// bounds. Flattened into `spur-operator run`.
#[derive(clap::Args, Clone, Debug)]
pub struct AgentArgs {
    /// Address the virtual agent listens on for spurctld's LaunchJob calls.
    #[arg(
        long,
        visible_alias = "listen",
        env = "SPUR_OPERATOR_AGENT_LISTEN",
        default_value = "0.0.0.0:6818"
    )]
    pub agent_listen: SocketAddr,

    /// Address spurctld dials back to reach the agent: this pod's IP (Downward API
    /// status.podIP). Not a load-balanced Service: spurctld must reach the acting replica,
    /// and the standby refuses launches. Unset, upstream's `SPUR_OPERATOR_ADDRESS` is
    /// used, then `POD_IP`, as upstream's manifests set them.
    #[arg(long, visible_alias = "address", env = "SPUR_OPERATOR_AGENT_ADDRESS")]
    pub agent_address: Option<String>,

    /// How the agent treats spurctld's bearer tokens (HS256 JWTs under
    /// --agent-auth-key-file): `required` refuses a call without a valid one; `permissive`
    /// refuses an invalid token but admits a call with none (counted in
    /// spur_operator_agent_calls_total), so tokens can be rolled out before they are
    /// enforced; `disabled` ignores them. Permissive by default: a spurctld that sends no
    /// token keeps working, and one that sends a token has it checked.
    #[arg(
        long,
        visible_alias = "auth-mode",
        env = "SPUR_OPERATOR_AGENT_AUTH",
        value_enum,
        default_value_t
    )]
    pub agent_auth: AgentAuthMode,

    /// File holding the HS256 key spurctld signs agent tokens with (its `[auth] jwt_key`'s
    /// bytes; one trailing newline is ignored). Any non-empty length is accepted, as
    /// spurctld signs with whatever key it is given; below the 32 bytes RFC 7518 asks of an
    /// HS256 key a warning is logged. Without it no token is checked, which
    /// `--agent-auth required` does not allow.
    #[arg(long, env = "SPUR_OPERATOR_AGENT_AUTH_KEY_FILE")]
    pub agent_auth_key_file: Option<PathBuf>,

    /// The same key given as its value, as upstream's `--jwt-key`/`SPUR_JWT_KEY` take it
    /// (from a Secret in the environment; on the command line it shows in `ps`). Prefer
    /// --agent-auth-key-file, a mounted Secret file.
    #[arg(
        long,
        visible_alias = "jwt-key",
        env = "SPUR_JWT_KEY",
        hide_env_values = true,
        conflicts_with = "agent_auth_key_file"
    )]
    pub agent_auth_key: Option<String>,

    /// Clock skew forgiven when checking a token's `exp` and `nbf`. 30 s: nodes kept by NTP
    /// differ by milliseconds, and a token long expired is still refused.
    #[arg(long, env = "SPUR_OPERATOR_AGENT_AUTH_LEEWAY", default_value = "30s", value_parser = parse_duration)]
    pub agent_auth_leeway: Duration,

    /// Bound on one LaunchJob's Kubernetes work (reading the node, creating the pod and the
    /// Service); past it the agent answers UNAVAILABLE and spurctld retries after its
    /// backoff. spurctld waits on a LaunchJob with no bound and handles its assignments one
    /// after another, so an API server that does not answer would otherwise hold up all its
    /// scheduling. 10 s: a healthy API server answers a launch's three calls in
    /// milliseconds, and an outage then costs spurctld at most 10 s per assignment (its
    /// LaunchJobs to one job's nodes go out together) before it backs off and moves on.
    #[arg(long, env = "SPUR_OPERATOR_AGENT_LAUNCH_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub agent_launch_timeout: Duration,

    /// Bound on one `spur exec` into a job's pod (ExecInJob, relayed by spurctld), from the
    /// call to the command's exit; past it the agent answers DEADLINE_EXCEEDED. spur exec
    /// runs one-shot commands (`nvidia-smi`, `rocm-smi`, `cat` a log) and spurctld waits on
    /// the call with no bound of its own. 60 s: such commands end in seconds, and a hung one
    /// holds no more than a minute of the caller's time.
    #[arg(long, env = "SPUR_OPERATOR_AGENT_EXEC_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    pub agent_exec_timeout: Duration,

    /// The most of each of an exec's stdout and stderr returned, in bytes; the rest is read
    /// and dropped, and the answer says it was cut. 1 MiB: ExecInJobResponse carries both in
    /// one message, and two of these stay well inside the 4 MiB gRPC clients take by default.
    #[arg(long, env = "SPUR_OPERATOR_AGENT_EXEC_OUTPUT_LIMIT", default_value_t = 1 << 20)]
    pub agent_exec_output_limit: usize,
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use kube::runtime::reflector::store::Writer;
    use kube::runtime::watcher;
    use pb::SlurmAgent as _;
    use tokio::time::Instant;

    use proptest::prelude::*;

    use super::*;
    use crate::fence::Fence;
    use crate::jobs::crd::SpurJobSpec;
    use crate::kube_testing::{Writes, api_server};

    /// How long the API server takes to answer the Node read a LaunchJob starts with.
    const NODE_READ: Duration = Duration::from_secs(3);

    fn job_store() -> Store<SpurJob> {
        let mut job = SpurJob::new(
            "train",
            SpurJobSpec {
                image: "busybox".into(),
                ..Default::default()
            },
        );
        job.metadata.namespace = Some("ml".into());
        job.metadata.uid = Some("uid-1".into());
        let mut writer = Writer::default();
        writer.apply_watcher_event(&watcher::Event::Apply(job));
        writer.as_reader()
    }

    fn launch() -> pb::LaunchJobRequest {
        pb::LaunchJobRequest {
            job_id: 7,
            spec: Some(pb::JobSpec {
                num_nodes: 1,
                num_tasks: 1,
                comment: "spurjob-uid=uid-1".into(),
                ..Default::default()
            }),
            target_node: "node-a".into(),
            run_attempt: 1,
            ..Default::default()
        }
    }

    /// A LaunchJob that starts while this replica holds the Lease for 2 more seconds and
    /// reaches its pod create after 3 (the Node read): what the agent answers and what
    /// reached the API server. The SpurJob store stays, as it does until the operator's
    /// main loop sees the hold has ended.
    async fn launch_across_the_end_of_the_hold(fenced: bool) -> (Result<(), Status>, Vec<String>) {
        let fence = Fence::new();
        fence.hold_until(Instant::now() + Duration::from_secs(2));
        let writes = Writes::default();
        let raw = api_server(Arc::clone(&writes), NODE_READ);
        let kube = if fenced { fence.kube_client(raw) } else { raw };
        let answer = agent(kube).launch_job(Request::new(launch())).await;
        let writes = writes.lock().expect("writes");
        (
            answer.map(|_| ()),
            writes.iter().map(|(w, _)| w.clone()).collect(),
        )
    }

    /// An agent acting for the one SpurJob of [`job_store`], with `node-a` registered.
    fn agent(kube: kube::Client) -> Agent {
        let (jobs_tx, jobs) = watch::channel(Some(job_store()));
        // The receiver keeps the last value once the sender is gone.
        drop(jobs_tx);
        let registered = Registered::default();
        registered.insert("node-a", "token".into());
        Agent::new(kube, jobs, registered)
    }

    #[tokio::test(start_paused = true)]
    async fn checked_when_the_call_started_a_pod_is_created_after_the_hold_ended() {
        let (answer, writes) = launch_across_the_end_of_the_hold(false).await;
        assert!(answer.is_ok(), "{answer:?}");
        assert_eq!(writes, ["POST /api/v1/namespaces/ml/pods"]);
    }

    #[tokio::test(start_paused = true)]
    async fn checked_at_the_write_no_pod_is_created_after_the_hold_ended() {
        let (answer, writes) = launch_across_the_end_of_the_hold(true).await;
        let refused = answer.expect_err("the create must be refused");
        assert_eq!(refused.code(), tonic::Code::Unavailable);
        assert!(
            refused
                .message()
                .contains("hold on the Lease ran out 1s ago"),
            "{}",
            refused.message()
        );
        assert!(writes.is_empty(), "{writes:?}");
    }

    #[tokio::test]
    async fn a_launch_of_a_second_job_of_a_spurjob_is_refused_and_the_job_cancelled() {
        use crate::controller::testing::{MemoryNetwork, ScriptedController};
        let controller = ScriptedController::default();
        let client = crate::controller::ControllerClient::new(
            crate::controller::ControllerAddr::new("spurctld", 6817),
            crate::controller::ChannelConfig::default(),
            None,
            MemoryNetwork::start(controller.clone()),
        )
        .expect("client");
        // The SpurJob of `job_store` ran as job 5; a late duplicate of it is job 7.
        let mut recorded = (*job_store().state()[0]).clone();
        recorded.status = Some(crate::jobs::crd::SpurJobStatus {
            spur_job_id: Some(5),
            ..Default::default()
        });
        let mut writer = Writer::default();
        writer.apply_watcher_event(&watcher::Event::Apply(recorded));
        let (_jobs_tx, jobs) = watch::channel(Some(writer.as_reader()));
        let registered = Registered::default();
        registered.insert("node-a", "token".into());
        let writes = Writes::default();
        let metrics = Metrics::new();
        let agent = Agent::new(
            api_server(Arc::clone(&writes), Duration::ZERO),
            jobs,
            registered,
        )
        .with_metrics(metrics.clone())
        .with_controller(client);
        let refused = agent
            .launch_job(Request::new(launch()))
            .await
            .expect_err("a duplicate is not launched");
        assert_eq!(refused.code(), tonic::Code::AlreadyExists);
        assert!(
            refused
                .message()
                .contains("job 7 is a second job of SpurJob train, which runs as job 5"),
            "{}",
            refused.message()
        );
        assert!(
            writes.lock().expect("writes").is_empty(),
            "no pod, no Service"
        );
        // The cancel goes out in the background.
        for _ in 0..100 {
            if controller.log().contains(&"CancelJob 7".to_owned()) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(controller.log(), ["CancelJob 7"]);
        let exposition = metrics.encode();
        assert!(
            exposition
                .contains("spur_operator_duplicate_jobs_cancelled_total{found_at=\"launch\"} 1"),
            "{exposition}"
        );
        assert!(
            exposition.contains("spur_operator_launch_failures_total{reason=\"duplicate\"} 1"),
            "{exposition}"
        );
        // Its own job launches as before.
        let mut own = launch();
        own.job_id = 5;
        agent
            .launch_job(Request::new(own))
            .await
            .expect("job 5 launches");
    }

    #[tokio::test]
    async fn a_refused_launch_is_counted_by_its_reason() {
        let metrics = Metrics::new();
        let agent =
            agent(api_server(Writes::default(), Duration::ZERO)).with_metrics(metrics.clone());
        let mut elsewhere = launch();
        elsewhere.target_node = "node-b".into();
        let refused = agent.launch_job(Request::new(elsewhere)).await;
        assert_eq!(
            refused.expect_err("not registered").code(),
            tonic::Code::PermissionDenied
        );
        let mut unknown = launch();
        unknown.spec.as_mut().unwrap().comment = "spurjob-uid=uid-2".into();
        let refused = agent.launch_job(Request::new(unknown)).await;
        assert_eq!(
            refused.expect_err("no SpurJob").code(),
            tonic::Code::NotFound
        );
        let text = metrics.encode();
        for line in [
            "spur_operator_launch_failures_total{reason=\"not_registered\"} 1",
            "spur_operator_launch_failures_total{reason=\"no_spurjob\"} 1",
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
    }

    #[tokio::test]
    async fn suspend_and_pmix_are_answered_as_upstreams_agent_answers_them() {
        let writes = Writes::default();
        let agent = agent(api_server(Arc::clone(&writes), Duration::ZERO));
        for resume in [false, true] {
            let answer = agent
                .suspend_job(Request::new(pb::AgentSuspendJobRequest {
                    job_id: 7,
                    resume,
                }))
                .await;
            assert!(answer.is_ok(), "{answer:?}");
        }
        let refused = agent
            .prepare_pmix(Request::new(pb::PreparePmixRequest {
                job_id: 7,
                run_attempt: 1,
            }))
            .await
            .expect_err("no PMIx server here");
        assert_eq!(refused.code(), tonic::Code::Unimplemented);
        assert!(refused.message().contains("job 7"), "{}", refused.message());
        let released = agent
            .release_pmix(Request::new(pb::ReleasePmixRequest { job_id: 7 }))
            .await;
        assert!(released.is_ok(), "{released:?}");
        assert!(
            writes.lock().expect("writes").is_empty(),
            "none of them writes"
        );
    }

    #[tokio::test]
    async fn exec_and_output_of_a_job_without_pods_say_so() {
        // The API server lists nothing (every GET is NotFound), so no pod is found.
        let agent = agent(api_server(Writes::default(), Duration::ZERO));
        let refused = agent
            .exec_in_job(Request::new(pb::ExecInJobRequest {
                job_id: 7,
                command: vec!["true".into()],
                user: "k8s".into(),
            }))
            .await
            .expect_err("no pod to exec into");
        assert_eq!(refused.code(), tonic::Code::NotFound, "{refused:?}");
        let refused = agent
            .stream_job_output(Request::new(pb::StreamJobOutputRequest {
                job_id: 7,
                stream: "stdout".into(),
                user: "k8s".into(),
            }))
            .await
            .err()
            .expect("no pod to read");
        assert_eq!(refused.code(), tonic::Code::NotFound, "{refused:?}");
    }

    fn node() -> impl Strategy<Value = String> {
        prop_oneof![
            4 => Just("node-a".to_owned()),
            1 => Just("node-b".to_owned()),
            1 => Just(String::new()),
            1 => "\\PC{0,12}",
        ]
    }

    fn comment() -> impl Strategy<Value = String> {
        prop_oneof![
            4 => Just("spurjob-uid=uid-1".to_owned()),
            1 => Just("spurjob-uid=uid-2".to_owned()),
            1 => Just("spurjob-uid=".to_owned()),
            1 => "\\PC{0,30}",
        ]
    }

    /// Mostly the counts a real launch carries, sometimes anything.
    fn small_or_any() -> impl Strategy<Value = u32> {
        prop_oneof![3 => 0u32..3, 1 => any::<u32>()]
    }

    prop_compose! {
        fn any_launch()(
            job_id in any::<u32>(),
            target_node in node(),
            comment in comment(),
            num_nodes in small_or_any(),
            num_tasks in small_or_any(),
            tasks_per_node in small_or_any(),
            task_offset in small_or_any(),
            nodelist in prop::collection::vec(node(), 0..3),
            gres in prop::collection::vec("(gpu(:[a-z0-9]{0,6})?:[0-9]{0,4}|\\PC{0,10})", 0..3),
            run_attempt in any::<u32>(),
        ) -> pb::LaunchJobRequest {
            pb::LaunchJobRequest {
                job_id,
                spec: Some(pb::JobSpec {
                    num_nodes,
                    num_tasks,
                    tasks_per_node,
                    nodelist: nodelist.join(","),
                    gres,
                    comment,
                    ..Default::default()
                }),
                target_node,
                task_offset,
                run_attempt,
                ..Default::default()
            }
        }
    }

    proptest! {
        /// Whatever spurctld sends, the agent answers (never panics), and it creates a pod
        /// only for a registered node and a SpurJob it acts for, pinned to that node; a
        /// refusal says why.
        #[test]
        fn any_launch_is_a_pinned_pod_for_a_known_job_or_a_named_refusal(launch in any_launch()) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .expect("runtime");
            let writes = Writes::default();
            let answer = runtime.block_on(async {
                let agent = agent(api_server(Arc::clone(&writes), Duration::ZERO));
                agent.launch_job(Request::new(launch.clone())).await
            });
            let writes = writes.lock().expect("writes");
            let pods: Vec<_> = writes.iter().filter(|(w, _)| w.ends_with("/pods")).collect();
            let uid = launch.spec.as_ref().and_then(|s| uid_in_comment(&s.comment));
            match &answer {
                Ok(_) => prop_assert_eq!(pods.len(), 1, "answered without one pod: {:?}", writes),
                Err(status) => {
                    prop_assert!(pods.is_empty(), "refused ({}) yet made {:?}", status.message(), pods);
                    prop_assert!(!status.message().is_empty());
                }
            }
            for (what, pod) in &pods {
                prop_assert_eq!(launch.target_node.as_str(), "node-a", "{}", what);
                prop_assert_eq!(uid, Some("uid-1"));
                prop_assert_eq!(pod["spec"]["nodeName"].as_str(), Some("node-a"));
                prop_assert_eq!(what.as_str(), "POST /api/v1/namespaces/ml/pods");
            }
        }
    }
}

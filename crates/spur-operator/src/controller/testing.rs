//! An in-memory network and a scripted spurctld for the channel's unit tests.
//!
//! Everything runs as tokio tasks over `tokio::io::duplex` pipes, so the tests can run on
//! tokio's paused clock and the real bounds (seconds long) apply without waiting: no OS
//! socket is involved whose progress the paused clock would race.

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use spur_proto as pb;
use tokio::io::DuplexStream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::metadata::MetadataValue;
use tonic::{Request, Response, Status};

use crate::net::{Accepted, Dialer};

/// The peer a scripted server sees: a pipe has no address.
const PIPE_PEER: std::net::SocketAddr =
    std::net::SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);

/// What the far end does with a new connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    /// The scripted controller serves it.
    Serve,
    /// Accepts and never reads or writes: a killed pod whose packets vanish.
    BlackHole,
    /// The dial never completes: a SYN dropped by a Service with no ready endpoint.
    NeverConnect,
    /// The dial fails at once: nothing listens.
    Refuse,
}

/// The server ends of in-memory connections, as the scripted servers accept them.
type ToServer = mpsc::UnboundedSender<io::Result<Accepted<DuplexStream>>>;

/// A dialer whose connections end in a [`ScriptedController`] (or nowhere), counting dials.
/// Every host leads to the first controller unless [`MemoryNetwork::add_host`] gave it
/// one of its own (a replica dialed by name, as a leader hint names it).
#[derive(Clone)]
pub struct MemoryNetwork {
    peer: Arc<Mutex<Peer>>,
    host_peers: Arc<Mutex<BTreeMap<String, Peer>>>,
    dials: Arc<AtomicUsize>,
    dialed: Arc<Mutex<Vec<String>>>,
    to_server: ToServer,
    hosts: Arc<Mutex<BTreeMap<String, ToServer>>>,
    /// Hosts the next dials lead to instead of the one dialed (a Service's picks).
    redirects: Arc<Mutex<VecDeque<String>>>,
    held: Arc<Mutex<Vec<DuplexStream>>>,
}

/// A request's `authorization` metadata, or "" without one.
fn authorization<T>(request: &Request<T>) -> String {
    request
        .metadata()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

fn serve(controller: ScriptedController) -> ToServer {
    let (to_server, incoming) = mpsc::unbounded_channel();
    let seen = controller.authorizations.clone();
    // Every call's `authorization` metadata, before any method sees it.
    let record = move |request: Request<()>| {
        seen.lock().unwrap().push(authorization(&request));
        Ok(request)
    };
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(pb::SlurmControllerServer::with_interceptor(
                controller, record,
            ))
            .serve_with_incoming(UnboundedReceiverStream::new(incoming))
            .await
            .expect("scripted controller serves");
    });
    to_server
}

impl MemoryNetwork {
    /// Starts `controller` on its own task and returns the network that leads to it.
    pub fn start(controller: ScriptedController) -> MemoryNetwork {
        MemoryNetwork {
            peer: Arc::new(Mutex::new(Peer::Serve)),
            host_peers: Arc::default(),
            dials: Arc::new(AtomicUsize::new(0)),
            dialed: Arc::default(),
            to_server: serve(controller),
            hosts: Arc::default(),
            redirects: Arc::default(),
            held: Arc::default(),
        }
    }

    /// Dials of `host` reach `controller` (started on its own task).
    pub fn add_host(&self, host: &str, controller: ScriptedController) {
        self.hosts
            .lock()
            .unwrap()
            .insert(host.to_owned(), serve(controller));
    }

    pub fn set_peer(&self, peer: Peer) {
        *self.peer.lock().unwrap() = peer;
    }

    /// What the far end of a dial of `host` does, whatever [`MemoryNetwork::set_peer`] says.
    pub fn set_host_peer(&self, host: &str, peer: Peer) {
        self.host_peers
            .lock()
            .unwrap()
            .insert(host.to_owned(), peer);
    }

    pub fn dials(&self) -> usize {
        self.dials.load(Ordering::SeqCst)
    }

    /// The next dials, whatever host they name, lead to `hosts` in turn (as a Service
    /// picks a replica for each connection).
    pub fn redirect_next(&self, hosts: &[&str]) {
        self.redirects
            .lock()
            .unwrap()
            .extend(hosts.iter().map(|h| (*h).to_owned()));
    }

    /// The hosts dialed, in order.
    pub fn dialed(&self) -> Vec<String> {
        self.dialed.lock().unwrap().clone()
    }
}

impl Dialer for MemoryNetwork {
    type Stream = DuplexStream;

    fn dial(&self, host: &str, _port: u16) -> BoxFuture<'static, io::Result<DuplexStream>> {
        self.dials.fetch_add(1, Ordering::SeqCst);
        let host = self
            .redirects
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or_else(|| host.to_owned());
        let host = host.as_str();
        self.dialed.lock().unwrap().push(host.to_owned());
        let peer = self
            .host_peers
            .lock()
            .unwrap()
            .get(host)
            .copied()
            .unwrap_or(*self.peer.lock().unwrap());
        let (client, server) = tokio::io::duplex(64 * 1024);
        match peer {
            Peer::Serve => {
                let to_server = self
                    .hosts
                    .lock()
                    .unwrap()
                    .get(host)
                    .cloned()
                    .unwrap_or_else(|| self.to_server.clone());
                let _ = to_server.send(Ok(Accepted::new(server, PIPE_PEER)));
                Box::pin(async move { Ok(client) })
            }
            Peer::BlackHole => {
                self.held.lock().unwrap().push(server);
                Box::pin(async move { Ok(client) })
            }
            Peer::NeverConnect => Box::pin(futures::future::pending()),
            Peer::Refuse => {
                Box::pin(async { Err(io::Error::from(io::ErrorKind::ConnectionRefused)) })
            }
        }
    }
}

/// A spurctld whose answers a test scripts: each call takes the next queued failure, or
/// succeeds when the queue is empty. Ping echoes the `authorization` metadata it received
/// in `version`, so a test can see what was sent.
///
/// It also keeps what node sync needs: the nodes it knows (a heartbeat for any other
/// answers NOT_FOUND), registrations to refuse, a log of node calls (and submissions), an
/// answer delay, and the most calls it saw in flight at once; and what submission needs:
/// the jobs submitted, which GetJobs lists by name, and a reply to lose.
#[derive(Clone, Default)]
pub struct ScriptedController {
    failures: Arc<Mutex<VecDeque<Status>>>,
    pub calls: Arc<AtomicUsize>,
    known: Arc<Mutex<std::collections::BTreeSet<String>>>,
    refusals: Arc<Mutex<std::collections::BTreeMap<String, u32>>>,
    log: Arc<Mutex<Vec<String>>>,
    delay: Arc<Mutex<std::time::Duration>>,
    in_flight: Arc<AtomicUsize>,
    pub max_in_flight: Arc<AtomicUsize>,
    /// The `hostname` Ping answers (`spurctld-0` when unset).
    hostname: Arc<Mutex<Option<String>>>,
    /// How long Ping waits before answering.
    read_delay: Arc<Mutex<std::time::Duration>>,
    /// Jobs submitted, ids from 7 on; GetJobs lists those of the name asked for.
    jobs: Arc<Mutex<Vec<pb::JobInfo>>>,
    /// The next SubmitJob is applied and its reply never sent.
    lose_next_submit_reply: Arc<std::sync::atomic::AtomicBool>,
    /// The `authorization` metadata of every call, in arrival order ("" when absent).
    authorizations: Arc<Mutex<Vec<String>>>,
    /// Each node's state and reason as the last UpdateNode (or [`Self::hold_node`]) set
    /// them; GetNodes answers these.
    node_states: Arc<Mutex<std::collections::BTreeMap<String, (pb::NodeState, String)>>>,
    /// GetNodes calls answered so far (they wait the read delay, as GetJobs does).
    pub node_reads: Arc<AtomicUsize>,
}

impl ScriptedController {
    /// A controller whose Ping answers `hostname`.
    pub fn named(hostname: &str) -> Self {
        let controller = ScriptedController::default();
        *controller.hostname.lock().unwrap() = Some(hostname.to_owned());
        controller
    }

    /// Holds `node` as an administrator would (`scontrol update state=drain reason=...`).
    pub fn hold_node(&self, node: &str, state: pb::NodeState, reason: &str) {
        self.node_states
            .lock()
            .unwrap()
            .insert(node.to_owned(), (state, reason.to_owned()));
    }

    pub fn fail_next(&self, status: Status) {
        self.failures.lock().unwrap().push_back(status);
    }

    /// Refuse the next `times` registrations of `node` with `accepted = false`.
    pub fn refuse_registration(&self, node: &str, times: u32) {
        self.refusals.lock().unwrap().insert(node.to_owned(), times);
    }

    /// Lose every registered node, as a controller that lost its state.
    pub fn forget_all(&self) {
        self.known.lock().unwrap().clear();
    }

    pub fn knows(&self, node: &str) -> bool {
        self.known.lock().unwrap().contains(node)
    }

    /// GetJobs and GetNodes wait `delay` before answering (a follower whose forward to the leader
    /// hangs: it forwards reads too; Ping is answered locally and does not wait).
    pub fn set_read_delay(&self, delay: std::time::Duration) {
        *self.read_delay.lock().unwrap() = delay;
    }

    pub fn set_delay(&self, delay: std::time::Duration) {
        *self.delay.lock().unwrap() = delay;
    }

    /// Applies the next SubmitJob and never answers it: a reply lost after the write.
    pub fn lose_next_submit_reply(&self) {
        self.lose_next_submit_reply.store(true, Ordering::SeqCst);
    }

    /// Holds job `job_id` in `state`, as a replica's copy would.
    pub fn set_job(&self, job_id: u32, state: pb::JobState) {
        let mut jobs = self.jobs.lock().unwrap();
        jobs.retain(|job| job.job_id != job_id);
        jobs.push(pb::JobInfo {
            job_id,
            state: state.into(),
            ..Default::default()
        });
    }

    /// The jobs submitted so far.
    pub fn jobs(&self) -> Vec<pb::JobInfo> {
        self.jobs.lock().unwrap().clone()
    }

    /// Node calls in arrival order, e.g. `RegisterAgent a`, `UpdateNode a DOWN`.
    /// The `authorization` metadata of every call so far ("" for a call without one).
    pub fn authorizations(&self) -> Vec<String> {
        self.authorizations.lock().unwrap().clone()
    }

    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    async fn enter(&self, entry: String) {
        self.log.lock().unwrap().push(entry);
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        let delay = *self.delay.lock().unwrap();
        tokio::time::sleep(delay).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
    }

    fn answer<T>(&self, ok: T) -> Result<Response<T>, Status> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        match self.failures.lock().unwrap().pop_front() {
            Some(status) => Err(status),
            None => Ok(Response::new(ok)),
        }
    }
}

/// A status as a follower sends it during an election, naming the leader.
pub fn not_leader(leader: &str) -> Status {
    let mut status = Status::unavailable("not the Raft leader");
    status.metadata_mut().insert(
        spur_proto::LEADER_HINT_KEY,
        MetadataValue::try_from(leader).unwrap(),
    );
    status
}

#[tonic::async_trait]
impl pb::SlurmController for ScriptedController {
    async fn ping(&self, request: Request<()>) -> Result<Response<pb::PingResponse>, Status> {
        let auth = authorization(&request);
        let hostname = self.hostname.lock().unwrap().clone();
        self.answer(pb::PingResponse {
            hostname: hostname.unwrap_or_else(|| "spurctld-0".into()),
            server_time: None,
            version: auth,
        })
    }
    async fn register_agent(
        &self,
        r: Request<pb::RegisterAgentRequest>,
    ) -> Result<Response<pb::RegisterAgentResponse>, Status> {
        let name = r.into_inner().hostname;
        self.enter(format!("RegisterAgent {name}")).await;
        let refused = {
            let mut refusals = self.refusals.lock().unwrap();
            match refusals.get_mut(&name) {
                Some(n) if *n > 0 => {
                    *n -= 1;
                    true
                }
                _ => false,
            }
        };
        let answer = self.answer(pb::RegisterAgentResponse {
            accepted: !refused,
            message: if refused {
                "join refused".into()
            } else {
                String::new()
            },
            node_token: format!("token-{name}"),
        });
        if matches!(&answer, Ok(a) if a.get_ref().accepted) {
            self.known.lock().unwrap().insert(name);
        }
        answer
    }
    async fn heartbeat(
        &self,
        r: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatResponse>, Status> {
        let r = r.into_inner();
        self.enter(format!("Heartbeat {} {}", r.hostname, r.node_token))
            .await;
        // (An empty hostname is the channel tests' placeholder call.)
        if !r.hostname.is_empty() && !self.knows(&r.hostname) {
            return Err(Status::not_found(format!(
                "node {} not found — is the node registered?",
                r.hostname
            )));
        }
        self.answer(pb::HeartbeatResponse {})
    }
    async fn update_node(&self, r: Request<pb::UpdateNodeRequest>) -> Result<Response<()>, Status> {
        let r = r.into_inner();
        let state = pb::NodeState::try_from(r.state.unwrap_or(-1))
            .map(|s| s.as_str_name())
            .unwrap_or("none");
        self.enter(format!("UpdateNode {} {state}", r.name)).await;
        let answer = self.answer(());
        if answer.is_ok()
            && let Some(state) = r.state.and_then(|s| pb::NodeState::try_from(s).ok())
        {
            self.hold_node(&r.name, state, r.reason.as_deref().unwrap_or_default());
        }
        answer
    }
    async fn submit_job(
        &self,
        r: Request<pb::SubmitJobRequest>,
    ) -> Result<Response<pb::SubmitJobResponse>, Status> {
        let spec = r.into_inner().spec.unwrap_or_default();
        self.enter(format!("SubmitJob {}", spec.name)).await;
        let answer = self.answer(())?;
        let job_id = {
            let mut jobs = self.jobs.lock().unwrap();
            let job_id = 7 + jobs.len() as u32;
            jobs.push(pb::JobInfo {
                job_id,
                name: spec.name,
                comment: spec.comment,
                ..Default::default()
            });
            job_id
        };
        if self.lose_next_submit_reply.swap(false, Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        Ok(answer.map(|()| pb::SubmitJobResponse {
            job_id,
            warnings: vec![],
        }))
    }
    async fn get_job(
        &self,
        r: Request<pb::GetJobRequest>,
    ) -> Result<Response<pb::JobInfo>, Status> {
        self.answer(pb::JobInfo {
            job_id: r.into_inner().job_id,
            ..Default::default()
        })
    }
    async fn get_nodes(
        &self,
        r: Request<pb::GetNodesRequest>,
    ) -> Result<Response<pb::GetNodesResponse>, Status> {
        let read_delay = *self.read_delay.lock().unwrap();
        tokio::time::sleep(read_delay).await;
        self.node_reads.fetch_add(1, Ordering::SeqCst);
        let states = r.into_inner().states;
        let nodes = self
            .node_states
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, (state, _))| states.is_empty() || states.contains(&(*state as i32)))
            .map(|(name, (state, reason))| pb::NodeInfo {
                name: name.clone(),
                state: *state as i32,
                state_reason: reason.clone(),
            })
            .collect();
        Ok(Response::new(pb::GetNodesResponse { nodes }))
    }
    async fn get_jobs(
        &self,
        r: Request<pb::GetJobsRequest>,
    ) -> Result<Response<pb::GetJobsResponse>, Status> {
        let read_delay = *self.read_delay.lock().unwrap();
        tokio::time::sleep(read_delay).await;
        let name = r.into_inner().name;
        let jobs = self
            .jobs
            .lock()
            .unwrap()
            .iter()
            .filter(|job| name.is_empty() || job.name == name)
            .cloned()
            .collect();
        self.answer(pb::GetJobsResponse { jobs })
    }
    async fn cancel_job(&self, r: Request<pb::CancelJobRequest>) -> Result<Response<()>, Status> {
        let job_id = r.into_inner().job_id;
        self.enter(format!("CancelJob {job_id}")).await;
        let answer = self.answer(())?;
        let mut jobs = self.jobs.lock().unwrap();
        if let Some(job) = jobs.iter_mut().find(|j| j.job_id == job_id) {
            if job.state != pb::JobState::JobPending as i32
                && job.state != pb::JobState::JobRunning as i32
            {
                return Err(Status::internal(format!(
                    "job {job_id} is already {:?}",
                    job.state()
                )));
            }
            job.state = pb::JobState::JobCancelled as i32;
        }
        Ok(answer)
    }
    async fn report_job_status(
        &self,
        _: Request<pb::ReportJobStatusRequest>,
    ) -> Result<Response<()>, Status> {
        self.answer(())
    }
}

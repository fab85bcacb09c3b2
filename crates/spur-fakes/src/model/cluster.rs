//! The replicated log shared through the harness, leadership and elections.
//!
//! Real spurctld replicates through Raft over the network. Here the harness holds the one
//! log, and the network decides only who can commit and who learns what: a leader commits
//! while it reaches a majority; a replica cut off keeps its stale copy and its stale idea
//! of the leader; when the leader dies or loses its majority, a new one is chosen among
//! the reachable majority after a sampled election time. The traffic that matters to the
//! operator (clients to replicas, forwards from followers to the leader, the leader to the
//! agents) does cross the simulated network.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use rand::RngExt;
use rand_chacha::ChaCha8Rng;
use tonic::Status;

use super::scheduler::{Dispatch, DispatchNode};
use super::state::{Command, Effect, LogEntry, StateMachine};
use super::{ControllerConfig, replica_host};
use spur_judge::trace::Trace;

/// What the replicas know of the network between them: whether two replicas' processes
/// exchange messages, and whether one's process is stopped. The simulation's network
/// answers from its faults; the replicas as processes (`spur-sim replica`)
/// answer from what their own processes measure over the kernel's TCP.
pub trait Reach: Send + Sync + std::fmt::Debug {
    /// Whether the replicas on `a` and `b` (neither stopped) exchange messages.
    fn talks(&self, a: &str, b: &str) -> bool;
    /// Whether `host`'s process is stopped.
    fn is_frozen(&self, host: &str) -> bool;
}

/// How a refused registration is answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefusalKind {
    /// An error status `PERMISSION_DENIED`.
    PermissionDenied,
    /// A response with `accepted = false` and a message.
    NotAccepted,
}

/// How the reply to a write that was applied is lost (the ambiguous failure: the client
/// cannot tell whether its write took effect).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LostReply {
    /// The client gets `UNKNOWN "transport error"`: what a real follower answered when
    /// its connection to the leader broke under a forwarded write (docs/specs.md, the wire
    /// subset), and what the client sees of a reset connection. It comes at once.
    TransportError,
    /// No answer ever comes: the reply packet vanished and the connection stays open, so
    /// only the client's own bounds (request timeout, keepalive) end the call.
    Hang,
}

/// A replica's idea of its role.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// It believes it leads (it may be a stale leader cut off from the majority).
    Leader,
    /// It follows `leader` (the host it believes leads), or knows none.
    Follower { leader: Option<String> },
}

/// Why a write was not committed.
#[derive(Debug)]
pub enum ProposeError {
    /// This replica does not lead; `leader` is the one it knows of.
    NotLeader { leader: Option<String> },
    /// It believes it leads but cannot reach a majority: the write waits.
    NoQuorum,
    /// The state refused the write (an answer such as NOT_FOUND).
    Refused(Status),
}

/// One replica slot of the StatefulSet.
#[derive(Debug)]
struct Slot {
    /// The current pod: `spurctld-<slot>`, then `spurctld-<slot>-r<generation>`.
    host: String,
    generation: u32,
    /// Whether its software runs.
    alive: bool,
    /// Who it believes leads.
    known_leader: Option<String>,
    /// When it last heard from the leader it names (a follower forgets it after
    /// `forget_leader_after` of silence).
    heard_leader_at: Duration,
    /// When it last became leader (a node it never heard from counts as heard then).
    leading_since: Duration,
    /// When it last heard each node's heartbeat or registration: memory of the process,
    /// not of the log (spurctld keeps heartbeats in memory).
    heartbeats: BTreeMap<String, Duration>,
    /// Its copy of the state, up to what it has applied.
    state: StateMachine,
}

#[derive(Debug)]
struct ClusterState {
    log: Vec<LogEntry>,
    term: u64,
    /// The slot that won the latest election.
    leader: Option<usize>,
    slots: Vec<Slot>,
    /// When the running election ends, if one runs.
    election_due: Option<Duration>,
    rng: ChaCha8Rng,
    refusal: Option<(Duration, RefusalKind)>,
    /// Writes whose next applied reply is lost, by method name.
    lost_replies: BTreeMap<String, LostReply>,
    /// Join tokens made so far: the next one's number.
    join_tokens_made: u64,
}

/// The shared replicated state of the controller replicas. Cloning shares it.
#[derive(Clone, Debug)]
pub struct Cluster {
    inner: Arc<Mutex<ClusterState>>,
    config: Arc<ControllerConfig>,
    /// `None` in one process over real TCP: every replica reaches every other.
    net: Option<Arc<dyn Reach>>,
    trace: Trace,
    /// Write calls received from clients, with their callers (see [`super::calls`]).
    calls: Arc<Mutex<super::calls::CallLog>>,
}

impl Cluster {
    /// Replica slots with nothing running yet. `rng` draws election times and winners;
    /// `net`, when given, says which replicas reach each other.
    pub fn new(
        config: ControllerConfig,
        rng: ChaCha8Rng,
        net: Option<Arc<dyn Reach>>,
        trace: Trace,
    ) -> Self {
        let slots = (0..config.replicas)
            .map(|slot| Slot {
                host: replica_host(slot, 0),
                generation: 0,
                alive: false,
                known_leader: None,
                heard_leader_at: Duration::ZERO,
                leading_since: Duration::ZERO,
                heartbeats: BTreeMap::new(),
                state: StateMachine::default(),
            })
            .collect();
        Self {
            inner: Arc::new(Mutex::new(ClusterState {
                log: Vec::new(),
                term: 0,
                leader: None,
                slots,
                election_due: None,
                rng,
                refusal: None,
                lost_replies: BTreeMap::new(),
                join_tokens_made: 0,
            })),
            config: Arc::new(config),
            net,
            trace,
            calls: Arc::default(),
        }
    }

    /// Notes a write call received from a client.
    pub fn record_call(&self, call: super::calls::CallRecord) {
        self.calls.lock().expect("call log lock").push(call);
    }

    /// Takes the write calls received since the last call, in the order received.
    pub fn take_calls(&self) -> Vec<super::calls::CallRecord> {
        self.calls.lock().expect("call log lock").take()
    }

    /// Calls that were not recorded because nobody took them.
    pub fn calls_dropped(&self) -> u64 {
        self.calls.lock().expect("call log lock").dropped()
    }

    /// The replicas' tunables.
    pub fn config(&self) -> &ControllerConfig {
        &self.config
    }

    /// The trace the replicas record to.
    pub fn trace(&self) -> &Trace {
        &self.trace
    }

    fn lock(&self) -> MutexGuard<'_, ClusterState> {
        self.inner.lock().expect("cluster lock")
    }

    fn reach(&self, a: &str, b: &str) -> bool {
        a == b || self.net.as_ref().is_none_or(|net| net.talks(a, b))
    }

    fn majority(&self, state: &ClusterState) -> usize {
        state.slots.len() / 2 + 1
    }

    /// Whether `slot` runs and reaches a majority of running replicas (itself included).
    fn has_quorum(&self, state: &ClusterState, slot: usize) -> bool {
        let me = &state.slots[slot];
        me.alive
            && state
                .slots
                .iter()
                .filter(|other| other.alive && self.reach(&me.host, &other.host))
                .count()
                >= self.majority(state)
    }

    /// Whether replica `slot`'s process is stopped ([`Reach::is_frozen`]): its own loops
    /// (scheduling, the health check) do nothing until it runs again.
    pub fn is_frozen(&self, slot: usize) -> bool {
        self.net
            .as_ref()
            .is_some_and(|net| net.is_frozen(&self.host_of(slot)))
    }

    /// The host of the current pod of `slot`.
    pub fn host_of(&self, slot: usize) -> String {
        self.lock().slots[slot].host.clone()
    }

    /// The slot `host` is the current pod of.
    pub fn slot_of(&self, host: &str) -> Option<usize> {
        self.lock().slots.iter().position(|s| s.host == host)
    }

    /// The current pods, by slot.
    pub fn hosts(&self) -> Vec<String> {
        self.lock().slots.iter().map(|s| s.host.clone()).collect()
    }

    /// A replica's software started on `host` (the current pod of `slot`).
    pub fn started(&self, slot: usize, host: &str, now: Duration) {
        let mut state = self.lock();
        let me = &mut state.slots[slot];
        if me.host != host {
            return;
        }
        me.alive = true;
        // A process starts knowing no leader and no heartbeat.
        me.known_leader = None;
        me.heartbeats.clear();
        drop(state);
        self.trace.record(now, host, "replica started");
    }

    /// The pod `host` died. Its slot stays empty until [`Cluster::replace`].
    pub fn died(&self, host: &str, now: Duration) {
        let mut state = self.lock();
        if let Some(me) = state.slots.iter_mut().find(|s| s.host == host) {
            me.alive = false;
            drop(state);
            self.trace
                .record(now, "harness", format!("replica {host} died"));
        }
    }

    /// A new pod for `slot`, with a new name and address and an empty state it catches up
    /// from the log. Returns its host name.
    pub fn replace(&self, slot: usize) -> String {
        let mut state = self.lock();
        let me = &mut state.slots[slot];
        me.generation += 1;
        me.host = replica_host(slot, me.generation);
        me.alive = false;
        me.known_leader = None;
        me.heartbeats.clear();
        me.state = StateMachine::default();
        let host = me.host.clone();
        // A new pod must win an election like any other; it does not inherit the slot's
        // leadership (that would skip the election when it starts before one ends).
        if state.leader == Some(slot) {
            state.leader = None;
        }
        host
    }

    /// The leader, if it runs and reaches a majority: one that can commit writes. (A
    /// leader cut off from its peers still believes it leads; see [`Cluster::leader`].)
    pub fn leader_with_quorum(&self) -> Option<String> {
        let state = self.lock();
        state
            .leader
            .filter(|&slot| state.slots[slot].alive && self.has_quorum(&state, slot))
            .map(|slot| state.slots[slot].host.clone())
    }

    /// The leader that won the latest election, if its software still runs.
    pub fn leader(&self) -> Option<String> {
        let state = self.lock();
        state
            .leader
            .map(|slot| &state.slots[slot])
            .filter(|slot| slot.alive)
            .map(|slot| slot.host.clone())
    }

    /// The current term (one per election won).
    pub fn term(&self) -> u64 {
        self.lock().term
    }

    /// A copy of the committed log.
    pub fn log(&self) -> Vec<LogEntry> {
        self.lock().log.clone()
    }

    /// The job ids the log handed out, in commit order.
    pub fn job_ids(&self) -> Vec<u32> {
        self.lock()
            .log
            .iter()
            .filter_map(|entry| match entry.outcome {
                Effect::JobId(id) => Some(id),
                _ => None,
            })
            .collect()
    }

    /// Refuse registrations until simulated time `until`.
    pub fn refuse_registrations(&self, until: Duration, kind: RefusalKind) {
        self.lock().refusal = Some((until, kind));
    }

    /// A new join token, `(id, secret)`: the next of the cluster's sequence.
    pub fn new_join_token(&self) -> (String, String) {
        let mut state = self.lock();
        let number = state.join_tokens_made;
        state.join_tokens_made += 1;
        super::admission::new_join_token(number)
    }

    /// Whether registrations are refused at `now`, and how.
    pub fn registration_refusal(&self, now: Duration) -> Option<RefusalKind> {
        self.lock()
            .refusal
            .filter(|(until, _)| now < *until)
            .map(|(_, kind)| kind)
    }

    /// The reply to the next `method` write (`"SubmitJob"`, …) that the leader applies is
    /// lost, as `how` says. The write itself stays applied.
    pub fn lose_next_reply(&self, method: &str, how: LostReply) {
        self.lock().lost_replies.insert(method.to_owned(), how);
    }

    /// Takes the pending lost reply of `method`, if one is armed (one write loses it).
    pub fn take_lost_reply(&self, method: &str) -> Option<LostReply> {
        self.lock().lost_replies.remove(method)
    }

    /// State loss: the leader forgets every registered node (a log entry, so every
    /// replica forgets). Does nothing without a leader.
    pub fn forget_nodes(&self, now: Duration) {
        let leader = self.lock().leader;
        if let Some(slot) = leader {
            let _ = self.propose(slot, Command::ForgetNodes, now);
        }
    }

    /// A join token committed through the leader as `CreateToken` commits one: the
    /// harness's `spur token create`. Returns `(token, id)`; `None` without a leader.
    pub fn create_join_token(&self, now: Duration) -> Option<(String, String)> {
        let slot = self.lock().leader?;
        let (id, secret) = self.new_join_token();
        let token = super::admission::record(&secret, None);
        let command = Command::CreateToken {
            id: id.clone(),
            token,
        };
        self.propose(slot, command, now).ok()?;
        Some((format!("{id}.{secret}"), id))
    }

    /// Revokes join token `id` through the leader, as `RevokeToken` does; false without a
    /// leader or for an unknown id.
    pub fn revoke_join_token(&self, id: &str, now: Duration) -> bool {
        let Some(slot) = self.lock().leader else {
            return false;
        };
        let command = Command::RevokeToken { id: id.to_owned() };
        self.propose(slot, command, now).is_ok()
    }

    /// `slot`'s idea of its role.
    pub fn role(&self, slot: usize) -> Role {
        let state = self.lock();
        let me = &state.slots[slot];
        match &me.known_leader {
            Some(leader) if *leader == me.host => Role::Leader,
            leader => Role::Follower {
                leader: leader.clone(),
            },
        }
    }

    /// Commits `command` through `slot`, which must lead and reach a majority.
    pub fn propose(
        &self,
        slot: usize,
        command: Command,
        now: Duration,
    ) -> Result<Effect, ProposeError> {
        let mut state = self.lock();
        self.leadership(&state, slot)?;
        state.slots[slot]
            .state
            .check(&command)
            .map_err(ProposeError::Refused)?;
        let outcome = self.append(&mut state, slot, command, now);
        Ok(outcome)
    }

    /// Runs `check` on the state of `slot`, which must believe it leads, with or without a
    /// majority: what spurctld does for a heartbeat (kept in the leader's memory, no Raft
    /// write), so a leader cut off from its peers still answers it.
    pub fn leader_local<T>(
        &self,
        slot: usize,
        check: impl FnOnce(&StateMachine) -> Result<T, Status>,
    ) -> Result<T, ProposeError> {
        let state = self.lock();
        let me = &state.slots[slot];
        if me.known_leader.as_deref() != Some(me.host.as_str()) {
            return Err(ProposeError::NotLeader {
                leader: me.known_leader.clone(),
            });
        }
        check(&me.state).map_err(ProposeError::Refused)
    }

    /// `slot` heard from node `name` (a heartbeat or a registration) at `now`.
    pub fn heard_from(&self, slot: usize, name: &str, now: Duration) {
        self.lock().slots[slot]
            .heartbeats
            .insert(name.to_owned(), now);
    }

    /// On the leader `slot`: the nodes not yet DOWN or held whose last heartbeat it heard
    /// is older than the timeout; none on a replica that does not lead. The post-election
    /// grace is the health check's own (see `scheduler::LeadershipGrace`).
    pub fn silent_nodes(&self, slot: usize, now: Duration) -> Vec<String> {
        let state = self.lock();
        let me = &state.slots[slot];
        let timeout = self.config.heartbeat_timeout;
        if me.known_leader.as_deref() != Some(me.host.as_str()) {
            return Vec::new();
        }
        me.state
            .nodes
            .iter()
            .filter(|(_, node)| {
                !matches!(
                    node.state,
                    spur_proto::NodeState::NodeDown
                        | spur_proto::NodeState::NodeDrain
                        | spur_proto::NodeState::NodeDraining
                )
            })
            .filter(|(name, _)| {
                let last = me
                    .heartbeats
                    .get(*name)
                    .copied()
                    .unwrap_or(me.leading_since);
                now.saturating_sub(last) > timeout
            })
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// On the leader `slot`: the DOWN (or ERROR) nodes no admin holds that it heard a
    /// heartbeat from within the timeout, which its health check brings back. A node it has
    /// not heard from at all is left as it is, as spurctld leaves a node with no
    /// `last_heartbeat`. Unlike marking DOWN, no post-election grace holds this back.
    pub fn recovered_nodes(&self, slot: usize, now: Duration) -> Vec<String> {
        let state = self.lock();
        let me = &state.slots[slot];
        if me.known_leader.as_deref() != Some(me.host.as_str()) {
            return Vec::new();
        }
        let timeout = self.config.heartbeat_timeout;
        me.state
            .nodes
            .iter()
            .filter(|(_, node)| node.recoverable())
            .filter(|(name, _)| {
                me.heartbeats
                    .get(*name)
                    .is_some_and(|last| now.saturating_sub(*last) <= timeout)
            })
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Reads `slot`'s own copy of the state (possibly stale).
    pub fn read<T>(&self, slot: usize, read: impl FnOnce(&StateMachine) -> T) -> T {
        read(&self.lock().slots[slot].state)
    }

    fn leadership(&self, state: &ClusterState, slot: usize) -> Result<(), ProposeError> {
        let me = &state.slots[slot];
        if me.known_leader.as_deref() != Some(me.host.as_str()) {
            return Err(ProposeError::NotLeader {
                leader: me.known_leader.clone(),
            });
        }
        if state.leader != Some(slot) || !self.has_quorum(state, slot) {
            return Err(ProposeError::NoQuorum);
        }
        Ok(())
    }

    fn append(
        &self,
        state: &mut ClusterState,
        slot: usize,
        command: Command,
        now: Duration,
    ) -> Effect {
        let index = state.log.len() as u64 + 1;
        let term = state.term;
        let outcome = state.slots[slot].state.apply(&command);
        let leader_host = state.slots[slot].host.clone();
        self.trace.record(
            now,
            &leader_host,
            format!(
                "commit #{index} t{term}: {} -> {outcome:?}",
                command.describe()
            ),
        );
        state.log.push(LogEntry {
            index,
            term,
            command,
            outcome: outcome.clone(),
        });
        // Followers in reach apply it at once, so reads through them are fresh.
        for other in 0..state.slots.len() {
            if other != slot {
                let host = state.slots[other].host.clone();
                if state.slots[other].alive && self.reach(&leader_host, &host) {
                    Self::catch_up(state, other);
                }
            }
        }
        outcome
    }

    fn catch_up(state: &mut ClusterState, slot: usize) {
        let ClusterState { log, slots, .. } = state;
        let copy = &mut slots[slot].state;
        while (copy.applied as usize) < log.len() {
            let entry = &log[copy.applied as usize];
            copy.apply(&entry.command);
        }
    }

    /// On the leader `slot` (with a majority): the dispatches to make now, one per job
    /// that fits on idle nodes. Nothing is committed: as in spurctld, the job stays
    /// PENDING with no nodes until every node confirmed its LaunchJob.
    pub fn schedule(&self, slot: usize, at: SystemTime) -> Vec<Dispatch> {
        let state = self.lock();
        if self.leadership(&state, slot).is_err() {
            return Vec::new();
        }
        let copy = &state.slots[slot].state;
        copy.placements(at)
            .into_iter()
            .map(|(job_id, nodes)| {
                let job = &copy.jobs[&job_id];
                Dispatch {
                    job_id,
                    attempt: job.attempt + 1,
                    requeue_count: job.requeue_count,
                    array: job.array,
                    spec: job.spec.clone(),
                    nodes: nodes
                        .into_iter()
                        .map(|name| {
                            let node = &copy.nodes[&name];
                            DispatchNode {
                                address: node.address.clone(),
                                port: node.port,
                                name,
                            }
                        })
                        .collect(),
                }
            })
            .collect()
    }

    fn sample_election(&self, state: &mut ClusterState) -> Duration {
        let min = self.config.election_min.as_millis() as u64;
        let max = self.config.election_max.as_millis() as u64;
        Duration::from_millis(state.rng.random_range(min..=max.max(min)))
    }

    /// Advances leadership to simulated time `now`: replicas in reach of the leader learn
    /// it and catch up; a lost leader starts an election that ends after a sampled time
    /// with a new leader among the replicas that reach a majority.
    pub fn tick(&self, now: Duration) {
        let mut state = self.lock();
        self.forget_silent_leaders(&mut state, now);
        let healthy = state.leader.filter(|&slot| self.has_quorum(&state, slot));
        match (healthy, state.election_due) {
            (Some(leader), _) => {
                state.election_due = None;
                self.spread_leader(&mut state, leader, now);
            }
            (None, None) => {
                let after = self.sample_election(&mut state);
                state.election_due = Some(now + after);
                let what = match state.leader {
                    Some(slot) => format!("leader {} lost", state.slots[slot].host),
                    None => "no leader".to_owned(),
                };
                self.trace.record(
                    now,
                    "harness",
                    format!("{what}; election ends in {:.3}s", after.as_secs_f64()),
                );
            }
            (None, Some(due)) if now >= due => {
                let candidates: Vec<usize> = (0..state.slots.len())
                    .filter(|&slot| self.has_quorum(&state, slot))
                    .collect();
                if candidates.is_empty() {
                    let after = self.sample_election(&mut state);
                    state.election_due = Some(now + after);
                    self.trace
                        .record(now, "harness", "election found no majority; retrying");
                    return;
                }
                let winner = candidates[state.rng.random_range(0..candidates.len())];
                state.term += 1;
                state.leader = Some(winner);
                state.election_due = None;
                // A winner's log is as long as the majority's: it catches up first.
                Self::catch_up(&mut state, winner);
                let host = state.slots[winner].host.clone();
                state.slots[winner].known_leader = Some(host.clone());
                state.slots[winner].leading_since = now;
                self.trace
                    .record(now, &host, format!("elected leader, term {}", state.term));
                self.spread_leader(&mut state, winner, now);
            }
            (None, Some(_)) => {}
        }
    }

    /// Replicas that reach the leader learn who leads and catch up; a follower that has
    /// not heard its leader for `forget_leader_after` forgets it.
    fn spread_leader(&self, state: &mut ClusterState, leader: usize, now: Duration) {
        let leader_host = state.slots[leader].host.clone();
        let informed: Vec<usize> = (0..state.slots.len())
            .filter(|&slot| {
                let host = &state.slots[slot].host;
                state.slots[slot].alive && self.reach(host, &leader_host)
            })
            .collect();
        for slot in informed {
            if state.slots[slot].known_leader.as_deref() != Some(leader_host.as_str()) {
                state.slots[slot].known_leader = Some(leader_host.clone());
            }
            state.slots[slot].heard_leader_at = now;
            Self::catch_up(state, slot);
        }
    }

    /// Followers that have not heard the leader they name for `forget_leader_after`
    /// forget it (spurctld's followers then refuse writes at once, with no leader hint).
    fn forget_silent_leaders(&self, state: &mut ClusterState, now: Duration) {
        let healthy = state
            .leader
            .filter(|&slot| self.has_quorum(state, slot))
            .map(|slot| state.slots[slot].host.clone());
        for slot in &mut state.slots {
            let names_other = slot
                .known_leader
                .as_ref()
                .is_some_and(|leader| *leader != slot.host);
            let hears = healthy.as_ref().is_some_and(|leader| {
                slot.known_leader.as_ref() == Some(leader) && self.reach(&slot.host, leader)
            });
            if names_other
                && !hears
                && now.saturating_sub(slot.heard_leader_at) >= self.config.forget_leader_after
            {
                slot.known_leader = None;
            }
        }
    }
}

//! How the operator uses its channel to spurctld: the one description of it, and the state
//! machine that does it. Flag docs and the README point here.
//!
//! What a client can really observe of spurctld (fidelity.md rows 3, 8, 10, 11, 22) is
//! little: a Ping is answered by whichever replica the Service picked, from its own
//! process, leader or not; a follower forwards reads and writes to the leader over a client
//! with no bound, so both hang while that forward hangs, and reads fall back to the
//! follower's own copy when the forward fails; a follower that knows no leader refuses
//! writes at once (`UNAVAILABLE "not the Raft leader"`); a leader cut off from its majority
//! never steps down, answers reads and heartbeats from its own state and holds writes until
//! it learns a newer term. So no answer tells who leads; what a client can learn is whether
//! a replica serves a forwarded read now, and how long a call has waited. The rules:
//!
//! 1. **One shared channel; a failed call drops it** ([`Rule::DropOnFailure`]). A transport
//!    failure (UNAVAILABLE, UNKNOWN, CANCELLED, DEADLINE_EXCEEDED, a failed connect) drops
//!    the channel the call used, and the next call dials the Service afresh: a request bound
//!    alone would cancel the call but leave the next one on the same dead connection, and a
//!    follower that refuses writes keeps refusing them: one cut off from its peers refuses
//!    every write until the cut heals, and a channel kept on it is left only when another
//!    rule moves it (docs/evidence.md, `follower-cut-off`). An answer (NOT_FOUND,
//!    INVALID_ARGUMENT, ...) keeps the channel. The dropped channel is Pinged for its
//!    replica's name and the next round passes over that replica as rule 4 does
//!    ([`Rule::Avoid`]): a headless Service's name resolves to its pods in one order, and a
//!    dialer that takes them in turn can meet the same one at the same point of every round.
//!    A follower cut off from its peers answers the probe from its own copy, so without the
//!    pass-over every round could share it again while it refuses every write.
//!    A round whose every candidate answered its probe and was passed over (the Service
//!    handed out no other replica; with one replica, there is none) falls back to it
//!    instead of failing its calls: it dials once more, passing over nothing, and shares
//!    that channel if its probe is answered. Without the fallback, with a single replica
//!    the round after every failed call failed at once, so each retry cost a second
//!    failure. Whenever a candidate reaches another replica, or fails its dial or probe,
//!    the pass-over stands (a round after rule 6 never falls back).
//! 2. **A new channel serves a forwarded read before it is shared** ([`Rule::ProbeRedial`]):
//!    each one dialed is asked for a job that cannot exist (GetJobs of id `u32::MAX`) within
//!    the probe's bound. A follower whose forwards hang (its leader frozen, gone, or cut off
//!    from it) does not answer, and the Service is dialed again, up to `dials` times; when
//!    every probe failed, the calls waiting fail and their callers retry within a second:
//!    sharing the last channel anyway, as an earlier version did, left its calls hung on a
//!    replica known not to serve. A frozen leader stays in the Service, so without the probe
//!    a dial that lands on it, or on a follower still forwarding to it, is shared unasked
//!    (docs/evidence.md, `leader-freeze`).
//! 3. **Dials are hedged** ([`Rule::Hedge`]): while no dial of a round has a verdict, another
//!    starts every quarter of the probe's bound. A SYN that a Service with no ready endpoint
//!    dropped is retransmitted by the kernel only after 1 s, 3 s, ...; a dial made a moment
//!    later reaches an endpoint that became ready meanwhile, and one to another replica
//!    answers while the first waits on a hung forward.
//! 4. **A call waits no longer than the probe's bound while another channel serves**
//!    ([`Rule::Patience`], [`Rule::Abandon`]): once a call on the shared channel has waited
//!    that long (an answer inside a cluster takes milliseconds), a replacement round dials
//!    the Service; a candidate is Pinged for its replica's name, as is the stuck channel
//!    (every replica answers Ping itself, with its own name: it names who answers, never
//!    who leads), and one that reached the same replica is passed over ([`Rule::Avoid`]):
//!    a leader cut off from its peers serves the probe's read from its own state, and the
//!    Service would pick it again one time in three. When a candidate's probe is answered it
//!    is shared, the old one dropped,
//!    and every call that waited that long on the old one is abandoned (CANCELLED), for its
//!    caller to retry on the new channel. That is what takes a write off a follower
//!    forwarding to a leader that vanished, or off a leader cut off from its peers, within
//!    about a second instead of the request bound (5 s) after a new leader is elected
//!    (docs/evidence.md, `leader-cut-follower`). At most one round per bound, however many
//!    calls wait. An abandoned write may still have applied, as when the request bound
//!    fires: SubmitJob looks for its SpurJob's UID before submitting again.
//! 5. **A channel is replaced at its maximum age** ([`Rule::Rotate`]), by one to another
//!    replica whose probe is answered (named and passed over as in rule 4), else kept: a
//!    leader cut off from its peers keeps a healthy connection and answers reads and
//!    heartbeats from a stale state, which neither keepalive nor a bound notices, while the
//!    new leader hears no heartbeat and marks the nodes DOWN after its timeout (90 s),
//!    failing their jobs. An idle operator calls about once a heartbeat interval (30 s),
//!    and each such round rotates (the maximum age, 20 s, is under it); since a rotation
//!    never lands on the replica it left, no two rounds in a row reach the cut leader, and
//!    the new leader hears every node at least every other round. Rotating to the first
//!    candidate whose probe was answered, as an earlier version did, can stay on the cut
//!    leader, since its own state answers the probe (`sim/tests/simulated/cut_replica.rs`;
//!    docs/evidence.md, `leader-cut-long`).
//! 6. **A replica that contradicts an acknowledged write is left** ([`Rule::ReadYourWrites`]):
//!    the client remembers each job whose end its agent reported and a replica acknowledged
//!    ([`super::session`]); a read sent a grace (2 s: four Raft heartbeats) after that
//!    which still shows the job pending or running came from a replica answering from a
//!    stale copy (a leader cut off from its peers, or a follower that forgot its leader),
//!    often one that rotation or a fresh dial just picked. Its channel is dropped, the read
//!    fails for its caller to retry, and the next round passes over that replica as rule 4
//!    does. The acknowledgement is kept: when the operator can reach nothing else for a
//!    while (a partition leaving it on the stale replica's side), the round that finds no
//!    other replica ends, the next one lands on the same replica, and its reads are left
//!    again, until another replica repeats the contradiction or it has lasted 10 s (then it
//!    is the truth: a report for an attempt already replaced). Forgetting the
//!    acknowledgement after one leaving let the next stale reads be believed until the
//!    rotation (docs/evidence.md, `leader-cut-stale-read`).
//!
//! Bounds outside this module: the connect timeout (a dropped SYN costs it, not the
//! kernel's ~127 s), HTTP/2 keepalive (a connection whose peer vanished is found dead) and
//! the request bound (every call ends), all set on the channel by [`super::connect`].
//!
//! The policy is a pure state machine: the client ([`super::ControllerClient`]) feeds it
//! [`Event`]s stamped with the time they happened and carries out the [`Command`]s it
//! answers with, under one lock; the policy does no I/O, reads no clock and holds no lock,
//! so its tests feed events and assert commands with no network at all.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;

/// A dial of the Service, and the channel it made (one id for both).
pub type DialId = u64;
/// One call of the client's.
pub type CallId = u64;
/// A replica as its Ping names it (the client numbers the names it has seen).
pub type ReplicaId = u64;

/// The numbers of the rules: derived from the config (see [`Rules::from_config`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rules {
    /// Bound on a new channel's probe, and how long a call may wait before a replacement
    /// round starts; `None`: no probe, no patience, no hedge (rules 2 to 4 off).
    pub probe: Option<Duration>,
    /// Dial again this often while no dial of a round has a verdict; `None`: one at a time.
    pub hedge: Option<Duration>,
    /// How long a call may wait on the shared channel before a replacement round.
    pub patience: Option<Duration>,
    /// Replace the shared channel once it is this old.
    pub max_age: Option<Duration>,
    /// Dials per round at most (at least 1).
    pub dials: usize,
    /// Rule 6: how long after an acknowledged end a read that contradicts it means the
    /// replica is behind; `None`: rule 6 off.
    pub read_your_writes: Option<Duration>,
    /// Rule 1, and rule 4's avoidance and abandonment, each on unless switched off.
    pub drop_on_failure: bool,
    pub avoid: bool,
    pub abandon: bool,
}

impl Rules {
    /// The rules of `config`, with those named in `config.rules_off` switched off.
    pub fn from_config(config: &crate::controller::ChannelConfig) -> Rules {
        let off = |rule: Rule| config.rules_off.contains(&rule);
        let probe = config.connect_probe.filter(|_| !off(Rule::ProbeRedial));
        Rules {
            probe,
            hedge: config
                .connect_probe
                .map(|bound| bound / 4)
                .filter(|_| !off(Rule::Hedge)),
            patience: config.connect_probe.filter(|_| !off(Rule::Patience)),
            max_age: config.max_age.filter(|_| !off(Rule::Rotate)),
            read_your_writes: config
                .stale_read_grace
                .filter(|_| !off(Rule::ReadYourWrites)),
            // Without a probe a dial's only verdict is its connect, which has its own bound.
            dials: if probe.is_some() {
                config.dials.max(1)
            } else {
                1
            },
            drop_on_failure: !off(Rule::DropOnFailure),
            avoid: !off(Rule::Avoid),
            abandon: !off(Rule::Abandon),
        }
    }
}

/// A rule of the module doc; each time one fires it is counted
/// (`spur_operator_controller_channel_rules_total{rule}`), and each can be switched off for
/// an experiment (`--controller-rules-off`, hidden).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Rule {
    DropOnFailure,
    ProbeRedial,
    Hedge,
    Patience,
    Avoid,
    Abandon,
    Rotate,
    ReadYourWrites,
}

impl Rule {
    pub const ALL: [Rule; 8] = [
        Rule::DropOnFailure,
        Rule::ProbeRedial,
        Rule::Hedge,
        Rule::Patience,
        Rule::Avoid,
        Rule::Abandon,
        Rule::Rotate,
        Rule::ReadYourWrites,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Rule::DropOnFailure => "drop-on-failure",
            Rule::ProbeRedial => "probe-redial",
            Rule::Hedge => "hedge",
            Rule::Patience => "patience",
            Rule::Avoid => "avoid",
            Rule::Abandon => "abandon",
            Rule::Rotate => "rotate",
            Rule::ReadYourWrites => "read-your-writes",
        }
    }
}

impl std::str::FromStr for Rule {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Rule::ALL
            .into_iter()
            .find(|r| r.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Rule::ALL.iter().map(|r| r.name()).collect();
                format!("unknown rule `{s}` (one of {})", names.join(", "))
            })
    }
}

/// How a call ended, as far as the channel is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// The controller answered (a value, or a verdict such as NOT_FOUND).
    Answered,
    /// A transport failure or a refusal to serve: the channel goes (rule 1).
    Failed,
    /// The caller stopped waiting (its own timeout): nothing learnt about the channel.
    Left,
    /// Answered from a copy behind a write another answer acknowledged (rule 6): the
    /// channel goes, and the next round avoids its replica.
    Behind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A call wants a channel.
    CallStarted {
        call: CallId,
    },
    CallEnded {
        call: CallId,
        ended: Ended,
    },
    /// A dial ended: a channel, or the connect's error.
    Dialed {
        dial: DialId,
        ok: bool,
    },
    /// A new channel's probe was answered within its bound, or not.
    Probed {
        dial: DialId,
        answered: bool,
    },
    /// Dial `dial`'s channel reached the replica whose Ping answered with this name.
    Named {
        dial: DialId,
        replica: ReplicaId,
    },
    /// Time passed (the client ticks at [`Policy::next_wake`]).
    Tick,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// Dial the Service (connect a new channel) and report [`Event::Dialed`].
    Dial { dial: DialId },
    /// Probe dial `dial`'s channel within the probe's bound and report [`Event::Probed`];
    /// when `named`, Ping it first and report [`Event::Named`].
    Probe { dial: DialId, named: bool },
    /// Ping dial `dial`'s channel and report [`Event::Named`] if answered.
    Name { dial: DialId },
    /// Dial `dial`'s channel is the one calls share from now.
    Share { dial: DialId },
    /// Call `call` goes on dial `dial`'s channel.
    Use { call: CallId, dial: DialId },
    /// Dial `dial`'s channel is shared no more (it dropped for `rule`); calls still on it
    /// finish there.
    Drop { dial: DialId, rule: Rule },
    /// Dial `dial`'s channel is not needed: close it.
    Discard { dial: DialId },
    /// Stop waiting for call `call`'s answer: it fails, and its caller retries.
    Abandon { call: CallId },
    /// Call `call`, waiting for a channel, fails: no dial of the round made one that serves
    /// (with the last dial's or probe's error).
    Fail { call: CallId },
}

/// Why a round of dials runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Purpose {
    /// No channel: calls wait for this round.
    Fill,
    /// The shared channel reached its maximum age.
    Rotate,
    /// A call on the shared channel waited past the patience.
    Patience,
}

/// Dials (and their probes) for one channel.
#[derive(Debug)]
struct Round {
    purpose: Purpose,
    started: usize,
    /// Dials whose verdict is not in yet.
    pending: BTreeSet<DialId>,
    /// When the next hedged dial starts; `None` without a hedge.
    next_dial: Option<Instant>,
    /// The channel a patience round replaces, or the one a round after rule 6 or a failed
    /// call left: a candidate that reaches the same replica is no replacement.
    replaces: Option<DialId>,
    /// The round passes over a failed call's replica (rule 1): when every candidate is
    /// passed over, it falls back to that replica instead of failing its calls.
    falls_back: bool,
    /// Candidates whose probe was answered but that were passed over for reaching the
    /// replica `replaces` reached.
    passed_over: usize,
}

/// The state of the channel.
#[derive(Debug)]
enum Link {
    /// No channel and no dial: the next call dials.
    Closed,
    /// No channel; calls wait for the round's verdict.
    Connecting(Round),
    /// A channel calls share; `replacing` dials for its successor.
    Open {
        dial: DialId,
        opened: Instant,
        replacing: Option<Round>,
    },
}

#[derive(Debug)]
struct Call {
    /// The channel the call went on; `None` while it waits for one.
    on: Option<DialId>,
    /// When it started, or went on its channel after waiting for one.
    started: Instant,
}

/// The channel policy (see the module doc).
#[derive(Debug)]
pub struct Policy {
    rules: Rules,
    link: Link,
    calls: BTreeMap<CallId, Call>,
    next_dial: DialId,
    /// When the last patience round started: at most one per patience.
    last_patience_round: Option<Instant>,
    /// The replica each named channel reached.
    names: BTreeMap<DialId, ReplicaId>,
    /// The channel a failed call dropped while no round ran: the next round passes over
    /// its replica (rule 1).
    failed_on: Option<DialId>,
    fired: Vec<Rule>,
}

impl Policy {
    pub fn new(rules: Rules) -> Policy {
        Policy {
            rules,
            link: Link::Closed,
            calls: BTreeMap::new(),
            next_dial: 0,
            last_patience_round: None,
            names: BTreeMap::new(),
            failed_on: None,
            fired: Vec::new(),
        }
    }

    pub fn rules(&self) -> &Rules {
        &self.rules
    }

    /// The channel calls share now.
    pub fn shared(&self) -> Option<DialId> {
        match self.link {
            Link::Open { dial, .. } => Some(dial),
            _ => None,
        }
    }

    /// The channel `call` was given, and the replica it reached when a Ping named it.
    pub fn channel_of(&self, call: CallId) -> (Option<DialId>, Option<ReplicaId>) {
        let dial = self.calls.get(&call).and_then(|call| call.on);
        (dial, dial.and_then(|dial| self.names.get(&dial).copied()))
    }

    /// The rules that fired since the last take, in order.
    pub fn take_fired(&mut self) -> Vec<Rule> {
        std::mem::take(&mut self.fired)
    }

    /// Applies `event`, which happened at `now`, and answers what to do.
    pub fn on(&mut self, now: Instant, event: Event) -> Vec<Command> {
        let mut out = Vec::new();
        match event {
            Event::CallStarted { call } => self.call_started(now, call, &mut out),
            Event::CallEnded { call, ended } => self.call_ended(now, call, ended, &mut out),
            Event::Dialed { dial, ok } => self.dialed(now, dial, ok, &mut out),
            Event::Probed { dial, answered } => self.probed(now, dial, answered, &mut out),
            Event::Named { dial, replica } => {
                self.names.insert(dial, replica);
            }
            Event::Tick => self.tick(now, &mut out),
        }
        // Names matter for the shared channel, a round's candidates and what it replaces.
        let round = self.round();
        let live = |dial: &DialId| {
            self.shared() == Some(*dial)
                || self.failed_on == Some(*dial)
                || round.is_some_and(|r| r.pending.contains(dial) || r.replaces == Some(*dial))
        };
        let dead: Vec<DialId> = self.names.keys().copied().filter(|d| !live(d)).collect();
        for dial in dead {
            self.names.remove(&dial);
        }
        out
    }

    /// When the client should send the next [`Event::Tick`]; `None`: only on an event.
    pub fn next_wake(&self) -> Option<Instant> {
        let hedge = self
            .round()
            .and_then(|round| round.next_dial.filter(|_| round.started < self.rules.dials));
        let patience = self.rules.patience.and_then(|patience| {
            let Link::Open {
                dial, replacing, ..
            } = &self.link
            else {
                return None;
            };
            self.calls
                .values()
                .filter_map(|call| {
                    let due = call.started + patience;
                    if call.on? != *dial {
                        // On a channel no longer shared: abandoned at its patience.
                        return self.rules.abandon.then_some(due);
                    }
                    if replacing.is_some() {
                        return None; // the round's verdict decides
                    }
                    Some(match self.last_patience_round {
                        Some(last) => due.max(last + patience),
                        None => due,
                    })
                })
                .min()
        });
        [hedge, patience].into_iter().flatten().min()
    }

    fn round(&self) -> Option<&Round> {
        match &self.link {
            Link::Connecting(round) => Some(round),
            Link::Open { replacing, .. } => replacing.as_ref(),
            Link::Closed => None,
        }
    }

    fn round_mut(&mut self) -> Option<&mut Round> {
        match &mut self.link {
            Link::Connecting(round) => Some(round),
            Link::Open { replacing, .. } => replacing.as_mut(),
            Link::Closed => None,
        }
    }

    fn start_round(&mut self, now: Instant, purpose: Purpose, out: &mut Vec<Command>) -> Round {
        let dial = self.take_dial_id();
        out.push(Command::Dial { dial });
        Round {
            purpose,
            started: 1,
            pending: BTreeSet::from([dial]),
            next_dial: self.rules.hedge.map(|hedge| now + hedge),
            replaces: None,
            falls_back: false,
            passed_over: 0,
        }
    }

    fn take_dial_id(&mut self) -> DialId {
        let dial = self.next_dial;
        self.next_dial += 1;
        dial
    }

    /// One more dial for the running round, if it has dials left.
    fn dial_again(&mut self, now: Instant, rule: Rule, out: &mut Vec<Command>) -> bool {
        let (dials, hedge) = (self.rules.dials, self.rules.hedge);
        let dial = self.next_dial;
        let Some(round) = self.round_mut() else {
            return false;
        };
        if round.started >= dials {
            return false;
        }
        round.started += 1;
        round.pending.insert(dial);
        round.next_dial = hedge.map(|hedge| now + hedge);
        self.next_dial += 1;
        self.fired.push(rule);
        out.push(Command::Dial { dial });
        true
    }

    fn call_started(&mut self, now: Instant, call: CallId, out: &mut Vec<Command>) {
        let mut on = None;
        match &self.link {
            Link::Closed => {
                let mut round = self.start_round(now, Purpose::Fill, out);
                round.replaces = self.failed_on.take();
                round.falls_back = round.replaces.is_some();
                self.link = Link::Connecting(round);
            }
            Link::Connecting(_) => {}
            Link::Open {
                dial,
                opened,
                replacing,
            } => {
                let (dial, expired) = (
                    *dial,
                    self.rules
                        .max_age
                        .is_some_and(|max_age| now >= *opened + max_age),
                );
                if expired && replacing.is_none() {
                    self.fired.push(Rule::Rotate);
                    // A rotation that lands on the replica it left would bound nothing: it
                    // wants another replica, as a patience round does.
                    if self.rules.avoid && !self.names.contains_key(&dial) {
                        out.push(Command::Name { dial });
                    }
                    let mut round = self.start_round(now, Purpose::Rotate, out);
                    round.replaces = Some(dial).filter(|_| self.rules.avoid);
                    if let Link::Open { replacing, .. } = &mut self.link {
                        *replacing = Some(round);
                    }
                }
                on = Some(dial);
                out.push(Command::Use { call, dial });
            }
        }
        self.calls.insert(call, Call { on, started: now });
    }

    fn call_ended(&mut self, now: Instant, call: CallId, ended: Ended, out: &mut Vec<Command>) {
        let Some(call) = self.calls.remove(&call) else {
            return; // abandoned or failed already
        };
        if ended == Ended::Behind {
            self.leave_behind(now, call, out);
            return;
        }
        if ended != Ended::Failed || !self.rules.drop_on_failure {
            return;
        }
        let Link::Open {
            dial, replacing, ..
        } = &mut self.link
        else {
            return;
        };
        if call.on != Some(*dial) {
            return; // an older channel, already replaced
        }
        let dial = *dial;
        let replacing = replacing.take();
        self.fired.push(Rule::DropOnFailure);
        // The next round passes over the replica that failed the call, as a patience round
        // does: a follower cut off from its peers refuses every write, and a Service that
        // hands out its pods in turn can hand it out again every round.
        let avoid = Some(dial).filter(|_| self.rules.avoid);
        // A round replacing this channel asked for its name already.
        let asked = replacing.as_ref().is_some_and(|r| r.replaces == Some(dial));
        if avoid.is_some() && !asked && !self.names.contains_key(&dial) {
            out.push(Command::Name { dial });
        }
        out.push(Command::Drop {
            dial,
            rule: Rule::DropOnFailure,
        });
        // A replacement under way becomes the round the next calls wait for.
        self.link = match replacing {
            Some(mut round) => {
                round.purpose = Purpose::Fill;
                round.replaces = round.replaces.or(avoid);
                round.falls_back = avoid.is_some();
                Link::Connecting(round)
            }
            None => {
                self.failed_on = avoid;
                Link::Closed
            }
        };
    }

    /// Rule 6: `call` read from a replica behind an acknowledged write. Its channel, if
    /// still shared, is dropped, and a round that passes over its replica starts at once
    /// (a replacement under way is told to pass over it too).
    fn leave_behind(&mut self, now: Instant, call: Call, out: &mut Vec<Command>) {
        let Some(on) = call.on else {
            return;
        };
        if self.rules.read_your_writes.is_none() || self.shared() != Some(on) {
            return; // switched off, or an older channel, already replaced
        }
        self.fired.push(Rule::ReadYourWrites);
        if !self.names.contains_key(&on) {
            out.push(Command::Name { dial: on });
        }
        out.push(Command::Drop {
            dial: on,
            rule: Rule::ReadYourWrites,
        });
        let replacing = match &mut self.link {
            Link::Open { replacing, .. } => replacing.take(),
            _ => None,
        };
        let mut round = match replacing {
            Some(mut round) => {
                round.purpose = Purpose::Fill;
                round
            }
            None => self.start_round(now, Purpose::Fill, out),
        };
        round.replaces = Some(on);
        self.link = Link::Connecting(round);
    }

    fn dialed(&mut self, now: Instant, dial: DialId, ok: bool, out: &mut Vec<Command>) {
        let probing = self.rules.probe.is_some();
        let Some(round) = self.round_mut().filter(|r| r.pending.contains(&dial)) else {
            if ok {
                out.push(Command::Discard { dial });
            }
            return;
        };
        match (ok, probing) {
            (true, true) => {
                let named = round.replaces.is_some();
                out.push(Command::Probe { dial, named });
            }
            (true, false) => self.accept(now, dial, out),
            (false, _) => {
                round.pending.remove(&dial);
                // A refused or timed-out connect is a verdict: the next dial starts now.
                if !self.dial_again(now, Rule::ProbeRedial, out) {
                    self.round_over_if_done(now, out);
                }
            }
        }
    }

    fn probed(&mut self, now: Instant, dial: DialId, answered: bool, out: &mut Vec<Command>) {
        let Some(replaces) = self
            .round()
            .filter(|r| r.pending.contains(&dial))
            .map(|r| r.replaces)
        else {
            out.push(Command::Discard { dial });
            return;
        };
        // A patience round wants another replica than the one the calls are stuck on, and a
        // round after rule 6 another than the one that was behind: a leader cut off from
        // its peers serves reads from its own state, and the Service may pick it again and
        // again.
        let same_replica = self.rules.avoid
            && replaces.is_some_and(|old| {
            matches!((self.names.get(&old), self.names.get(&dial)), (Some(a), Some(b)) if a == b)
        });
        if answered && !same_replica {
            self.accept(now, dial, out);
            return;
        }
        if same_replica {
            self.fired.push(Rule::Avoid);
        }
        let Some(round) = self.round_mut() else {
            return;
        };
        if same_replica && answered {
            round.passed_over += 1;
        }
        round.pending.remove(&dial);
        out.push(Command::Discard { dial });
        if !self.dial_again(now, Rule::ProbeRedial, out) {
            self.round_over_if_done(now, out);
        }
    }

    /// Dial `dial` is accepted: its channel is shared, the round ends.
    fn accept(&mut self, now: Instant, dial: DialId, out: &mut Vec<Command>) {
        let link = std::mem::replace(
            &mut self.link,
            Link::Open {
                dial,
                opened: now,
                replacing: None,
            },
        );
        out.push(Command::Share { dial });
        let (round, old) = match link {
            Link::Connecting(round) => (round, None),
            Link::Open {
                dial: old,
                replacing: Some(round),
                ..
            } => (round, Some(old)),
            Link::Open { .. } | Link::Closed => unreachable!("accept without a round"),
        };
        // The round's other dials report later and are discarded then.
        if let Some(old) = old {
            let rule = match round.purpose {
                Purpose::Patience => Rule::Patience,
                Purpose::Rotate | Purpose::Fill => Rule::Rotate,
            };
            out.push(Command::Drop { dial: old, rule });
        }
        for (id, call) in &mut self.calls {
            if call.on.is_none() {
                // Its patience counts from now: the wait for a channel has bounds of its own.
                call.on = Some(dial);
                call.started = now;
                out.push(Command::Use { call: *id, dial });
            }
        }
        self.abandon_overdue(now, out);
    }

    /// Abandons every call that waited past the patience on a channel no longer shared.
    fn abandon_overdue(&mut self, now: Instant, out: &mut Vec<Command>) {
        let (Some(patience), Some(shared)) = (self.rules.patience, self.shared()) else {
            return;
        };
        if !self.rules.abandon {
            return;
        }
        let overdue: Vec<CallId> = self
            .calls
            .iter()
            .filter(|(_, call)| {
                call.on.is_some_and(|on| on != shared) && now >= call.started + patience
            })
            .map(|(id, _)| *id)
            .collect();
        for call in overdue {
            self.calls.remove(&call);
            self.fired.push(Rule::Abandon);
            out.push(Command::Abandon { call });
        }
    }

    /// Ends the running round when none of its dials is pending and none may start.
    fn round_over_if_done(&mut self, now: Instant, out: &mut Vec<Command>) {
        let Some(round) = self.round() else {
            return;
        };
        if !round.pending.is_empty() || round.started < self.rules.dials {
            return;
        }
        match &mut self.link {
            // Rule 1's fallback: every candidate answered and reached the replica a failed
            // call left, so no other is to be had; one more dial takes any replica.
            Link::Connecting(round) if round.falls_back && round.passed_over == round.started => {
                round.falls_back = false;
                round.replaces = None;
                let dial = self.next_dial;
                self.next_dial += 1;
                round.pending.insert(dial);
                out.push(Command::Dial { dial });
            }
            Link::Connecting(_) => {
                self.link = Link::Closed;
                let waiting: Vec<CallId> = self
                    .calls
                    .iter()
                    .filter(|(_, call)| call.on.is_none())
                    .map(|(id, _)| *id)
                    .collect();
                for call in waiting {
                    self.calls.remove(&call);
                    out.push(Command::Fail { call });
                }
            }
            // A replacement that found nothing better keeps the shared channel; one for its
            // age keeps it for another maximum age.
            Link::Open {
                replacing, opened, ..
            } => {
                if replacing
                    .take()
                    .is_some_and(|r| r.purpose == Purpose::Rotate)
                {
                    *opened = now;
                }
            }
            Link::Closed => {}
        }
    }

    fn tick(&mut self, now: Instant, out: &mut Vec<Command>) {
        // Rule 3: a hedged dial while the round has no verdict.
        if self
            .round()
            .is_some_and(|r| r.next_dial.is_some_and(|at| now >= at))
        {
            self.dial_again(now, Rule::Hedge, out);
        }
        // Rule 4: calls past their patience.
        let Some(patience) = self.rules.patience else {
            return;
        };
        self.abandon_overdue(now, out);
        let Link::Open {
            dial,
            replacing: None,
            ..
        } = &self.link
        else {
            return;
        };
        let dial = *dial;
        let overdue = self
            .calls
            .values()
            .any(|call| call.on == Some(dial) && now >= call.started + patience);
        let allowed = self
            .last_patience_round
            .is_none_or(|last| now >= last + patience);
        if overdue && allowed {
            self.last_patience_round = Some(now);
            self.fired.push(Rule::Patience);
            if !self.names.contains_key(&dial) {
                out.push(Command::Name { dial });
            }
            let mut round = self.start_round(now, Purpose::Patience, out);
            round.replaces = Some(dial);
            if let Link::Open { replacing, .. } = &mut self.link {
                *replacing = Some(round);
            }
        }
    }
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;

//! Heartbeats for every registered node, on one cadence, with bounded concurrency.
//!
//! spurctld marks a node silent for 90 s (`heartbeat_timeout_secs`) DOWN and fails its
//! jobs (fidelity row 6). At the default 30 s interval and 5 s request bound a node gets
//! three tries inside that window, so one failed round (an election, a blip) costs
//! nothing; `spur_operator_node_heartbeat_age_seconds` shows how close each node came.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::stream::{self, StreamExt};
use spur_proto as pb;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::Code;

use super::sync::Registered;
use crate::controller::ControllerClient;
use crate::metrics::{Metrics, NodeLabels};

#[derive(Clone, Copy, Debug)]
pub struct HeartbeatConfig {
    pub interval: Duration,
    pub concurrency: usize,
}

/// A node heartbeats send back to node sync, to be registered again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rejoin {
    /// The controller answered NOT_FOUND: it forgot the node.
    Forgotten(String),
    /// The controller refused the node token the heartbeat carried (expired, missing,
    /// forged): the node still exists there and needs a new token.
    TokenRefused { node: String, token: String },
}

/// What one round of heartbeats came to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Round {
    pub sent: usize,
    pub failed: usize,
    /// Nodes the controller answered NOT_FOUND for: it forgot them.
    pub forgotten: Vec<String>,
    /// Nodes whose node token the controller refused (expired, missing, forged), with the
    /// token refused: a registration gets them a new one.
    pub token_refused: Vec<(String, String)>,
    /// Nodes whose heartbeat the controller accepted.
    pub accepted: Vec<String>,
    /// One failure, to show what went wrong.
    pub sample_error: Option<String>,
}

/// Sends one heartbeat per registered node, `concurrency` at a time.
pub async fn round(
    controller: &ControllerClient,
    registered: &Registered,
    concurrency: usize,
    metrics: &Metrics,
) -> Round {
    let nodes = registered.snapshot();
    let mut result = Round {
        sent: nodes.len(),
        ..Round::default()
    };
    let mut answers = stream::iter(nodes)
        .map(|(name, token)| async move {
            let request = pb::HeartbeatRequest {
                hostname: name.clone(),
                node_token: token,
                ..Default::default()
            };
            let answer = controller.heartbeat(request.clone()).await;
            (name, request.node_token, answer)
        })
        .buffered(concurrency.max(1));
    while let Some((name, token, answer)) = answers.next().await {
        let Err(error) = answer else {
            result.accepted.push(name);
            continue;
        };
        result.failed += 1;
        metrics.heartbeat_failures.inc();
        if error.code() == Code::NotFound {
            result.forgotten.push(name);
        } else if super::admission::node_token_refused(error.code(), error.message()) {
            if result.token_refused.is_empty() {
                result.sample_error = Some(format!("{name}: {error}"));
            }
            result.token_refused.push((name, token));
        } else if result.sample_error.is_none() {
            result.sample_error = Some(format!("{name}: {error}"));
        }
    }
    result
}

/// Heartbeats every `interval` until dropped. One log line per round with failures, not
/// one per node; forgotten nodes, and nodes whose token was refused, go to node sync to be
/// registered again at once.
pub async fn run(
    controller: ControllerClient,
    registered: Registered,
    config: HeartbeatConfig,
    metrics: Metrics,
    rejoins: mpsc::UnboundedSender<Rejoin>,
) {
    let mut ticks = tokio::time::interval(config.interval);
    // After a stall, carry on at the cadence rather than firing a burst.
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    let mut ages = Ages::default();
    loop {
        ticks.tick().await;
        let started = Instant::now();
        let round = round(&controller, &registered, config.concurrency, &metrics).await;
        let sent: Vec<String> = registered.snapshot().into_iter().map(|(n, _)| n).collect();
        ages.update(&sent, &round.accepted, started, Instant::now(), &metrics);
        if round.failed > 0 {
            tracing::warn!(
                failed = round.failed,
                sent = round.sent,
                forgotten = round.forgotten.len(),
                token_refused = round.token_refused.len(),
                sample = round.sample_error.as_deref().unwrap_or("NOT_FOUND"),
                "heartbeats failed"
            );
        }
        let forgotten = round.forgotten.into_iter().map(Rejoin::Forgotten);
        let refused = (round.token_refused.into_iter())
            .map(|(node, token)| Rejoin::TokenRefused { node, token });
        for rejoin in forgotten.chain(refused) {
            if rejoins.send(rejoin).is_err() {
                return;
            }
        }
    }
}

/// When each node's heartbeat was last accepted, for the age gauge.
#[derive(Debug, Default)]
pub struct Ages {
    last_accepted: BTreeMap<String, Instant>,
}

impl Ages {
    /// After a round that started at `started`: `accepted` were accepted (at `now`); every
    /// node of `nodes` gets its age, a node never accepted counting from the first round
    /// it was in; nodes no longer registered lose their gauge.
    pub fn update(
        &mut self,
        nodes: &[String],
        accepted: &[String],
        started: Instant,
        now: Instant,
        metrics: &Metrics,
    ) {
        for name in accepted {
            self.last_accepted.insert(name.clone(), now);
        }
        let current: std::collections::BTreeSet<&String> = nodes.iter().collect();
        let gone: Vec<String> = self
            .last_accepted
            .keys()
            .filter(|n| !current.contains(n))
            .cloned()
            .collect();
        for name in gone {
            self.last_accepted.remove(&name);
            metrics
                .heartbeat_age_seconds
                .remove(&NodeLabels { node: name });
        }
        for name in nodes {
            let last = *self.last_accepted.entry(name.clone()).or_insert(started);
            metrics
                .heartbeat_age_seconds
                .get_or_create(&NodeLabels { node: name.clone() })
                .set(now.saturating_duration_since(last).as_secs_f64());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// spurctld's default `heartbeat_timeout_secs`: a node silent this long goes DOWN.
    const SPURCTLD_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(90);

    fn age(metrics: &Metrics, node: &str) -> Option<f64> {
        let text = metrics.encode();
        let needle = format!("spur_operator_node_heartbeat_age_seconds{{node=\"{node}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(needle.as_str()))
            .map(|v| v.parse().unwrap())
    }

    #[test]
    fn each_node_shows_the_age_of_its_last_accepted_heartbeat() {
        let metrics = Metrics::new();
        let mut ages = Ages::default();
        let t0 = Instant::now();
        let s = |n: &[&str]| n.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let at = |secs| t0 + Duration::from_secs(secs);
        // Round 1: a accepted, b refused.
        ages.update(&s(&["a", "b"]), &s(&["a"]), at(0), at(1), &metrics);
        assert_eq!(
            (age(&metrics, "a"), age(&metrics, "b")),
            (Some(0.0), Some(1.0))
        );
        // Round 2: only b accepted; a ages.
        ages.update(&s(&["a", "b"]), &s(&["b"]), at(30), at(31), &metrics);
        assert_eq!(
            (age(&metrics, "a"), age(&metrics, "b")),
            (Some(30.0), Some(0.0))
        );
        // Round 3: a no longer registered: its gauge goes.
        ages.update(&s(&["b"]), &s(&[]), at(60), at(61), &metrics);
        assert_eq!((age(&metrics, "a"), age(&metrics, "b")), (None, Some(30.0)));
    }

    #[test]
    fn the_default_cadence_gets_three_tries_inside_the_controller_timeout() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            run: crate::config::RunArgs,
        }
        let cli = <Cli as clap::Parser>::try_parse_from([
            "test",
            "--agent-address",
            "127.0.0.1",
            "--identity",
            "op-0",
        ])
        .unwrap();
        let config = cli.run.validate().unwrap();
        let interval = config.heartbeat.interval;
        let bound = config
            .controller
            .channel
            .request_timeout
            .unwrap_or(Duration::from_secs(5));
        assert_eq!(interval, Duration::from_secs(30));
        // A node whose heartbeat failed at t gets tries at t + interval and t + 2 intervals,
        // each answered within the request bound, before the controller's 90 s pass.
        assert!(
            interval * 2 + bound < SPURCTLD_HEARTBEAT_TIMEOUT,
            "{interval:?} {bound:?}"
        );
        // And the defaults of the new flags are the documented ones.
        assert_eq!(
            config.node_sync.not_ready,
            super::super::NotReadyState::Drain
        );
        assert_eq!(config.jobs, crate::jobs::JobsTuning::default());
    }
}

//! Heartbeats for every registered node, on one cadence, with bounded concurrency.

use std::time::Duration;

use futures::stream::{self, StreamExt};
use spur_proto as pb;
use tokio::sync::mpsc;
use tonic::Code;

use super::sync::Registered;
use crate::controller::ControllerClient;
use crate::metrics::Metrics;

#[derive(Clone, Copy, Debug)]
pub struct HeartbeatConfig {
    pub interval: Duration,
    pub concurrency: usize,
}

/// What one round of heartbeats came to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Round {
    pub sent: usize,
    pub failed: usize,
    /// Nodes the controller answered NOT_FOUND for: it forgot them.
    pub forgotten: Vec<String>,
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
            (name, controller.heartbeat(request).await)
        })
        .buffered(concurrency.max(1));
    while let Some((name, answer)) = answers.next().await {
        let Err(error) = answer else { continue };
        result.failed += 1;
        metrics.heartbeat_failures.inc();
        if error.code() == Code::NotFound {
            result.forgotten.push(name);
        } else if result.sample_error.is_none() {
            result.sample_error = Some(format!("{name}: {error}"));
        }
    }
    result
}

/// Heartbeats every `interval` until dropped. One log line per round with failures, not
/// one per node; forgotten nodes go to node sync to be registered again at once.
pub async fn run(
    controller: ControllerClient,
    registered: Registered,
    config: HeartbeatConfig,
    metrics: Metrics,
    forgotten: mpsc::UnboundedSender<String>,
) {
    let mut ticks = tokio::time::interval(config.interval);
    // After a stall, carry on at the cadence rather than firing a burst.
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    loop {
        ticks.tick().await;
        let round = round(&controller, &registered, config.concurrency, &metrics).await;
        if round.failed > 0 {
            tracing::warn!(
                failed = round.failed,
                sent = round.sent,
                forgotten = round.forgotten.len(),
                sample = round.sample_error.as_deref().unwrap_or("NOT_FOUND"),
                "heartbeats failed"
            );
        }
        for name in round.forgotten {
            if forgotten.send(name).is_err() {
                return;
            }
        }
    }
}

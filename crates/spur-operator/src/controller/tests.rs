//! The channel rule and the bounds, on tokio's paused clock over an in-memory network.

use std::time::Duration;

use tokio::time::Instant;
use tonic::{Code, Status};

use super::ChannelConfig;
use super::testing::{MemoryNetwork, Peer, ScriptedController, not_leader};
use super::{ConnectError, ControllerAddr, ControllerClient, ControllerError, Rule};
use crate::metrics::Metrics;

fn client_over(network: &MemoryNetwork, config: ChannelConfig) -> ControllerClient {
    ControllerClient::new(
        ControllerAddr::new("spurctld", 6817),
        config,
        None,
        network.clone(),
    )
    .unwrap()
}

/// The default channel without the connect probe, so the channel rule's tests count only
/// their own calls.
fn unprobed() -> ChannelConfig {
    ChannelConfig {
        connect_probe: None,
        ..ChannelConfig::default()
    }
}

fn setup() -> (ScriptedController, MemoryNetwork, ControllerClient) {
    let (controller, network, client, _) = setup_with_metrics();
    (controller, network, client)
}

/// [`setup`], with the metrics the client exports its connects and drops to.
fn setup_with_metrics() -> (ScriptedController, MemoryNetwork, ControllerClient, Metrics) {
    let controller = ScriptedController::default();
    let network = MemoryNetwork::start(controller.clone());
    let metrics = Metrics::new();
    let client = client_over(&network, unprobed()).with_metrics(metrics.clone());
    (controller, network, client, metrics)
}

#[tokio::test(start_paused = true)]
async fn drops_the_channel_after_each_transport_failure() {
    for code in [
        Code::Unavailable,
        Code::Unknown,
        Code::Cancelled,
        Code::DeadlineExceeded,
    ] {
        let (controller, network, client, metrics) = setup_with_metrics();
        client.ping().await.unwrap();
        assert_eq!(network.dials(), 1);

        controller.fail_next(Status::new(code, "scripted"));
        let err = client.ping().await.unwrap_err();
        assert_eq!(err.code(), code);
        assert!(
            !client.is_connected().await,
            "{code:?} must drop the channel"
        );

        client.ping().await.unwrap();
        assert_eq!(
            network.dials(),
            2,
            "{code:?}: the next call connects afresh"
        );
        assert_eq!(
            (metrics.channel_connects.get(), metrics.channel_drops.get()),
            (2, 1),
            "{code:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn keeps_the_channel_after_an_answer() {
    for code in [
        Code::NotFound,
        Code::InvalidArgument,
        Code::PermissionDenied,
        Code::FailedPrecondition,
        Code::AlreadyExists,
    ] {
        let (controller, network, client, metrics) = setup_with_metrics();
        controller.fail_next(Status::new(code, "scripted"));
        let err = client.heartbeat(Default::default()).await.unwrap_err();
        assert_eq!(err.code(), code);
        assert!(
            client.is_connected().await,
            "{code:?} must keep the channel"
        );

        client.heartbeat(Default::default()).await.unwrap();
        assert_eq!(network.dials(), 1, "{code:?}: the channel was reused");
        assert_eq!(metrics.channel_drops.get(), 0);
    }
}

#[tokio::test(start_paused = true)]
async fn every_rpc_goes_through_the_same_channel() {
    let (controller, network, client) = setup();
    client.ping().await.unwrap();
    client.register_agent(Default::default()).await.unwrap();
    client.heartbeat(Default::default()).await.unwrap();
    client.update_node(Default::default()).await.unwrap();
    assert_eq!(
        client.submit_job(Default::default()).await.unwrap().job_id,
        7
    );
    assert_eq!(client.get_job(42).await.unwrap().job_id, 42);
    client.get_jobs(Default::default()).await.unwrap();
    client.cancel_job(Default::default()).await.unwrap();
    client.report_job_status(Default::default()).await.unwrap();
    assert_eq!(
        controller.calls.load(std::sync::atomic::Ordering::SeqCst),
        9
    );
    assert_eq!(network.dials(), 1);
}

#[tokio::test(start_paused = true)]
async fn concurrent_callers_share_one_connect() {
    let (_controller, network, client) = setup();
    let calls: Vec<_> = (0..16)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move { client.ping().await })
        })
        .collect();
    for call in calls {
        call.await.unwrap().unwrap();
    }
    assert_eq!(network.dials(), 1);
}

/// Twelve registrations against a bound of four in flight, each answered after 1 s:
/// spurctld never sees more than four at once, and the twelve end in three rounds.
#[tokio::test(start_paused = true)]
async fn calls_beyond_the_in_flight_bound_wait_their_turn() {
    let controller = ScriptedController::default();
    controller.set_delay(Duration::from_secs(1));
    let network = MemoryNetwork::start(controller.clone());
    let config = ChannelConfig {
        max_in_flight: 4,
        ..unprobed()
    };
    let client = client_over(&network, config);
    let started = Instant::now();
    let calls: Vec<_> = (0..12)
        .map(|n| {
            let client = client.clone();
            let request = spur_proto::RegisterAgentRequest {
                hostname: format!("node-{n}"),
                ..Default::default()
            };
            tokio::spawn(async move { client.register_agent(request).await })
        })
        .collect();
    for call in calls {
        call.await.unwrap().unwrap();
    }
    let most = controller
        .max_in_flight
        .load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(most, 4, "calls spurctld saw at once");
    assert_eq!(started.elapsed(), Duration::from_secs(3));
}

#[tokio::test(start_paused = true)]
async fn a_black_holed_peer_is_found_by_keepalive_then_reconnected() {
    let (_controller, network, client) = setup();
    network.set_peer(Peer::BlackHole);

    let keepalive = ChannelConfig::default().keepalive.unwrap();
    let expected = keepalive.interval + keepalive.timeout;
    let started = Instant::now();
    let err = client.ping().await.unwrap_err();
    let elapsed = started.elapsed();
    // The keepalive (a ping after the interval, unanswered for the timeout) fires before
    // the request bound.
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    assert!(err.to_string().contains("keep-alive"), "{err}");
    assert!(
        elapsed >= expected && elapsed < expected + Duration::from_secs(1),
        "keepalive should close the connection at {expected:?}, took {elapsed:?}"
    );
    assert!(!client.is_connected().await);

    network.set_peer(Peer::Serve);
    client.ping().await.unwrap();
    assert_eq!(network.dials(), 2, "the next call opened a new connection");
}

#[tokio::test(start_paused = true)]
async fn without_keepalive_the_request_bound_fires() {
    let controller = ScriptedController::default();
    let network = MemoryNetwork::start(controller);
    let config = ChannelConfig {
        keepalive: None,
        ..unprobed()
    };
    let client = client_over(&network, config);
    network.set_peer(Peer::BlackHole);

    let bound = ChannelConfig::default().request_timeout.unwrap();
    let started = Instant::now();
    let err = client.ping().await.unwrap_err();
    let elapsed = started.elapsed();
    assert_eq!(err.code(), Code::Cancelled, "{err}");
    assert!(err.to_string().contains("Timeout expired"), "{err}");
    assert!(
        elapsed >= bound && elapsed < bound + Duration::from_secs(1),
        "the {bound:?} request bound should fire, took {elapsed:?}"
    );
    assert!(!client.is_connected().await);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_syn_fails_at_the_connect_timeout() {
    let (_controller, network, client, metrics) = setup_with_metrics();
    network.set_peer(Peer::NeverConnect);

    let connect_bound = ChannelConfig::default().connect_timeout.unwrap();
    let started = Instant::now();
    let err = client.ping().await.unwrap_err();
    assert_eq!(started.elapsed(), connect_bound);
    match &err {
        ControllerError::Connect {
            source: ConnectError::Timeout(bound),
            ..
        } => assert_eq!(*bound, connect_bound),
        other => panic!("expected a connect timeout, got {other}"),
    }
    assert_eq!(metrics.channel_connect_failures.get(), 1);

    // Once the Service has an endpoint, the next call connects at once.
    network.set_peer(Peer::Serve);
    let started = Instant::now();
    client.ping().await.unwrap();
    assert!(started.elapsed() < Duration::from_millis(10));
}

#[tokio::test(start_paused = true)]
async fn a_refused_connect_fails_at_once_and_names_the_cause() {
    let (_controller, network, client) = setup();
    network.set_peer(Peer::Refuse);
    let started = Instant::now();
    let err = client.ping().await.unwrap_err();
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert!(
        matches!(
            err,
            ControllerError::Connect {
                source: ConnectError::Refused(_),
                ..
            }
        ),
        "{err}"
    );
}

#[tokio::test(start_paused = true)]
async fn unbounded_the_call_hangs_on_a_black_hole() {
    // Why the channel is bounded (docs/specs.md, "The seed's failures"): with no bound of
    // any kind, an hour later the call still waits.
    let controller = ScriptedController::default();
    let network = MemoryNetwork::start(controller);
    let client = client_over(&network, ChannelConfig::unbounded());
    network.set_peer(Peer::BlackHole);
    let waited = tokio::time::timeout(Duration::from_secs(3600), client.ping()).await;
    assert!(waited.is_err(), "an unbounded call returned: {waited:?}");
}

#[tokio::test(start_paused = true)]
async fn sends_the_bearer_token_on_every_call() {
    let controller = ScriptedController::default();
    let network = MemoryNetwork::start(controller.clone());
    let client = ControllerClient::new(
        ControllerAddr::new("spurctld", 6817),
        ChannelConfig::default(),
        Some("s3cr3t"),
        network,
    )
    .unwrap();
    assert_eq!(client.ping().await.unwrap().version, "Bearer s3cr3t");
    client.submit_job(Default::default()).await.unwrap();
    // The write and every call around it (probes, reads) carried it, not only Ping.
    let seen = controller.authorizations();
    assert!(controller.log().iter().any(|c| c.starts_with("SubmitJob")));
    assert!(seen.len() >= 2, "{seen:?}");
    assert!(seen.iter().all(|a| a == "Bearer s3cr3t"), "{seen:?}");

    // And without a token, none is sent.
    let bare = ScriptedController::default();
    let client = client_over(
        &MemoryNetwork::start(bare.clone()),
        ChannelConfig::default(),
    );
    client.ping().await.unwrap();
    let seen = bare.authorizations();
    assert!(
        !seen.is_empty() && seen.iter().all(String::is_empty),
        "{seen:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_followers_refusal_carries_its_leader_hint() {
    let (controller, _network, client) = setup();
    controller.fail_next(not_leader("spurctld-1.spurctld:6817"));
    let err = client.submit_job(Default::default()).await.unwrap_err();
    assert_eq!(err.leader_hint(), Some("spurctld-1.spurctld:6817"));
}

fn calls(controller: &ScriptedController) -> usize {
    controller.calls.load(std::sync::atomic::Ordering::SeqCst)
}

// ---------------------------------------------------------------------------------------
// The policy carried out: probes, hedged dials, patience (policy.rs has the transitions).
// ---------------------------------------------------------------------------------------

/// A Service whose next picks the test scripts (`redirect_next`): `stuck`, a follower
/// whose forwards hang once the test says so, and `serving`, a replica that answers.
fn stuck_and_serving(config: ChannelConfig) -> TwoReplicas {
    let (stuck, serving) = (
        ScriptedController::named("spurctld-0"),
        ScriptedController::named("spurctld-1"),
    );
    let network = MemoryNetwork::start(ScriptedController::named("spurctld-2"));
    network.add_host("stuck", stuck.clone());
    network.add_host("serving", serving.clone());
    let client = client_over(&network, config);
    (stuck, serving, network, client)
}

type TwoReplicas = (
    ScriptedController,
    ScriptedController,
    MemoryNetwork,
    ControllerClient,
);

fn with_rules_off(rules: &[Rule]) -> ChannelConfig {
    ChannelConfig {
        rules_off: rules.iter().copied().collect(),
        ..ChannelConfig::default()
    }
}

const HOUR: Duration = Duration::from_secs(3600);

#[tokio::test(start_paused = true)]
async fn a_follower_whose_reads_hang_is_passed_over_for_a_replica_that_serves() {
    let (stuck, serving, network, client) = stuck_and_serving(ChannelConfig::default());
    stuck.set_read_delay(HOUR);
    network.redirect_next(&["stuck", "serving"]);
    let started = Instant::now();
    client.heartbeat(Default::default()).await.unwrap();
    // The hedged second dial, a quarter of the probe's bound after the first, serves.
    let hedge = ChannelConfig::default().hedge().unwrap();
    assert_eq!(started.elapsed(), hedge);
    assert_eq!(network.dialed(), ["stuck", "serving"]);
    assert_eq!(calls(&serving), 2, "the probe and the heartbeat");
    assert_eq!(calls(&stuck), 0, "its probe never got an answer");
}

#[tokio::test(start_paused = true)]
async fn a_frozen_replica_is_passed_over_too() {
    let (_stuck, serving, network, client) = stuck_and_serving(ChannelConfig::default());
    network.set_host_peer("stuck", Peer::BlackHole);
    network.redirect_next(&["stuck", "serving"]);
    client.heartbeat(Default::default()).await.unwrap();
    assert_eq!(calls(&serving), 2, "the probe and the heartbeat");
}

#[tokio::test(start_paused = true)]
async fn without_the_probe_the_first_channel_is_used_whatever_it_serves() {
    let (stuck, _serving, network, client) = stuck_and_serving(unprobed());
    stuck.set_read_delay(HOUR);
    network.redirect_next(&["stuck", "serving"]);
    client.heartbeat(Default::default()).await.unwrap();
    assert_eq!(network.dialed(), ["stuck"]);
    assert_eq!(calls(&stuck), 1, "the heartbeat alone");
}

#[tokio::test(start_paused = true)]
async fn when_every_probe_fails_the_call_fails_naming_the_probe() {
    let (stuck, _serving, network, client) = stuck_and_serving(ChannelConfig::default());
    stuck.set_read_delay(HOUR);
    network.redirect_next(&["stuck", "stuck", "stuck", "stuck"]);
    let started = Instant::now();
    let err = client.heartbeat(Default::default()).await.unwrap_err();
    assert!(err.to_string().contains("probe"), "{err}");
    // Four dials a quarter bound apart; the last probe's bound ends the round.
    let config = ChannelConfig::default();
    assert_eq!(
        started.elapsed(),
        config.hedge().unwrap() * 3 + config.connect_probe.unwrap()
    );
    assert_eq!(network.dials(), 4);
    assert_eq!(
        calls(&stuck),
        0,
        "no heartbeat reached the replica that does not serve"
    );
}

#[tokio::test(start_paused = true)]
async fn a_write_stuck_on_its_channel_is_abandoned_once_another_replica_serves() {
    let metrics = crate::metrics::Metrics::new();
    let (stuck, serving, network, _) = stuck_and_serving(ChannelConfig::default());
    let client = ControllerClient::new(
        ControllerAddr::new("spurctld", 6817),
        ChannelConfig::default(),
        None,
        network.clone(),
    )
    .unwrap()
    .with_metrics(metrics.clone());
    network.redirect_next(&["stuck", "serving"]);
    client.heartbeat(Default::default()).await.unwrap();
    // Its leader vanishes: every forward of the follower hangs from now.
    stuck.set_delay(HOUR);
    stuck.set_read_delay(HOUR);
    let started = Instant::now();
    let err = client.heartbeat(Default::default()).await.unwrap_err();
    assert_eq!(err.code(), Code::Cancelled, "{err}");
    assert!(err.to_string().contains("abandoned"), "{err}");
    // The patience (1 s), then the replacement's dial and probe (instant here).
    assert_eq!(
        started.elapsed(),
        ChannelConfig::default().connect_probe.unwrap()
    );
    client.heartbeat(Default::default()).await.unwrap();
    assert_eq!(
        calls(&serving),
        3,
        "the replacement's Ping and probe, and the retried heartbeat"
    );
    let text = metrics.encode();
    for rule in ["patience", "abandon"] {
        assert!(
            text.contains(&format!(
                "spur_operator_controller_channel_rules_total{{rule=\"{rule}\"}} 1"
            )),
            "{rule}: {text}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn without_patience_the_stuck_write_waits_out_the_request_bound() {
    let (stuck, _serving, network, client) = stuck_and_serving(with_rules_off(&[Rule::Patience]));
    network.redirect_next(&["stuck", "serving"]);
    client.heartbeat(Default::default()).await.unwrap();
    stuck.set_delay(HOUR);
    let started = Instant::now();
    let err = client.heartbeat(Default::default()).await.unwrap_err();
    assert_eq!(err.code(), Code::Cancelled, "{err}");
    assert_eq!(
        started.elapsed(),
        ChannelConfig::default().request_timeout.unwrap()
    );
}

#[tokio::test(start_paused = true)]
async fn a_caller_cancelled_mid_dial_leaves_the_dials_to_finish_for_the_next() {
    let (stuck, serving, network, client) = stuck_and_serving(with_rules_off(&[Rule::Hedge]));
    stuck.set_read_delay(HOUR);
    network.redirect_next(&["stuck", "stuck", "serving"]);
    let started = Instant::now();
    // A readiness check's own bound gives up during the second probe.
    let bound = Duration::from_millis(1500);
    assert!(tokio::time::timeout(bound, client.ping()).await.is_err());
    // The next caller finds the third dial, to the serving replica, already under way.
    client.get_jobs(Default::default()).await.unwrap();
    let probe = ChannelConfig::default().connect_probe.unwrap();
    assert_eq!(started.elapsed(), probe * 2);
    assert_eq!(network.dialed(), ["stuck", "stuck", "serving"]);
    assert_eq!(calls(&serving), 2, "the probe and the read");
}

#[tokio::test(start_paused = true)]
async fn a_readiness_check_unanswered_within_its_bound_drops_the_channel() {
    // Only readiness checks use the channel (a standby): a caller's own timeout would leave
    // the next check on the same stuck follower; the client's bound drops it. Patience is
    // off, so that only the bound can.
    for inside in [true, false] {
        let (stuck, _serving, network, client) =
            stuck_and_serving(with_rules_off(&[Rule::Patience]));
        network.redirect_next(&["stuck"]);
        client.check_within(Duration::from_secs(2)).await.unwrap();
        stuck.set_read_delay(HOUR);
        let bound = Duration::from_secs(2);
        if inside {
            let err = client.check_within(bound).await.unwrap_err();
            assert_eq!(err.code(), Code::DeadlineExceeded, "{err}");
        } else {
            tokio::time::timeout(bound, client.get_jobs(Default::default()))
                .await
                .unwrap_err();
        }
        let dials = network.dials();
        stuck.set_read_delay(Duration::ZERO);
        client.ping().await.unwrap();
        assert_eq!(
            network.dials() > dials,
            inside,
            "bound inside the client: {inside}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_channel_past_its_maximum_age_is_replaced_only_by_one_that_serves() {
    let (stuck, serving, network, client) = stuck_and_serving(ChannelConfig::default());
    network.redirect_next(&["serving"]);
    client.get_jobs(Default::default()).await.unwrap();
    tokio::time::sleep(ChannelConfig::default().max_age.unwrap()).await;
    // The replacement round reaches only the stuck follower: the old channel stays.
    stuck.set_read_delay(HOUR);
    network.redirect_next(&["stuck", "stuck", "stuck", "stuck"]);
    client.get_jobs(Default::default()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = calls(&serving);
    client.get_jobs(Default::default()).await.unwrap();
    assert_eq!(calls(&serving), before + 1, "still on the serving replica");
    assert_eq!(network.dials(), 5);
}

/// Rule 6 while the operator reaches only a replica that is behind: `stale` (the Service's
/// every pick unless redirected) never heard of job 7, whose end `fresh` holds.
fn confined_to_a_stale_replica(config: ChannelConfig) -> (MemoryNetwork, ControllerClient) {
    let (stale, fresh) = (
        ScriptedController::named("spurctld-0"),
        ScriptedController::named("spurctld-1"),
    );
    fresh.set_job(7, spur_proto::JobState::JobCompleted);
    let network = MemoryNetwork::start(stale);
    network.add_host("fresh", fresh);
    (network.clone(), client_over(&network, config))
}

/// A report of job 7's end, acknowledged, then a wait past rule 6's grace.
async fn acknowledged_end_of_job_7(client: &ControllerClient) {
    client
        .report_job_status(spur_proto::ReportJobStatusRequest {
            job_id: 7,
            reporting_node: "a".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
}

/// The reads of job 7 by id a status poll makes over `secs` seconds, a retry every 500 ms:
/// whether each was answered, and the states it showed.
async fn polls(client: &ControllerClient, secs: u64) -> Vec<Result<Vec<i32>, Code>> {
    let mut out = Vec::new();
    for _ in 0..secs * 2 {
        let read = client
            .get_jobs(spur_proto::GetJobsRequest {
                job_ids: vec![7],
                ..Default::default()
            })
            .await;
        out.push(
            read.map(|r| r.jobs.iter().map(|j| j.state).collect())
                .map_err(|e| e.code()),
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    out
}

#[tokio::test(start_paused = true)]
async fn a_stale_replica_is_left_again_while_it_is_all_the_service_reaches() {
    let (network, client) = confined_to_a_stale_replica(ChannelConfig::default());
    acknowledged_end_of_job_7(&client).await;
    // Confined for 4 s: no read of the stale copy is believed, the second no more than the
    // first: believing it would leave the job Running in its status until the cut heals.
    let confined = polls(&client, 4).await;
    assert!(
        confined.iter().all(|read| read.is_err()),
        "a stale read was believed: {confined:?}"
    );
    // The partition heals: the next round passes over the stale replica.
    network.redirect_next(&["fresh"]);
    let healed = polls(&client, 1).await;
    assert_eq!(
        healed[0],
        Ok(vec![spur_proto::JobState::JobCompleted as i32]),
        "{healed:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_contradiction_that_outlasts_the_window_is_believed() {
    // The same, as if the report had been for an attempt the controller replaced: with no
    // window, the first read after the failed round is believed (one firing, as before).
    let config = ChannelConfig {
        behind_window: Duration::ZERO,
        ..ChannelConfig::default()
    };
    let (_network, client) = confined_to_a_stale_replica(config);
    acknowledged_end_of_job_7(&client).await;
    let confined = polls(&client, 4).await;
    assert!(
        confined.iter().any(|read| read == &Ok(vec![])),
        "no stale read was believed: {confined:?}"
    );
}

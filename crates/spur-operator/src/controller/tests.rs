//! The channel rule and the bounds, on tokio's paused clock over an in-memory network.

use std::time::Duration;

use tokio::time::Instant;
use tonic::{Code, Status};

use super::testing::{MemoryNetwork, Peer, ScriptedController, not_leader};
use super::{ConnectError, ControllerAddr, ControllerClient, ControllerError};
use crate::config::ChannelConfig;

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

/// The default channel without the leader recheck, so the connect probe's tests count only
/// the dials the probe makes.
fn probed_only() -> ChannelConfig {
    ChannelConfig {
        leader_recheck: None,
        ..ChannelConfig::default()
    }
}

fn setup() -> (ScriptedController, MemoryNetwork, ControllerClient) {
    let controller = ScriptedController::default();
    let network = MemoryNetwork::start(controller.clone());
    let client = client_over(&network, unprobed());
    (controller, network, client)
}

#[tokio::test(start_paused = true)]
async fn drops_the_channel_after_each_transport_failure() {
    for code in [
        Code::Unavailable,
        Code::Unknown,
        Code::Cancelled,
        Code::DeadlineExceeded,
    ] {
        let (controller, network, client) = setup();
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
        let stats = client.stats();
        assert_eq!((stats.connects, stats.drops), (2, 1), "{code:?}");
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
        let (controller, network, client) = setup();
        controller.fail_next(Status::new(code, "scripted"));
        let err = client.heartbeat(Default::default()).await.unwrap_err();
        assert_eq!(err.code(), code);
        assert!(
            client.is_connected().await,
            "{code:?} must keep the channel"
        );

        client.heartbeat(Default::default()).await.unwrap();
        assert_eq!(network.dials(), 1, "{code:?}: the channel was reused");
        assert_eq!(client.stats().drops, 0);
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
    let (_controller, network, client) = setup();
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
    assert_eq!(client.stats().connect_failures, 1);

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
    // The seed's failure: with no bound of any kind, an hour later the call still waits.
    let controller = ScriptedController::default();
    let network = MemoryNetwork::start(controller);
    let client = client_over(&network, ChannelConfig::unbounded());
    network.set_peer(Peer::BlackHole);
    let waited = tokio::time::timeout(Duration::from_secs(3600), client.ping()).await;
    assert!(waited.is_err(), "an unbounded call returned: {waited:?}");
}

#[tokio::test(start_paused = true)]
async fn sends_the_bearer_token() {
    let controller = ScriptedController::default();
    let network = MemoryNetwork::start(controller);
    let client = ControllerClient::new(
        ControllerAddr::new("spurctld", 6817),
        ChannelConfig::default(),
        Some("s3cr3t"),
        network,
    )
    .unwrap();
    assert_eq!(client.ping().await.unwrap().version, "Bearer s3cr3t");
}

#[tokio::test(start_paused = true)]
async fn records_the_leader_hint_of_a_follower() {
    let (controller, _network, client) = setup();
    assert_eq!(client.leader_hint(), None);
    controller.fail_next(not_leader("spurctld-1.spurctld:6817"));
    let err = client.submit_job(Default::default()).await.unwrap_err();
    assert_eq!(err.leader_hint(), Some("spurctld-1.spurctld:6817"));
    assert_eq!(
        client.leader_hint().as_deref(),
        Some("spurctld-1.spurctld:6817")
    );
}

fn calls(controller: &ScriptedController) -> usize {
    controller.calls.load(std::sync::atomic::Ordering::SeqCst)
}

// ---------------------------------------------------------------------------------------
// The connect probe: a replica whose write went unanswered is avoided.
// ---------------------------------------------------------------------------------------

/// A Service whose next picks the test scripts: `cut` (a leader cut off from its peers,
/// answering reads from its own state and never a write) and `healthy` (a follower whose
/// reads come from the new leader).
fn cut_and_healthy() -> TwoReplicas {
    two_replicas(
        ("cut", "spurctld-2"),
        ("healthy", "spurctld-1"),
        probed_only(),
    )
}

type TwoReplicas = (
    ScriptedController,
    ScriptedController,
    MemoryNetwork,
    ControllerClient,
);

/// Two replicas, dialed as hosts `a.0` and `b.0` (a test scripts the Service's picks),
/// whose Pings name `a.1` and `b.1`; other dials reach a third one, and a client
/// configured by `config`.
fn two_replicas(a: (&str, &str), b: (&str, &str), config: ChannelConfig) -> TwoReplicas {
    let (first, second) = (
        ScriptedController::named(a.1),
        ScriptedController::named(b.1),
    );
    let network = MemoryNetwork::start(ScriptedController::default());
    network.add_host(a.0, first.clone());
    network.add_host(b.0, second.clone());
    let client = client_over(&network, config);
    (first, second, network, client)
}

#[tokio::test(start_paused = true)]
async fn a_replica_whose_write_went_unanswered_is_not_used_again() {
    let (cut, healthy, network, client) = cut_and_healthy();
    // The Service picks the cut replica three times in a row, then the healthy one.
    network.redirect_next(&["cut", "cut", "healthy"]);
    client.get_jobs(Default::default()).await.unwrap();
    assert_eq!(calls(&cut), 2, "the probe and the read");

    // It takes the write and never answers: the request bound fires.
    cut.set_delay(Duration::from_secs(3600));
    let err = client.heartbeat(Default::default()).await.unwrap_err();
    assert_eq!(err.code(), Code::Cancelled, "{err}");

    // The next channel's probe names the cut replica again: turned down, dialed again.
    let before = calls(&healthy);
    client.get_jobs(Default::default()).await.unwrap();
    assert_eq!(network.dialed(), ["cut", "cut", "healthy"]);
    assert_eq!(calls(&healthy), before + 2, "the probe and the read");
    assert_eq!(client.stats().connects, 3);
}

#[tokio::test(start_paused = true)]
async fn a_follower_whose_reads_hang_too_does_not_mark_the_leaders_name() {
    // Through a follower, Ping is forwarded: it names the leader, as the healthy replica
    // does. Cut off, the follower holds reads and writes alike.
    let follower = ScriptedController::named("spurctld-0");
    let healthy = ScriptedController::named("spurctld-0");
    let network = MemoryNetwork::start(ScriptedController::default());
    network.add_host("follower", follower.clone());
    network.add_host("healthy", healthy.clone());
    let client = client_over(&network, probed_only());
    network.redirect_next(&["follower", "healthy"]);
    client.get_jobs(Default::default()).await.unwrap();

    follower.set_delay(Duration::from_secs(3600));
    follower.set_ping_delay(Duration::from_secs(3600));
    let err = client.heartbeat(Default::default()).await.unwrap_err();
    assert_eq!(err.code(), Code::Cancelled, "{err}");

    // The healthy replica's probe names the leader too: it is used, not turned down.
    client.get_jobs(Default::default()).await.unwrap();
    assert_eq!(network.dialed(), ["follower", "healthy"]);
    assert_eq!(calls(&healthy), 2, "the probe and the read");
}

/// `cut_and_healthy`'s network with a client configured by `config`.
fn cut_and_healthy_with(
    config: ChannelConfig,
) -> (ScriptedController, MemoryNetwork, ControllerClient) {
    let (_cut, healthy, network, client) =
        two_replicas(("cut", "spurctld-2"), ("healthy", "spurctld-1"), config);
    (healthy, network, client)
}

fn unhedged() -> ChannelConfig {
    ChannelConfig {
        connect_hedge: None,
        ..probed_only()
    }
}

#[tokio::test(start_paused = true)]
async fn a_channel_whose_probe_goes_unanswered_is_dialed_again() {
    let defaults = ChannelConfig::default();
    // Hedged, the next dial starts once the hedge passes without an answer; unhedged, once
    // the probe's bound gave up on the first.
    for (config, took) in [
        (probed_only(), defaults.connect_hedge.unwrap()),
        (unhedged(), defaults.connect_probe.unwrap()),
    ] {
        let (healthy, network, client) = cut_and_healthy_with(config);
        // A follower whose forward to the leader hangs: it accepts and never answers.
        network.set_host_peer("hung", Peer::BlackHole);
        network.redirect_next(&["hung", "healthy"]);
        let started = Instant::now();
        client.get_jobs(Default::default()).await.unwrap();
        assert_eq!(started.elapsed(), took);
        assert_eq!(network.dialed(), ["hung", "healthy"]);
        assert_eq!(calls(&healthy), 2);
    }
}

#[tokio::test(start_paused = true)]
async fn hedged_probes_find_the_one_answering_replica_among_hung_ones() {
    let (healthy, network, client) = cut_and_healthy_with(probed_only());
    network.set_host_peer("hung", Peer::BlackHole);
    network.redirect_next(&["hung", "hung", "hung", "healthy"]);
    let started = Instant::now();
    client.get_jobs(Default::default()).await.unwrap();
    // Four dials 250 ms apart: the fourth answers at once, before any probe's bound.
    let hedge = ChannelConfig::default().connect_hedge.unwrap();
    assert_eq!(started.elapsed(), hedge * 3);
    assert_eq!(calls(&healthy), 2, "the probe and the read");
}

#[tokio::test(start_paused = true)]
async fn a_caller_cancelled_mid_dial_leaves_the_dials_to_finish_for_the_next() {
    let (healthy, network, client) = cut_and_healthy_with(unhedged());
    network.set_host_peer("hung", Peer::BlackHole);
    network.redirect_next(&["hung", "hung", "healthy"]);
    let started = Instant::now();
    // A readiness probe's bound gives up during the second probe.
    let bound = Duration::from_millis(1500);
    assert!(tokio::time::timeout(bound, client.ping()).await.is_err());
    // The next caller finds the third dial, to the healthy replica, already under way.
    client.get_jobs(Default::default()).await.unwrap();
    let probe = ChannelConfig::default().connect_probe.unwrap();
    assert_eq!(started.elapsed(), probe * 2);
    assert_eq!(network.dialed(), ["hung", "hung", "healthy"]);
    assert_eq!(calls(&healthy), 2, "the probe and the read");
}

#[tokio::test(start_paused = true)]
async fn the_last_dial_is_kept_whatever_its_probe_said() {
    let (cut, _healthy, network, client) = cut_and_healthy();
    network.redirect_next(&["cut", "cut", "cut", "cut", "cut"]);
    client.get_jobs(Default::default()).await.unwrap();
    cut.set_delay(Duration::from_secs(3600));
    client.heartbeat(Default::default()).await.unwrap_err();
    cut.set_delay(Duration::ZERO);
    // Four dials all reach the cut replica: the fourth channel is used, not refused.
    client.get_jobs(Default::default()).await.unwrap();
    assert_eq!(network.dialed().len(), 5);
}

#[tokio::test(start_paused = true)]
async fn an_avoided_replica_that_answers_is_kept_over_ones_that_never_answer_and_forgiven() {
    let (cut, _healthy, network, client) = cut_and_healthy();
    network.redirect_next(&["cut"]);
    client.get_jobs(Default::default()).await.unwrap();
    cut.set_delay(Duration::from_secs(3600));
    client.heartbeat(Default::default()).await.unwrap_err();
    // The partition heals before the others elect a leader: the cut replica leads again,
    // and the followers' forwards to it hang (probes unanswered).
    cut.set_delay(Duration::ZERO);
    network.set_host_peer("hung", Peer::BlackHole);
    network.redirect_next(&["cut", "hung", "hung", "hung"]);
    // Answered: the hung channels would have held it past the request bound.
    client.heartbeat(Default::default()).await.unwrap();
    // The answered write forgives it: once the channel is rotated (its maximum age), a new
    // one to it is taken at the first dial.
    tokio::time::sleep(ChannelConfig::default().max_age.unwrap()).await;
    network.redirect_next(&["cut"]);
    client.get_jobs(Default::default()).await.unwrap();
    assert_eq!(
        network.dialed(),
        ["cut", "cut", "hung", "hung", "hung", "cut"]
    );
}

/// The cut replica was avoided for a write that hung; then its peers elected it, and the
/// other replica, still forwarding to the dead leader, answers Pings from its own state
/// and refuses writes. Returns once that replica's channel is the shared one.
async fn avoided_then_elected() -> TwoReplicas {
    let (cut, healthy, network, client) = cut_and_healthy();
    network.redirect_next(&["cut"]);
    client.get_jobs(Default::default()).await.unwrap();
    cut.set_delay(Duration::from_secs(3600));
    client.heartbeat(Default::default()).await.unwrap_err();
    cut.set_delay(Duration::ZERO);
    network.redirect_next(&["cut", "healthy"]);
    client.get_jobs(Default::default()).await.unwrap();
    assert_eq!(network.dialed(), ["cut", "cut", "healthy"]);
    (cut, healthy, network, client)
}

#[tokio::test(start_paused = true)]
async fn an_avoided_replica_is_tried_again_once_another_refuses_a_write_as_unavailable() {
    // As wire.md records it: no hint after the leader's process died, or the hint of the
    // leader the follower could not connect to.
    for refusal in [
        Status::unavailable("tcp connect error"),
        not_leader("spurctld-0:6817"),
    ] {
        let (_cut, healthy, network, client) = avoided_then_elected().await;
        healthy.fail_next(refusal);
        let err = client.heartbeat(Default::default()).await.unwrap_err();
        assert_eq!(err.code(), Code::Unavailable, "{err}");
        network.redirect_next(&["cut"]);
        client.heartbeat(Default::default()).await.unwrap();
        assert_eq!(network.dialed(), ["cut", "cut", "healthy", "cut"]);
    }
}

#[tokio::test(start_paused = true)]
async fn without_the_probe_a_new_channel_is_used_at_once() {
    let (cut, _healthy, network, client) = {
        let (cut, healthy, network, _) = cut_and_healthy();
        let client = client_over(&network, unprobed());
        (cut, healthy, network, client)
    };
    network.redirect_next(&["cut", "cut"]);
    client.get_jobs(Default::default()).await.unwrap();
    cut.set_delay(Duration::from_secs(3600));
    client.heartbeat(Default::default()).await.unwrap_err();
    cut.set_delay(Duration::ZERO);
    client.get_jobs(Default::default()).await.unwrap();
    assert_eq!(network.dialed(), ["cut", "cut"]);
    assert_eq!(calls(&cut), 2, "two reads, no probe");
}

// ---------------------------------------------------------------------------------------
// The leader recheck: a call stuck while the replicas have moved on is abandoned.
// ---------------------------------------------------------------------------------------

/// A follower whose reads came from the old leader `spurctld-2` (its probe named it), and
/// a replica answering for the new leader `spurctld-0`; the Service picks the follower,
/// then the other.
fn follower_of_a_gone_leader(config: ChannelConfig) -> TwoReplicas {
    let replicas = two_replicas(
        ("follower", "spurctld-2"),
        ("moved-on", "spurctld-0"),
        config,
    );
    replicas.2.redirect_next(&["follower", "moved-on"]);
    replicas
}

#[tokio::test(start_paused = true)]
async fn a_write_stuck_behind_a_gone_leader_is_abandoned_once_another_answers() {
    let (follower, moved_on, network, client) = follower_of_a_gone_leader(ChannelConfig::default());
    client.get_jobs(Default::default()).await.unwrap();
    // Its forward to the dead leader hangs every call from now on.
    follower.set_delay(Duration::from_secs(3600));
    follower.set_ping_delay(Duration::from_secs(3600));
    let started = Instant::now();
    let err = client.heartbeat(Default::default()).await.unwrap_err();
    assert_eq!(err.code(), Code::Cancelled, "{err}");
    assert!(err.to_string().contains("abandoned"), "{err}");
    // The first recheck (1 s) finds spurctld-0 answering; a Ping on the stuck channel, to
    // see whether it is a cut leader to avoid, gets no answer within the probe's bound.
    let config = ChannelConfig::default();
    assert_eq!(
        started.elapsed(),
        config.leader_recheck.unwrap() + config.connect_probe.unwrap()
    );
    // The fresh channel takes the stuck one's place: no dial for the next call.
    client.heartbeat(Default::default()).await.unwrap();
    assert_eq!(network.dialed(), ["follower", "moved-on"]);
    assert_eq!(calls(&moved_on), 2, "the recheck's probe and the heartbeat");
}

#[tokio::test(start_paused = true)]
async fn without_the_recheck_the_stuck_write_waits_out_the_request_bound() {
    let (follower, _moved_on, _network, client) = follower_of_a_gone_leader(probed_only());
    client.get_jobs(Default::default()).await.unwrap();
    follower.set_delay(Duration::from_secs(3600));
    let started = Instant::now();
    let err = client.heartbeat(Default::default()).await.unwrap_err();
    assert_eq!(err.code(), Code::Cancelled, "{err}");
    assert_eq!(
        Some(started.elapsed()),
        ChannelConfig::default().request_timeout
    );
}

#[tokio::test(start_paused = true)]
async fn a_follower_naming_the_new_leader_after_its_write_hung_does_not_mark_that_leader() {
    let (follower, moved_on, network, client) = follower_of_a_gone_leader(probed_only());
    client.get_jobs(Default::default()).await.unwrap();
    follower.set_delay(Duration::from_secs(3600));
    // The write hangs on the forward to the gone leader; meanwhile the follower's reads
    // forward to the new one, so its Ping names spurctld-0, as every healthy replica does.
    follower.set_hostname("spurctld-0");
    client.heartbeat(Default::default()).await.unwrap_err();
    client.get_jobs(Default::default()).await.unwrap();
    assert_eq!(
        network.dialed(),
        ["follower", "moved-on"],
        "not turned down"
    );
    assert_eq!(calls(&moved_on), 2, "the probe and the read");
}

/// A follower whose reads come from `spurctld-0`, which every other dial reaches too; the
/// client's channel leads to the follower, vetted and used once.
async fn follower_of_the_same_leader() -> (ScriptedController, MemoryNetwork, ControllerClient) {
    let follower = ScriptedController::named("spurctld-0");
    let network = MemoryNetwork::start(ScriptedController::named("spurctld-0"));
    network.add_host("follower", follower.clone());
    network.redirect_next(&["follower"]);
    let client = client_over(&network, ChannelConfig::default());
    client.get_jobs(Default::default()).await.unwrap();
    (follower, network, client)
}

#[tokio::test(start_paused = true)]
async fn a_call_on_a_channel_that_answers_no_ping_is_abandoned_while_another_answers() {
    let (follower, network, client) = follower_of_the_same_leader().await;
    // Cut off from the leader after its probe, it holds every call and every Ping.
    follower.set_delay(Duration::from_secs(3600));
    follower.set_ping_delay(Duration::from_secs(3600));
    let started = Instant::now();
    let err = client.heartbeat(Default::default()).await.unwrap_err();
    assert!(err.to_string().contains("answers no Ping"), "{err}");
    // The recheck at 1 s finds the leader through a fresh channel, then gives the stuck
    // channel's own Ping the probe's bound; no second Ping after the abandon.
    let config = ChannelConfig::default();
    assert_eq!(
        started.elapsed(),
        config.leader_recheck.unwrap() + config.connect_probe.unwrap()
    );
    client.heartbeat(Default::default()).await.unwrap();
    // The recheck dialed its four times (every answer gave the call's own view, so other
    // replicas were tried); the fresh channel took the stuck one's place, no dial since.
    assert_eq!(network.dials(), 1 + ChannelConfig::default().recheck_dials);
}

#[tokio::test(start_paused = true)]
async fn a_channel_to_the_same_outdated_view_goes_with_the_abandoned_call() {
    let (first, second, moved_on) = (
        ScriptedController::named("spurctld-1"),
        ScriptedController::named("spurctld-1"),
        ScriptedController::named("spurctld-0"),
    );
    let network = MemoryNetwork::start(ScriptedController::default());
    network.add_host("first", first.clone());
    network.add_host("second", second.clone());
    network.add_host("moved-on", moved_on.clone());
    network.redirect_next(&["first"]);
    let client = client_over(&network, ChannelConfig::default());
    client.get_jobs(Default::default()).await.unwrap();
    // A write hangs on the first channel; a failed read drops that channel meanwhile, and
    // the next one, through another replica, still reads from spurctld-1.
    first.set_delay(Duration::from_secs(3600));
    let stuck = tokio::spawn({
        let client = client.clone();
        async move { client.heartbeat(Default::default()).await }
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    first.fail_next(Status::unavailable("connection reset"));
    client.get_jobs(Default::default()).await.unwrap_err();
    network.redirect_next(&["second", "moved-on"]);
    client.get_jobs(Default::default()).await.unwrap();
    // The recheck finds the replicas answering for spurctld-0: the stuck write is left,
    // and so is the second channel, whose reads come from the same spurctld-1.
    let err = stuck.await.unwrap().unwrap_err();
    assert!(err.to_string().contains("answer for spurctld-0"), "{err}");
    let second_calls = calls(&second);
    client.get_jobs(Default::default()).await.unwrap();
    assert_eq!(
        calls(&second),
        second_calls,
        "no read from the outdated view"
    );
    assert_eq!(network.dialed(), ["first", "second", "moved-on"]);
    assert_eq!(calls(&moved_on), 2, "the recheck's probe and the read");
}

#[tokio::test(start_paused = true)]
async fn a_ping_unanswered_within_its_bound_drops_the_channel() {
    // Only readiness Pings use the channel (a standby): a caller's own timeout would leave
    // the next Ping on the same stuck follower; the client's bound drops it.
    // Without the leader recheck, which would leave such a channel too once the other
    // replicas answer, however long its caller waits.
    for inside in [true, false] {
        let follower = ScriptedController::named("spurctld-0");
        let network = MemoryNetwork::start(ScriptedController::named("spurctld-0"));
        network.add_host("follower", follower.clone());
        network.redirect_next(&["follower"]);
        let client = client_over(&network, probed_only());
        client.get_jobs(Default::default()).await.unwrap();
        follower.set_ping_delay(Duration::from_secs(3600));
        let bound = Duration::from_secs(2);
        if inside {
            let err = client.ping_within(bound).await.unwrap_err();
            assert_eq!(err.code(), Code::DeadlineExceeded, "{err}");
        } else {
            tokio::time::timeout(bound, client.ping())
                .await
                .unwrap_err();
        }
        let dials = network.dials();
        follower.set_ping_delay(Duration::ZERO);
        client.ping().await.unwrap();
        assert_eq!(
            network.dials() > dials,
            inside,
            "bound inside the client: {inside}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_slow_answer_while_the_same_leader_answers_is_left_alone() {
    let (follower, network, client) = follower_of_the_same_leader().await;
    follower.set_delay(Duration::from_millis(3500));
    let started = Instant::now();
    client.heartbeat(Default::default()).await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_millis(3500));
    // Rechecks at 1 s, 2 s and 3 s each dialed four times (every answer was the call's own
    // view) and found the same leader.
    assert_eq!(
        network.dials(),
        1 + 3 * ChannelConfig::default().recheck_dials
    );
    assert_eq!(client.stats().drops, 0);
}

#[tokio::test(start_paused = true)]
async fn a_channel_kept_without_an_answer_to_its_probe_is_left_once_a_replica_answers() {
    let healthy = ScriptedController::named("spurctld-1");
    let network = MemoryNetwork::start(ScriptedController::default());
    network.add_host("healthy", healthy.clone());
    // A follower whose forward to the leader hangs, four picks running: the fourth channel
    // is kept without a view.
    network.set_host_peer("hung", Peer::BlackHole);
    network.redirect_next(&["hung", "hung", "hung", "hung", "healthy"]);
    let client = client_over(&network, ChannelConfig::default());
    let started = Instant::now();
    let err = client.get_jobs(Default::default()).await.unwrap_err();
    assert!(err.to_string().contains("probe got no answer"), "{err}");
    // Four dials 250 ms apart, kept when the last probe gives up, then one recheck.
    let config = ChannelConfig::default();
    assert_eq!(
        started.elapsed(),
        config.connect_hedge.unwrap() * 3
            + config.connect_probe.unwrap()
            + config.leader_recheck.unwrap()
    );
    client.get_jobs(Default::default()).await.unwrap();
    assert_eq!(network.dials(), 5);
    assert_eq!(calls(&healthy), 2, "the recheck's probe and the read");
}

// ---------------------------------------------------------------------------------------
// Hedged dials: a dropped SYN does not hold the connect for its whole bound.
// ---------------------------------------------------------------------------------------

/// The first dial's SYN is dropped (no ready endpoint yet); the endpoint is ready for the
/// next one.
fn endpoint_ready_after_first_dial(config: ChannelConfig) -> (MemoryNetwork, ControllerClient) {
    let network = MemoryNetwork::start(ScriptedController::default());
    network.set_host_peer("dropped", Peer::NeverConnect);
    network.redirect_next(&["dropped"]);
    let client = client_over(&network, config);
    (network, client)
}

#[tokio::test(start_paused = true)]
async fn a_hedged_dial_connects_once_an_endpoint_is_ready() {
    let (network, client) = endpoint_ready_after_first_dial(unprobed());
    let started = Instant::now();
    client.ping().await.unwrap();
    let hedge = ChannelConfig::default().connect_hedge.unwrap();
    assert_eq!(started.elapsed(), hedge);
    assert_eq!(network.dialed(), ["dropped", "spurctld"]);
    assert_eq!(client.stats().connect_failures, 0);
}

#[tokio::test(start_paused = true)]
async fn without_hedging_a_dropped_syn_holds_the_connect_for_its_bound() {
    let config = ChannelConfig {
        connect_hedge: None,
        ..unprobed()
    };
    let (network, client) = endpoint_ready_after_first_dial(config);
    let started = Instant::now();
    client.ping().await.unwrap_err();
    assert_eq!(
        started.elapsed(),
        ChannelConfig::default().connect_timeout.unwrap()
    );
    assert_eq!(network.dialed(), ["dropped"]);
}

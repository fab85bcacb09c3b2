//! The real operator against the model in token admission (`[admission] mode = "token"`):
//! nodes admitted with the join token of `--controller-join-token-file`, their node tokens
//! renewed before they expire, a revoked join token, and a Secret rotated in place.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::json;
use spur_fakes::model::ControllerConfig;
use spur_proto::JobState;
use spur_sim::harness::Sim;
use spur_sim::world::WorldConfig;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// Node tokens this long-lived, so renewals happen within a short run: renewed at half
/// their life, since the operator's day ahead of expiry is longer than all of it.
const LIFETIME: Duration = Duration::from_secs(20 * 60);

/// A world in token admission, its controllers elected, with a join token made and written
/// where the operator is told to read it. Returns the token's file and id.
fn admitting(seed: u64) -> (Sim, PathBuf, String) {
    let config = WorldConfig {
        controller: ControllerConfig {
            token_admission: true,
            node_token_lifetime: LIFETIME,
            ..ControllerConfig::default()
        },
        ..WorldConfig::default()
    };
    let mut sim = Sim::with_config(seed, config);
    sim.add_nodes(2);
    sim.world.run_until(secs(10)).unwrap();
    let (token, id) = sim
        .world
        .cluster()
        .create_join_token(sim.world.elapsed())
        .expect("a leader after 10 s");
    let dir =
        std::env::temp_dir().join(format!("spur-sim-admission-{}-{seed}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("join-token");
    std::fs::write(&file, format!("{token}\n")).unwrap();
    (sim, file, id)
}

fn start_operator(sim: &mut Sim, file: &std::path::Path) {
    let file = file.to_str().unwrap().to_owned();
    let flags = [
        "--heartbeat-interval",
        "5s",
        "--controller-join-token-file",
        &file,
    ];
    sim.start_operator("operator", &flags);
}

/// Heartbeats the replicas refused for their node token.
fn token_refusals(sim: &Sim) -> usize {
    let trace = sim.world.trace();
    trace.find("Heartbeat -> Unauthenticated").len()
        + trace.find("Heartbeat -> PermissionDenied").len()
}

#[test]
fn admitted_nodes_run_a_spurjob_and_renew_their_node_tokens_before_they_expire() {
    let (mut sim, file, _) = admitting(61);
    sim.start_kubelet();
    start_operator(&mut sim, &file);
    sim.world.run_until(secs(30)).unwrap();
    assert_eq!(sim.registered_nodes(), ["node-0", "node-1"]);
    sim.create_spurjob(
        "default",
        "admitted",
        json!({"image": "busybox", "command": ["true"], "env": {"SIM_RUN_SECONDS": "5"}}),
    );
    sim.world.run_until(secs(90)).unwrap();
    let status = &sim.spurjob("default", "admitted").unwrap()["status"];
    assert_eq!(status["state"], "Completed", "{status:#}");
    let id = status["spurJobId"].as_u64().unwrap() as u32;
    assert_eq!(
        sim.controller_job(id).unwrap().state(),
        JobState::JobCompleted
    );

    // Three node-token lifetimes: each node registers again at half of each.
    let registrations = sim.successful_calls("RegisterAgent");
    sim.world.run_until(secs(10) + 3 * LIFETIME).unwrap();
    let renewals = sim.successful_calls("RegisterAgent") - registrations;
    assert!(
        (2 * 5..=2 * 7).contains(&renewals),
        "{renewals} renewals of 2 nodes in 3 lifetimes"
    );
    assert_eq!(
        token_refusals(&sim),
        0,
        "no heartbeat went out with an expired token"
    );
    let cluster = sim.world.cluster();
    let slot = cluster.slot_of(&cluster.leader().unwrap()).unwrap();
    let states = cluster.read(slot, |s| {
        s.nodes.values().map(|n| n.state).collect::<Vec<_>>()
    });
    assert!(
        states.iter().all(|s| *s == spur_proto::NodeState::NodeIdle),
        "{states:?}"
    );
    let _ = std::fs::remove_dir_all(file.parent().unwrap());
}

#[test]
fn after_a_revocation_nodes_lose_their_standing_at_expiry_and_a_rotated_secret_brings_them_back() {
    let (mut sim, file, id) = admitting(62);
    start_operator(&mut sim, &file);
    sim.world.run_until(secs(30)).unwrap();
    assert_eq!(sim.registered_nodes(), ["node-0", "node-1"]);
    assert!(
        sim.world
            .cluster()
            .revoke_join_token(&id, sim.world.elapsed())
    );

    // The node tokens still serve until they expire; the renewal at half their life is
    // refused, and once they expire the heartbeats are too.
    sim.world
        .run_until(secs(20) + LIFETIME / 2 + secs(60))
        .unwrap();
    assert!(
        !sim.world
            .trace()
            .find("RegisterAgent -> PermissionDenied token revoked")
            .is_empty()
    );
    assert_eq!(token_refusals(&sim), 0);
    sim.world.run_until(secs(20) + LIFETIME + secs(70)).unwrap();
    assert!(
        !sim.world
            .trace()
            .find("Heartbeat -> Unauthenticated node token expired")
            .is_empty(),
        "the expired node tokens were refused"
    );
    let refused_at_expiry = token_refusals(&sim);
    sim.world
        .run_until(secs(20) + LIFETIME + secs(120))
        .unwrap();
    assert_eq!(
        token_refusals(&sim),
        refused_at_expiry,
        "a node whose token is refused stops heartbeating and registers again instead"
    );

    // An administrator puts a new token in the Secret: read at the next registration.
    let (token, _) = sim
        .world
        .cluster()
        .create_join_token(sim.world.elapsed())
        .unwrap();
    std::fs::write(&file, token).unwrap();
    let rotated = sim.world.elapsed();
    let registrations = sim.successful_calls("RegisterAgent");
    sim.world.run_until(rotated + secs(120)).unwrap();
    assert!(sim.successful_calls("RegisterAgent") >= registrations + 2);
    let beats = sim.successful_calls("Heartbeat");
    sim.world.run_until(rotated + secs(140)).unwrap();
    assert!(
        sim.successful_calls("Heartbeat") >= beats + 4,
        "both nodes heartbeat again"
    );
    let _ = std::fs::remove_dir_all(file.parent().unwrap());
}

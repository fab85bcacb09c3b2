//! `/readyz` as a kubelet sees it in the simulated world: not ready while spurctld has no
//! ready endpoint or the API server is down, ready once both answer.

use std::time::Duration;

use spur_sim::harness::Sim;
use spur_sim::kube_api::OutageMode;
use spur_sim::world::WorldConfig;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

#[test]
fn readyz_follows_the_controller_and_the_api_server() {
    let mut sim = Sim::with_controllers_at(31, WorldConfig::default(), secs(20));
    sim.add_nodes(1);
    sim.start_operator("operator", &[]);
    let probes = spur_sim::prober::start(
        &mut sim.world,
        "prober",
        "operator",
        8080,
        "/readyz",
        secs(1),
        secs(3),
    );
    sim.world.run_until(secs(18)).unwrap();
    assert_eq!(probes.at(secs(18)), Some(false), "no controller yet");

    sim.world.run_until(secs(40)).unwrap();
    assert_eq!(
        probes.at(secs(40)),
        Some(true),
        "controller and API server answer"
    );

    sim.api.faults().start_outage(OutageMode::Unavailable);
    sim.world.run_until(secs(50)).unwrap();
    assert_eq!(probes.at(secs(50)), Some(false), "the API server is down");

    sim.api.faults().end_outage();
    sim.world.run_until(secs(60)).unwrap();
    assert_eq!(probes.at(secs(60)), Some(true), "the API server is back");
    // One probe a second, fewer while probes wait out their timeout.
    assert!(probes.len() >= 40, "{} probes in 60 s", probes.len());
}

//! `/readyz` as a kubelet sees it in the simulated world: not ready while spurctld has no
//! ready endpoint or the API server is down, ready once both answer.

use std::time::Duration;

use spur_fakes::api_server::OutageMode;
use spur_sim::harness::Sim;
use spur_sim::world::WorldConfig;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// A kubelet-like prober of the operator's /readyz every `period`, 3 s to answer.
fn probe_operator(sim: &mut Sim, period: Duration) -> spur_sim::prober::ProbeLog {
    spur_sim::prober::start(
        &mut sim.world,
        "prober",
        "operator",
        8080,
        "/readyz",
        period,
        secs(3),
    )
}

#[test]
fn readyz_follows_the_controller_and_the_api_server() {
    let mut sim = Sim::with_controllers_at(31, WorldConfig::default(), secs(20));
    sim.add_nodes(1);
    sim.start_operator("operator", &[]);
    let probes = probe_operator(&mut sim, secs(1));
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

/// Runs `sim` to `until`, judging readiness every 250 ms as the scenarios do.
fn judge(mut sim: Sim, until: Duration) -> (Vec<String>, usize) {
    use spur_judge::checks::readiness::ReadinessJudge;
    let probes = probe_operator(&mut sim, secs(5));
    let mut judge = ReadinessJudge::new(
        secs(15),
        probes,
        spur_sim::prober::ProbeRule::DEPLOYMENT,
        "operator",
    );
    let mut violations = Vec::new();
    let mut now = Duration::ZERO;
    while now < until {
        now += Duration::from_millis(250);
        sim.world.run_until(now).unwrap();
        violations.extend(
            spur_sim::scenario::observe::sample_readiness(&mut judge, &sim, now, true)
                .map(|v| v.to_string()),
        );
    }
    (violations, judge.judged)
}

#[test]
fn the_readiness_check_passes_a_truthful_operator_and_flags_a_lying_one() {
    let mut truthful = Sim::new(32);
    truthful.start_operator("operator", &[]);
    let (violations, judged) = judge(truthful, secs(60));
    assert!(violations.is_empty(), "{violations:?}");
    assert!(judged > 100, "the check judged {judged} samples");

    // A probe bound no answer can meet: /readyz says not ready while everything is up.
    let mut lying = Sim::new(32);
    lying.start_operator("operator", &["--probe-timeout", "1ms"]);
    let (violations, _) = judge(lying, secs(60));
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert!(
        violations[0].starts_with("readiness operator/readyz")
            && violations[0].contains("the kubelet holds it not ready"),
        "{violations:?}"
    );
}

#[test]
fn the_judges_probe_rule_is_the_deployments() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/deployment.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let deployment: serde_json::Value = serde_yaml_ng::from_str(&text).unwrap();
    let probe = &deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"];
    let field = |name: &str, default: u64| probe[name].as_u64().unwrap_or(default);
    let rule = spur_sim::prober::ProbeRule::DEPLOYMENT;
    // Kubernetes' defaults where the Deployment sets nothing.
    assert_eq!(secs(field("periodSeconds", 10)), rule.period, "{probe}");
    assert_eq!(secs(field("timeoutSeconds", 1)), rule.timeout, "{probe}");
    assert_eq!(
        field("failureThreshold", 3) as usize,
        rule.failure_threshold
    );
    assert_eq!(
        field("successThreshold", 1) as usize,
        rule.success_threshold
    );
}

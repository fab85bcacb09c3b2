//! A run's timeline (`spur-sim replay --html`, `spur-sim lab --html`) tells what happened:
//! the fault over the lane it hit, the operator's calls as the operator saw them end, and
//! each deadline met or missed with its violation. Drawing it changes nothing the
//! simulation observes.

use std::time::Duration;

use spur_judge::catalogue;
use spur_judge::profiles::Profile;
use spur_judge::timeline::Timeline;
use spur_sim::scenario::{ScenarioConfig, run_plan};

/// The seed's own story: the leader's pod is killed and its packets vanish, so a channel
/// to it hangs. (A frozen leader no longer serves here: what the kernel of a stopped
/// process took in is answered at the thaw, `spur_sim::net::Freezable`, so a 20 s freeze
/// ends before seed-fix's 30 s request bound.)
fn leader_kill(profile: Profile, timeline: bool) -> spur_sim::scenario::Outcome {
    let mut plan = catalogue::plan("leader-kill-silent", Duration::from_secs(20)).expect("named");
    plan.seed = 1;
    let config = ScenarioConfig {
        timeline,
        ..ScenarioConfig::default()
    };
    run_plan(&plan, profile, &config)
}

fn drawn(profile: Profile) -> (spur_sim::scenario::Outcome, Timeline) {
    spur_sim::timeline_calls::catch_in_this_process();
    let outcome = leader_kill(profile, true);
    let timeline = *outcome.timeline.clone().expect("asked for a timeline");
    (outcome, timeline)
}

#[test]
fn a_missed_deadline_is_drawn_with_the_fault_and_the_call_that_hung_through_it() {
    let (outcome, timeline) = drawn(Profile::SeedFix);
    assert!(
        !outcome.passed(),
        "seed-fix misses a deadline behind a silently killed leader"
    );

    // The kill, on the lane of the leader it killed, until the world is whole again 30 s
    // later (the replacement pod has caught up).
    let [kill] = timeline.faults.as_slice() else {
        panic!("one fault: {:?}", timeline.faults);
    };
    assert_eq!(kill.name, "leader-kill-silent");
    assert_eq!(kill.to_ms - kill.from_ms, 30_000);
    let down = timeline
        .spans
        .iter()
        .find(|s| s.kind == "down")
        .expect("the killed host's span");
    assert_eq!(kill.lanes, std::slice::from_ref(&down.lane));
    assert!(
        timeline
            .spans
            .iter()
            .any(|s| s.kind == "leader" && s.lane == down.lane && s.to_ms >= kill.from_ms),
        "the killed host led when it died: {:?}",
        timeline.spans
    );

    // The operator's own account: a call that went unanswered through the kill for
    // seed-fix's 30 s request bound.
    let hung = timeline
        .calls
        .iter()
        .filter(|c| c.lane == "operator" && c.outcome == "transport")
        .filter(|c| c.from_ms >= kill.from_ms && c.from_ms < kill.to_ms)
        .max_by_key(|c| c.to_ms - c.from_ms)
        .unwrap_or_else(|| {
            panic!(
                "no call failed on the transport after the kill: {:#?}",
                timeline
                    .calls
                    .iter()
                    .filter(|c| c.lane == "operator")
                    .collect::<Vec<_>>()
            )
        });
    assert!(
        hung.to_ms - hung.from_ms >= 29_000,
        "it hung for the request bound: {hung:?}"
    );
    assert!(
        timeline
            .calls
            .iter()
            .any(|c| c.lane.starts_with("spurctld") && c.outcome == "answered"),
        "the replicas' answers are drawn on their lanes"
    );

    // The missed deadline, red, with the violation that reported it.
    let missed: Vec<_> = timeline.deadlines.iter().filter(|d| !d.met).collect();
    assert!(
        !missed.is_empty(),
        "a missed deadline: {:?}",
        timeline.deadlines
    );
    for d in &missed {
        let violation = d
            .violation
            .as_deref()
            .expect("a missed deadline names its violation");
        assert!(violation.starts_with(&format!("{} {}", d.check, d.object)));
        assert!(d.end_ms > d.due_ms && d.due_ms > d.from_ms);
    }
    assert_eq!(
        missed.len(),
        outcome
            .violations
            .iter()
            .filter(|v| ["registration", "submission", "status", "deletion"].contains(&v.check))
            .count()
    );
    assert!(timeline.deadlines.iter().any(|d| d.met));
    let job = &missed[0].object;
    assert!(
        timeline
            .jobs
            .iter()
            .any(|j| format!("spurjob/{}", j.name) == *job),
        "the job that missed has its row"
    );
}

#[test]
fn the_default_operator_meets_every_deadline_of_the_same_kill() {
    let (outcome, timeline) = drawn(Profile::Default);
    assert!(outcome.passed(), "{:?}", outcome.violations);
    assert!(timeline.deadlines.iter().all(|d| d.met));
    assert!(timeline.violations.is_empty());
    // No call of the operator hangs on the dead leader for long.
    let longest = timeline
        .calls
        .iter()
        .filter(|c| c.lane == "operator")
        .map(|c| c.to_ms - c.from_ms)
        .max()
        .expect("calls were caught");
    assert!(longest < 10_000, "longest call {longest} ms");
}

#[test]
fn drawing_the_timeline_changes_nothing_the_simulation_observes() {
    let plain = leader_kill(Profile::Default, false);
    let (drawn, _) = drawn(Profile::Default);
    assert!(plain.timeline.is_none());
    assert_eq!(plain.trace_hash, drawn.trace_hash);
}

#[test]
fn the_page_of_a_ten_minute_seed_stays_small() {
    // Issue 21's bound: 10 minutes of simulated time with 20 SpurJobs under 2 MB.
    spur_sim::timeline_calls::catch_in_this_process();
    let config = ScenarioConfig {
        timeline: true,
        ..ScenarioConfig::default().with_intensity(spur_sim::scenario::Intensity {
            duration: Duration::from_secs(570),
            ..Default::default()
        })
    };
    let outcome = spur_sim::scenario::run(7, Profile::Default, &config);
    let timeline = outcome.timeline.expect("asked for");
    assert!(timeline.end_ms >= 600_000, "ran {} ms", timeline.end_ms);
    assert!(timeline.jobs.len() >= 20);
    let page = spur_judge::timeline::html::render(&timeline);
    assert!(page.len() < 2 << 20, "{} bytes", page.len());
}

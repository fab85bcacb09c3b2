//! The simulation as a [`Stage`]: the plan's actions are scheduled in the turmoil world at
//! their exact times, and each sample reads the world's state.

use std::cell::{Cell, RefCell};
use std::collections::BTreeSet;
use std::rc::Rc;
use std::time::Duration;

use serde_json::json;
use spur_judge::checks::acting::ActingCheck;
use spur_judge::checks::readiness::WorldView;
use spur_judge::checks::{AcceptedJob, Observation, Violation};
use spur_judge::hosts::{OPERATOR, OPERATOR_B, PROBER, PROBER_B};
use spur_judge::plan::{Fault, Plan, ScenarioConfig};
use spur_judge::probes::{ProbeLog, ProbeRule};
use spur_judge::profiles::Profile;
use spur_judge::service::ServiceSetup;
use spur_judge::stage::{Action, Drawing, Ending, Stage};
use spur_judge::timeline::FaultSpan;
use spur_judge::trace::TraceEvent;

use super::observe::{accepted_jobs, judge_acting, observe_sim, view};
use super::{Missing, landed, sabotage, schedule_fault};
use crate::harness::Sim;
use crate::net::NetConfig;
use crate::operator::KUBE_API_HOST;
use crate::world::WorldConfig;

/// One seed's simulated world, with what its runner needs to know of it.
pub struct SimStage<'c> {
    sim: Sim,
    config: &'c ScenarioConfig,
    profile: Profile,
    seed: u64,
    service: ServiceSetup,
    /// The harness's knowledge of the API server, which its outage faults set.
    api_up: Rc<Cell<bool>>,
    /// Faults that found nothing to strike (a leader kill with no leader), by index.
    skipped: Rc<RefCell<Vec<usize>>>,
    /// The config's sabotage, scheduled at the first step: after the plan's own actions,
    /// so one at the same time as a fault follows it.
    sabotage_scheduled: bool,
    /// The last sample's time: the world's steps overshoot it by less than a tick.
    now: Duration,
}

impl<'c> SimStage<'c> {
    /// The world of `plan`'s seed: its Service, nodes and kubelet; nothing else started.
    pub fn new(plan: &Plan, profile: Profile, config: &'c ScenarioConfig) -> Self {
        let seed = plan.seed;
        let service = config.intensity.service_for(seed);
        let world_config = WorldConfig {
            max_duration: plan.end + Duration::from_secs(60),
            tick: config.intensity.tick,
            net: NetConfig {
                service: service.kind,
                no_endpoint: service.no_endpoint,
                ..NetConfig::default()
            },
            ..WorldConfig::default()
        };
        let mut sim = Sim::without_controllers(seed, world_config);
        sim.world.trace().record(
            Duration::ZERO,
            "harness",
            format!("service spurctld is {}", service.name()),
        );
        sim.add_nodes(plan.nodes);
        sim.start_kubelet();
        if config.timeline {
            // Calls an earlier run on this thread left.
            crate::timeline_calls::take();
        }
        SimStage {
            sim,
            config,
            profile,
            seed,
            service,
            api_up: Rc::new(Cell::new(true)),
            skipped: Rc::default(),
            sabotage_scheduled: false,
            now: Duration::ZERO,
        }
    }

    /// Creates SpurJob `job` at `at`.
    fn schedule_create(&mut self, at: Duration, job: spur_judge::plan::PlannedJob) {
        let api = self.sim.api.clone();
        self.sim.world.at(at, move |_| {
            let spec = json!({
                "image": "busybox",
                "command": ["sh", "-c", "true"],
                "env": {"SIM_RUN_SECONDS": job.run_secs.to_string(),
                        "SIM_EXIT_CODE": job.exit_code.to_string()},
            });
            let name = job.name;
            let created = api.create(json!({
                "apiVersion": "spur.amd.com/v1alpha1", "kind": "SpurJob",
                "metadata": {"name": name, "namespace": "default"}, "spec": spec,
            }));
            landed(&format!("create SpurJob {name}"), created, Missing::Fails);
        });
    }
}

impl Stage for SimStage<'_> {
    const NAME: &'static str = "simulation";

    fn start_operator(&mut self, name: &str) -> Result<(), String> {
        let mut flags = self.profile.flags();
        flags.extend(self.config.operator_flags.iter().map(String::as_str));
        if name == OPERATOR_B {
            flags.extend(self.config.operator_b_flags.iter().map(String::as_str));
        }
        self.sim.start_operator(name, &flags);
        Ok(())
    }

    fn probes(&mut self, operator: &str) -> Result<ProbeLog, String> {
        // 8080 is the health port every profile keeps.
        let prober = if operator == OPERATOR {
            PROBER
        } else {
            PROBER_B
        };
        Ok(crate::prober::start(
            &mut self.sim.world,
            prober,
            operator,
            8080,
            "/readyz",
            ProbeRule::DEPLOYMENT.period,
            ProbeRule::DEPLOYMENT.timeout,
        ))
    }

    fn schedule(&mut self, at: Duration, action: Action) {
        match action {
            Action::StartControllers => self.sim.world.at(at, |w| w.start_controllers()),
            Action::Create(job) => self.schedule_create(at, job),
            Action::Strike { index, fault } => {
                let skipped = self.skipped.clone();
                let skip = move || skipped.borrow_mut().push(index);
                schedule_fault(&mut self.sim, at, fault, self.api_up.clone(), skip);
            }
        }
    }

    fn advance(&mut self, to: Duration) -> Result<(), String> {
        if !self.sabotage_scheduled {
            self.sabotage_scheduled = true;
            for (at, sabotage) in &self.config.sabotage {
                let (api, sabotage, at) = (self.sim.api.clone(), sabotage.clone(), *at);
                self.sim
                    .world
                    .at(at, move |w| sabotage::strike(w, &api, &sabotage, at));
            }
        }
        self.now = to;
        self.sim.world.run_until(to).map_err(|e| e.to_string())
    }

    fn now(&self) -> Duration {
        self.now
    }

    fn api_up(&self) -> bool {
        self.api_up.get()
    }

    fn delete(&mut self, name: &str) -> Result<(), String> {
        let deleted =
            self.sim
                .api
                .delete("spur.amd.com/v1alpha1", "SpurJob", Some("default"), name);
        landed(&format!("delete SpurJob {name}"), deleted, Missing::Fails);
        Ok(())
    }

    fn judge_acting(&mut self, acting: &mut ActingCheck) -> Vec<Violation> {
        judge_acting(acting, &self.sim)
    }

    fn observe(&mut self, operators: &[&str]) -> Observation {
        observe_sim(&self.sim, self.now, operators)
    }

    fn readiness_view(&mut self, operator: &str) -> WorldView {
        view(operator, &self.sim, self.now, self.api_up.get())
    }

    fn take_skipped(&mut self) -> Vec<usize> {
        std::mem::take(&mut *self.skipped.borrow_mut())
    }

    fn accepted_jobs(&mut self) -> Option<Vec<AcceptedJob>> {
        Some(accepted_jobs(&self.sim.world.log()))
    }

    fn ending(&mut self) -> Ending {
        let events = self.sim.world.trace().events();
        Ending {
            trace_hash: self.sim.world.trace_hash(),
            rpcs: controller_calls(&events),
            service: Some(self.service),
            replay_args: self.config.intensity.for_seed(self.seed).args(),
        }
    }

    fn drawing(&mut self, plan: &Plan, skipped: &BTreeSet<usize>, end: Duration) -> Drawing {
        let events = self.sim.world.trace().events();
        let (seed, profile) = (self.seed, self.profile);
        let mut drawing = drawing(&events, plan, skipped, end);
        // A named scenario's caller (the lab) puts its own title and replay.
        drawing.title = format!("seed {seed}, profile {profile}");
        drawing.replay = format!(
            "cargo run --release -p spur-sim -- replay --seed {seed} --profile {profile}{} --html FILE",
            self.config.intensity.for_seed(seed).args()
        );
        drawing.calls.extend(crate::timeline_calls::take());
        drawing
    }
}

/// Calls the operator replicas made to the controller, as the replicas answered them
/// ([`spur_fakes::model::calls::answered`]).
fn controller_calls(events: &[TraceEvent]) -> usize {
    spur_fakes::model::calls::answered(events, Duration::ZERO, Duration::MAX)
        .values()
        .sum()
}

/// A finished run as the trace shows it: lanes for the operator replicas, every controller
/// replica the run had and the API server; the plan's faults that struck, each over the
/// lanes the harness named when it struck (the API server's for its own faults).
fn drawing(
    events: &[TraceEvent],
    plan: &Plan,
    skipped: &BTreeSet<usize>,
    end: Duration,
) -> Drawing {
    let mut replicas = BTreeSet::new();
    for event in events {
        if event.host.starts_with("spurctld") {
            replicas.insert(event.host.clone());
        }
    }
    let lanes = spur_judge::timeline::lanes(&plan.operators, replicas.iter().cloned());
    let faults = plan
        .faults
        .iter()
        .enumerate()
        .filter(|(index, _)| !skipped.contains(index))
        .map(|(_, planned)| {
            let mut struck = spur_judge::timeline::struck_at(events, planned.at);
            if strikes_the_api(&planned.fault) {
                struck = vec![KUBE_API_HOST.to_owned()];
            } else if struck.is_empty() {
                struck = replicas.iter().cloned().collect();
            }
            FaultSpan {
                name: planned.fault.name().to_owned(),
                from_ms: planned.at.as_millis() as u64,
                to_ms: (planned.at + planned.fault.heals_after()).as_millis() as u64,
                lanes: struck,
            }
        })
        .collect();
    let (spans, calls) = spur_judge::timeline::from_trace(events, end);
    Drawing {
        lanes,
        spans,
        faults,
        calls,
        ..Drawing::default()
    }
}

/// Whether `fault` strikes the API server rather than a host.
fn strikes_the_api(fault: &Fault) -> bool {
    matches!(
        fault,
        Fault::ApiOutage { .. }
            | Fault::WatchCut
            | Fault::StatusConflict { .. }
            | Fault::NodeNotReadyFlap { .. }
            | Fault::NodeResourcesChanged { .. }
            | Fault::NodeDeleted { .. }
    )
}

//! What one scenario came to, on either stage: its violations, its lags and counts.

use std::collections::BTreeMap;

use crate::checks::Violation;
use crate::profiles::Profile;
use crate::service::ServiceSetup;

/// Summary statistics of one lag, in milliseconds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LagStats {
    pub count: usize,
    pub p50: u64,
    pub p99: u64,
    pub max: u64,
}

impl LagStats {
    pub fn of(values: &[u64]) -> LagStats {
        if values.is_empty() {
            return LagStats::default();
        }
        let mut sorted = values.to_vec();
        sorted.sort_unstable();
        let at = |q: f64| sorted[((sorted.len() - 1) as f64 * q).round() as usize];
        LagStats {
            count: sorted.len(),
            p50: at(0.5),
            p99: at(0.99),
            max: *sorted.last().expect("not empty"),
        }
    }
}

/// What one scenario came to.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub seed: u64,
    pub profile: Profile,
    pub violations: Vec<Violation>,
    pub trace_hash: String,
    pub sim_secs: f64,
    pub wall_ms: u128,
    pub faults: Vec<String>,
    pub registration_lags: Vec<u64>,
    pub submission_lags: Vec<u64>,
    pub status_lags: Vec<u64>,
    pub failover_submission_lags: Vec<u64>,
    /// Beyond the first, the controller jobs of one SpurJob that ran or may still run
    /// (violations of `duplicate-submission`).
    pub duplicates: usize,
    /// Second jobs of SpurJobs that ended without running: stopped by the operator.
    pub duplicates_stopped: usize,
    /// Calls the operator made to the controller replicas (a forward is not a second call;
    /// the readiness probe's Pings are calls).
    pub rpcs: usize,
    /// Leader-only writes applied from each operator replica.
    pub acting_writes: BTreeMap<String, usize>,
    /// Controller write calls received from each operator replica, each judged against
    /// the Lease.
    pub acting_calls: BTreeMap<String, usize>,
    /// Of those writes and calls, the ones a cut held that landed outside their sender's
    /// term when it healed (judged by when they may have been sent; `checks::acting`).
    pub landed_after_cut: BTreeMap<String, usize>,
    /// The `spurctld` Service it ran behind (forced, or drawn from its seed); `None` for a
    /// run on real processes, whose Service is the lab's own.
    pub service: Option<ServiceSetup>,
    /// The flags beyond seed and profile that replay it: a non-default intensity, and
    /// always the Service it ran behind.
    pub replay_args: String,
    /// The run as a picture, when the config asked for one.
    pub timeline: Option<Box<crate::timeline::Timeline>>,
}

impl Outcome {
    /// A run that could not be judged, with the one violation that says why: a panic in
    /// the simulation, or a lab run that never reported.
    pub fn failed(seed: u64, profile: Profile, violation: Violation) -> Outcome {
        Outcome {
            seed,
            profile,
            violations: vec![violation],
            trace_hash: String::new(),
            sim_secs: 0.0,
            wall_ms: 0,
            faults: Vec::new(),
            registration_lags: Vec::new(),
            submission_lags: Vec::new(),
            status_lags: Vec::new(),
            failover_submission_lags: Vec::new(),
            duplicates: 0,
            duplicates_stopped: 0,
            rpcs: 0,
            acting_writes: BTreeMap::new(),
            acting_calls: BTreeMap::new(),
            landed_after_cut: BTreeMap::new(),
            service: None,
            replay_args: String::new(),
            timeline: None,
        }
    }

    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }

    pub fn replay_command(&self) -> String {
        format!(
            "cargo run --release -p spur-sim -- replay --seed {} --profile {}{}",
            self.seed, self.profile, self.replay_args
        )
    }
}

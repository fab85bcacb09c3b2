//! SpurJobs: the custom resource, its conversion to the controller's JobSpec, the
//! reconciler that submits and mirrors them, and the reports of their pods' ends.

mod args;
pub mod convert;
pub mod crd;
pub mod duplicates;
pub mod failure;
pub mod nudge;
pub mod orphans;
pub mod pods;
pub mod reconcile;
pub mod reports;
pub mod status;
pub mod submit;

pub use args::JobsArgs;
pub use crd::SpurJob;

/// Keeps a deleted SpurJob until its job is cancelled and its pods are gone.
pub const FINALIZER: &str = "spur.amd.com/cleanup";
/// On every pod and Service of a job: the controller's job id.
pub const LABEL_JOB_ID: &str = "spur.amd.com/job-id";
/// On every pod and headless Service the operator creates.
pub const LABEL_MANAGED_BY: &str = "spur.amd.com/managed-by";
/// The `managed-by` value written on everything the operator creates: upstream's operator's
/// (`spur-k8s`) own value, so selectors and dashboards written for it find our pods too.
pub const MANAGED_BY: &str = "spur-k8s-operator";
/// The value earlier versions of this operator wrote; their pods may still be running
/// after an upgrade, and must still be found.
pub const MANAGED_BY_EARLIER: &str = "spur-operator";

/// The label selector of every pod either operator made, under either value: pods of jobs
/// running across an upgrade or a swap from upstream still have their ends reported and
/// are found by `spur exec`.
pub fn managed_selector() -> String {
    format!("{LABEL_MANAGED_BY} in ({MANAGED_BY},{MANAGED_BY_EARLIER})")
}
/// The owning SpurJob's UID.
pub const LABEL_SPURJOB_UID: &str = "spur.amd.com/spurjob-uid";
/// On every pod: the SpurJob's name and the node it runs on, as upstream's operator labels
/// them (selectors and dashboards written for it keep matching), made label values.
pub const LABEL_JOB_NAME: &str = "spur.amd.com/job-name";
pub const LABEL_TARGET_NODE: &str = "spur.amd.com/target-node";

/// `value` as a label value: at most 63 characters of letters, digits, `-`, `_` and `.`,
/// beginning and ending with a letter or digit; any other character becomes `-`. A name
/// longer than that is cut (the full name stays in the owner reference and annotations).
pub fn label_value(value: &str) -> String {
    let mapped: String = value
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .take(63)
        .collect();
    mapped
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_owned()
}

/// The headless Service of a multi-node job.
pub fn service_name(job_id: u32) -> String {
    format!("spur-job-{job_id}")
}

/// Tunables of the SpurJob reconciler and the pod reports; the flags in `config` carry
/// the defaults' reasons.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JobsTuning {
    /// How long after a FAILED_PRECONDITION refusal of SubmitJob it is tried again with
    /// an unchanged spec (such a refusal names a condition outside the spec, e.g. a user
    /// unknown on the controller's host, which an administrator may fix).
    pub precondition_retry: std::time::Duration,
    /// How many times a pod's report refused with "node X is not allocated to job N" is
    /// sent again (within the one reconciliation of the pod) before the operator gives up
    /// on it.
    pub report_refusal_retries: u32,
    /// The delay between those tries.
    pub report_refusal_delay: std::time::Duration,
    /// How long CancelJob may answer "job N not found" before the job counts as gone
    /// (`--job-lost-after`: a stale replica does not know newer jobs).
    pub lost_after: std::time::Duration,
    /// How long after an unanswered SubmitJob the SpurJob's jobs are read back for a
    /// late duplicate (`--duplicate-watch`, see [`duplicates`]).
    pub duplicate_watch: std::time::Duration,
    /// How often they are read meanwhile (`--duplicate-watch-interval`).
    pub duplicate_watch_interval: std::time::Duration,
}

impl Default for JobsTuning {
    fn default() -> Self {
        JobsTuning {
            precondition_retry: std::time::Duration::from_secs(300),
            report_refusal_retries: 15,
            report_refusal_delay: std::time::Duration::from_secs(2),
            lost_after: std::time::Duration::from_secs(120),
            duplicate_watch: std::time::Duration::from_secs(600),
            duplicate_watch_interval: std::time::Duration::from_secs(30),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::label_value;

    #[test]
    fn any_text_becomes_a_valid_label_value() {
        assert_eq!(label_value("train-llama"), "train-llama");
        assert_eq!(label_value("node/a b"), "node-a-b");
        assert_eq!(label_value("-_x_-"), "x");
        assert_eq!(label_value(&"n".repeat(80)).len(), 63);
        assert_eq!(
            label_value(&format!("{}-x", "n".repeat(62))),
            "n".repeat(62)
        );
        assert_eq!(label_value("ü"), "");
    }
}

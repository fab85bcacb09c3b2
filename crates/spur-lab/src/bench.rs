//! `spur-sim lab-bench`: the operator at scale against the real three replicas, in the
//! lab's namespace. Registers every labelled node of the simulated API server and reports
//! the time from the first leader to the last registration (and the controller's write
//! rate that reveals), then keeps many SpurJobs active and reports the steady state's
//! GetJobs rate and the operator's resident memory. A benchmark, not a test: it prints
//! numbers and fails only when the world did not get there within its limits.

use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;

use super::world::{Lab, LabSetup};
use spur_judge::hosts::OPERATOR;

#[derive(Debug, clap::Args)]
pub struct LabBenchArgs {
    /// Labelled nodes to register.
    #[arg(long, default_value_t = 5000)]
    pub nodes: usize,
    /// Active SpurJobs in the steady state.
    #[arg(long, default_value_t = 10_000)]
    pub jobs: usize,
    /// How long the steady state is watched.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub steady: Duration,
    /// Each phase (registration, submission) fails past this.
    #[arg(long, default_value = "600s", value_parser = humantime::parse_duration)]
    pub limit: Duration,
    /// The output of `spur-sim lab-limits --replicas 3 --json`: each rate is then printed
    /// as a ratio of what the real replicas answer when driven as hard as they go.
    #[arg(long, value_name = "FILE")]
    pub limits: Option<std::path::PathBuf>,
}

/// The real spurctld's answered calls a second by call kind, for three replicas, as
/// `lab-limits --json` printed them.
#[derive(Debug, Default)]
pub struct ControllerLimits {
    per_second: std::collections::BTreeMap<String, f64>,
}

impl ControllerLimits {
    /// Reads `lab-limits --json`'s lines; an unreadable file or line is an error naming it.
    pub fn read(path: &std::path::Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("--limits {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| anyhow::anyhow!("--limits {}: {e}", path.display()))
    }

    fn parse(text: &str) -> anyhow::Result<Self> {
        let mut limits = Self::default();
        for (n, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            let row: serde_json::Value = serde_json::from_str(line).map_err(|e| {
                anyhow::anyhow!("line {}: not lab-limits --json output: {e}", n + 1)
            })?;
            let (Some(call), Some(rate)) = (row["call"].as_str(), row["per_second"].as_f64())
            else {
                anyhow::bail!("line {}: no \"call\" and \"per_second\"", n + 1);
            };
            if row["replicas"] == 3 {
                limits.per_second.insert(call.to_owned(), rate);
            }
        }
        anyhow::ensure!(
            !limits.per_second.is_empty(),
            "no line for 3 replicas (run lab-limits with --replicas 3)"
        );
        Ok(limits)
    }

    /// `rate` beside `call`'s limit, or nothing when that call was not measured.
    fn beside(limits: Option<&Self>, call: &str, rate: f64) -> String {
        match limits.and_then(|l| l.per_second.get(call)) {
            Some(limit) => format!(
                " ({:.2} of the real replicas' {call} limit, {limit:.0}/s)",
                rate / limit
            ),
            None => String::new(),
        }
    }
}

/// Resident memory of process `pid`, in MiB (`VmRSS` of /proc/PID/status).
fn resident_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: f64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kib / 1024.0)
}

pub fn main(args: LabBenchArgs) -> anyhow::Result<bool> {
    if let Some(why) = super::kernel::missing_tools() {
        anyhow::bail!("the lab cannot run here: {why}");
    }
    // Scale against the real peer: the simulated replicas are measured by `spur-sim bench`.
    let limits = args
        .limits
        .as_deref()
        .map(ControllerLimits::read)
        .transpose()?;
    let (replicas, operator) = super::binaries(None, super::ReplicaKind::Real)?;
    super::kernel::enter_private_network()?;
    let dir = std::env::temp_dir().join(format!("spur-lab-bench-{}", std::process::id()));
    let setup = LabSetup {
        replicas,
        operator,
        dir: dir.clone(),
        operator_flags: Vec::new(),
        no_endpoint: super::kernel::NoEndpoint::Drop,
        service: spur_judge::service::ServiceKind::ClusterIp,
        operator_root: None,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let result = runtime.block_on(bench(setup, &args, limits.as_ref()));
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn bench(
    setup: LabSetup,
    args: &LabBenchArgs,
    limits: Option<&ControllerLimits>,
) -> anyhow::Result<bool> {
    let mut lab = Lab::new(setup, args.nodes, &[OPERATOR]).await?;
    lab.start_clock();
    for slot in 0..lab.replica_count() {
        lab.start_replica(slot)?;
    }
    lab.start_operator(OPERATOR, &[])?;
    let pid = lab.operator_pid(OPERATOR).expect("just started");
    if !registration(&mut lab, args, pid, limits).await?
        || !submission(&mut lab, args, limits).await?
    {
        return Ok(false);
    }
    steady_state(&mut lab, args, pid).await?;
    Ok(true)
}

/// Registration, from the first leader to the last node the leader knows, printed;
/// `false` when it did not end within the limit.
async fn registration(
    lab: &mut Lab,
    args: &LabBenchArgs,
    pid: u32,
    limits: Option<&ControllerLimits>,
) -> anyhow::Result<bool> {
    let mut first_leader = None;
    let registered_at = loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        lab.tick().await?;
        if first_leader.is_none() && lab.leader_slot().is_some() {
            first_leader = Some(lab.now());
        }
        if first_leader.is_some() && lab.registered_count().await == Some(args.nodes) {
            break lab.now();
        }
        if lab.now() > args.limit {
            println!(
                "registration: {} of {} nodes after {:?}",
                lab.registered_count().await.unwrap_or(0),
                args.nodes,
                args.limit
            );
            return Ok(false);
        }
    };
    let took = registered_at - first_leader.expect("set");
    let rate = args.nodes as f64 / took.as_secs_f64().max(0.001);
    println!(
        "{} nodes registered {:.1} s after the first leader: {rate:.0} registrations/s{}; operator RSS {:.0} MiB",
        args.nodes,
        took.as_secs_f64(),
        ControllerLimits::beside(limits, "RegisterAgent", rate),
        resident_mib(pid).unwrap_or(f64::NAN)
    );
    Ok(true)
}

/// Creates the many active SpurJobs (pods that run for an hour) and waits until each has
/// its controller job, printed; `false` when that did not happen within the limit.
async fn submission(
    lab: &mut Lab,
    args: &LabBenchArgs,
    limits: Option<&ControllerLimits>,
) -> anyhow::Result<bool> {
    let created = Instant::now();
    for i in 0..args.jobs {
        // A create that failed would shrink the load the figure claims: stop instead.
        let name = format!("bench-{i:05}");
        lab.api
            .create(json!({
                "apiVersion": "spur.amd.com/v1alpha1", "kind": "SpurJob",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"image": "busybox", "command": ["sleep", "3600"],
                         "env": {"SIM_RUN_SECONDS": "3600"}},
            }))
            .map_err(|e| anyhow::anyhow!("creating SpurJob {name}: {} {}", e.code, e.message))?;
    }
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        lab.tick().await?;
        let submitted = lab
            .index
            .lock()
            .spurjobs
            .values()
            .filter(|j| j.spur_job_id.is_some())
            .count();
        if submitted == args.jobs {
            break;
        }
        if created.elapsed() > args.limit {
            println!(
                "submission: {submitted} of {} SpurJobs after {:?}",
                args.jobs, args.limit
            );
            return Ok(false);
        }
    }
    let took = created.elapsed().as_secs_f64();
    let rate = args.jobs as f64 / took.max(0.001);
    println!(
        "{} SpurJobs submitted {took:.1} s after they were created: {rate:.0} a second{}",
        args.jobs,
        ControllerLimits::beside(limits, "SubmitJob", rate),
    );
    Ok(true)
}

/// The steady state with every SpurJob active, watched for `--steady`: the operator's
/// GetJobs and all its controller calls per second, and its memory, printed.
async fn steady_state(lab: &mut Lab, args: &LabBenchArgs, pid: u32) -> anyhow::Result<()> {
    const GET_JOBS: &str = "spur_operator_controller_rpcs_total{method=\"GetJobs\"";
    const ALL_CALLS: &str = "spur_operator_controller_rpcs_total{";
    let before = lab.operator_metric(OPERATOR, GET_JOBS).await;
    let all_before = lab.operator_metric(OPERATOR, ALL_CALLS).await;
    let watch = Instant::now();
    while watch.elapsed() < args.steady {
        tokio::time::sleep(Duration::from_millis(500)).await;
        lab.tick().await?;
    }
    let secs = watch.elapsed().as_secs_f64();
    let after = lab.operator_metric(OPERATOR, GET_JOBS).await;
    let all_after = lab.operator_metric(OPERATOR, ALL_CALLS).await;
    let rate = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) => format!("{:.2}", (b - a) / secs),
        _ => "unknown (metrics unreadable)".into(),
    };
    println!(
        "steady state over {secs:.0} s with {} active SpurJobs and {} nodes: GetJobs {}/s, all controller calls {}/s; operator RSS {:.0} MiB",
        args.jobs,
        args.nodes,
        rate(before, after),
        rate(all_before, all_after),
        resident_mib(pid).unwrap_or(f64::NAN)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_replica_limits_are_read_and_a_rate_is_printed_as_their_ratio() {
        let text = concat!(
            r#"{"replicas":1,"call":"SubmitJob","per_second":196.0}"#,
            "\n",
            r#"{"replicas":3,"call":"SubmitJob","per_second":136.0}"#,
            "\n\n",
            r#"{"replicas":3,"call":"RegisterAgent","per_second":494.0}"#,
        );
        let limits = ControllerLimits::parse(text).expect("lab-limits output");
        assert_eq!(
            ControllerLimits::beside(Some(&limits), "SubmitJob", 68.0),
            " (0.50 of the real replicas' SubmitJob limit, 136/s)"
        );
        assert_eq!(ControllerLimits::beside(Some(&limits), "GetJobs", 1.0), "");
        assert_eq!(ControllerLimits::beside(None, "SubmitJob", 1.0), "");
    }

    #[test]
    fn limits_that_are_not_lab_limits_output_are_refused_with_the_line() {
        let err = ControllerLimits::parse("{}\n").unwrap_err().to_string();
        assert!(err.contains("line 1"), "{err}");
        let err = ControllerLimits::parse(r#"{"replicas":1,"call":"SubmitJob","per_second":1}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("--replicas 3"), "{err}");
    }
}

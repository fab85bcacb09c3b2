//! A SpurJob to the controller's JobSpec: a pure function, so every rule is tested
//! without a cluster.

use spur_proto as pb;

use super::crd::{SpurJob, SpurJobSpec};
use crate::quantity;

pub use spur_names::{UID_TAG, uid_in_comment};

/// The SpurJob annotation naming the user its job runs as at spurctld (`JobSpec.user`).
pub const ANNOTATION_USER: &str = "spur.amd.com/user";

/// The user a SpurJob without [`ANNOTATION_USER`] submits as, unless `--default-user` says
/// otherwise (the flag's default is the same).
pub const DEFAULT_USER: &str = "k8s";

/// What is wrong with a SpurJob, naming the field as a user writes it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("spec.{field}: {reason}")]
pub struct ValidationError {
    pub field: String,
    pub reason: String,
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> ValidationError {
    ValidationError {
        field: field.into(),
        reason: reason.into(),
    }
}

/// The longest time limit accepted: a year. Longer is a typo, and spurctld stores seconds.
const MAX_TIME_LIMIT_SECS: u64 = 366 * 24 * 3600;

/// Builds the JobSpec spurctld receives for `job`, submitting as [`DEFAULT_USER`] unless
/// the SpurJob's annotation names a user (see [`job_spec_as`]).
pub fn job_spec(job: &SpurJob, uid: &str) -> Result<pb::JobSpec, ValidationError> {
    job_spec_as(job, uid, DEFAULT_USER)
}

/// The user `job` submits as: its `spur.amd.com/user` annotation, else `default_user`.
/// A blank annotation counts as none.
pub fn job_user(job: &SpurJob, default_user: &str) -> String {
    job.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_USER))
        .map(|u| u.trim())
        .filter(|u| !u.is_empty())
        .unwrap_or(default_user)
        .to_owned()
}

/// Builds the JobSpec spurctld receives for `job`. `uid` is the object's UID, carried in
/// the comment so the submission can be found again; the job's user is its
/// `spur.amd.com/user` annotation, else `default_user` (`--default-user`). spurctld takes
/// the user from an unauthenticated submission as given (with a token it is the token's
/// subject instead), and a cancel names it.
pub fn job_spec_as(
    job: &SpurJob,
    uid: &str,
    default_user: &str,
) -> Result<pb::JobSpec, ValidationError> {
    let spec = &job.spec;
    let Checked {
        name,
        num_tasks,
        memory_per_node_mb,
        time_limit,
    } = check_spec(job)?;
    let gpus_per_node = gpus_per_node(spec);
    let argv = spec.command.iter().chain(&spec.args).cloned().collect();
    Ok(pb::JobSpec {
        name,
        partition: spec.partition.clone().unwrap_or_default(),
        account: spec.account.clone().unwrap_or_default(),
        user: job_user(job, default_user),
        num_nodes: spec.num_nodes,
        num_tasks,
        tasks_per_node: spec.tasks_per_node,
        cpus_per_task: spec.cpus_per_task,
        memory_per_node_mb,
        gpus_per_node,
        argv,
        environment: spec.env.clone(),
        time_limit: time_limit.map(|secs| pb::Duration {
            seconds: secs as i64,
            nanos: 0,
        }),
        dependency: spec.dependencies.clone(),
        array_spec: spec.array_spec.clone().unwrap_or_default(),
        comment: format!("{UID_TAG}{uid}"),
        host_network: spec.host_network,
        privileged: spec.privileged,
        host_ipc: spec.host_ipc,
        shm_size: spec.shm_size.clone().unwrap_or_default(),
        container_image: spec.image.clone(),
        // Only what the pods mount: spurctld shows them, and a malformed one mounts nothing.
        container_mounts: spec
            .volumes
            .iter()
            .filter(|v| parse_volume(v).is_ok())
            .cloned()
            .collect(),
        extra_resources: spec.extra_resources.clone(),
        ..Default::default()
    })
}

/// What [`check_spec`] read from a spec while checking it.
struct Checked {
    name: String,
    num_tasks: u32,
    memory_per_node_mb: u64,
    time_limit: Option<u64>,
}

/// Checks `job`'s spec before anything is sent: the first invalid field, in the order
/// of the spec's fields, or the values read from the checked ones.
fn check_spec(job: &SpurJob) -> Result<Checked, ValidationError> {
    let spec = &job.spec;
    let name = match &spec.name {
        Some(name) if name.trim().is_empty() => return Err(invalid("name", "must not be empty")),
        Some(name) => name.clone(),
        None => job.metadata.name.clone().unwrap_or_default(),
    };
    if spec.image.trim().is_empty() {
        return Err(invalid("image", "must name a container image"));
    }
    if spec.num_nodes == 0 {
        return Err(invalid("numNodes", "must be at least 1"));
    }
    if spec.tasks_per_node == 0 {
        return Err(invalid("tasksPerNode", "must be at least 1"));
    }
    if spec.cpus_per_task == 0 {
        return Err(invalid("cpusPerTask", "must be at least 1"));
    }
    let num_tasks = spec
        .num_nodes
        .checked_mul(spec.tasks_per_node)
        .ok_or_else(|| invalid("tasksPerNode", "numNodes × tasksPerNode is too large"))?;
    let memory_per_node_mb = match &spec.memory_per_node {
        None => 0,
        Some(q) => {
            let mb = quantity::parse(q)
                .map_err(|e| invalid("memoryPerNode", e.to_string()))?
                .mebibytes();
            u64::try_from(mb).map_err(|_| invalid("memoryPerNode", "too large"))?
        }
    };
    if let Some(shm) = &spec.shm_size {
        quantity::parse(shm).map_err(|e| invalid("shmSize", e.to_string()))?;
    }
    let time_limit = spec
        .time_limit
        .as_deref()
        .map(|t| parse_time_limit(t).map_err(|reason| invalid("timeLimit", reason)))
        .transpose()?;
    if let Some(timeout) = &spec.start_timeout {
        parse_time_limit(timeout).map_err(|reason| invalid("startTimeout", reason))?;
    }
    super::failure::check_policy(spec)
        .map_err(|(field, reason)| invalid(format!("failurePolicy.{field}"), reason))?;
    Ok(Checked {
        name,
        num_tasks,
        memory_per_node_mb,
        time_limit,
    })
}

/// The spec's GPUs as spurctld takes them, or `None` for none.
///
/// GPUs in exactly one form: spurctld refuses a `gpu:` gres entry together with
/// gpus_per_node (INVALID_ARGUMENT "only one GPU request form ..."). Both mean the same
/// to its scheduler (spur-core gpu_request.rs `resolve_gpu_demand_for`: each becomes
/// `GpuDemand::PerNode { counts: vec![count; num_nodes] }`, which spur-sched's backfill
/// places per node); gpus_per_node is the explicit form: typed, with no string to parse,
/// and "any type" is an empty gpu_type (`None`) rather than the literal type name "any"
/// a gres entry would carry. It is also what upstream's own Kubernetes job controller
/// sends (spur-k8s job_controller.rs). `gpus` would be a job total, spread unevenly.
fn gpus_per_node(spec: &SpurJobSpec) -> Option<pb::GpuRequest> {
    spec.gpus
        .as_ref()
        .filter(|g| g.count > 0)
        .map(|g| pb::GpuRequest {
            count: g.count,
            gpu_type: g.gpu_type.clone().unwrap_or_default(),
        })
}

/// A wall-time limit in seconds, in any form a SpurJob written for upstream's operator or a
/// spur `sbatch --time` uses:
///
/// - a bare number of minutes (`90`), as in Slurm;
/// - numbers with units `d`, `h`, `m`, `s` in either case (`4h`, `1h30m`, `90M`, `2H`,
///   `1d12h`), and a last number without a unit after hours read as minutes (`1h30`), as
///   upstream reads it;
/// - `H:MM:SS`, `D-H`, `D-H:MM` and `D-H:MM:SS`, as Slurm and spur read them.
///
/// Refused with a reason, where upstream's operator silently submitted no limit at all: an
/// unknown unit, a zero or year-long limit, and the forms that read two ways — `A:B`
/// (Slurm: minutes and seconds; spur's sbatch: hours and minutes) and a number without a
/// unit after `d` or `m` (`1m30`: upstream reads 31 minutes, a person 1.5).
pub fn parse_time_limit(input: &str) -> Result<u64, String> {
    let s = input.trim();
    if s.is_empty() {
        return Err("is empty".into());
    }
    if s.bytes().all(|b| b.is_ascii_digit()) {
        return check_limit(whole(s, s)?.checked_mul(60), s);
    }
    if s.contains(':') || s.contains('-') {
        return check_limit(Some(parse_clock(s)?), s);
    }
    let mut total: Option<u64> = Some(0);
    let mut digits = String::new();
    let mut last_unit = None;
    for c in s.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let unit = match c.to_ascii_lowercase() {
            'd' => 86_400,
            'h' => 3_600,
            'm' => 60,
            's' => 1,
            _ => {
                return Err(format!(
                    "`{s}`: `{c}` is not a unit (use d, h, m, s, a bare number of minutes, or H:MM:SS); upstream's operator would have submitted the job with no time limit"
                ));
            }
        };
        if digits.is_empty() {
            return Err(format!("`{s}`: `{c}` has no number before it"));
        }
        let n = whole(&digits, s)?;
        total = total.and_then(|t| n.checked_mul(unit).and_then(|v| t.checked_add(v)));
        digits.clear();
        last_unit = Some(unit);
    }
    if !digits.is_empty() {
        if last_unit != Some(3_600) {
            return Err(format!(
                "`{s}`: the last number has no unit, and after `d` or `m` it reads two ways (upstream's operator counts it in minutes); write its unit"
            ));
        }
        let minutes = whole(&digits, s)?;
        total = total.and_then(|t| minutes.checked_mul(60).and_then(|v| t.checked_add(v)));
    }
    check_limit(total, s)
}

/// The ASCII digits `digits` of the limit `s` as a number.
fn whole(digits: &str, s: &str) -> Result<u64, String> {
    digits.parse().map_err(|_| format!("`{s}` is too large"))
}

/// `H:MM:SS`, `D-H`, `D-H:MM`, `D-H:MM:SS` in seconds; `A:B` is refused as ambiguous.
fn parse_clock(s: &str) -> Result<u64, String> {
    let (days, clock) = match s.split_once('-') {
        Some((days, clock)) => (Some(days), clock),
        None => (None, s),
    };
    let number = |part: &str, what: &str| -> Result<u64, String> {
        if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("`{s}`: `{part}` is not a number of {what}"));
        }
        whole(part, s)
    };
    let parts: Vec<&str> = clock.split(':').collect();
    let (hours, minutes, seconds) = match (days, parts.as_slice()) {
        (None, [h, m, sec]) => (*h, *m, *sec),
        (None, [_, _]) => {
            return Err(format!(
                "`{s}` reads two ways (Slurm: minutes:seconds; spur's sbatch: hours:minutes); write `1h30m`, `90m` or `H:MM:SS`"
            ));
        }
        (Some(_), [h]) => (*h, "0", "0"),
        (Some(_), [h, m]) => (*h, *m, "0"),
        (Some(_), [h, m, sec]) => (*h, *m, *sec),
        _ => {
            return Err(format!("`{s}` is not H:MM:SS, D-H, D-H:MM or D-H:MM:SS"));
        }
    };
    let days = days.map_or(Ok(0), |d| number(d, "days"))?;
    let (hours, minutes, seconds) = (
        number(hours, "hours")?,
        number(minutes, "minutes")?,
        number(seconds, "seconds")?,
    );
    if minutes >= 60 || seconds >= 60 {
        return Err(format!("`{s}`: minutes and seconds must be below 60"));
    }
    days.checked_mul(86_400)
        .and_then(|d| hours.checked_mul(3_600).and_then(|h| d.checked_add(h)))
        .and_then(|t| t.checked_add(minutes * 60 + seconds))
        .ok_or_else(|| format!("`{s}` is too large"))
}

fn check_limit(secs: Option<u64>, s: &str) -> Result<u64, String> {
    match secs {
        Some(0) => Err("must be longer than zero".into()),
        Some(secs) if secs <= MAX_TIME_LIMIT_SECS => Ok(secs),
        _ => Err(format!("`{s}` is longer than a year")),
    }
}

/// A mount of a job's pods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Volume {
    HostPath {
        source: String,
        target: String,
        read_only: bool,
    },
    Claim {
        claim: String,
        target: String,
        read_only: bool,
    },
}

/// `/src:/dst[:ro]` (hostPath) or `pvc:claim:/dst[:ro]`.
pub fn parse_volume(input: &str) -> Result<Volume, String> {
    let parts: Vec<&str> = input.split(':').collect();
    let (read_only, parts) = match parts.split_last() {
        Some((&"ro", rest)) => (true, rest),
        Some((&"rw", rest)) => (false, rest),
        _ => (false, parts.as_slice()),
    };
    let absolute = |p: &str, what: &str| {
        if p.starts_with('/') {
            Ok(p.to_owned())
        } else {
            Err(format!("`{input}`: the {what} must be an absolute path"))
        }
    };
    match parts {
        ["pvc", claim, target] => {
            if claim.is_empty() {
                return Err(format!("`{input}`: the claim name is empty"));
            }
            Ok(Volume::Claim {
                claim: (*claim).to_owned(),
                target: absolute(target, "mount path")?,
                read_only,
            })
        }
        [source, target] => Ok(Volume::HostPath {
            source: absolute(source, "host path")?,
            target: absolute(target, "mount path")?,
            read_only,
        }),
        _ => Err(format!(
            "`{input}` is not /host/path:/mount/path[:ro] or pvc:claim:/mount/path[:ro]"
        )),
    }
}

/// The `volumes` and `secretEnv` entries of `spec` that do not parse, each naming its field
/// and why. They are left out and the job runs without them, where a malformed entry once
/// made the whole SpurJob invalid: upstream's operator leaves such an entry out and runs
/// the job, so a SpurJob written for it (or adopted from it, already running) must run
/// here too. The reconciler tells the user of each (a Warning Event and the
/// `EntriesDropped` condition), so nothing is dropped silently.
pub fn dropped_entries(spec: &SpurJobSpec) -> Vec<ValidationError> {
    let volumes = spec.volumes.iter().enumerate().filter_map(|(i, v)| {
        parse_volume(v)
            .err()
            .map(|reason| invalid(format!("volumes[{i}]"), reason))
    });
    let secrets = spec.secret_env.iter().filter_map(|(env, r)| {
        parse_secret_ref(r)
            .err()
            .map(|reason| invalid(format!("secretEnv.{env}"), reason))
    });
    volumes.chain(secrets).collect()
}

/// `secret/key` to (secret, key).
pub fn parse_secret_ref(input: &str) -> Result<(String, String), String> {
    match input.split_once('/') {
        Some((secret, key)) if !secret.is_empty() && !key.is_empty() && !key.contains('/') => {
            Ok((secret.to_owned(), key.to_owned()))
        }
        _ => Err(format!("`{input}` is not secret-name/key")),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;
    use crate::jobs::crd::SpurJobSpec;

    /// The per-node GPU request a JobSpec carries: its `gpus_per_node` (what the operator
    /// sends), else its `gpu:` gres entries (what a LaunchJob's spec carries: spurctld
    /// rewrites them to the node's count and clears gpus_per_node), summed as spurctld sums
    /// them. No type (an empty gpu_type, or `any` in a gres entry) is `None`; a count of 0 is
    /// no request.
    fn gpus_from(job: &pb::JobSpec) -> Option<crate::jobs::crd::GpuSpec> {
        if let Some(g) = job.gpus_per_node.as_ref().filter(|g| g.count > 0) {
            return Some(crate::jobs::crd::GpuSpec {
                count: g.count,
                gpu_type: (!g.gpu_type.is_empty()).then(|| g.gpu_type.clone()),
            });
        }
        let typed = |t: &str| (!t.is_empty() && t != "any").then(|| t.to_owned());
        let mut count = 0u32;
        let mut gpu_type = None;
        for entry in &job.gres {
            let parts: Vec<&str> = entry.trim().split(':').collect();
            let (kind, n) = match parts.as_slice() {
                ["gpu"] => (None, Some(1)),
                ["gpu", n] if n.parse::<u32>().is_ok() => (None, n.parse().ok()),
                ["gpu", kind] => (Some(*kind), Some(1)),
                ["gpu", kind, n] => (Some(*kind), n.parse::<u32>().ok()),
                _ => (None, None),
            };
            let Some(n) = n else { continue };
            count = count.saturating_add(n);
            if gpu_type.is_none() {
                gpu_type = kind.and_then(typed);
            }
        }
        (count > 0).then_some(crate::jobs::crd::GpuSpec { count, gpu_type })
    }

    /// The fields of a SpurJobSpec that a JobSpec carries back: the round-trip tests' oracle.
    fn spec_fields_from(job: &pb::JobSpec) -> SpurJobSpec {
        let gpus = gpus_from(job);
        let opt = |s: &str| (!s.is_empty()).then(|| s.to_owned());
        SpurJobSpec {
            name: opt(&job.name),
            image: job.container_image.clone(),
            args: job.argv.clone(),
            env: job.environment.clone(),
            gpus,
            num_nodes: job.num_nodes,
            tasks_per_node: job.tasks_per_node,
            cpus_per_task: job.cpus_per_task,
            partition: opt(&job.partition),
            account: opt(&job.account),
            volumes: job.container_mounts.clone(),
            host_network: job.host_network,
            privileged: job.privileged,
            host_ipc: job.host_ipc,
            shm_size: opt(&job.shm_size),
            extra_resources: job.extra_resources.clone(),
            array_spec: opt(&job.array_spec),
            dependencies: job.dependency.clone(),
            ..Default::default()
        }
    }
    use crate::jobs::crd::GpuSpec;

    fn job(spec: SpurJobSpec) -> SpurJob {
        let mut job = SpurJob::new("train", spec);
        job.metadata.namespace = Some("ml".into());
        job
    }

    #[test]
    fn time_limits_as_people_write_them() {
        for (input, secs) in [
            ("4h", 14_400),
            ("1h30m", 5_400),
            ("2d", 172_800),
            ("90", 5_400),
            ("45s", 45),
            ("1d12h", 129_600),
            // As upstream's operator reads them.
            ("1h30", 5_400),
            ("90M", 5_400),
            ("2H", 7_200),
            ("1D2h30M15S", 95_415),
            ("  2h  ", 7_200),
            // As Slurm and spur's sbatch read them.
            ("1:30:00", 5_400),
            ("2-0", 172_800),
            ("1-12:30", 131_400),
            ("0-0:0:45", 45),
        ] {
            assert_eq!(parse_time_limit(input), Ok(secs), "{input}");
        }
        for (bad, why) in [
            ("", "empty"),
            ("0", "longer than zero"),
            ("0h", "longer than zero"),
            ("4x", "would have submitted the job with no time limit"),
            ("h", "no number"),
            ("1m30", "two ways"),
            ("1d12", "two ways"),
            ("1:30", "two ways"),
            ("1:90:00", "below 60"),
            ("1:2:3:4", "is not H:MM:SS"),
            ("-1:00:00", "not a number of days"),
            ("400d", "longer than a year"),
            ("99999999999999999999", "too large"),
            ("1.5h", "not a unit"),
        ] {
            let error = parse_time_limit(bad).expect_err(bad);
            assert!(error.contains(why), "{bad:?}: {error}");
        }
    }

    #[test]
    fn volumes_and_secrets() {
        assert_eq!(
            parse_volume("/data:/data:ro"),
            Ok(Volume::HostPath {
                source: "/data".into(),
                target: "/data".into(),
                read_only: true
            })
        );
        assert_eq!(
            parse_volume("pvc:ckpt:/ckpt"),
            Ok(Volume::Claim {
                claim: "ckpt".into(),
                target: "/ckpt".into(),
                read_only: false
            })
        );
        for bad in ["data:/data", "/a", "pvc::/x", "nfs:srv:/x:ro:y", "/a:b"] {
            assert!(parse_volume(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_secret_ref("hf/token"),
            Ok(("hf".into(), "token".into()))
        );
        assert!(parse_secret_ref("hf").is_err() && parse_secret_ref("a/b/c").is_err());
    }

    #[test]
    fn the_uid_tag_is_found_in_the_comment() {
        assert_eq!(uid_in_comment("spurjob-uid=abc-1"), Some("abc-1"));
        assert_eq!(uid_in_comment("user note; spurjob-uid=x"), Some("x"));
        assert_eq!(uid_in_comment("spurjob-uid="), None);
        assert_eq!(uid_in_comment(""), None);
    }

    #[test]
    fn a_full_spec_converts() {
        let spec = SpurJobSpec {
            image: "rocm/pytorch".into(),
            command: vec!["torchrun".into()],
            args: vec!["train.py".into()],
            gpus: Some(GpuSpec {
                count: 8,
                gpu_type: Some("mi300x".into()),
            }),
            num_nodes: 2,
            tasks_per_node: 8,
            cpus_per_task: 4,
            memory_per_node: Some("512Gi".into()),
            time_limit: Some("1h30m".into()),
            ..Default::default()
        };
        let js = job_spec(&job(spec), "uid-1").unwrap();
        assert_eq!(js.name, "train");
        assert_eq!(js.argv, ["torchrun", "train.py"]);
        assert_eq!((js.num_nodes, js.num_tasks, js.tasks_per_node), (2, 16, 8));
        assert_eq!(js.memory_per_node_mb, 524_288);
        assert!(js.gres.is_empty(), "{:?}", js.gres);
        assert_eq!(
            js.gpus_per_node,
            Some(pb::GpuRequest {
                count: 8,
                gpu_type: "mi300x".into()
            })
        );
        assert_eq!(js.time_limit.unwrap().seconds, 5_400);
        assert_eq!(js.comment, "spurjob-uid=uid-1");
        let any = SpurJobSpec {
            image: "x".into(),
            gpus: Some(GpuSpec {
                count: 2,
                gpu_type: None,
            }),
            num_nodes: 1,
            tasks_per_node: 1,
            cpus_per_task: 1,
            ..Default::default()
        };
        let js = job_spec(&job(any), "u").unwrap();
        assert!(js.gres.is_empty());
        assert_eq!(
            js.gpus_per_node,
            Some(pb::GpuRequest {
                count: 2,
                gpu_type: String::new()
            })
        );
        assert_eq!(
            spec_fields_from(&js).gpus,
            Some(GpuSpec {
                count: 2,
                gpu_type: None
            })
        );
    }

    #[test]
    fn no_gpus_no_gpu_request_and_zero_is_none() {
        let base = SpurJobSpec {
            image: "x".into(),
            num_nodes: 1,
            tasks_per_node: 1,
            cpus_per_task: 1,
            ..Default::default()
        };
        let js = job_spec(&job(base.clone()), "u").unwrap();
        assert!(js.gres.is_empty() && js.gpus_per_node.is_none());
        let zero = SpurJobSpec {
            gpus: Some(GpuSpec {
                count: 0,
                gpu_type: Some("mi300x".into()),
            }),
            ..base
        };
        let js = job_spec(&job(zero), "u").unwrap();
        assert!(js.gres.is_empty() && js.gpus_per_node.is_none());
    }

    #[test]
    fn gpus_read_back_from_either_form() {
        let gres = |entries: &[&str]| pb::JobSpec {
            gres: entries.iter().map(|e| (*e).to_owned()).collect(),
            ..Default::default()
        };
        let gpu = |count, t: Option<&str>| {
            Some(GpuSpec {
                count,
                gpu_type: t.map(str::to_owned),
            })
        };
        // What spurctld puts in a LaunchJob's spec.
        assert_eq!(gpus_from(&gres(&["gpu:mi300x:8"])), gpu(8, Some("mi300x")));
        assert_eq!(gpus_from(&gres(&["gpu:4"])), gpu(4, None));
        assert_eq!(gpus_from(&gres(&["gpu:any:2"])), gpu(2, None));
        assert_eq!(gpus_from(&gres(&["gpu"])), gpu(1, None));
        assert_eq!(
            gpus_from(&gres(&["rdma:1", "gpu:2", "gpu:3"])),
            gpu(5, None)
        );
        assert_eq!(gpus_from(&gres(&["license:x:1", "gpu:x:y:z", ""])), None);
        assert_eq!(gpus_from(&gres(&["gpu:mi300x:99999999999"])), None);
        assert_eq!(gpus_from(&gres(&["gpu:0"])), None);
        let explicit = pb::JobSpec {
            gpus_per_node: Some(pb::GpuRequest {
                count: 8,
                gpu_type: "mi300x".into(),
            }),
            ..Default::default()
        };
        assert_eq!(gpus_from(&explicit), gpu(8, Some("mi300x")));
    }

    #[test]
    fn the_user_is_the_annotation_or_the_default() {
        let spec = SpurJobSpec {
            image: "x".into(),
            num_nodes: 1,
            tasks_per_node: 1,
            cpus_per_task: 1,
            ..Default::default()
        };
        let plain = job(spec);
        assert_eq!(job_spec(&plain, "u").unwrap().user, DEFAULT_USER);
        assert_eq!(job_spec_as(&plain, "u", "batch").unwrap().user, "batch");
        let mut annotated = plain.clone();
        annotated.metadata.annotations =
            Some([(ANNOTATION_USER.to_string(), " alice ".to_string())].into());
        assert_eq!(job_spec_as(&annotated, "u", "batch").unwrap().user, "alice");
        let mut blank = plain;
        blank.metadata.annotations = Some([(ANNOTATION_USER.to_string(), " ".to_string())].into());
        assert_eq!(job_spec_as(&blank, "u", "batch").unwrap().user, "batch");
    }

    fn label() -> impl Strategy<Value = String> {
        "[a-z][a-z0-9-]{0,11}"
    }

    prop_compose! {
        fn valid_spec()(
            image in "[a-z]{1,8}(/[a-z]{1,8})?(:[a-z0-9.]{1,6})?",
            args in prop::collection::vec("[ -~]{0,12}", 0..4),
            env in prop::collection::btree_map("[A-Z_]{1,8}", "[ -~]{0,12}", 0..4),
            gpus in prop::option::of((1u32..=8, prop::option::of(label()))),
            num_nodes in 1u32..=64,
            tasks_per_node in 1u32..=16,
            cpus_per_task in 1u32..=32,
            memory_gi in prop::option::of(1u64..=2048),
            hours in prop::option::of(1u64..=240),
            partition in prop::option::of(label()),
            account in prop::option::of(label()),
            volumes in prop::collection::vec(
                prop_oneof![
                    ("/[a-z]{1,8}", "/[a-z]{1,8}", any::<bool>())
                        .prop_map(|(s, d, ro)| if ro { format!("{s}:{d}:ro") } else { format!("{s}:{d}") }),
                    (label(), "/[a-z]{1,8}").prop_map(|(c, d)| format!("pvc:{c}:{d}")),
                ],
                0..3,
            ),
            flags in (any::<bool>(), any::<bool>(), any::<bool>()),
            shm_gi in prop::option::of(1u64..=64),
            extra in prop::collection::btree_map(label(), "[0-9]{1,3}", 0..3),
            array_spec in prop::option::of("[0-9]{1,2}-[0-9]{2,3}"),
            dependencies in prop::collection::vec("afterok:[0-9]{1,5}", 0..3),
            start_minutes in prop::option::of(1u64..=120),
            on_rank_failure in prop::option::of(prop_oneof![Just("FailJob"), Just("WaitForOthers")]),
            restarts in prop::option::of((0u32..=5, any::<bool>())),
        ) -> SpurJobSpec {
            SpurJobSpec {
                name: None,
                image,
                command: Vec::new(),
                args,
                env,
                secret_env: BTreeMap::new(),
                gpus: gpus.map(|(count, gpu_type)| GpuSpec { count, gpu_type }),
                num_nodes,
                tasks_per_node,
                cpus_per_task,
                memory_per_node: memory_gi.map(|g| format!("{g}Gi")),
                time_limit: hours.map(|h| format!("{h}h")),
                partition,
                account,
                volumes,
                host_network: flags.0,
                privileged: flags.1,
                host_ipc: flags.2,
                shm_size: shm_gi.map(|g| format!("{g}Gi")),
                extra_resources: extra,
                tolerations: Vec::new(),
                node_selector: BTreeMap::new(),
                priority_class: None,
                service_account: None,
                array_spec,
                dependencies,
                start_timeout: start_minutes.map(|m| format!("{m}m")),
                failure_policy: (on_rank_failure.is_some() || restarts.is_some()).then(|| {
                    crate::jobs::crd::FailurePolicy {
                        on_rank_failure: on_rank_failure.map(str::to_owned),
                        on_start_timeout: restarts
                            .filter(|(max, requeue)| *requeue && *max > 0 && start_minutes.is_some())
                            .map(|_| "Requeue".to_owned()),
                        max_restarts: restarts.map(|(max, _)| max),
                    }
                }),
            }
        }
    }

    /// One way to break a valid spec, and the field the error must name.
    #[derive(Clone, Debug)]
    enum Breakage {
        BadQuantity(String),
        ZeroNodes,
        ZeroTasks,
        ZeroCpus,
        TimeLimitOverflow(String),
        EmptyImage,
        BadShm(String),
        BadRankFailurePolicy(String),
        BadStartTimeout(String),
        BadStartTimeoutPolicy(String),
        /// `onStartTimeout: Requeue` with no restarts allowed.
        RequeueWithoutRestarts,
        /// `onStartTimeout: Requeue` with no `startTimeout` to act on.
        RequeueWithoutStartTimeout,
    }

    fn breakage() -> impl Strategy<Value = Breakage> {
        prop_oneof![
            "[0-9]{0,3}(x|Gb|GiB|\\.\\.)".prop_map(Breakage::BadQuantity),
            Just(Breakage::ZeroNodes),
            Just(Breakage::ZeroTasks),
            Just(Breakage::ZeroCpus),
            prop_oneof![
                (367u64..100_000).prop_map(|d| format!("{d}d")),
                Just("99999999999999999999999h".to_owned()),
                (530_000u64..10_000_000).prop_map(|m| m.to_string()),
            ]
            .prop_map(Breakage::TimeLimitOverflow),
            Just(Breakage::EmptyImage),
            "-[1-9]Gi|[a-z]{2}".prop_map(Breakage::BadShm),
            "failjob|Wait|[A-Z][a-z]{0,8}".prop_map(Breakage::BadRankFailurePolicy),
            "0|0s|[1-9]x|soon|".prop_map(Breakage::BadStartTimeout),
            "requeue|Retry|fail|".prop_map(Breakage::BadStartTimeoutPolicy),
            Just(Breakage::RequeueWithoutRestarts),
            Just(Breakage::RequeueWithoutStartTimeout),
        ]
    }

    fn apply(spec: &mut SpurJobSpec, breakage: &Breakage) -> String {
        match breakage {
            Breakage::BadQuantity(q) => {
                spec.memory_per_node = Some(q.clone());
                "memoryPerNode".into()
            }
            Breakage::ZeroNodes => {
                spec.num_nodes = 0;
                "numNodes".into()
            }
            Breakage::ZeroTasks => {
                spec.tasks_per_node = 0;
                "tasksPerNode".into()
            }
            Breakage::ZeroCpus => {
                spec.cpus_per_task = 0;
                "cpusPerTask".into()
            }
            Breakage::TimeLimitOverflow(t) => {
                spec.time_limit = Some(t.clone());
                "timeLimit".into()
            }
            Breakage::EmptyImage => {
                spec.image = " ".into();
                "image".into()
            }
            Breakage::BadShm(s) => {
                spec.shm_size = Some(s.clone());
                "shmSize".into()
            }
            Breakage::BadRankFailurePolicy(p) => {
                spec.failure_policy = Some(crate::jobs::crd::FailurePolicy {
                    on_rank_failure: Some(p.clone()),
                    ..Default::default()
                });
                "failurePolicy.onRankFailure".into()
            }
            Breakage::BadStartTimeout(t) => {
                spec.start_timeout = Some(t.clone());
                "startTimeout".into()
            }
            Breakage::BadStartTimeoutPolicy(p) => {
                spec.failure_policy = Some(crate::jobs::crd::FailurePolicy {
                    on_start_timeout: Some(p.clone()),
                    max_restarts: Some(2),
                    ..Default::default()
                });
                "failurePolicy.onStartTimeout".into()
            }
            Breakage::RequeueWithoutRestarts => {
                spec.start_timeout = Some("5m".into());
                spec.failure_policy = Some(crate::jobs::crd::FailurePolicy {
                    on_start_timeout: Some("Requeue".into()),
                    max_restarts: Some(0),
                    ..Default::default()
                });
                "failurePolicy.onStartTimeout".into()
            }
            Breakage::RequeueWithoutStartTimeout => {
                spec.start_timeout = None;
                spec.failure_policy = Some(crate::jobs::crd::FailurePolicy {
                    on_start_timeout: Some("Requeue".into()),
                    max_restarts: Some(2),
                    ..Default::default()
                });
                "failurePolicy.onStartTimeout".into()
            }
        }
    }

    proptest! {
        #[test]
        fn every_valid_spec_converts_and_keeps_its_values(spec in valid_spec(), uid in "[a-f0-9-]{8,36}") {
            let js = job_spec(&job(spec.clone()), &uid).unwrap();
            // Exactly one GPU form: spurctld refuses a gpu gres entry beside gpus_per_node.
            prop_assert!(js.gres.iter().all(|g| !g.starts_with("gpu")), "{:?}", js.gres);
            prop_assert_eq!(js.gpus_per_node.is_some(), spec.gpus.is_some());
            let back = spec_fields_from(&js);
            prop_assert_eq!(back.name.as_deref(), Some("train"));
            prop_assert_eq!(&back.image, &spec.image);
            prop_assert_eq!(&back.args, &spec.args);
            prop_assert_eq!(&back.env, &spec.env);
            prop_assert_eq!(back.num_nodes, spec.num_nodes);
            prop_assert_eq!(back.tasks_per_node, spec.tasks_per_node);
            prop_assert_eq!(back.cpus_per_task, spec.cpus_per_task);
            prop_assert_eq!(&back.gpus, &spec.gpus);
            prop_assert_eq!(&back.partition, &spec.partition);
            prop_assert_eq!(&back.account, &spec.account);
            prop_assert_eq!(&back.volumes, &spec.volumes);
            prop_assert_eq!((back.host_network, back.privileged, back.host_ipc),
                            (spec.host_network, spec.privileged, spec.host_ipc));
            prop_assert_eq!(&back.shm_size, &spec.shm_size);
            prop_assert_eq!(&back.extra_resources, &spec.extra_resources);
            prop_assert_eq!(&back.array_spec, &spec.array_spec);
            prop_assert_eq!(&back.dependencies, &spec.dependencies);
            prop_assert_eq!(js.num_tasks, spec.num_nodes * spec.tasks_per_node);
            let gi: u64 = spec.memory_per_node.as_deref()
                .map_or(0, |m| m.trim_end_matches("Gi").parse().unwrap());
            prop_assert_eq!(js.memory_per_node_mb, gi * 1024);
            if let Some(t) = &spec.time_limit {
                let h: i64 = t.trim_end_matches('h').parse().unwrap();
                prop_assert_eq!(js.time_limit.unwrap().seconds, h * 3600);
            }
            prop_assert_eq!(uid_in_comment(&js.comment), Some(uid.as_str()));
        }

        #[test]
        fn any_time_limit_text_parses_or_is_refused_with_its_text(input in "[0-9dhmsDHMS:\\- x.]{0,14}") {
            if let Err(reason) = parse_time_limit(&input) {
                prop_assert!(!reason.is_empty());
            }
        }

        #[test]
        fn the_three_spellings_of_one_limit_agree(h in 0u64..200, m in 0u64..60, sec in 0u64..60) {
            prop_assume!(h + m + sec > 0);
            let secs = h * 3600 + m * 60 + sec;
            let units = parse_time_limit(&format!("{h}h{m}m{sec}s"));
            prop_assert_eq!(&units, &Ok(secs));
            prop_assert_eq!(&parse_time_limit(&format!("{h}:{m:02}:{sec:02}")), &units);
            prop_assert_eq!(&parse_time_limit(&format!("{}-{}:{m}:{sec}", h / 24, h % 24)), &units);
            if sec == 0 {
                prop_assert_eq!(&parse_time_limit(&format!("{h}H{m}")), &units, "as upstream reads it");
            }
        }

        /// A malformed `volumes` or `secretEnv` entry leaves the spec valid: it is named
        /// among the dropped entries, left out of what spurctld receives, and the rest kept.
        #[test]
        fn a_malformed_volume_or_secret_entry_is_dropped_and_named_never_invalid(
            spec in valid_spec(),
            bad_volume in prop_oneof![
                Just("relative:/x".to_owned()),
                Just("nfs:server:/x:ro:extra".to_owned()),
                "[a-z]{1,5}".prop_map(|s| s),
            ],
            bad_secret in "[a-z]{1,6}",
        ) {
            let mut spec = spec;
            spec.secret_env.insert("HF".into(), "hf/token".into());
            prop_assert!(dropped_entries(&spec).is_empty());
            let good_volumes = spec.volumes.clone();
            spec.volumes.insert(0, bad_volume.clone());
            spec.secret_env.insert("TOKEN".into(), bad_secret.clone());
            let js = job_spec(&job(spec.clone()), "uid").expect("still valid");
            prop_assert_eq!(&js.container_mounts, &good_volumes);
            let dropped: Vec<String> = dropped_entries(&spec).iter().map(|d| d.to_string()).collect();
            prop_assert_eq!(dropped.len(), 2, "{:?}", dropped);
            prop_assert!(dropped[0].starts_with("spec.volumes[0]: "), "{:?}", dropped);
            prop_assert!(dropped[0].contains(&bad_volume), "{:?}", dropped);
            prop_assert!(dropped[1].starts_with("spec.secretEnv.TOKEN: "), "{:?}", dropped);
            prop_assert!(dropped[1].contains(&bad_secret), "{:?}", dropped);
        }

        #[test]
        fn every_invalid_spec_names_its_field(spec in valid_spec(), breakage in breakage()) {
            let mut spec = spec;
            let field = apply(&mut spec, &breakage);
            let err = job_spec(&job(spec), "uid").unwrap_err();
            prop_assert_eq!(&err.field, &field, "{:?}: {}", breakage, err);
            let prefix = format!("spec.{}: ", field);
            prop_assert!(err.to_string().starts_with(&prefix), "{}", err);
        }
    }
}

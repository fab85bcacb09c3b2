//! What the cluster cases watch: the spurctld replicas' own logs (who leads, since when),
//! objects through `kubectl get -w`, and bounded polls.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use super::ClusterProcess;
use crate::common::kubectl::kubectl_binary;

/// How long each step may take before the run fails: an election is about 6 s after the
/// leader stops, a Ready replacement about 6 s after the delete.
pub(super) const STEP_LIMIT: Duration = Duration::from_secs(60);
pub(super) const POLL: Duration = Duration::from_millis(100);

/// A replica taking the lead, as its log says (`become leader id=N`): a survivor elected
/// in a new term, or the deleted leader's replacement resuming its committed term from its
/// claim, which openraft does when it comes back before the followers' election timeout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Leadership {
    pub(super) node: usize,
    pub(super) at: SystemTime,
}

/// Every leadership any spurctld replica logged, oldest first, from every container log
/// of pods `spurctld-N` (a deleted pod's log included).
pub(super) fn leaderships(log_dir: &Path) -> Vec<Leadership> {
    let mut found = Vec::new();
    for log in pod_logs(log_dir, "spur_spurctld-") {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        for line in text.lines().map(strip_ansi) {
            let Some((_, id)) = line.split_once("become leader id=") else {
                continue;
            };
            let node = id.trim().parse().ok();
            if let (Some(node), Some(at)) = (node, line_time(&line)) {
                found.push(Leadership { node, at });
            }
        }
    }
    found.sort_by_key(|l| l.at);
    found
}

/// The first leadership taken after `after`.
pub(super) fn leadership_after(log_dir: &Path, after: SystemTime) -> Option<Leadership> {
    leaderships(log_dir).into_iter().find(|l| l.at > after)
}

/// When an operator replica took the Lease after `after`, from every operator pod's log
/// (JSON lines): an operator failover inside a run delays its SpurJob by the Lease's
/// duration, which a run's report names apart from the controller's leader change.
pub(super) fn operator_takeovers_after(log_dir: &Path, after: SystemTime) -> Vec<SystemTime> {
    let mut found: Vec<SystemTime> = pod_logs(log_dir, "spur-system_spur-operator-")
        .into_iter()
        .flat_map(|log| {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let lines: Vec<String> = text.lines().map(str::to_owned).collect();
            lines
        })
        .filter(|line| line.contains("acquired the lease"))
        .filter_map(|line| json_line_time(&line))
        .filter(|at| *at > after)
        .collect();
    found.sort();
    found
}

/// The time of a JSON tracing line (`"timestamp":"<RFC 3339>"`).
fn json_line_time(line: &str) -> Option<SystemTime> {
    let (_, rest) = line.split_once("\"timestamp\":\"")?;
    humantime::parse_rfc3339(rest.split('"').next()?).ok()
}

/// Every container log of the pods whose directory (`<namespace>_<pod>-…`) starts with
/// `pod_prefix`, a deleted pod's included.
fn pod_logs(log_dir: &Path, pod_prefix: &str) -> Vec<PathBuf> {
    super::logs(log_dir)
        .into_iter()
        .filter(|log| {
            let pod_dir = log.parent().and_then(Path::file_name);
            pod_dir.is_some_and(|d| d.to_string_lossy().starts_with(pod_prefix))
        })
        .collect()
}

/// The RFC 3339 time a tracing line opens with.
fn line_time(line: &str) -> Option<SystemTime> {
    humantime::parse_rfc3339(line.split_whitespace().next()?).ok()
}

/// The line without terminal colour sequences (`ESC [ ... m`), which spurctld writes.
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            chars.by_ref().find(|c| c.is_ascii_alphabetic());
        } else {
            out.push(c);
        }
    }
    out
}

/// Polls `probe` every 100 ms until it answers, for at most [`STEP_LIMIT`].
pub(super) fn poll<T>(
    what: &str,
    cluster: &ClusterProcess,
    mut probe: impl FnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + STEP_LIMIT;
    while Instant::now() < deadline {
        if let Some(value) = probe() {
            return value;
        }
        std::thread::sleep(POLL);
    }
    panic!("{what}: not within {STEP_LIMIT:?}\n{}", cluster.diagnose());
}

/// One object watched with `kubectl get -w`, each line of its template kept with the time
/// it arrived: a watch event comes within milliseconds of the change, where a poll of
/// kubectl processes lags by a whole invocation.
pub(super) struct Watch {
    child: Child,
    lines: Arc<Mutex<Vec<(SystemTime, String)>>>,
}

impl Watch {
    pub(super) fn start(cluster: &ClusterProcess, object: &[&str], template: &str) -> Watch {
        let mut child = Command::new(kubectl_binary())
            .arg("--kubeconfig")
            .arg(&cluster.kubeconfig)
            .args(["get", "-w", "-o"])
            .arg(format!("jsonpath={template}{{\"\\n\"}}"))
            .args(object)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start kubectl get -w");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let out = BufReader::new(child.stdout.take().expect("piped"));
        let kept = lines.clone();
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                let arrived = SystemTime::now();
                kept.lock()
                    .expect("lines")
                    .push((arrived, line.trim().to_owned()));
            }
        });
        Watch { child, lines }
    }

    /// When the first line that `matches` arrived, with that line.
    pub(super) fn first(&self, matches: impl Fn(&str) -> bool) -> Option<(SystemTime, String)> {
        let lines = self.lines.lock().expect("lines");
        lines.iter().find(|(_, l)| matches(l)).cloned()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(super) fn jsonpath(cluster: &ClusterProcess, args: &[&str], path: &str) -> String {
    let jsonpath = format!("jsonpath={path}");
    let (_, out) = cluster.kubectl(&[args, &["-o", &jsonpath]].concat());
    out.trim().to_owned()
}

pub(super) fn seconds_between(from: SystemTime, to: SystemTime) -> f64 {
    match to.duration_since(from) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}

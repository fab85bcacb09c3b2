//! Memory limits as a kubelet enforces them: one cgroup a container, under a parent the
//! cluster owns (`spur-cluster-<pid>/<pod-uid>/<container>`), limited to the container's
//! `resources.limits.memory`. The kernel's OOM killer ends a container over its limit, and
//! the cgroup's `oom_kill` count tells the kubelet that is what ended it.
//!
//! cgroup v2 (`memory.max`, `memory.events`) where the unified hierarchy is mounted alone
//! with the memory controller available; else the v1 memory hierarchy
//! (`memory.limit_in_bytes`, `memory.oom_control`). Neither: limits are not enforced.
//!
//! A container's process joins its cgroup itself, between fork and exec, through a
//! descriptor of `cgroup.procs` opened before the fork, so its program never runs unlimited.

use std::io::Write as _;
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Container;

/// `statfs(2)`'s filesystem type of a cgroup v2 mount.
const CGROUP2_SUPER_MAGIC: libc::c_long = 0x6367_7270;

/// Where the cgroup hierarchies are, what the cluster's parent is called, and how a cgroup
/// whose processes linger is removed.
#[derive(Clone, Debug)]
pub struct CgroupConfig {
    /// Where the unified (v2) hierarchy is mounted on a machine that runs it alone
    /// (default `/sys/fs/cgroup`, systemd's place for it).
    pub unified_root: PathBuf,
    /// The v1 memory hierarchy (default `/sys/fs/cgroup/memory`, where v1 and hybrid
    /// machines mount it).
    pub v1_memory_root: PathBuf,
    /// The parent's name before the cluster's pid (default `spur-cluster-`): one parent a
    /// cluster, and a parent whose pid is gone is a killed cluster's leftover to remove.
    pub parent_prefix: String,
    /// How many times a busy cgroup's removal is tried, its processes SIGKILLed before each
    /// retry (default 100: with `removal_interval` a second, far longer than a killed
    /// process takes to go).
    pub removal_attempts: u32,
    /// The wait between those tries (default 10 ms: a SIGKILLed process is gone within a
    /// few, and the kubelet's loop waits meanwhile).
    pub removal_interval: Duration,
}

impl Default for CgroupConfig {
    fn default() -> Self {
        Self {
            unified_root: PathBuf::from("/sys/fs/cgroup"),
            v1_memory_root: PathBuf::from("/sys/fs/cgroup/memory"),
            parent_prefix: "spur-cluster-".into(),
            removal_attempts: 100,
            removal_interval: Duration::from_millis(10),
        }
    }
}

/// Which memory controller the cgroups use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Version {
    /// v1; `memsw` when the kernel accounts swap (`memory.memsw.*` exist).
    V1 {
        memsw: bool,
    },
    V2,
}

/// The cluster's parent cgroup; dropping it removes it and everything left under it.
#[derive(Debug)]
pub struct MemoryCgroups {
    version: Version,
    parent: PathBuf,
    config: CgroupConfig,
}

impl MemoryCgroups {
    /// The parent of this process's cluster, made after removing the parents of clusters
    /// whose process is gone; `Err` says why memory limits cannot be enforced here.
    pub fn create(config: CgroupConfig) -> Result<Self, String> {
        let (version, root) = detect(&config)?;
        remove_leftovers(&root, &config);
        let parent = root.join(format!("{}{}", config.parent_prefix, std::process::id()));
        remove_tree(&parent, &config).map_err(|e| io_error(&parent, e))?;
        std::fs::create_dir(&parent).map_err(|e| io_error(&parent, e))?;
        let cgroups = Self {
            version,
            parent,
            config,
        };
        if version == Version::V2 {
            enable_memory(&cgroups.parent)?;
        }
        Ok(cgroups)
    }

    /// A fresh cgroup for a run of container `name` of pod `pod_uid`, limited to `limit`
    /// bytes of memory (and of swap with it), unlimited if `None`.
    pub fn container(
        &self,
        pod_uid: &str,
        name: &str,
        limit: Option<u64>,
    ) -> Result<ContainerCgroup, String> {
        let pod_dir = self.parent.join(pod_uid);
        make_dir(&pod_dir)?;
        if self.version == Version::V2 {
            enable_memory(&pod_dir)?;
        }
        let dir = pod_dir.join(name);
        make_dir(&dir)?;
        let cgroup = ContainerCgroup::open(self, dir, pod_dir)?;
        cgroup.set_limit(limit)?;
        Ok(cgroup)
    }
}

impl Drop for MemoryCgroups {
    fn drop(&mut self) {
        if let Err(e) = remove_tree(&self.parent, &self.config) {
            eprintln!("cgroups: removing {}: {e}", self.parent.display());
        }
    }
}

/// One run of a container's cgroup; dropping it kills what is left in it and removes it
/// (and its pod's directory once that is empty).
#[derive(Debug)]
pub struct ContainerCgroup {
    version: Version,
    dir: PathBuf,
    pod_dir: PathBuf,
    config: CgroupConfig,
    /// `cgroup.procs`, opened before the fork for the child to join through.
    procs: Arc<OwnedFd>,
    /// The `oom_kill` count when the run began (a reused cgroup keeps its count).
    oom_kills_at_start: u64,
}

impl ContainerCgroup {
    fn open(cgroups: &MemoryCgroups, dir: PathBuf, pod_dir: PathBuf) -> Result<Self, String> {
        let procs_path = dir.join("cgroup.procs");
        let procs = std::fs::OpenOptions::new()
            .write(true)
            .open(&procs_path)
            .map_err(|e| io_error(&procs_path, e))?;
        let mut cgroup = Self {
            version: cgroups.version,
            dir,
            pod_dir,
            config: cgroups.config.clone(),
            procs: Arc::new(procs.into()),
            oom_kills_at_start: 0,
        };
        cgroup.oom_kills_at_start = cgroup.oom_kills()?;
        Ok(cgroup)
    }

    /// Writes the limit; v1's swap limit must stay at or above the memory limit, so it is
    /// lifted first and set last.
    fn set_limit(&self, limit: Option<u64>) -> Result<(), String> {
        let value = limit.map(|l| l.to_string());
        match self.version {
            Version::V1 { memsw } => {
                let value = value.as_deref().unwrap_or("-1");
                if memsw {
                    self.write("memory.memsw.limit_in_bytes", "-1")?;
                }
                self.write("memory.limit_in_bytes", value)?;
                if memsw {
                    self.write("memory.memsw.limit_in_bytes", value)?;
                }
            }
            Version::V2 => {
                self.write("memory.max", value.as_deref().unwrap_or("max"))?;
                if self.dir.join("memory.swap.max").exists() {
                    self.write("memory.swap.max", if limit.is_some() { "0" } else { "max" })?;
                }
                // The kubelet's choice on cgroup v2: an OOM kill takes the whole container.
                self.write("memory.oom.group", "1")?;
            }
        }
        Ok(())
    }

    fn write(&self, file: &str, value: &str) -> Result<(), String> {
        let path = self.dir.join(file);
        std::fs::write(&path, value)
            .map_err(|e| format!("{}: writing {value}: {e}", path.display()))
    }

    /// How many processes the OOM killer has killed in this cgroup.
    fn oom_kills(&self) -> Result<u64, String> {
        let file = match self.version {
            Version::V1 { .. } => "memory.oom_control",
            Version::V2 => "memory.events",
        };
        let path = self.dir.join(file);
        let text = std::fs::read_to_string(&path).map_err(|e| io_error(&path, e))?;
        counter(&text, "oom_kill")
            .ok_or_else(|| format!("{} has no oom_kill count", path.display()))
    }

    /// Whether the OOM killer killed a process of this run (an unreadable count is no).
    pub fn oom_killed(&self) -> bool {
        self.oom_kills().is_ok_and(|n| n > self.oom_kills_at_start)
    }

    /// What the child joins the cgroup through, for [`join`] between fork and exec.
    pub fn procs(&self) -> Arc<OwnedFd> {
        Arc::clone(&self.procs)
    }
}

impl Drop for ContainerCgroup {
    fn drop(&mut self) {
        if let Err(e) = remove_one(&self.dir, &self.config) {
            eprintln!("cgroups: removing {}: {e}", self.dir.display());
        }
        // The pod's other containers may still hold it: then it stays for the last one.
        let _ = std::fs::remove_dir(&self.pod_dir);
    }
}

/// Moves the calling process into the cgroup whose `cgroup.procs` is `procs` ("0" is the
/// writer itself). Between fork and exec: one write(2), nothing allocated.
pub fn join(procs: &OwnedFd) -> std::io::Result<()> {
    // SAFETY: the buffer is a static byte string and the descriptor is open.
    let written = unsafe { libc::write(procs.as_raw_fd(), c"0".as_ptr().cast(), 1) };
    if written == 1 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A container's `resources.limits.memory` in bytes, as Kubernetes reads the quantity;
/// `Err` names the quantity that does not parse.
pub fn memory_limit(container: &Container) -> Result<Option<u64>, String> {
    let limits = container.resources.as_ref().and_then(|r| r.limits.as_ref());
    let Some(quantity) = limits.and_then(|l| l.get("memory")) else {
        return Ok(None);
    };
    let parsed = spur_operator::parse_quantity(&quantity.0)
        .map_err(|e| format!("resources.limits.memory: {e}"))?;
    let bytes = u64::try_from(parsed.whole())
        .map_err(|_| format!("resources.limits.memory: `{}` is too large", quantity.0))?;
    Ok(Some(bytes))
}

/// A run's cgroup for `container` of the pod `pod_uid`, limited as its spec says; `None`
/// where the cluster enforces no limits. `Err` is a `CreateContainerError` message.
pub fn for_container(
    cgroups: Option<&MemoryCgroups>,
    pod_uid: &str,
    container: &Container,
) -> Result<Option<ContainerCgroup>, String> {
    let Some(cgroups) = cgroups else {
        return Ok(None);
    };
    let limit = memory_limit(container)?;
    cgroups.container(pod_uid, &container.name, limit).map(Some)
}

/// The message of the event an OOM kill of `container` makes.
pub fn oom_message(container: &Container) -> String {
    let limits = container.resources.as_ref().and_then(|r| r.limits.as_ref());
    let limit = limits
        .and_then(|l| l.get("memory"))
        .map_or("none", |q| q.0.as_str());
    format!(
        "Container {} was killed by the kernel's OOM killer (memory limit {limit})",
        container.name
    )
}

/// The value of `key` in a flat-keyed cgroup file (`key value` lines).
fn counter(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (name, value) = line.split_once(' ')?;
        (name == key).then(|| value.trim().parse().ok())?
    })
}

/// The usable memory controller and the root the parent goes under.
fn detect(config: &CgroupConfig) -> Result<(Version, PathBuf), String> {
    if is_cgroup2(&config.unified_root) {
        let controllers = config.unified_root.join("cgroup.controllers");
        let available = std::fs::read_to_string(&controllers).unwrap_or_default();
        if available.split_whitespace().any(|c| c == "memory") {
            enable_memory(&config.unified_root)?;
            return Ok((Version::V2, config.unified_root.clone()));
        }
    }
    let v1 = &config.v1_memory_root;
    if v1.join("memory.limit_in_bytes").is_file() && v1.join("memory.oom_control").is_file() {
        let memsw = v1.join("memory.memsw.limit_in_bytes").is_file();
        return Ok((Version::V1 { memsw }, v1.clone()));
    }
    Err(format!(
        "neither {} is cgroup v2 with the memory controller nor {} a v1 memory hierarchy",
        config.unified_root.display(),
        v1.display()
    ))
}

fn is_cgroup2(path: &Path) -> bool {
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: statfs(2) writes into the zeroed struct; the path is NUL-terminated.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    let ok = unsafe { libc::statfs(c_path.as_ptr(), &mut stat) } == 0;
    ok && stat.f_type as libc::c_long == CGROUP2_SUPER_MAGIC
}

/// v2: the memory controller in `dir`'s children, so their `memory.*` files exist.
fn enable_memory(dir: &Path) -> Result<(), String> {
    let path = dir.join("cgroup.subtree_control");
    let enabled = std::fs::read_to_string(&path).unwrap_or_default();
    if enabled.split_whitespace().any(|c| c == "memory") {
        return Ok(());
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .map_err(|e| io_error(&path, e))?;
    file.write_all(b"+memory")
        .map_err(|e| format!("{}: enabling memory: {e}", path.display()))
}

fn make_dir(dir: &Path) -> Result<(), String> {
    match std::fs::create_dir(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(io_error(dir, e)),
        _ => Ok(()),
    }
}

/// Removes the parents under `root` of clusters whose process is gone (a cluster killed
/// by SIGKILL cannot remove its own).
fn remove_leftovers(root: &Path, config: &CgroupConfig) {
    let entries = std::fs::read_dir(root).into_iter().flatten().flatten();
    for entry in entries {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix(&config.parent_prefix) else {
            continue;
        };
        let gone = pid
            .parse::<u32>()
            .is_ok_and(|p| !Path::new(&format!("/proc/{p}")).exists());
        if gone && let Err(e) = remove_tree(&entry.path(), config) {
            eprintln!(
                "cgroups: removing the leftover {}: {e}",
                entry.path().display()
            );
        }
    }
}

/// Removes the parent cluster `pid` left, if it left one: for whoever killed it (a test
/// whose cluster it SIGKILLed) to clean up after it.
pub fn remove_left_by(pid: u32, config: &CgroupConfig) {
    let name = format!("{}{pid}", config.parent_prefix);
    for root in [&config.unified_root, &config.v1_memory_root] {
        let parent = root.join(&name);
        if parent.is_dir()
            && let Err(e) = remove_tree(&parent, config)
        {
            eprintln!("cgroups: removing {}: {e}", parent.display());
        }
    }
}

/// `dir` and every cgroup under it, innermost first.
fn remove_tree(dir: &Path, config: &CgroupConfig) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_tree(&entry.path(), config)?;
        }
    }
    remove_one(dir, config)
}

/// Removes one cgroup that has no children, SIGKILLing what still runs in it until it can.
fn remove_one(dir: &Path, config: &CgroupConfig) -> std::io::Result<()> {
    let mut attempt = 1;
    loop {
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e)
                if e.raw_os_error() == Some(libc::EBUSY) && attempt < config.removal_attempts =>
            {
                kill_members(dir);
                std::thread::sleep(config.removal_interval);
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

fn kill_members(dir: &Path) {
    let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
    for pid in procs
        .lines()
        .filter_map(|l| l.trim().parse::<libc::pid_t>().ok())
    {
        // SAFETY: kill(2) has no memory-safety preconditions; the pid is in our cgroup.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
    }
}

fn io_error(path: &Path, error: std::io::Error) -> String {
    format!("{}: {error}", path.display())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(memory: Option<&str>) -> Container {
        let resources = memory.map(|m| serde_json::json!({"limits": {"memory": m}}));
        serde_json::from_value(serde_json::json!({"name": "c", "resources": resources}))
            .expect("container")
    }

    #[test]
    fn memory_limits_read_as_kubernetes_quantities() {
        let cases = [
            ("32Mi", 32 << 20),
            ("1Gi", 1 << 30),
            ("512Ki", 512 << 10),
            ("128M", 128_000_000),
            ("1G", 1_000_000_000),
            ("64k", 64_000),
            ("1e6", 1_000_000),
            ("1.5Mi", 3 << 19),
            ("1000", 1000),
        ];
        for (quantity, bytes) in cases {
            assert_eq!(
                memory_limit(&container(Some(quantity))),
                Ok(Some(bytes)),
                "{quantity}"
            );
        }
        assert_eq!(memory_limit(&container(None)), Ok(None));
        let bad = memory_limit(&container(Some("32 megs"))).expect_err("refused");
        assert!(
            bad.contains("resources.limits.memory") && bad.contains("32 megs"),
            "{bad}"
        );
    }

    #[test]
    fn the_oom_kill_count_is_read_from_v1_and_v2_files() {
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        let v2 = "low 0\nhigh 0\nmax 12\noom 2\noom_kill 2\noom_group_kill 1\n";
        assert_eq!(counter(v1, "oom_kill"), Some(3));
        assert_eq!(counter(v2, "oom_kill"), Some(2));
        assert_eq!(counter("oom 1\n", "oom_kill"), None);
    }
}

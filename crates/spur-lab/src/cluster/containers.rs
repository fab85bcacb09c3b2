//! A container as a process: its environment (literal, `$(VAR)`, downward API, Secret and
//! ConfigMap keys), its command line, and its start in the pod's namespaces as its user.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use k8s_openapi::api::core::v1::{ConfigMap, Container, EnvVar, Pod, Secret};

use super::mounts::MountPlan;
use crate::kernel::check;

/// The PATH a container gets when its spec sets none (the usual image default).
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Expands `$(NAME)` from `env` as Kubernetes does: `$$` escapes a `$`, an unknown name
/// stays as written.
pub fn expand(text: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(')
            && let Some(close) = inner.find(')')
        {
            let name = &inner[..close];
            match env.get(name) {
                Some(value) => out.push_str(value),
                None => out.push_str(&rest[i..i + 2 + close + 1]),
            }
            rest = &inner[close + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// The container's environment in order, each value expanded against those before it;
/// `Err` is a `CreateContainerConfigError` message.
pub async fn environment(
    client: &kube::Client,
    pod: &Pod,
    container: &Container,
    pod_ip: &str,
) -> Result<BTreeMap<String, String>, String> {
    let mut env = BTreeMap::new();
    for var in container.env.iter().flatten() {
        if let Some(value) = value_of(client, pod, var, pod_ip, &env).await? {
            env.insert(var.name.clone(), value);
        }
    }
    Ok(env)
}

/// One variable's value; `None` for an optional key that is missing.
async fn value_of(
    client: &kube::Client,
    pod: &Pod,
    var: &EnvVar,
    pod_ip: &str,
    env: &BTreeMap<String, String>,
) -> Result<Option<String>, String> {
    let Some(from) = &var.value_from else {
        return Ok(Some(expand(var.value.as_deref().unwrap_or_default(), env)));
    };
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    if let Some(field) = &from.field_ref {
        return field_value(pod, &field.field_path, pod_ip).map(Some);
    }
    if let Some(key) = &from.secret_key_ref {
        let api = kube::Api::<Secret>::namespaced(client.clone(), namespace);
        let found = api.get_opt(&key.name).await.map_err(|e| e.to_string())?;
        let value = found.and_then(|s| secret_key(&s, &key.key));
        return present(value, key.optional, "secret", &key.name, &key.key);
    }
    if let Some(key) = &from.config_map_key_ref {
        let api = kube::Api::<ConfigMap>::namespaced(client.clone(), namespace);
        let found = api.get_opt(&key.name).await.map_err(|e| e.to_string())?;
        let value = found.and_then(|c| c.data.and_then(|d| d.get(&key.key).cloned()));
        return present(value, key.optional, "configmap", &key.name, &key.key);
    }
    Err(format!(
        "env {}: only fieldRef, secretKeyRef and configMapKeyRef are supported",
        var.name
    ))
}

/// A Secret's key: `data` (base64 in the JSON, decoded by the type), else `stringData`.
fn secret_key(secret: &Secret, key: &str) -> Option<String> {
    if let Some(bytes) = secret.data.as_ref().and_then(|d| d.get(key)) {
        return Some(String::from_utf8_lossy(&bytes.0).into_owned());
    }
    secret
        .string_data
        .as_ref()
        .and_then(|d| d.get(key).cloned())
}

fn present(
    value: Option<String>,
    optional: Option<bool>,
    kind: &str,
    name: &str,
    key: &str,
) -> Result<Option<String>, String> {
    match value {
        Some(v) => Ok(Some(v)),
        None if optional == Some(true) => Ok(None),
        None => Err(format!(
            "couldn't find key {key} in {kind} {name} (or the {kind} itself)"
        )),
    }
}

/// The downward API's fields a kubelet fills in.
pub(super) fn field_value(pod: &Pod, path: &str, pod_ip: &str) -> Result<String, String> {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    let value = match path {
        "metadata.name" => meta.name.clone(),
        "metadata.namespace" => meta.namespace.clone(),
        "metadata.uid" => meta.uid.clone(),
        "status.podIP" => Some(pod_ip.to_owned()),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()),
        "spec.serviceAccountName" => spec.and_then(|s| s.service_account_name.clone()),
        _ => return Err(format!("unsupported fieldRef {path}")),
    };
    Ok(value.unwrap_or_default())
}

/// Who a container runs as: runAsUser/runAsGroup of the container, else of the pod, else root.
pub fn user_of(pod: &Pod, container: &Container) -> (u32, u32) {
    let own = container.security_context.as_ref();
    let pods = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let uid = own
        .and_then(|c| c.run_as_user)
        .or_else(|| pods.and_then(|p| p.run_as_user))
        .unwrap_or(0);
    let gid = own
        .and_then(|c| c.run_as_group)
        .or_else(|| pods.and_then(|p| p.run_as_group))
        .unwrap_or(uid);
    (uid as u32, gid as u32)
}

/// A container's supplementary groups: the pod's `fsGroup`, then its `supplementalGroups`.
pub fn groups_of(pod: &Pod) -> Vec<libc::gid_t> {
    let context = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let fs_group = context.and_then(|c| c.fs_group);
    let supplemental = context.and_then(|c| c.supplemental_groups.clone());
    fs_group
        .into_iter()
        .chain(supplemental.into_iter().flatten())
        .map(|g| g as libc::gid_t)
        .collect()
}

/// Where and as whom a process of the pod runs.
pub struct Sandbox<'a> {
    pub netns: &'a OwnedFd,
    pub utsns: &'a OwnedFd,
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (the pod's `fsGroup` and `supplementalGroups`).
    pub groups: Vec<libc::gid_t>,
    /// The memory cgroup it joins before its program runs; `None`: the kubelet's own.
    pub cgroup: Option<&'a super::cgroup::ContainerCgroup>,
    /// How its filesystem is entered: a container's own mount namespace built from a plan,
    /// or the root of a running container (an exec probe's, `/proc/<pid>/root`).
    pub filesystem: Filesystem,
}

/// A process's view of the filesystem.
#[derive(Clone, Debug)]
pub enum Filesystem {
    /// The host's, as it is.
    Host,
    /// A mount namespace of its own, built by the plan.
    Built(MountPlan),
    /// A running container's root, entered by chroot.
    Enter(CString),
}

impl Filesystem {
    /// Between fork and exec: system calls only.
    fn enter(&self) -> std::io::Result<()> {
        match self {
            Self::Host => Ok(()),
            Self::Built(plan) => {
                // SAFETY: unshare(2) has no memory preconditions.
                check(unsafe { libc::unshare(libc::CLONE_NEWNS) })?;
                plan.replay()
            }
            // SAFETY: the path is a NUL-terminated string owned by `self`.
            Self::Enter(root) => unsafe {
                check(libc::chroot(root.as_ptr()))?;
                check(libc::chdir(c"/".as_ptr()))
            },
        }
    }
}

/// `program args` in the pod's namespaces as its user, in a process group of its own
/// (signals reach its children too), killed if the forking thread dies.
pub fn command(
    sandbox: &Sandbox<'_>,
    program: &Path,
    args: &[String],
    env: &BTreeMap<String, String>,
) -> Command {
    let mut command = Command::new(program);
    command
        .args(args)
        .env_clear()
        .env("PATH", DEFAULT_PATH)
        .envs(env)
        .current_dir("/");
    super::pod_net::enter(&mut command, Some(sandbox.netns), Some(sandbox.utsns));
    let (uid, gid) = (sandbox.uid, sandbox.gid);
    let groups = sandbox.groups.clone();
    let filesystem = sandbox.filesystem.clone();
    let cgroup = sandbox.cgroup.map(super::cgroup::ContainerCgroup::procs);
    // SAFETY: write, unshare, mount, mkdir, open, chroot, chdir, setpgid, setgroups, setgid,
    // setuid and prctl are async-signal-safe, on memory allocated before the fork.
    unsafe {
        command.pre_exec(move || {
            // First, so nothing the child does from here on is outside its limit.
            if let Some(procs) = &cgroup {
                super::cgroup::join(procs)?;
            }
            filesystem.enter()?;
            check(libc::setpgid(0, 0))?;
            check(libc::setgroups(groups.len(), groups.as_ptr()))?;
            check(libc::setgid(gid))?;
            check(libc::setuid(uid))?;
            // After the change of user, which clears the death signal.
            check(libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL))
        });
    }
    command
}

/// Starts a container's process, its stdout and stderr appended to `log`.
pub fn start(mut command: Command, log: &Path) -> std::io::Result<Child> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    command
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .spawn()
}

/// Sends `signal` to a container's process group.
pub fn signal(child: &Child, signal: libc::c_int) {
    // SAFETY: kill(2) has no memory-safety preconditions; the group is the child's own.
    unsafe {
        libc::kill(-(child.id() as libc::pid_t), signal);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_expand_escapes_stay_and_unknown_names_are_kept() {
        let env: BTreeMap<String, String> = [
            ("A".to_owned(), "x".to_owned()),
            ("B".to_owned(), "y".to_owned()),
        ]
        .into();
        assert_eq!(expand("$(A)-$(B)", &env), "x-y");
        assert_eq!(expand("$$(A) $(C) $ $(", &env), "$(A) $(C) $ $(");
        assert_eq!(expand("plain", &env), "plain");
    }
}

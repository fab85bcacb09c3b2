//! A container's filesystem: the host's root seen through an overlay whose writes land in a
//! tmpfs of the container's own, the pod's volumes bound at their mount paths, the cluster's
//! hosts file at `/etc/hosts`, then a chroot into it.
//!
//! Every path is worked out before the fork ([`MountPlan::new`]): the child replays a list
//! of `mount`, `mkdir`, `open` and `chroot` calls, which are async-signal-safe, on memory
//! allocated before it. A mount path is resolved against the host's symbolic links first
//! (`/var/run` is `/run` on Debian), so no `mkdir` in the child follows a link out of the
//! container's root.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Component, Path, PathBuf};

use crate::kernel::check;

/// The host's kernel filesystems every container sees as they are.
const KERNEL_MOUNTS: [&str; 3] = ["/proc", "/sys", "/dev"];

/// The most symbolic links followed while resolving one mount path (the kernel's own
/// limit, `MAXSYMLINKS`).
const MAX_LINKS: usize = 40;

/// One host path bound into the container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bind {
    /// The host file or directory.
    pub source: PathBuf,
    /// Where the container sees it (absolute).
    pub target: PathBuf,
    pub read_only: bool,
}

/// One system call of the child's replay.
#[derive(Clone, Debug)]
enum Step {
    Mount {
        source: Option<CString>,
        target: CString,
        fstype: Option<CString>,
        flags: libc::c_ulong,
        data: Option<CString>,
    },
    /// A directory that may exist already (EEXIST is not an error).
    Mkdir(CString),
    /// An empty file to bind a file over, if none is there.
    Touch(CString),
    Chroot(CString),
    Chdir(CString),
}

/// The replay that builds one container's filesystem.
#[derive(Clone, Debug)]
pub struct MountPlan {
    steps: Vec<Step>,
}

impl MountPlan {
    /// The plan for a container whose scratch directory (an empty host directory the
    /// kubelet made for it) is `scratch`: `binds` in order, then `hosts` at `/etc/hosts`,
    /// the root read-only if `read_only_root`, and `workdir` as the working directory.
    pub fn new(
        scratch: &Path,
        binds: &[Bind],
        hosts: Option<&Path>,
        read_only_root: bool,
        workdir: &Path,
    ) -> anyhow::Result<Self> {
        let root = scratch.join("root");
        let mut plan = Self { steps: Vec::new() };
        plan.private_root()?;
        plan.overlay(scratch, &root)?;
        for dir in KERNEL_MOUNTS {
            plan.bind(Path::new(dir), &root.join(&dir[1..]), true, false)?;
        }
        let hosts_bind = hosts.map(|h| Bind {
            source: h.to_owned(),
            target: PathBuf::from("/etc/hosts"),
            read_only: true,
        });
        for bind in binds.iter().chain(hosts_bind.as_ref()) {
            plan.bind_volume(&root, bind)?;
        }
        if read_only_root {
            plan.remount_read_only(&root)?;
        }
        plan.steps.push(Step::Chroot(c_path(&root)?));
        plan.steps.push(Step::Chdir(c_path(workdir)?));
        Ok(plan)
    }

    /// Nothing mounted in the container's namespace propagates back to the host's.
    fn private_root(&mut self) -> anyhow::Result<()> {
        self.steps.push(Step::Mount {
            source: None,
            target: c_path(Path::new("/"))?,
            fstype: None,
            flags: libc::MS_REC | libc::MS_PRIVATE,
            data: None,
        });
        Ok(())
    }

    /// A tmpfs on `scratch` holding the overlay's upper and work directories, and the
    /// overlay of the host's root on `root`.
    fn overlay(&mut self, scratch: &Path, root: &Path) -> anyhow::Result<()> {
        let (upper, work) = (scratch.join("upper"), scratch.join("work"));
        self.steps.push(Step::Mount {
            source: Some(CString::new("tmpfs")?),
            target: c_path(scratch)?,
            fstype: Some(CString::new("tmpfs")?),
            flags: libc::MS_NOSUID | libc::MS_NODEV,
            data: Some(CString::new("mode=0755")?),
        });
        for dir in [&upper, &work, &root.to_path_buf()] {
            self.steps.push(Step::Mkdir(c_path(dir)?));
        }
        let options = format!(
            "lowerdir=/,upperdir={},workdir={}",
            upper.display(),
            work.display()
        );
        self.steps.push(Step::Mount {
            source: Some(CString::new("overlay")?),
            target: c_path(root)?,
            fstype: Some(CString::new("overlay")?),
            flags: 0,
            data: Some(CString::new(options)?),
        });
        Ok(())
    }

    /// `bind.source` at `bind.target` inside `root`, making the directories (or the empty
    /// file) it needs inside the overlay.
    fn bind_volume(&mut self, root: &Path, bind: &Bind) -> anyhow::Result<()> {
        let inside = resolve(&bind.target)?;
        let missing = missing_components(&inside);
        let is_dir = bind.source.is_dir();
        for (n, dir) in missing.iter().enumerate() {
            let last = n + 1 == missing.len();
            let path = c_path(&root.join(dir.strip_prefix("/").unwrap_or(dir)))?;
            self.steps.push(if last && !is_dir {
                Step::Touch(path)
            } else {
                Step::Mkdir(path)
            });
        }
        let target = root.join(inside.strip_prefix("/").unwrap_or(&inside));
        self.bind(&bind.source, &target, is_dir, bind.read_only)
    }

    fn bind(
        &mut self,
        source: &Path,
        target: &Path,
        recursive: bool,
        read_only: bool,
    ) -> anyhow::Result<()> {
        let target = c_path(target)?;
        let rec = if recursive { libc::MS_REC } else { 0 };
        self.steps.push(Step::Mount {
            source: Some(c_path(source)?),
            target: target.clone(),
            fstype: None,
            flags: libc::MS_BIND | rec,
            data: None,
        });
        if read_only {
            self.steps.push(remount_read_only(target));
        }
        Ok(())
    }

    fn remount_read_only(&mut self, root: &Path) -> anyhow::Result<()> {
        self.steps.push(remount_read_only(c_path(root)?));
        Ok(())
    }

    /// In the child, between fork and exec, after `unshare(CLONE_NEWNS)`: system calls
    /// only, on memory allocated before the fork.
    pub fn replay(&self) -> std::io::Result<()> {
        for step in &self.steps {
            replay_step(step)?;
        }
        Ok(())
    }
}

fn remount_read_only(target: CString) -> Step {
    Step::Mount {
        source: None,
        target,
        fstype: None,
        flags: libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY,
        data: None,
    }
}

fn replay_step(step: &Step) -> std::io::Result<()> {
    let ptr = |s: &Option<CString>| s.as_ref().map_or(std::ptr::null(), |s| s.as_ptr());
    // SAFETY: every pointer is null or a NUL-terminated string owned by the plan.
    unsafe {
        match step {
            Step::Mount {
                source,
                target,
                fstype,
                flags,
                data,
            } => check(libc::mount(
                ptr(source),
                target.as_ptr(),
                ptr(fstype),
                *flags,
                ptr(data).cast(),
            )),
            Step::Mkdir(path) => {
                if libc::mkdir(path.as_ptr(), 0o755) != 0 {
                    let error = std::io::Error::last_os_error();
                    if error.raw_os_error() != Some(libc::EEXIST) {
                        return Err(error);
                    }
                }
                Ok(())
            }
            Step::Touch(path) => {
                let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_CLOEXEC;
                // A descriptor, not a status: only a negative one is a failure.
                let fd = libc::open(path.as_ptr(), flags, 0o644);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                check(libc::close(fd))
            }
            Step::Chroot(path) => check(libc::chroot(path.as_ptr())),
            Step::Chdir(path) => check(libc::chdir(path.as_ptr())),
        }
    }
}

/// `target` with every symbolic link of the host's root resolved, as the container's root
/// (the host's, overlaid) resolves it; components past the first missing one stay as
/// written, since nothing there can be a link yet.
pub fn resolve(target: &Path) -> anyhow::Result<PathBuf> {
    if !target.is_absolute() {
        anyhow::bail!("mount path {} is not absolute", target.display());
    }
    let mut pending: Vec<PathBuf> = components(target);
    pending.reverse();
    let mut resolved = PathBuf::from("/");
    let mut links = 0;
    while let Some(part) = pending.pop() {
        let next = resolved.join(&part);
        match std::fs::read_link(&next) {
            Ok(link) => {
                links += 1;
                if links > MAX_LINKS {
                    anyhow::bail!("mount path {}: too many symbolic links", target.display());
                }
                if link.is_absolute() {
                    resolved = PathBuf::from("/");
                }
                pending.extend(components(&link).into_iter().rev());
            }
            Err(_) if part == Path::new("..") => {
                resolved.pop();
            }
            Err(_) => resolved = next,
        }
    }
    Ok(resolved)
}

/// The normal and `..` components of a path (`.` and the root dropped).
fn components(path: &Path) -> Vec<PathBuf> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(name) => Some(PathBuf::from(name)),
            Component::ParentDir => Some(PathBuf::from("..")),
            _ => None,
        })
        .collect()
}

/// The prefixes of `path` (itself included) that do not exist on the host, outermost first.
fn missing_components(path: &Path) -> Vec<PathBuf> {
    let mut missing: Vec<PathBuf> = path
        .ancestors()
        .take_while(|p| std::fs::symlink_metadata(p).is_err())
        .map(Path::to_path_buf)
        .collect();
    missing.reverse();
    missing
}

fn c_path(path: &Path) -> anyhow::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| anyhow::anyhow!("{} has a NUL byte", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_of_the_host_are_followed_and_missing_parts_kept() {
        let dir = std::env::temp_dir().join(format!("spur-mounts-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("real")).expect("dir");
        let link = dir.join("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(dir.join("real"), &link).expect("symlink");
        let resolved = resolve(&link.join("new/deeper")).expect("resolve");
        assert_eq!(resolved, dir.join("real/new/deeper"));
        let relative = dir.join("rel");
        let _ = std::fs::remove_file(&relative);
        std::os::unix::fs::symlink("real", &relative).expect("symlink");
        assert_eq!(resolve(&relative).expect("resolve"), dir.join("real"));
        assert_eq!(
            missing_components(&dir.join("real/a/b")),
            vec![dir.join("real/a"), dir.join("real/a/b")]
        );
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    #[test]
    fn a_relative_mount_path_is_refused() {
        assert!(resolve(Path::new("etc/spur")).is_err());
    }
}

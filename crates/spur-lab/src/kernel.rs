//! What the lab asks of the Linux kernel: a private network namespace for the whole lab,
//! each pod as a process of its own user with its own hostname, and nftables rules that
//! make the Service and the faults.
//!
//! Every 127.0.0.0/8 address is on the loopback interface, so pods listen on addresses of
//! their own; but a connection to a local address leaves from 127.0.0.1 whoever makes it.
//! Each pod's process therefore runs as a user of its own, and a `postrouting` rule
//! rewrites the source of its new connections to the pod's address (`meta skuid` → SNAT).
//! From then on conntrack's reply tuple names both real ends of every connection, through
//! the Service's DNAT too, and the faults match on it in the `input` hook: after conntrack
//! confirmed the connection, so a dropped SYN's retransmits stay pinned to the same
//! endpoint, as on a real node.

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::Ipv4Addr;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Command, Stdio};

/// Moves this process (and every process it starts from now on) into a network namespace
/// of its own and brings its loopback up. The namespace goes away when the last process
/// in it exits, so nothing is left behind whatever happens. Call it before any thread
/// starts: a namespace belongs to the thread that made it and the threads it starts later.
pub fn enter_private_network() -> std::io::Result<()> {
    // SAFETY: unshare(2) with a constant flag has no memory-safety preconditions.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::other(format!(
            "unshare(CLONE_NEWNET): {} (the lab needs root, or CAP_SYS_ADMIN)",
            std::io::Error::last_os_error()
        )));
    }
    run("ip", &["link", "set", "lo", "up"], None)
}

/// Whether this machine can run the lab: root and the `nft` and `ip` tools.
pub fn missing_tools() -> Option<String> {
    // SAFETY: geteuid(2) cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("the lab runs as root (it creates a network namespace)".into());
    }
    for tool in ["nft", "ip"] {
        let found = Command::new(tool)
            .arg("-V")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok();
        if !found {
            return Some(format!(
                "`{tool}` is missing (ci/install-deps.sh installs nftables and iproute2)"
            ));
        }
    }
    None
}

/// A libc call's status as a `Result`: 0 is success, anything else names `errno`. Safe to
/// call between fork and exec (it allocates nothing on success, and reads errno otherwise).
pub(crate) fn check(status: libc::c_int) -> std::io::Result<()> {
    if status == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Runs `program` to its end, `stdin` fed to it; its stderr names a failure.
pub(super) fn run(program: &str, args: &[&str], stdin: Option<&str>) -> std::io::Result<()> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .expect("piped")
            .write_all(text.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// One pod: a process with its own address, user and hostname.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pod {
    /// The pod's name, also its hostname (spurctld answers Ping with it).
    pub name: String,
    pub ip: Ipv4Addr,
    /// The user its process runs as: the kernel's handle on "packets from this pod".
    pub uid: u32,
}

impl Pod {
    /// `command` set up to run as this pod: its own UTS namespace and hostname, its user,
    /// and killed when the lab dies (PR_SET_PDEATHSIG), so no pod outlives a lab that
    /// crashed. The lab starts pods from its main thread only: the death signal follows
    /// the thread that forked.
    pub fn command(&self, command: Command) -> Command {
        self.command_in(command, None, None)
    }

    /// As [`Pod::command`], and with `image` the program runs from an image's root
    /// filesystem as a container runtime would run it (see [`ImageRoot`]); the command's
    /// program is then a path inside that root. With `hosts`, that file is the pod's
    /// `/etc/hosts`, as the kubelet mounts one into every pod: the lab's DNS for a headless
    /// Service (it must be reachable at the same path inside `image`, as the scenario's
    /// directory is). The lab rewrites it in place, so the mount sees every change.
    pub fn command_in(
        &self,
        mut command: Command,
        image: Option<&ImageRoot>,
        hosts: Option<&std::ffi::CStr>,
    ) -> Command {
        let name = self.name.clone().into_bytes();
        let uid = self.uid;
        let image = image.cloned();
        let hosts = hosts.map(std::ffi::CStr::to_owned);
        // SAFETY: between fork and exec only async-signal-safe calls run (unshare,
        // sethostname, mount, mkdir, chroot, chdir, setgroups, setgid, setuid, prctl), on
        // memory allocated before the fork.
        unsafe {
            command.pre_exec(move || {
                let namespaces = if image.is_some() || hosts.is_some() {
                    libc::CLONE_NEWUTS | libc::CLONE_NEWNS
                } else {
                    libc::CLONE_NEWUTS
                };
                check(libc::unshare(namespaces))?;
                check(libc::sethostname(name.as_ptr().cast(), name.len()))?;
                let none = std::ptr::null::<libc::c_char>();
                match &image {
                    Some(image) => image.enter()?,
                    // Nothing mounted here propagates back to the host's namespace.
                    None if hosts.is_some() => check(libc::mount(
                        none,
                        c"/".as_ptr(),
                        none,
                        libc::MS_REC | libc::MS_PRIVATE,
                        std::ptr::null(),
                    ))?,
                    None => {}
                }
                if let Some(hosts) = &hosts {
                    check(libc::mount(
                        hosts.as_ptr(),
                        c"/etc/hosts".as_ptr(),
                        none,
                        libc::MS_BIND,
                        std::ptr::null(),
                    ))?;
                }
                check(libc::setgroups(0, std::ptr::null()))?;
                check(libc::setgid(uid))?;
                check(libc::setuid(uid))?;
                // After the change of user: the kernel clears the death signal when the
                // credentials change.
                check(libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL))?;
                Ok(())
            });
        }
        command
    }
}

/// An image's root filesystem (ci/image.sh unpacks the operator's), entered the way
/// ci/image-run.sh enters it for the image's smoke runs: in a mount namespace of the pod's
/// own, the root bind-mounted read-only, a fresh tmpfs on its /tmp, and one host directory
/// under /tmp (the scenario's files: the kubeconfig) bound at the same path inside, which is
/// also the working directory. Every path is made into a C string here, before any fork.
#[derive(Clone, Debug)]
pub struct ImageRoot {
    root: std::ffi::CString,
    tmp: std::ffi::CString,
    /// The directories to make inside the tmpfs down to the bind target, outermost first.
    mkdirs: Vec<std::ffi::CString>,
    bind_source: std::ffi::CString,
    bind_target: std::ffi::CString,
    workdir: std::ffi::CString,
}

impl ImageRoot {
    pub fn new(root: &Path, bind: &Path) -> anyhow::Result<Self> {
        use std::os::unix::ffi::OsStrExt as _;
        let c = |p: &Path| {
            std::ffi::CString::new(p.as_os_str().as_bytes())
                .map_err(|_| anyhow::anyhow!("{} has a NUL byte", p.display()))
        };
        let root = std::fs::canonicalize(root)
            .map_err(|e| anyhow::anyhow!("image root {}: {e}", root.display()))?;
        if !root.join("tmp").is_dir() {
            anyhow::bail!(
                "{} has no /tmp: not an image root of ci/image.sh",
                root.display()
            );
        }
        let below_tmp = bind.strip_prefix("/tmp").map_err(|_| {
            anyhow::anyhow!(
                "{} must be under /tmp to appear inside the image root (its /tmp is a tmpfs)",
                bind.display()
            )
        })?;
        let mut mkdirs = Vec::new();
        let mut inside = root.join("tmp");
        for part in below_tmp.components() {
            inside.push(part);
            mkdirs.push(c(&inside)?);
        }
        Ok(Self {
            tmp: c(&root.join("tmp"))?,
            bind_target: c(&inside)?,
            root: c(&root)?,
            mkdirs,
            bind_source: c(bind)?,
            workdir: c(bind)?,
        })
    }

    /// In the child, between fork and exec: async-signal-safe system calls only.
    fn enter(&self) -> std::io::Result<()> {
        let none = std::ptr::null::<libc::c_char>();
        // SAFETY: every pointer is a NUL-terminated string owned by `self` or null.
        unsafe {
            // Nothing mounted here propagates back to the host's namespace.
            check(libc::mount(
                none,
                c"/".as_ptr(),
                none,
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ))?;
            check(libc::mount(
                self.root.as_ptr(),
                self.root.as_ptr(),
                none,
                libc::MS_BIND | libc::MS_REC,
                std::ptr::null(),
            ))?;
            check(libc::mount(
                none,
                self.root.as_ptr(),
                none,
                libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY,
                std::ptr::null(),
            ))?;
            check(libc::mount(
                c"tmpfs".as_ptr(),
                self.tmp.as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                c"mode=1777,size=64m".as_ptr().cast(),
            ))?;
            for dir in &self.mkdirs {
                check(libc::mkdir(dir.as_ptr(), 0o755))?;
            }
            check(libc::mount(
                self.bind_source.as_ptr(),
                self.bind_target.as_ptr(),
                none,
                libc::MS_BIND,
                std::ptr::null(),
            ))?;
            check(libc::chroot(self.root.as_ptr()))?;
            check(libc::chdir(self.workdir.as_ptr()))?;
        }
        Ok(())
    }
}

/// The address a Service without endpoints sends SYNs to when it drops them: packets to it
/// are dropped on arrival, after conntrack confirmed the mapping.
pub const BLACK_HOLE: Ipv4Addr = Ipv4Addr::new(127, 0, 9, 9);

pub use spur_judge::service::NoEndpoint;

/// The lab's nftables state: the Service and the faults. [`Firewall::apply`] replaces the
/// whole table in one transaction.
#[derive(Clone, Debug)]
pub struct Firewall {
    /// The pods whose connections are sourced from their own address.
    pub pods: Vec<Pod>,
    /// The Service's ClusterIP and port.
    pub service: (Ipv4Addr, u16),
    /// Its ready endpoints, in a stable order.
    pub endpoints: Vec<Ipv4Addr>,
    pub no_endpoint: NoEndpoint,
    /// Addresses whose every packet is dropped.
    pub black_holed: Vec<Ipv4Addr>,
    /// Pairs of addresses cut off from each other, both ways.
    pub partitions: Vec<(Ipv4Addr, Ipv4Addr)>,
}

impl Firewall {
    /// The ruleset, as `nft -f` reads it.
    pub fn ruleset(&self) -> String {
        let (vip, port) = self.service;
        let mut text = String::from("table ip spurlab {}\ndelete table ip spurlab\n");
        text.push_str("table ip spurlab {\n");
        text.push_str("  chain service {\n    type nat hook output priority -100;\n");
        if self.endpoints.is_empty() {
            match self.no_endpoint {
                NoEndpoint::Drop => {
                    let _ = writeln!(
                        text,
                        "    ip daddr {vip} tcp dport {port} dnat to {BLACK_HOLE}"
                    );
                }
                // Reject: nothing listens on the ClusterIP, so the kernel refuses the
                // connect. DropUnconfirmed: dropped in `unconfirmed` below, before
                // conntrack confirms the entry.
                NoEndpoint::Reject | NoEndpoint::DropUnconfirmed => {}
            }
        } else {
            let map: Vec<String> = self
                .endpoints
                .iter()
                .enumerate()
                .map(|(i, ip)| format!("{i} : {ip}"))
                .collect();
            let _ = writeln!(
                text,
                "    ip daddr {vip} tcp dport {port} dnat to numgen random mod {} map {{ {} }}",
                self.endpoints.len(),
                map.join(", ")
            );
        }
        text.push_str("  }\n");
        text.push_str("  chain pod_source {\n    type nat hook postrouting priority 100;\n");
        for pod in &self.pods {
            let _ = writeln!(
                text,
                "    meta skuid {} ip saddr 127.0.0.1 snat to {}",
                pod.uid, pod.ip
            );
        }
        text.push_str("  }\n");
        // A filter drop in the output hook discards the SYN before postrouting, where
        // conntrack would confirm its entry: the kernel's retransmit is a new connection
        // to the NAT chain above, which maps it once endpoints exist. (A drop in the input
        // hook, as the faults below, comes after the entry was confirmed.)
        text.push_str("  chain unconfirmed {\n    type filter hook output priority 0;\n");
        if self.endpoints.is_empty() && self.no_endpoint == NoEndpoint::DropUnconfirmed {
            let _ = writeln!(text, "    ip daddr {vip} tcp dport {port} drop");
        }
        text.push_str("  }\n");
        text.push_str("  chain faults {\n    type filter hook input priority 0;\n");
        let _ = writeln!(text, "    ip daddr {BLACK_HOLE} drop");
        for ip in &self.black_holed {
            let _ = writeln!(text, "    ct reply ip saddr {ip} drop");
            let _ = writeln!(text, "    ct reply ip daddr {ip} drop");
        }
        for (a, b) in &self.partitions {
            let _ = writeln!(text, "    ct reply ip saddr {a} ct reply ip daddr {b} drop");
            let _ = writeln!(text, "    ct reply ip saddr {b} ct reply ip daddr {a} drop");
        }
        text.push_str("  }\n}\n");
        text
    }

    /// Installs the ruleset (atomically: `nft -f` runs one transaction).
    pub fn apply(&self) -> std::io::Result<()> {
        run("nft", &["-f", "-"], Some(&self.ruleset()))
    }

    /// Whether `a` and `b` are cut off from each other.
    pub fn cut(&self, a: Ipv4Addr, b: Ipv4Addr) -> bool {
        self.black_holed.contains(&a)
            || self.black_holed.contains(&b)
            || self.partitions.iter().any(|p| *p == (a, b) || *p == (b, a))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_root_binds_a_directory_under_tmp_at_the_same_path() {
        let root = std::env::temp_dir().join(format!("spur-image-root-{}", std::process::id()));
        std::fs::create_dir_all(root.join("tmp")).unwrap();
        let image = ImageRoot::new(&root, Path::new("/tmp/spur-lab-x/pods")).unwrap();
        let root = std::fs::canonicalize(&root).unwrap();
        let made: Vec<String> = image
            .mkdirs
            .iter()
            .map(|d| d.to_str().unwrap().to_owned())
            .collect();
        assert_eq!(
            made,
            [
                format!("{}/tmp/spur-lab-x", root.display()),
                format!("{}/tmp/spur-lab-x/pods", root.display()),
            ]
        );
        assert_eq!(image.bind_target.to_str().unwrap(), made[1]);
        assert_eq!(image.workdir.to_str().unwrap(), "/tmp/spur-lab-x/pods");

        let elsewhere = ImageRoot::new(&root, Path::new("/work/keep/pods")).unwrap_err();
        assert!(
            elsewhere.to_string().contains("must be under /tmp"),
            "{elsewhere}"
        );
        std::fs::remove_dir(root.join("tmp")).unwrap();
        let bare = ImageRoot::new(&root, Path::new("/tmp/x")).unwrap_err();
        assert!(bare.to_string().contains("has no /tmp"), "{bare}");
        std::fs::remove_dir(&root).unwrap();
    }

    fn firewall() -> Firewall {
        Firewall {
            pods: vec![Pod {
                name: "spurctld-0".into(),
                ip: Ipv4Addr::new(127, 0, 1, 1),
                uid: 20001,
            }],
            service: (Ipv4Addr::new(127, 0, 2, 1), 6817),
            endpoints: Vec::new(),
            no_endpoint: NoEndpoint::Drop,
            black_holed: Vec::new(),
            partitions: Vec::new(),
        }
    }

    #[test]
    fn a_service_without_endpoints_pins_its_syns_to_the_black_hole_refuses_or_drops_them_unconfirmed()
     {
        let mut fw = firewall();
        let rules = fw.ruleset();
        assert!(rules.contains("dnat to 127.0.9.9"), "{rules}");
        assert!(rules.contains("ip daddr 127.0.9.9 drop"), "{rules}");
        assert!(!rules.contains("6817 drop"), "{rules}");
        fw.no_endpoint = NoEndpoint::Reject;
        assert!(!fw.ruleset().contains("dnat"), "{}", fw.ruleset());
        assert!(!fw.ruleset().contains("6817 drop"), "{}", fw.ruleset());
        fw.no_endpoint = NoEndpoint::DropUnconfirmed;
        let rules = fw.ruleset();
        assert!(!rules.contains("dnat"), "{rules}");
        assert!(
            rules.contains(
                "type filter hook output priority 0;\n    ip daddr 127.0.2.1 tcp dport 6817 drop"
            ),
            "{rules}"
        );
        fw.endpoints = vec![Ipv4Addr::new(127, 0, 1, 1), Ipv4Addr::new(127, 0, 1, 3)];
        assert!(
            fw.ruleset()
                .contains("numgen random mod 2 map { 0 : 127.0.1.1, 1 : 127.0.1.3 }"),
            "{}",
            fw.ruleset()
        );
        assert!(!fw.ruleset().contains("6817 drop"), "{}", fw.ruleset());
    }

    #[test]
    fn faults_match_both_real_ends_of_a_connection() {
        let mut fw = firewall();
        let (a, b) = (Ipv4Addr::new(127, 0, 3, 1), Ipv4Addr::new(127, 0, 1, 2));
        fw.partitions.push((a, b));
        fw.black_holed.push(Ipv4Addr::new(127, 0, 1, 1));
        let rules = fw.ruleset();
        assert!(rules.contains("ct reply ip saddr 127.0.3.1 ct reply ip daddr 127.0.1.2 drop"));
        assert!(rules.contains("ct reply ip saddr 127.0.1.2 ct reply ip daddr 127.0.3.1 drop"));
        assert!(rules.contains("ct reply ip daddr 127.0.1.1 drop"));
        assert!(rules.contains("meta skuid 20001 ip saddr 127.0.0.1 snat to 127.0.1.1"));
        assert!(fw.cut(b, a) && fw.cut(Ipv4Addr::new(127, 0, 1, 1), a));
        assert!(!fw.cut(a, Ipv4Addr::new(127, 0, 1, 3)));
    }
}

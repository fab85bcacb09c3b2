//! Pod networking: one bridge in the cluster's network namespace, each pod a network and
//! UTS namespace of its own (held by a "pause" process, as a container runtime holds it)
//! with a veth onto the bridge and an address from the pod CIDR.
//!
//! The namespaces are never named (`ip netns add` would leave a file under /run/netns if
//! the kubelet died): they live exactly as long as their pause process, which dies with the
//! thread that forked it (PR_SET_PDEATHSIG), and the veth pair dies with the namespace.

use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command, Stdio};

use crate::kernel::check;

/// The bridge every pod's veth is a port of; removed on drop.
#[derive(Debug)]
pub struct Bridge {
    pub name: String,
    pub gateway: Ipv4Addr,
    pub prefix: u8,
}

impl Bridge {
    /// Creates `name` with `gateway/prefix` in the current network namespace.
    pub fn create(name: &str, gateway: Ipv4Addr, prefix: u8) -> anyhow::Result<Self> {
        // A bridge left by a kubelet that was SIGKILLed goes first.
        let _ = ip(&["link", "del", name]);
        ip(&["link", "add", name, "type", "bridge"])?;
        let bridge = Self {
            name: name.to_owned(),
            gateway,
            prefix,
        };
        // A bridge without an address of its own takes its lowest port's, so a pod's veth
        // coming or going can change the gateway's MAC under the pods' ARP caches: their
        // traffic through the gateway then goes nowhere until the entry is probed again
        // (tens of seconds), as a CNI bridge plugin avoids by setting it too.
        ip(&["link", "set", name, "address", &gateway_mac(gateway)])?;
        ip(&["addr", "add", &format!("{gateway}/{prefix}"), "dev", name])?;
        ip(&["link", "set", name, "up"])?;
        Ok(bridge)
    }
}

/// A locally administered unicast MAC holding the gateway's address, unique among the
/// cluster's bridges as their gateways are.
fn gateway_mac(gateway: Ipv4Addr) -> String {
    let [a, b, c, d] = gateway.octets();
    format!("02:53:{a:02x}:{b:02x}:{c:02x}:{d:02x}")
}

impl Drop for Bridge {
    fn drop(&mut self) {
        let _ = ip(&["link", "del", &self.name]);
    }
}

/// A pod's network: its pause process holding the namespaces, its address and host veth.
#[derive(Debug)]
pub struct PodNet {
    pub ip: Ipv4Addr,
    pub veth: String,
    pause: Child,
    /// The pod's network and UTS namespaces, opened before any container forks.
    pub netns: OwnedFd,
    pub utsns: OwnedFd,
}

impl PodNet {
    /// Starts the pause process (hostname `hostname`) and wires `ip` onto `bridge` through
    /// host-side veth `veth` (at most 15 bytes, the kernel's limit).
    pub fn create(
        bridge: &Bridge,
        hostname: &str,
        ip: Ipv4Addr,
        veth: &str,
    ) -> anyhow::Result<Self> {
        let pause = pause(hostname)?;
        let pid = pause.id();
        let open = |kind: &str| -> anyhow::Result<OwnedFd> {
            Ok(std::fs::File::open(format!("/proc/{pid}/ns/{kind}"))?.into())
        };
        let (netns, utsns) = match (open("net"), open("uts")) {
            (Ok(n), Ok(u)) => (n, u),
            (Err(e), _) | (_, Err(e)) => {
                kill_pause(pause);
                return Err(e);
            }
        };
        let mut net = Self {
            ip,
            veth: veth.to_owned(),
            pause,
            netns,
            utsns,
        };
        // On error `net` drops here, which kills the pause and removes the veth.
        net.wire(bridge)?;
        Ok(net)
    }

    /// The veth pair, its bridge port, the pod's address, loopback and default route.
    fn wire(&mut self, bridge: &Bridge) -> anyhow::Result<()> {
        let pid = self.pause.id().to_string();
        let veth = self.veth.as_str();
        ip(&[
            "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", &pid,
        ])?;
        ip(&["link", "set", veth, "master", &bridge.name, "up"])?;
        let cidr = format!("{}/{}", self.ip, bridge.prefix);
        let gw = bridge.gateway.to_string();
        for args in [
            &["addr", "add", &cidr, "dev", "eth0"][..],
            &["link", "set", "eth0", "up"],
            &["link", "set", "lo", "up"],
            &["route", "add", "default", "via", &gw],
        ] {
            self.ip_inside(args)?;
        }
        Ok(())
    }

    /// Runs `ip` inside the pod's network namespace.
    fn ip_inside(&self, args: &[&str]) -> anyhow::Result<()> {
        let mut command = Command::new("ip");
        command.args(args);
        enter(&mut command, Some(&self.netns), None);
        status(command, args)
    }
}

impl Drop for PodNet {
    fn drop(&mut self) {
        // Killing the pause frees the namespace, and the veth pair with it; the explicit
        // delete covers a veth whose peer never moved into the namespace.
        let _ = self.pause.kill();
        let _ = self.pause.wait();
        let _ = ip(&["link", "del", &self.veth]);
    }
}

/// Makes `command` join the pod's namespaces between fork and exec. The fds stay open
/// in the caller until the command has spawned.
pub fn enter(command: &mut Command, netns: Option<&OwnedFd>, utsns: Option<&OwnedFd>) {
    let net = netns.map(|fd| fd.as_raw_fd());
    let uts = utsns.map(|fd| fd.as_raw_fd());
    // SAFETY: setns(2) on fds opened before the fork is async-signal-safe.
    unsafe {
        command.pre_exec(move || {
            for (fd, kind) in [(net, libc::CLONE_NEWNET), (uts, libc::CLONE_NEWUTS)] {
                if let Some(fd) = fd
                    && libc::setns(fd, kind) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

/// `sleep infinity` in new network and UTS namespaces with hostname `hostname`, killed
/// when the forking thread dies.
fn pause(hostname: &str) -> anyhow::Result<Child> {
    let name = hostname.as_bytes().to_vec();
    let mut command = Command::new("sleep");
    command
        .arg("infinity")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: unshare, sethostname and prctl are async-signal-safe; `name` was allocated
    // before the fork.
    unsafe {
        command.pre_exec(move || {
            check(libc::unshare(libc::CLONE_NEWNET | libc::CLONE_NEWUTS))?;
            check(libc::sethostname(name.as_ptr().cast(), name.len()))?;
            check(libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL))
        });
    }
    Ok(command.spawn()?)
}

fn kill_pause(mut pause: Child) {
    let _ = pause.kill();
    let _ = pause.wait();
}

/// Runs `ip` in the current network namespace.
pub fn ip(args: &[&str]) -> anyhow::Result<()> {
    let mut command = Command::new("ip");
    command.args(args);
    status(command, args)
}

fn status(mut command: Command, args: &[&str]) -> anyhow::Result<()> {
    let out = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .output()?;
    if !out.status.success() {
        anyhow::bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Pod addresses: the CIDR's hosts after the gateway, handed out and given back.
#[derive(Clone, Debug)]
pub struct Addresses {
    base: u32,
    size: u32,
    used: std::collections::BTreeSet<u32>,
}

impl Addresses {
    /// The pool of `network/prefix`; offset 1 is the gateway's.
    pub fn new(network: Ipv4Addr, prefix: u8) -> Self {
        Self {
            base: u32::from(network),
            size: 1u32 << (32 - u32::from(prefix.clamp(8, 30))),
            used: Default::default(),
        }
    }

    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.base + 1)
    }

    /// The lowest free address and its offset (which names the pod's veth).
    pub fn take(&mut self) -> Option<(Ipv4Addr, u32)> {
        let offset = (2..self.size - 1).find(|o| !self.used.contains(o))?;
        self.used.insert(offset);
        Some((Ipv4Addr::from(self.base + offset), offset))
    }

    pub fn give_back(&mut self, ip: Ipv4Addr) {
        self.used.remove(&(u32::from(ip).wrapping_sub(self.base)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The MAC `ip` shows for `link` in this thread's network namespace (`/sys/class/net`
    /// shows the namespace sysfs was mounted in, not this one).
    fn mac_of(link: &str) -> String {
        let out = Command::new("ip")
            .args(["-o", "link", "show", "dev", link])
            .output()
            .expect("ip runs");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (_, after) = text.split_once("link/ether ").expect("an ether link");
        after.split_whitespace().next().expect("a MAC").to_owned()
    }

    #[test]
    fn the_bridge_keeps_its_mac_while_a_port_with_a_lower_one_joins_and_leaves() {
        if let Some(why) = crate::kernel::missing_tools() {
            eprintln!("skipped: {why}");
            return;
        }
        // This test's thread only; the namespace goes when the thread ends.
        crate::kernel::enter_private_network().expect("a private network namespace");
        let bridge = Bridge::create("spurmacbr", Ipv4Addr::new(10, 99, 0, 1), 24).unwrap();
        let own = mac_of("spurmacbr");
        assert_eq!(own, gateway_mac(bridge.gateway));
        ip(&[
            "link",
            "add",
            "spurmacv0",
            "address",
            "02:00:00:00:00:01",
            "type",
            "veth",
            "peer",
            "name",
            "spurmacp0",
        ])
        .unwrap();
        ip(&["link", "set", "spurmacv0", "master", "spurmacbr", "up"]).unwrap();
        assert_eq!(mac_of("spurmacbr"), own, "a lower-MAC port joined");
        ip(&["link", "del", "spurmacv0"]).unwrap();
        assert_eq!(mac_of("spurmacbr"), own, "the port left");
    }

    #[test]
    fn a_gateway_mac_is_locally_administered_unicast_and_holds_the_address() {
        let mac = gateway_mac(Ipv4Addr::new(10, 244, 1, 1));
        assert_eq!(mac, "02:53:0a:f4:01:01");
        let first = u8::from_str_radix(&mac[..2], 16).unwrap();
        assert_eq!(first & 0b11, 0b10, "locally administered, unicast");
    }

    #[test]
    fn addresses_skip_the_network_and_gateway_and_are_reused() {
        let mut pool = Addresses::new(Ipv4Addr::new(10, 244, 0, 0), 16);
        assert_eq!(pool.gateway(), Ipv4Addr::new(10, 244, 0, 1));
        let (a, _) = pool.take().unwrap();
        let (b, offset) = pool.take().unwrap();
        assert_eq!(
            (a, b, offset),
            (
                Ipv4Addr::new(10, 244, 0, 2),
                Ipv4Addr::new(10, 244, 0, 3),
                3
            )
        );
        pool.give_back(a);
        assert_eq!(pool.take().unwrap().0, a);
        let mut tiny = Addresses::new(Ipv4Addr::new(10, 0, 0, 0), 30);
        assert!(tiny.take().is_some() && tiny.take().is_none());
    }
}

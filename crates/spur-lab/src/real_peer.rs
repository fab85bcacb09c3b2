//! The real spurctld as a peer: finds the binary, writes each replica's config file and
//! state directory, starts one replica or three under Raft on loopback addresses of their
//! own, and stops every process it started when dropped, even when a test panics.
//!
//! The binary is `$SPURCTLD`, else `../shared/peers/spurctld/spurctld` beside the
//! workspace (the unmodified controller built from the public ROCm/spur repository).

use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub use spur_fakes::model::{CLIENT_PORT, RAFT_PORT};

/// Where the real binary is, if anywhere.
pub fn binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("SPURCTLD") {
        let path = PathBuf::from(path);
        return path.is_file().then_some(path);
    }
    let beside =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/peers/spurctld/spurctld");
    beside.is_file().then_some(beside)
}

/// The binary, or a failure naming what is missing: a case that needs the real peer and
/// cannot run fails, so a run without it is never reported as passed.
pub fn binary_or_fail(what: &str) -> PathBuf {
    binary().unwrap_or_else(|| {
        panic!(
            "{what}: the REAL spurctld was not found (SPURCTLD unset and \
             ../shared/peers/spurctld/spurctld missing), so this case cannot run. Build \
             ROCm/spur's spurctld (cargo build --release -p spurctld) and set \
             SPURCTLD=/path/to/spurctld"
        )
    })
}

/// What a cluster is started with.
#[derive(Clone, Debug)]
pub struct RealConfig {
    /// 1, or 3 under Raft.
    pub replicas: usize,
    /// `heartbeat_timeout_secs`: nodes silent this long go DOWN (spurctld's default is 90).
    pub heartbeat_timeout_secs: Option<u64>,
    /// `[auth] jwt_key`: spurctld signs its calls to agents with it.
    pub jwt_key: Option<String>,
    /// `max_launch_backoff_secs`: the longest wait between failed launches (default 300).
    pub max_launch_backoff_secs: Option<u64>,
    /// `terminal_job_retention_secs`: how long an ended job is kept (default 3600; spurctld
    /// keeps one at least 120 s, its accounting reconcile interval, whatever this says).
    pub terminal_retention_secs: Option<u64>,
    /// `[auth] mode = "required"` (only with `jwt_key`): every call needs a token; else
    /// spurctld's default, `permissive`.
    pub auth_required: bool,
    /// `[admission] mode = "token"`: registrations need a join token (`CreateToken`),
    /// heartbeats the node token a registration is answered with.
    pub token_admission: bool,
}

impl Default for RealConfig {
    fn default() -> Self {
        Self {
            replicas: 1,
            heartbeat_timeout_secs: None,
            jwt_key: None,
            max_launch_backoff_secs: None,
            terminal_retention_secs: None,
            auth_required: false,
            token_admission: false,
        }
    }
}

/// One running replica.
struct Process {
    child: Child,
    frozen: bool,
}

/// Real spurctld replicas, stopped (SIGKILL) when dropped.
pub struct RealCluster {
    base: [u8; 3],
    dir: PathBuf,
    config: RealConfig,
    binary: PathBuf,
    processes: Vec<Option<Process>>,
}

/// A loopback /24 of its own for each cluster: 127.<a>.<b>.0, from the process id and a
/// counter, so parallel tests (and parallel test processes) do not collide.
fn next_base() -> [u8; 3] {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let pid = std::process::id();
    [127, 10 + (pid % 200) as u8, (n % 250) as u8 + 1]
}

impl RealCluster {
    /// Starts the replicas; returns once each listens on its client port (not once a
    /// leader exists: see [`RealCluster::leader`]).
    pub fn start(binary: &Path, config: RealConfig) -> std::io::Result<RealCluster> {
        let base = next_base();
        let dir = std::env::temp_dir().join(format!(
            "spur-real-{}-{}-{}",
            std::process::id(),
            base[1],
            base[2]
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let mut cluster = RealCluster {
            base,
            dir,
            config,
            binary: binary.to_owned(),
            processes: Vec::new(),
        };
        for slot in 0..cluster.config.replicas {
            cluster.write_config(slot)?;
            cluster.processes.push(None);
            cluster.spawn(slot)?;
        }
        for slot in 0..cluster.config.replicas {
            cluster.wait_listening(slot, Duration::from_secs(10))?;
        }
        Ok(cluster)
    }

    /// How many replicas.
    pub fn replicas(&self) -> usize {
        self.config.replicas
    }

    /// Replica `slot`'s IP (slot 0 is `.1`).
    pub fn ip(&self, slot: usize) -> Ipv4Addr {
        let [a, b, c] = self.base;
        Ipv4Addr::new(a, b, c, slot as u8 + 1)
    }

    /// Replica `slot`'s client address.
    pub fn addr(&self, slot: usize) -> SocketAddr {
        SocketAddr::new(self.ip(slot).into(), CLIENT_PORT)
    }

    /// An address in this cluster's /24 that no replica uses, for a test's own servers
    /// (an agent): `.100 + n`.
    pub fn spare_ip(&self, n: u8) -> Ipv4Addr {
        let [a, b, c] = self.base;
        Ipv4Addr::new(a, b, c, 100 + n)
    }

    fn config_path(&self, slot: usize) -> PathBuf {
        self.dir.join(format!("spur{}.conf", slot + 1))
    }

    fn state_dir(&self, slot: usize) -> PathBuf {
        self.dir.join(format!("state{}", slot + 1))
    }

    fn write_config(&self, slot: usize) -> std::io::Result<()> {
        let mut text = String::from("cluster_name = \"conformance\"\n[controller]\n");
        let _ = writeln!(text, "listen_addr = \"{}\"", self.addr(slot));
        let _ = writeln!(text, "state_dir = \"{}\"", self.state_dir(slot).display());
        let raft = |s: usize| format!("{}:{RAFT_PORT}", self.ip(s));
        if self.config.replicas > 1 {
            let peers: Vec<String> = (0..self.config.replicas)
                .map(|s| format!("\"{}\"", raft(s)))
                .collect();
            let _ = writeln!(text, "peers = [{}]", peers.join(", "));
            let _ = writeln!(text, "node_id = {}", slot + 1);
        }
        // Even one replica listens for Raft; on its own address, not spurctld's default
        // [::]:6821, so clusters of parallel tests do not collide.
        let _ = writeln!(text, "raft_listen_addr = \"{}\"", raft(slot));
        if let Some(secs) = self.config.heartbeat_timeout_secs {
            let _ = writeln!(text, "heartbeat_timeout_secs = {secs}");
        }
        if let Some(secs) = self.config.max_launch_backoff_secs {
            let _ = writeln!(text, "max_launch_backoff_secs = {secs}");
        }
        if let Some(secs) = self.config.terminal_retention_secs {
            let _ = writeln!(text, "terminal_job_retention_secs = {secs}");
        }
        if let Some(key) = &self.config.jwt_key {
            let _ = writeln!(text, "[auth]\nplugin = \"jwt\"\njwt_key = \"{key}\"");
            if self.config.auth_required {
                text.push_str("mode = \"required\"\n");
            }
        }
        if self.config.token_admission {
            text.push_str("[admission]\nmode = \"token\"\n");
        }
        text.push_str("[[partitions]]\nname = \"default\"\ndefault = true\n");
        std::fs::create_dir_all(self.state_dir(slot))?;
        std::fs::write(self.config_path(slot), text)
    }

    fn spawn(&mut self, slot: usize) -> std::io::Result<()> {
        let log = self.dir.join(format!("spurctld{}.log", slot + 1));
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)?;
        let child = Command::new(&self.binary)
            .arg("-D")
            .arg("-f")
            .arg(self.config_path(slot))
            .arg("--state-dir")
            .arg(self.state_dir(slot))
            .arg("--listen")
            .arg(self.addr(slot).to_string())
            .env("NO_COLOR", "1")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()?;
        self.processes[slot] = Some(Process {
            child,
            frozen: false,
        });
        Ok(())
    }

    fn wait_listening(&mut self, slot: usize, limit: Duration) -> std::io::Result<()> {
        let start = Instant::now();
        loop {
            if std::net::TcpStream::connect_timeout(&self.addr(slot), Duration::from_millis(200))
                .is_ok()
            {
                return Ok(());
            }
            if let Some(process) = &mut self.processes[slot]
                && let Some(status) = process.child.try_wait()?
            {
                return Err(std::io::Error::other(format!(
                    "spurctld {} exited ({status}) before listening; log:\n{}",
                    slot + 1,
                    self.log(slot)
                )));
            }
            if start.elapsed() > limit {
                return Err(std::io::Error::other(format!(
                    "spurctld {} not listening on {} after {limit:?}",
                    slot + 1,
                    self.addr(slot)
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Replica `slot`'s log so far (ANSI colour codes included when it wrote any).
    pub fn log(&self, slot: usize) -> String {
        let path = self.dir.join(format!("spurctld{}.log", slot + 1));
        std::fs::read_to_string(path).unwrap_or_default()
    }

    /// The leader, from the replicas' logs ([`RaftLogs`]; a killed replica's log counts: it
    /// names the term its leader held), while that replica runs. A survivor's old `become
    /// leader` line from a contested first election is no evidence: it would name a
    /// survivor the moment its leader was killed.
    pub fn leader(&self) -> Option<usize> {
        let mut logs = RaftLogs::default();
        for slot in 0..self.replicas() {
            for line in self.log(slot).lines() {
                logs.read(slot, line);
            }
        }
        let slot = logs.leader_slot()?;
        (slot < self.replicas() && self.is_up(slot)).then_some(slot)
    }

    /// SIGKILL replica `slot` (a crashed pod); it stays down until [`RealCluster::restart`].
    pub fn kill(&mut self, slot: usize) {
        if let Some(mut process) = self.processes[slot].take() {
            if process.frozen {
                signal(process.child.id(), "CONT");
            }
            let _ = process.child.kill();
            let _ = process.child.wait();
        }
    }

    /// Starts replica `slot` again on its state directory, as a StatefulSet pod comes back.
    pub fn restart(&mut self, slot: usize) -> std::io::Result<()> {
        self.kill(slot);
        self.spawn(slot)?;
        self.wait_listening(slot, Duration::from_secs(10))
    }

    /// SIGSTOP replica `slot`: its sockets stay open and nothing answers.
    pub fn freeze(&mut self, slot: usize) {
        if let Some(process) = &mut self.processes[slot] {
            signal(process.child.id(), "STOP");
            process.frozen = true;
        }
    }

    /// SIGCONT replica `slot`.
    pub fn thaw(&mut self, slot: usize) {
        if let Some(process) = &mut self.processes[slot] {
            signal(process.child.id(), "CONT");
            process.frozen = false;
        }
    }

    /// Whether replica `slot` runs (not killed; frozen counts as running).
    pub fn is_up(&self, slot: usize) -> bool {
        self.processes[slot].is_some()
    }

    /// Where the replicas' files are.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every replica's log, for a failing test's message.
    pub fn logs(&self) -> String {
        let mut all = String::new();
        for slot in 0..self.replicas() {
            let log = self.log(slot);
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            let _ = writeln!(all, "--- spurctld {} (last 40 lines)", slot + 1);
            for line in tail.into_iter().rev() {
                let _ = writeln!(all, "{line}");
            }
        }
        all
    }
}

fn signal(pid: u32, name: &str) {
    // `kill(1)` rather than a libc binding: this runs a few times per test.
    let _ = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status();
}

impl Drop for RealCluster {
    fn drop(&mut self) {
        for slot in 0..self.processes.len() {
            self.kill(slot);
        }
        if std::env::var_os("SPUR_KEEP_REAL_LOGS").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A ClusterIP Service in front of real replicas, as kube-proxy makes one: each accepted
/// connection goes to a replica picked at random among those that accept a connect (a
/// tcpSocket readiness probe's view: a killed replica refuses and is skipped, a frozen one
/// accepts and is kept). Runs until the task is dropped.
pub async fn serve_service(
    listener: tokio::net::TcpListener,
    backends: Vec<SocketAddr>,
    seed: u64,
) {
    use rand::seq::SliceRandom;
    let mut rng = spur_judge::seed::rng_for(seed, "service");
    loop {
        let Ok((mut inbound, _)) = listener.accept().await else {
            continue;
        };
        let mut order = backends.clone();
        order.shuffle(&mut rng);
        tokio::spawn(async move {
            for backend in order {
                let connect = tokio::net::TcpStream::connect(backend);
                if let Ok(Ok(mut outbound)) =
                    tokio::time::timeout(Duration::from_secs(1), connect).await
                {
                    let _ = inbound.set_nodelay(true);
                    let _ = outbound.set_nodelay(true);
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    return;
                }
            }
            // No ready endpoint: kube-proxy's REJECT, the connection closes at once.
        });
    }
}

/// A Raft vote as openraft logs it: `T<term>-N<node>:committed` or `…:uncommitted` (node
/// ids are slots + 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Vote {
    pub term: u64,
    pub node: usize,
    pub committed: bool,
}

impl Vote {
    fn key(self) -> (u64, usize) {
        (self.term, self.node)
    }
}

/// The vote a replica moves to, from an openraft line `vote is changing from … to
/// T<term>-N<node>:<committed|uncommitted>`, or a simulated replica process's
/// `simulated replica vote: T<term>-N<node>:committed`.
pub fn vote_change(line: &str) -> Option<Vote> {
    // openraft's line, or a simulated replica process's (`spur_fakes::model::processes`).
    let to = match line.split_once("vote is changing from ") {
        Some((_, change)) => change.split_once(" to ")?.1,
        None => line.split_once("simulated replica vote: ")?.1,
    };
    let to = to.split_whitespace().next()?;
    let (vote, committed) = match to.rsplit_once(':')? {
        (vote, "committed") => (vote, true),
        (vote, "uncommitted") => (vote, false),
        _ => return None,
    };
    let (term, node) = vote.strip_prefix('T')?.split_once("-N")?;
    Some(Vote {
        term: term.parse().ok()?,
        node: node.parse().ok()?,
        committed,
    })
}

/// Who leads, as the replicas' own logs tell it: the node of the highest committed vote
/// any replica logged, unless that node has since moved its own vote past it. The second
/// part matters on a fresh cluster: every replica initialises Raft, and one that starts
/// after the first term's leader was elected holds a vote of the same term for a higher
/// node id; the leader adopts it and quits (openraft's `HigherVote`), and writes are
/// refused `"not the Raft leader"` until the next term's leader commits its vote, about
/// 3 s later; judged from the first vote alone, those seconds would count as a healthy
/// leader.
#[derive(Clone, Debug, Default)]
pub struct RaftLogs {
    highest: Option<(u64, usize)>,
    /// Each replica's own latest vote, by node id - 1.
    own: Vec<Option<Vote>>,
}

impl RaftLogs {
    /// Takes one log line of replica `slot` (lines of one replica in order).
    pub fn read(&mut self, slot: usize, line: &str) {
        let Some(vote) = vote_change(line) else {
            return;
        };
        if self.own.len() <= slot {
            self.own.resize(slot + 1, None);
        }
        self.own[slot] = Some(vote);
        if vote.committed {
            self.highest = self.highest.max(Some(vote.key()));
        }
    }

    /// The leader's slot by the logs alone (whether its process still runs and reaches a
    /// majority is for the caller to judge).
    pub fn leader_slot(&self) -> Option<usize> {
        let (term, node) = self.highest?;
        let slot = node.checked_sub(1)?;
        let quit = self
            .own
            .get(slot)
            .copied()
            .flatten()
            .is_some_and(|own| own.key() > (term, node));
        (!quit).then_some(slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vote_change_names_the_term_the_node_and_whether_it_is_committed() {
        let line = "2026-12-01T13:02:28.597378Z  INFO openraft::engine::handler::vote_handler: \
                    vote is changing from T2-N3:uncommitted to T2-N3:committed";
        let vote = |term, node, committed| {
            Some(Vote {
                term,
                node,
                committed,
            })
        };
        assert_eq!(vote_change(line), vote(2, 3, true));
        let uncommitted = "vote is changing from T1-N3:uncommitted to T2-N3:uncommitted";
        assert_eq!(vote_change(uncommitted), vote(2, 3, false));
        assert_eq!(vote_change("become leader id=3"), None);
        let simulated = "simulated replica vote: T4-N1:committed";
        assert_eq!(vote_change(simulated), vote(4, 1, true));
    }

    fn change(from: &str, to: &str) -> String {
        format!(
            "INFO openraft::engine::handler::vote_handler: vote is changing from {from} to {to}"
        )
    }

    /// The lines of a real fresh start (the pinned spurctld, replicas 1 and 2 started
    /// together, replica 3 three seconds later), in the order they were logged.
    #[test]
    fn a_leader_that_adopts_a_higher_vote_has_quit_until_the_next_term_commits() {
        let mut logs = RaftLogs::default();
        let mut read = |slot: usize, from: &str, to: &str| {
            logs.read(slot, &change(from, to));
            logs.leader_slot()
        };
        assert_eq!(read(0, "T0-N0:uncommitted", "T1-N1:uncommitted"), None);
        assert_eq!(read(1, "T0-N0:uncommitted", "T1-N2:uncommitted"), None);
        assert_eq!(read(0, "T1-N1:uncommitted", "T1-N2:uncommitted"), None);
        assert_eq!(read(1, "T1-N2:uncommitted", "T1-N2:committed"), Some(1));
        assert_eq!(read(0, "T1-N2:uncommitted", "T1-N2:committed"), Some(1));
        // Replica 3 starts and initialises on its own: another replica's vote alone
        // proves nothing.
        assert_eq!(read(2, "T0-N0:uncommitted", "T1-N3:uncommitted"), Some(1));
        // The leader adopts it ("quit leader"): no leader until the next term commits.
        assert_eq!(read(1, "T1-N2:committed", "T1-N3:uncommitted"), None);
        assert_eq!(read(1, "T1-N3:uncommitted", "T2-N2:uncommitted"), None);
        assert_eq!(read(2, "T1-N3:uncommitted", "T2-N2:uncommitted"), None);
        assert_eq!(read(1, "T2-N2:uncommitted", "T2-N2:committed"), Some(1));
    }

    #[test]
    fn a_leaders_log_read_behind_its_followers_does_not_depose_it() {
        let mut logs = RaftLogs::default();
        logs.read(0, &change("T3-N1:uncommitted", "T3-N1:committed"));
        logs.read(1, &change("T3-N2:uncommitted", "T4-N2:uncommitted"));
        logs.read(1, &change("T4-N2:uncommitted", "T4-N2:committed"));
        // Node 1's own log still shows T3: older than the highest committed, not past it.
        assert_eq!(logs.leader_slot(), Some(1));
    }
}

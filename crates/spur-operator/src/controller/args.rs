//! The controller channel's flags and their validated form: how to reach spurctld, its
//! TLS, and the bounds and rules of the channel ([`super::policy`] describes what each
//! rule does).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use clap::builder::TypedValueParser as _;

use super::{ControllerAddr, Rule, Scheme};
use crate::flags::{Bound, ConfigError, read_file};

/// HTTP/2 keepalive pings on the controller channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keepalive {
    /// Time between pings.
    pub interval: Duration,
    /// How long a ping may go unanswered before the connection is closed.
    pub timeout: Duration,
    /// Ping also when no call is in flight, so a dead connection is found before the next
    /// call has to wait on it.
    pub while_idle: bool,
}

/// TLS material for an `https://` controller address, loaded and checked at start-up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsConfig {
    /// PEM CA bundle to trust; `None` trusts the system's roots.
    pub ca_pem: Option<Vec<u8>>,
    /// PEM client certificate and key, for mutual TLS.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// Name to verify the server's certificate against, when not the address's host.
    pub domain: Option<String>,
}

/// How the operator's channel to spurctld is bounded. See the flags in
/// [`ControllerArgs`] for each default's reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChannelConfig {
    pub connect_timeout: Option<Duration>,
    pub keepalive: Option<Keepalive>,
    pub request_timeout: Option<Duration>,
    pub max_message_bytes: usize,
    /// Calls this client has in flight at once, over all its channels; more wait their
    /// turn, in order, before they reach the policy.
    pub max_in_flight: usize,
    /// Replace the shared channel once it is this old (rule 5 of `controller::policy`).
    pub max_age: Option<Duration>,
    /// Bound on the read that probes each new channel, and how long a call may wait before
    /// the channel is replaced (rules 2 to 4 of `controller::policy`); `None`: none of them.
    pub connect_probe: Option<Duration>,
    /// Dials per round while probes fail (rule 2). Not a flag: see [`DEFAULT_DIALS`].
    pub dials: usize,
    /// How long after a replica acknowledged a job's end a read that still shows it running
    /// means the replica reached is behind (rule 6 of `controller::policy`); `None`: off.
    /// Not a flag: see [`DEFAULT_STALE_READ_GRACE`].
    pub stale_read_grace: Option<Duration>,
    /// How long a replica that contradicted an acknowledged end is left again each time it
    /// is read again (rule 6). Not a flag: see [`DEFAULT_BEHIND_WINDOW`].
    pub behind_window: Duration,
    /// Channel rules switched off, for experiments that show what each one buys
    /// (`--controller-rules-off`, hidden).
    pub rules_off: BTreeSet<Rule>,
    pub tls: Option<TlsConfig>,
}

pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
pub const DEFAULT_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(2);
pub const DEFAULT_MAX_MESSAGE_MIB: usize = 32;
pub const DEFAULT_MAX_IN_FLIGHT: usize = 32;
/// `--controller-max-in-flight off`: as many as tokio's semaphore can count.
pub const NO_IN_FLIGHT_BOUND: usize = tokio::sync::Semaphore::MAX_PERMITS;
pub const DEFAULT_CHANNEL_MAX_AGE: Duration = Duration::from_secs(20);
pub const DEFAULT_CONNECT_PROBE: Duration = Duration::from_secs(1);
/// Rule 6's grace: a replica that forwards reads answers from the leader's state, and one
/// that applies the leader's commits lags a Raft heartbeat (spurctld's is 500 ms), so 2 s is
/// four of them; only a replica answering from a stale copy (a leader cut off from its
/// peers, a follower that forgot its leader) is this late. A property of spurctld, not a
/// choice for the operator's user, so not a flag; `--controller-rules-off
/// read-your-writes` switches the rule off for experiments.
pub const DEFAULT_STALE_READ_GRACE: Duration = Duration::from_secs(2);
/// Rule 6's window: a replica left for a stale read is left again when a later round
/// reaches it again (a leader cut off from its peers may be all the operator reaches for a
/// while), until the same contradiction has lasted this long. Then it is the truth: a
/// report for an attempt the controller had already replaced is acknowledged and ignored,
/// and with one replica (or a Service that reaches only one) the status poll fails
/// meanwhile. 10 s is five status polls, long enough to outlast a short confinement on the
/// stale side (docs/evidence.md, `leader-cut-stale-read`). Not a choice for the operator's
/// user either, so not a flag.
pub const DEFAULT_BEHIND_WINDOW: Duration = Duration::from_secs(10);
/// Dials per round: with two of three replicas unable to serve (followers whose forwards
/// hang), four dials through a Service that picks at random reach the third one 65 times
/// in 81; when a round found none, its calls fail and are retried within a second.
pub const DEFAULT_DIALS: usize = 4;

impl Default for ChannelConfig {
    fn default() -> Self {
        ChannelConfig {
            connect_timeout: Some(DEFAULT_CONNECT_TIMEOUT),
            keepalive: Some(Keepalive {
                interval: DEFAULT_KEEPALIVE_INTERVAL,
                timeout: DEFAULT_KEEPALIVE_INTERVAL,
                while_idle: true,
            }),
            request_timeout: Some(DEFAULT_REQUEST_TIMEOUT),
            max_message_bytes: DEFAULT_MAX_MESSAGE_MIB << 20,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            max_age: Some(DEFAULT_CHANNEL_MAX_AGE),
            connect_probe: Some(DEFAULT_CONNECT_PROBE),
            dials: DEFAULT_DIALS,
            stale_read_grace: Some(DEFAULT_STALE_READ_GRACE),
            behind_window: DEFAULT_BEHIND_WINDOW,
            rules_off: BTreeSet::new(),
            tls: None,
        }
    }
}

impl ChannelConfig {
    /// No bound of any kind: the operator's channel before the seed's fix. Only for the
    /// simulation's `unbounded` profile and for tests that show why the bounds exist.
    pub fn unbounded() -> Self {
        ChannelConfig {
            connect_timeout: None,
            keepalive: None,
            request_timeout: None,
            max_in_flight: NO_IN_FLIGHT_BOUND,
            max_age: None,
            connect_probe: None,
            stale_read_grace: None,
            ..ChannelConfig::default()
        }
    }

    /// How often a connect dials again while its SYN has no answer, and a round starts
    /// another dial while none has a verdict (rule 3 of `controller::policy`): a quarter
    /// of the probe's bound, so a round tries four replicas within one bound.
    pub fn hedge(&self) -> Option<Duration> {
        self.connect_probe
            .map(|bound| bound / 4)
            .filter(|_| !self.rules_off.contains(&Rule::Hedge))
    }
}

/// How to reach spurctld, and the bounds on that channel.
#[derive(Args, Clone, Debug)]
pub struct ControllerArgs {
    /// spurctld's client address: `host:port`, `http://host:port` or `https://host:port`
    /// (IPv6 literals in brackets). The default is the controller's Service in the
    /// operator's namespace on spurctld's client port.
    #[arg(
        long,
        env = "SPUR_OPERATOR_CONTROLLER_ADDR",
        default_value = "spurctld:6817"
    )]
    pub controller_addr: String,

    /// File holding a bearer token sent as `authorization` metadata on every call (for a
    /// spurctld that requires one). Read once at start-up.
    #[arg(long, env = "SPUR_OPERATOR_CONTROLLER_TOKEN_FILE")]
    pub controller_token_file: Option<PathBuf>,

    /// Bound on opening a connection (dial, TLS and HTTP/2 handshake), or `off`. A Service
    /// with no ready endpoint may silently drop the SYN, and Linux gives up only after
    /// ~127 s, so an unbounded connect holds the first registration for minutes. Inside a
    /// cluster a connect completes in milliseconds; 2 s covers a loaded node and keeps a
    /// dropped SYN cheap.
    #[arg(
        long,
        env = "SPUR_OPERATOR_CONTROLLER_CONNECT_TIMEOUT",
        default_value = "2s"
    )]
    pub controller_connect_timeout: Bound,

    /// Bound on each call, or `off`. No call on this channel streams, and spurctld answers
    /// in milliseconds when it answers at all. A follower forwards a write to the leader
    /// over a client with no bound of its own, so after a leader's pod vanishes that write
    /// hangs until this bound, with a healthy connection that keepalive cannot fault: 5 s
    /// keeps it inside an election's length (a GetJobs of 10,000 jobs is ~2 MiB, far
    /// below what 5 s carries).
    #[arg(
        long,
        env = "SPUR_OPERATOR_CONTROLLER_REQUEST_TIMEOUT",
        default_value = "5s"
    )]
    pub controller_request_timeout: Bound,

    /// Interval of HTTP/2 keepalive pings, also while idle, or `off`; a ping unanswered for
    /// as long closes the connection (a round trip inside a cluster is well under a
    /// millisecond, so one number serves both). A connection to a killed controller pod
    /// drops packets silently and would otherwise hang until the kernel gives up
    /// (minutes); a ping finds it dead within twice the interval (4 s by default, inside
    /// the 5 s request bound, so a dead peer is named as such).
    /// spurctld's tonic server sets no minimum ping interval (hyper's HTTP/2 server answers
    /// every PING and never sends ENHANCE_YOUR_CALM for them), so a 2 s ping on one
    /// connection costs it nothing.
    #[arg(
        long,
        env = "SPUR_OPERATOR_CONTROLLER_KEEPALIVE_INTERVAL",
        default_value = "2s"
    )]
    pub controller_keepalive_interval: Bound,

    /// Connect afresh (through the Service, to another replica) once a channel is this old,
    /// or `off`. A replica cut off from its peers may still think it leads: its connection
    /// stays healthy and it answers reads and heartbeats from its stale copy, so neither
    /// keepalive nor a bound notices, while the real leader hears no heartbeat and marks
    /// the nodes DOWN after its timeout (90 s). 20 s is under the heartbeat interval (30 s),
    /// so every round of heartbeats rotates and no two rounds in a row reach the same
    /// replica; at 30 s or more two may, and three missed rounds are a node DOWN. Each
    /// rotation costs about four calls (a Ping of each end, a probe, a redial one time in
    /// three), so a shorter age costs more calls (docs/evidence.md).
    #[arg(
        long,
        env = "SPUR_OPERATOR_CONTROLLER_CHANNEL_MAX_AGE",
        default_value = "20s"
    )]
    pub controller_channel_max_age: Bound,

    /// Bound on the read that vets each new channel through the Service, and how long a
    /// call may wait before the operator looks for another channel, or `off`. What both do,
    /// and the hedged dials (every quarter of this bound) that come with them, is described
    /// once, in the doc of `controller::policy` (and docs/controller-channel.md). Inside
    /// a cluster an answer takes milliseconds: 1 s fires only on a replica in trouble.
    #[arg(
        long,
        env = "SPUR_OPERATOR_CONTROLLER_CONNECT_PROBE",
        default_value = "1s"
    )]
    pub controller_connect_probe: Bound,

    /// Channel rules to switch off, for experiments that measure what each one buys
    /// (comma-separated: drop-on-failure, probe-redial, hedge, patience, avoid, abandon,
    /// rotate, read-your-writes). Never for production.
    #[arg(
        long,
        env = "SPUR_OPERATOR_CONTROLLER_RULES_OFF",
        value_delimiter = ',',
        hide = true
    )]
    pub controller_rules_off: Vec<Rule>,

    /// Largest message sent or received, in MiB. GetJobs over 10,000 active jobs is about
    /// 2 MiB; 32 leaves room for large clusters without allowing unbounded memory.
    #[arg(
        long,
        env = "SPUR_OPERATOR_CONTROLLER_MAX_MESSAGE_MIB",
        default_value_t = DEFAULT_MAX_MESSAGE_MIB,
        value_parser = clap::value_parser!(u16).range(1..=1024).map(usize::from)
    )]
    pub controller_max_message_mib: usize,

    /// Calls to spurctld in flight at once, from every pool (registration, heartbeats,
    /// reconciliations, reports), or `off`; more wait their turn. Only the readiness check
    /// and the channel's own probes go by. spurctld's HTTP/2 server (h2 0.4.16) closes a
    /// connection with GOAWAY ENHANCE_YOUR_CALM ("too_many_data_frames") once the small
    /// DATA frames it has not read yet pass a fixed budget, and every call on it fails: by
    /// our reading of h2, a unary call costs about 500 bytes of it until its handler reads
    /// it, so about 50 calls waiting in a busy spurctld; measured, between 48 and 64 on one
    /// channel. At 32 the real replicas still answer hundreds of registrations and
    /// thousands of heartbeats a second (docs/evidence.md).
    #[arg(
        long,
        env = "SPUR_OPERATOR_CONTROLLER_MAX_IN_FLIGHT",
        default_value_t = DEFAULT_MAX_IN_FLIGHT,
        value_parser = parse_max_in_flight
    )]
    pub controller_max_in_flight: usize,

    /// PEM CA bundle that signs spurctld's certificate (https only); the system's roots
    /// when unset.
    #[arg(long, env = "SPUR_OPERATOR_CONTROLLER_TLS_CA_FILE")]
    pub controller_tls_ca_file: Option<PathBuf>,

    /// PEM client certificate for mutual TLS (https only; needs the key too).
    #[arg(long, env = "SPUR_OPERATOR_CONTROLLER_TLS_CERT_FILE")]
    pub controller_tls_cert_file: Option<PathBuf>,

    /// PEM private key of the client certificate.
    #[arg(long, env = "SPUR_OPERATOR_CONTROLLER_TLS_KEY_FILE")]
    pub controller_tls_key_file: Option<PathBuf>,

    /// Name to verify spurctld's certificate against, when it is not the address's host.
    #[arg(long, env = "SPUR_OPERATOR_CONTROLLER_TLS_DOMAIN")]
    pub controller_tls_domain: Option<String>,
}

/// The validated form of [`ControllerArgs`].
#[derive(Clone, Debug)]
pub struct ControllerSettings {
    pub addr: ControllerAddr,
    pub channel: ChannelConfig,
    pub token: Option<String>,
}

impl ControllerArgs {
    /// Checks every value and loads the files the flags name.
    pub fn validate(&self) -> Result<ControllerSettings, ConfigError> {
        let addr: ControllerAddr =
            self.controller_addr
                .parse()
                .map_err(|e: super::AddressError| ConfigError::Invalid {
                    flag: "--controller-addr",
                    reason: e.to_string(),
                })?;
        let keepalive = self
            .controller_keepalive_interval
            .0
            .map(|interval| Keepalive {
                interval,
                timeout: interval,
                while_idle: true,
            });
        let channel = ChannelConfig {
            connect_timeout: self.controller_connect_timeout.0,
            keepalive,
            request_timeout: self.controller_request_timeout.0,
            max_message_bytes: self.controller_max_message_mib << 20,
            max_in_flight: self.controller_max_in_flight,
            max_age: self.controller_channel_max_age.0,
            connect_probe: self.controller_connect_probe.0,
            dials: DEFAULT_DIALS,
            stale_read_grace: Some(DEFAULT_STALE_READ_GRACE),
            behind_window: DEFAULT_BEHIND_WINDOW,
            rules_off: self.controller_rules_off.iter().copied().collect(),
            tls: self.tls(addr.scheme)?,
        };
        let token = self
            .controller_token_file
            .as_deref()
            .map(read_token)
            .transpose()?;
        Ok(ControllerSettings {
            addr,
            channel,
            token,
        })
    }

    fn tls(&self, scheme: Scheme) -> Result<Option<TlsConfig>, ConfigError> {
        let any_tls_flag = self.controller_tls_ca_file.is_some()
            || self.controller_tls_cert_file.is_some()
            || self.controller_tls_key_file.is_some()
            || self.controller_tls_domain.is_some();
        if scheme == Scheme::Http {
            if any_tls_flag {
                return Err(ConfigError::Invalid {
                    flag: "--controller-addr",
                    reason: "TLS options are set but the address is not https://".into(),
                });
            }
            return Ok(None);
        }
        let ca_pem = self
            .controller_tls_ca_file
            .as_deref()
            .map(|p| read_file("--controller-tls-ca-file", p))
            .transpose()?;
        let identity = match (
            &self.controller_tls_cert_file,
            &self.controller_tls_key_file,
        ) {
            (Some(cert), Some(key)) => Some((
                read_file("--controller-tls-cert-file", cert)?,
                read_file("--controller-tls-key-file", key)?,
            )),
            (None, None) => None,
            (Some(_), None) => {
                return Err(ConfigError::Invalid {
                    flag: "--controller-tls-key-file",
                    reason: "required with --controller-tls-cert-file".into(),
                });
            }
            (None, Some(_)) => {
                return Err(ConfigError::Invalid {
                    flag: "--controller-tls-cert-file",
                    reason: "required with --controller-tls-key-file".into(),
                });
            }
        };
        Ok(Some(TlsConfig {
            ca_pem,
            identity,
            domain: self.controller_tls_domain.clone(),
        }))
    }
}

/// A count of calls from 1 to 65,535, or `off`: no bound.
fn parse_max_in_flight(text: &str) -> Result<usize, String> {
    if text == "off" {
        return Ok(NO_IN_FLIGHT_BOUND);
    }
    match text.parse::<u16>() {
        Ok(n) if n > 0 => Ok(usize::from(n)),
        _ => Err(format!(
            "`{text}` is not a count of calls from 1 to 65535, or `off`"
        )),
    }
}

fn read_token(path: &Path) -> Result<String, ConfigError> {
    const FLAG: &str = "--controller-token-file";
    let bytes = read_file(FLAG, path)?;
    let token = String::from_utf8(bytes)
        .map_err(|_| ConfigError::Invalid {
            flag: FLAG,
            reason: format!("{} is not UTF-8 text", path.display()),
        })?
        .trim()
        .to_owned();
    if token.is_empty() {
        return Err(ConfigError::Invalid {
            flag: FLAG,
            reason: format!("{} is empty", path.display()),
        });
    }
    // It travels as an HTTP/2 header value: visible ASCII only.
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ConfigError::Invalid {
            flag: FLAG,
            reason: format!(
                "{} holds characters a header cannot carry (only visible ASCII)",
                path.display()
            ),
        });
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        controller: ControllerArgs,
    }

    fn parse(args: &[&str]) -> Result<ControllerSettings, String> {
        let cli = Cli::try_parse_from(std::iter::once("test").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        cli.controller.validate().map_err(|e| e.to_string())
    }

    #[test]
    fn flag_defaults_match_the_config_defaults() {
        let settings = parse(&[]).unwrap();
        assert_eq!(settings.channel, ChannelConfig::default());
        assert_eq!(settings.addr.to_string(), "http://spurctld:6817");
        assert_eq!(settings.token, None);
    }

    #[test]
    fn channel_rules_can_be_switched_off_by_name_and_a_wrong_name_is_named() {
        let settings = parse(&["--controller-rules-off", "hedge,rotate"]).unwrap();
        assert_eq!(
            settings.channel.rules_off,
            BTreeSet::from([Rule::Hedge, Rule::Rotate])
        );
        assert_eq!(settings.channel.hedge(), None);
        let err = parse(&["--controller-rules-off", "hedge,recheck"]).unwrap_err();
        assert!(err.contains("unknown rule `recheck`"), "{err}");
    }

    #[test]
    fn the_bound_on_calls_in_flight_is_a_count_or_off_and_a_wrong_one_is_named() {
        let bound = |flag: &str| parse(&["--controller-max-in-flight", flag]);
        assert_eq!(bound("8").unwrap().channel.max_in_flight, 8);
        assert_eq!(
            bound("off").unwrap().channel.max_in_flight,
            NO_IN_FLIGHT_BOUND
        );
        for wrong in ["0", "many", "70000"] {
            let err = bound(wrong).unwrap_err();
            assert!(err.contains("from 1 to 65535, or `off`"), "{wrong}: {err}");
        }
    }

    #[test]
    fn keepalive_finds_a_dead_peer_before_the_request_bound_fires() {
        let c = ChannelConfig::default();
        let keepalive = c.keepalive.unwrap();
        assert!(keepalive.interval + keepalive.timeout < c.request_timeout.unwrap());
    }

    #[test]
    fn bounds_parse_and_switch_off() {
        let settings = parse(&[
            "--controller-connect-timeout",
            "2s",
            "--controller-request-timeout",
            "off",
            "--controller-keepalive-interval",
            "1m 30s",
        ])
        .unwrap();
        assert_eq!(
            settings.channel.connect_timeout,
            Some(Duration::from_secs(2))
        );
        assert_eq!(settings.channel.request_timeout, None);
        let keepalive = settings.channel.keepalive.unwrap();
        assert_eq!(keepalive.interval, Duration::from_secs(90));
        assert_eq!(keepalive.timeout, Duration::from_secs(90));

        let off = parse(&["--controller-keepalive-interval", "off"]).unwrap();
        assert_eq!(off.channel.keepalive, None);
    }

    #[test]
    fn bad_values_name_their_flag() {
        let err = parse(&["--controller-connect-timeout", "soon"]).unwrap_err();
        assert!(err.contains("--controller-connect-timeout"), "{err}");
        let err = parse(&["--controller-request-timeout", "0s"]).unwrap_err();
        assert!(err.contains("zero"), "{err}");
        let err = parse(&["--controller-addr", "ftp://x:1"]).unwrap_err();
        assert!(err.starts_with("--controller-addr:"), "{err}");
        let err = parse(&["--controller-tls-ca-file", "/nonexistent"]).unwrap_err();
        assert!(err.contains("not https://"), "{err}");
        let err = parse(&[
            "--controller-addr",
            "https://spurctld:6817",
            "--controller-tls-ca-file",
            "/nonexistent/ca.pem",
        ])
        .unwrap_err();
        assert!(
            err.starts_with("--controller-tls-ca-file: cannot read /nonexistent/ca.pem"),
            "{err}"
        );
        let err = parse(&[
            "--controller-addr",
            "https://spurctld:6817",
            "--controller-tls-cert-file",
            "/nonexistent/cert.pem",
        ])
        .unwrap_err();
        assert!(
            err.starts_with("--controller-tls-key-file: required"),
            "{err}"
        );
    }

    #[test]
    fn token_file_is_trimmed_and_checked() {
        let dir = std::env::temp_dir().join(format!("spur-token-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good");
        std::fs::write(&good, "s3cr3t-token\n").unwrap();
        let bad = dir.join("bad");
        std::fs::write(&bad, "two words").unwrap();
        let empty = dir.join("empty");
        std::fs::write(&empty, "\n").unwrap();

        let settings = parse(&["--controller-token-file", good.to_str().unwrap()]).unwrap();
        assert_eq!(settings.token.as_deref(), Some("s3cr3t-token"));
        let err = parse(&["--controller-token-file", bad.to_str().unwrap()]).unwrap_err();
        assert!(err.contains("visible ASCII"), "{err}");
        let err = parse(&["--controller-token-file", empty.to_str().unwrap()]).unwrap_err();
        assert!(err.contains("is empty"), "{err}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}

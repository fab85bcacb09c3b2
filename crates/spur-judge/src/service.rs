//! The kinds of `spurctld` Service a scenario runs behind: upstream's headless Service, or
//! a ClusterIP one with each way kube-proxy treats a connection while no endpoint is
//! ready. A stage builds the Service; the plan and the reports only name it.

/// What a ClusterIP Service does with a connection when no replica is ready: the three
/// ways of docs/specs.md fidelity row 22, which differ in what a later ready endpoint
/// changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum NoEndpoint {
    /// The SYN is sent to an address that swallows it, after conntrack confirmed the
    /// mapping, so every retransmit follows it: the connect fails only when the kernel
    /// gives up (~127 s), whatever becomes ready meanwhile. The seed's cluster.
    Drop,
    /// Refused at once (kube-proxy's own REJECT rule for a Service without endpoints).
    Reject,
    /// The SYN is dropped before conntrack confirms the connection, so each kernel
    /// retransmit (at 1, 3, 7, 15, 31, 63 s) is routed afresh and connects once an
    /// endpoint is ready.
    DropUnconfirmed,
}

impl NoEndpoint {
    /// Its command-line value (`--no-endpoint`).
    pub fn name(self) -> &'static str {
        match self {
            NoEndpoint::Drop => "drop",
            NoEndpoint::Reject => "reject",
            NoEndpoint::DropUnconfirmed => "drop-unconfirmed",
        }
    }

    /// Parses [`NoEndpoint::name`].
    pub fn parse(s: &str) -> Result<Self, String> {
        [
            NoEndpoint::Drop,
            NoEndpoint::Reject,
            NoEndpoint::DropUnconfirmed,
        ]
        .into_iter()
        .find(|v| v.name() == s)
        .ok_or_else(|| format!("`{s}`: expected drop, reject or drop-unconfirmed"))
    }
}

/// The `spurctld` Service's kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ServiceKind {
    /// A virtual address that routes each connection to a ready endpoint picked at
    /// random, as kube-proxy does; what the seed's cluster had.
    ClusterIp,
    /// No virtual address: the name resolves to every ready endpoint (none while none is
    /// ready), as upstream's manifests deploy spurctld (`clusterIP: None`); the client
    /// picks among them itself.
    Headless,
}

impl ServiceKind {
    pub fn name(self) -> &'static str {
        match self {
            ServiceKind::ClusterIp => "clusterip",
            ServiceKind::Headless => "headless",
        }
    }

    /// Parses [`ServiceKind::name`] (a command-line value).
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "clusterip" => Ok(ServiceKind::ClusterIp),
            "headless" => Ok(ServiceKind::Headless),
            _ => Err(format!("`{s}`: expected clusterip or headless")),
        }
    }
}

/// The `spurctld` Service as a world has it: its kind and, for a ClusterIP one, what it
/// does with a SYN while no replica is ready. Each seed draws one of [`ServiceSetup::ALL`]
/// unless a run forces one (`--service`, `--no-endpoint`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ServiceSetup {
    pub kind: ServiceKind,
    /// Meaningless for a headless Service, whose name resolves to no address at all; it is
    /// kept at [`NoEndpoint::Drop`] there, so one setup has one value.
    pub no_endpoint: NoEndpoint,
}

impl ServiceSetup {
    /// Every setup users deploy or the seed's cluster had: upstream's headless Service,
    /// and a ClusterIP one with each way of docs/specs.md fidelity row 22.
    pub const ALL: [ServiceSetup; 4] = [
        ServiceSetup::HEADLESS,
        ServiceSetup::cluster_ip(NoEndpoint::Drop),
        ServiceSetup::cluster_ip(NoEndpoint::Reject),
        ServiceSetup::cluster_ip(NoEndpoint::DropUnconfirmed),
    ];

    pub const HEADLESS: ServiceSetup = ServiceSetup {
        kind: ServiceKind::Headless,
        no_endpoint: NoEndpoint::Drop,
    };

    pub const fn cluster_ip(no_endpoint: NoEndpoint) -> ServiceSetup {
        ServiceSetup {
            kind: ServiceKind::ClusterIp,
            no_endpoint,
        }
    }

    /// The setup of a kind and a way with no endpoint (ignored for a headless Service).
    pub fn new(kind: ServiceKind, no_endpoint: NoEndpoint) -> ServiceSetup {
        match kind {
            ServiceKind::Headless => ServiceSetup::HEADLESS,
            ServiceKind::ClusterIp => ServiceSetup::cluster_ip(no_endpoint),
        }
    }

    /// Its name in reports: `headless`, `clusterip/drop`, `clusterip/reject`, ...
    pub fn name(self) -> String {
        match self.kind {
            ServiceKind::Headless => self.kind.name().to_owned(),
            ServiceKind::ClusterIp => format!("{}/{}", self.kind.name(), self.no_endpoint.name()),
        }
    }

    /// The flags that force it (`spur-sim run` and `replay`).
    pub fn args(self) -> String {
        match self.kind {
            ServiceKind::Headless => format!(" --service {}", self.kind.name()),
            ServiceKind::ClusterIp => format!(
                " --service {} --no-endpoint {}",
                self.kind.name(),
                self.no_endpoint.name()
            ),
        }
    }
}

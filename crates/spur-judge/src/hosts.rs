//! The names every stage gives the parts of a scenario's world, so a plan, a check and a
//! report mean the same host in the simulation and in the lab.

use std::time::Duration;

/// The operator's host in every scenario.
pub const OPERATOR: &str = "operator";
/// The second operator replica's host, in scenarios that run two.
pub const OPERATOR_B: &str = "operator-b";
/// The host that probes the operator's `/readyz`, as a kubelet would.
pub const PROBER: &str = "kubelet-prober";
/// The host that probes the second replica's `/readyz`.
pub const PROBER_B: &str = "kubelet-prober-b";
/// How often the checks sample the world: the resolution of every measured lag.
pub const SAMPLE: Duration = Duration::from_millis(250);
/// A killed controller pod is replaced after this long, as a StatefulSet does.
pub const REPLACE_AFTER: Duration = Duration::from_secs(10);
/// The namespace the operator runs in (its Lease lives there).
pub const OPERATOR_NAMESPACE: &str = "spur-system";
/// The Lease the operator replicas elect their leader with (`--lease-name`'s default),
/// as `namespace/name`.
pub const OPERATOR_LEASE: &str = "spur-system/spur-operator";
/// Where the simulated API server listens.
pub const KUBE_API_HOST: &str = "kube-api";
pub const KUBE_API_PORT: u16 = 6443;
/// The name of the controller's client Service.
pub const CONTROLLER_SERVICE: &str = "spurctld";

//! The `spurctld` Service: a kube-proxy-like connector owned by the harness.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use spur_fakes::clock::sim_elapsed;
use spur_operator::net::{Dialer, Turns, dial_in_turn};

use turmoil::net::TcpStream;

use super::{Network, NoEndpoint, ServiceKind, TurmoilDialer, syn_timed_out};

/// One Service's endpoints, with the propagation delay applied when read.
#[derive(Debug)]
pub(super) struct ServiceTable {
    endpoints: BTreeMap<String, EndpointState>,
}

#[derive(Debug)]
struct EndpointState {
    ready: bool,
    /// What the Service saw before the last change, until the change propagates.
    previously_ready: bool,
    changed_at: Duration,
}

impl EndpointState {
    fn visible(&self, now: Duration, delay: Duration) -> bool {
        if now >= self.changed_at + delay {
            self.ready
        } else {
            self.previously_ready
        }
    }
}

impl ServiceTable {
    pub(super) fn new() -> Self {
        Self {
            endpoints: BTreeMap::new(),
        }
    }

    /// Records a readiness change; returns whether anything changed.
    pub(super) fn set_ready(
        &mut self,
        host: &str,
        ready: bool,
        now: Duration,
        delay: Duration,
    ) -> bool {
        match self.endpoints.get_mut(host) {
            Some(state) if state.ready == ready => false,
            Some(state) => {
                state.previously_ready = state.visible(now, delay);
                state.ready = ready;
                state.changed_at = now;
                true
            }
            None => {
                self.endpoints.insert(
                    host.to_owned(),
                    EndpointState {
                        ready,
                        previously_ready: false,
                        changed_at: now,
                    },
                );
                true
            }
        }
    }

    /// The endpoints the Service routes to at `now`, in name order.
    pub(super) fn visible_ready(&self, now: Duration, delay: Duration) -> Vec<String> {
        self.endpoints
            .iter()
            .filter(|(_, state)| state.visible(now, delay))
            .map(|(host, _)| host.clone())
            .collect()
    }
}

/// A dialer that routes Service names (`spurctld:6817`) as the Service's kind does, and
/// every other name straight through [`TurmoilDialer`].
///
/// A ClusterIP Service connects to a ready endpoint picked with the seeded RNG. With no
/// ready endpoint the SYN is dropped: the connect fails after the kernel's SYN timeout even
/// if an endpoint becomes ready meanwhile (conntrack keeps the first decision, which is
/// what stalled the seed's operator: docs/specs.md, "The seed's failures"), unless the
/// caller's own connect timeout fires first. In the `Reject` variant it is refused at once; in the `DropUnconfirmed`
/// one each kernel retransmit is routed afresh.
///
/// A headless Service's name resolves to the ready endpoints, in name order, and the dial
/// goes through the operator's own [`dial_in_turn`], as `TcpNetwork` dials a name with
/// several addresses; with no ready endpoint the name resolves to nothing and the dial
/// fails at once.
#[derive(Clone, Debug)]
pub struct ServiceDialer {
    plain: TurmoilDialer,
    /// Where this dialer's dials of a headless Service start: one counter per dialer
    /// (`TcpNetwork`'s is one per process), so no other world's dials move it.
    turns: Arc<Turns>,
}

impl ServiceDialer {
    pub(super) fn new(plain: TurmoilDialer) -> Self {
        Self {
            plain,
            turns: Arc::new(Turns::new()),
        }
    }

    /// The dialer used for names that are not Services.
    pub fn plain(&self) -> &TurmoilDialer {
        &self.plain
    }
}

impl Dialer for ServiceDialer {
    type Stream = TcpStream;

    fn dial(&self, host: &str, port: u16) -> BoxFuture<'static, std::io::Result<TcpStream>> {
        let net = self.plain.network();
        let Some(service) = net.service_for(host) else {
            return self.plain.dial(host, port);
        };
        let local = self.plain.local().to_owned();
        let at = sim_elapsed();
        if net.config().service == ServiceKind::Headless {
            return self.dial_headless(host, port, &service, &local, at);
        }
        match net.pick_endpoint(&service, at) {
            Some(endpoint) => {
                net.trace()
                    .record(at, &local, format!("service {service} -> {endpoint}"));
                self.plain.dial(&endpoint, port)
            }
            None => Box::pin(no_endpoint(
                net.clone(),
                self.plain.clone(),
                Dial {
                    service,
                    local,
                    host: host.to_owned(),
                    port,
                    at,
                },
            )),
        }
    }
}

impl ServiceDialer {
    /// A headless Service's dial: the name resolves to the ready endpoints, dialed in turn
    /// as the operator's own network does.
    fn dial_headless(
        &self,
        host: &str,
        port: u16,
        service: &str,
        local: &str,
        at: Duration,
    ) -> BoxFuture<'static, std::io::Result<TcpStream>> {
        let net = self.plain.network();
        let endpoints = net.ready_endpoints(service, at);
        net.trace().record(
            at,
            local,
            format!("service {service} resolves to [{}]", endpoints.join(", ")),
        );
        let plain = self.plain.clone();
        let start = self.turns.next();
        let host = host.to_owned();
        Box::pin(async move {
            dial_in_turn(&host, &endpoints, start, |endpoint| {
                plain.dial(endpoint, port)
            })
            .await
        })
    }
}

/// One dial of a ClusterIP Service that found no ready endpoint.
struct Dial {
    service: String,
    /// The dialing host.
    local: String,
    /// The name dialed, and its port.
    host: String,
    port: u16,
    /// When the dial began.
    at: Duration,
}

/// What a ClusterIP Service does with a SYN while no endpoint is ready, by the network's
/// [`NoEndpoint`].
async fn no_endpoint(net: Network, plain: TurmoilDialer, dial: Dial) -> std::io::Result<TcpStream> {
    let Dial {
        service,
        local,
        host,
        port,
        at,
    } = &dial;
    match net.config().no_endpoint {
        NoEndpoint::Reject => {
            net.trace().record(
                *at,
                local,
                format!("service {service}: no endpoint, refused"),
            );
            Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionRefused,
                format!("connect to {host}:{port}: connection refused"),
            ))
        }
        NoEndpoint::DropUnconfirmed => drop_unconfirmed(&net, &plain, &dial).await,
        NoEndpoint::Drop => {
            net.trace().record(
                *at,
                local,
                format!("service {service}: no endpoint, SYN dropped"),
            );
            tokio::time::sleep(net.config().syn_timeout()).await;
            Err(kernel_gave_up(&net, local, host, *port))
        }
    }
}

/// A SYN dropped before conntrack confirmed it: each retransmit is NATed afresh, and the
/// first one sent while an endpoint is ready goes there (from then on the plain dial's own
/// SYN timing holds, as a confirmed mapping's does).
async fn drop_unconfirmed(
    net: &Network,
    plain: &TurmoilDialer,
    dial: &Dial,
) -> std::io::Result<TcpStream> {
    let Dial {
        service,
        local,
        host,
        port,
        at,
    } = dial;
    net.trace().record(
        *at,
        local,
        format!("service {service}: no endpoint, SYN dropped unconfirmed"),
    );
    let config = net.config();
    let mut rto = config.syn_initial_rto;
    for _ in 0..config.syn_retries {
        tokio::time::sleep(rto).await;
        rto *= 2;
        if let Some(endpoint) = net.pick_endpoint(service, sim_elapsed()) {
            net.trace().record(
                sim_elapsed(),
                local,
                format!("service {service} -> {endpoint} (a retransmit)"),
            );
            return plain.dial(&endpoint, *port).await;
        }
    }
    tokio::time::sleep(rto).await;
    Err(kernel_gave_up(net, local, host, *port))
}

/// The kernel giving up on the SYN, traced now.
fn kernel_gave_up(net: &Network, local: &str, host: &str, port: u16) -> std::io::Error {
    net.trace().record(
        sim_elapsed(),
        local,
        format!("connect to {host}:{port} timed out (kernel)"),
    );
    syn_timed_out(host, port)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DELAY: Duration = Duration::from_secs(1);

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn readiness_reaches_the_service_after_the_propagation_delay() {
        let mut table = ServiceTable::new();
        table.set_ready("a", true, secs(10), DELAY);
        assert!(table.visible_ready(secs(10), DELAY).is_empty());
        assert_eq!(table.visible_ready(secs(11), DELAY), ["a"]);

        table.set_ready("a", false, secs(20), DELAY);
        assert_eq!(table.visible_ready(secs(20), DELAY), ["a"]);
        assert!(table.visible_ready(secs(21), DELAY).is_empty());
    }

    #[test]
    fn repeating_the_same_readiness_does_not_restart_the_delay() {
        let mut table = ServiceTable::new();
        assert!(table.set_ready("a", true, secs(0), DELAY));
        assert!(!table.set_ready("a", true, secs(5), DELAY));
        assert_eq!(table.visible_ready(secs(1), DELAY), ["a"]);
    }
}

//! The simulated network: the Service with no ready replica, the headless kind, the
//! kernel's SYN timeout, tonic, hyper and axum over turmoil.

use crate::common;

use std::time::Duration;

use common::{channel, now};
use spur_operator::net::Connector;
use spur_sim::net::{NetConfig, NoEndpoint, ServiceKind, SimListener};
use spur_sim::world::{World, WorldConfig};

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

#[test]
fn a_connect_through_a_service_with_no_ready_replica_fails_at_the_clients_connect_timeout() {
    let mut world = World::new(1);
    // No replica started: the Service has no endpoint, so the SYN is dropped.
    let dialer = world.dialer("operator");
    world.client("operator", async move {
        let started = now();
        let result = channel(dialer, "spurctld", |e| {
            e.connect_timeout(Duration::from_secs(2))
        })
        .await;
        let took = now() - started;
        assert!(result.is_err(), "no replica is ready");
        assert!(
            (2.0..2.05).contains(&secs(took)),
            "the connect hung until the 2 s connect timeout, took {took:?}"
        );
        Ok(())
    });
    world.run().unwrap();
}

#[test]
fn without_a_client_timeout_the_connect_fails_at_the_kernels_127_seconds() {
    let mut world = World::new(2);
    // A replica that becomes ready meanwhile does not help: the dropped SYN's fate is
    // sealed, as conntrack kept it on the seed's cluster.
    world.at(Duration::from_secs(10), |w| w.start_replica(0));
    let dialer = world.dialer("operator");
    world.client("operator", async move {
        let started = now();
        let error = channel(dialer, "spurctld", |e| e).await.unwrap_err();
        let took = now() - started;
        assert!(
            (127.0..127.05).contains(&secs(took)),
            "the connect hung for the kernel's SYN retries, took {took:?}"
        );
        let status = tonic::Status::from_error(Box::new(error));
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        Ok(())
    });
    world.run().unwrap();
}

#[test]
fn the_reject_variant_refuses_at_once() {
    let mut world = World::with_config(
        3,
        with_net(NetConfig {
            no_endpoint: NoEndpoint::Reject,
            ..NetConfig::default()
        }),
    );
    let dialer = world.dialer("operator");
    world.client("operator", async move {
        let started = now();
        assert!(channel(dialer, "spurctld", |e| e).await.is_err());
        assert!(now() - started < Duration::from_millis(10));
        Ok(())
    });
    world.run().unwrap();
}

/// A world whose network is `net`, everything else the default.
fn with_net(net: NetConfig) -> WorldConfig {
    WorldConfig {
        net,
        ..WorldConfig::default()
    }
}

/// A ClusterIP Service that drops a SYN before conntrack confirms it.
fn unconfirmed() -> WorldConfig {
    with_net(NetConfig {
        no_endpoint: NoEndpoint::DropUnconfirmed,
        ..NetConfig::default()
    })
}

#[test]
fn a_syn_dropped_before_conntrack_confirms_it_connects_at_the_first_retransmit_after_a_replica_is_ready()
 {
    let mut world = World::with_config(3, unconfirmed());
    // Ready at 10 s, routed from 11 s (the propagation delay): the retransmits at 1, 3
    // and 7 s are dropped, the one at 15 s connects.
    world.at(Duration::from_secs(10), |w| w.start_replica(0));
    let dialer = world.dialer("operator");
    world.client("operator", async move {
        let started = now();
        let mut client = channel(dialer, "spurctld", |e| e).await.expect("routed");
        let took = now() - started;
        assert!(
            (15.0..15.05).contains(&secs(took)),
            "connected at the fourth retransmit, took {took:?}"
        );
        let ping = client.ping(()).await.expect("ping").into_inner();
        assert_eq!(ping.hostname, "spurctld-0");
        Ok(())
    });
    world.run().unwrap();
}

#[test]
fn a_syn_dropped_before_conntrack_confirms_it_still_fails_at_127_seconds_with_no_replica() {
    let mut world = World::with_config(3, unconfirmed());
    let dialer = world.dialer("operator");
    world.client("operator", async move {
        let started = now();
        assert!(channel(dialer, "spurctld", |e| e).await.is_err());
        let took = now() - started;
        assert!((127.0..127.05).contains(&secs(took)), "took {took:?}");
        Ok(())
    });
    world.run().unwrap();
}

#[test]
fn a_ready_replica_is_routed_only_after_the_propagation_delay() {
    let mut world = World::new(4);
    world.start_replica(0);
    let dialer = world.dialer("operator");
    world.client("operator", async move {
        // The replica is ready within the first milliseconds; the Service learns it 1 s
        // later. A connect before that is dropped (bounded here by a short timeout).
        let early = channel(dialer.clone(), "spurctld", |e| {
            e.connect_timeout(Duration::from_millis(500))
        })
        .await;
        assert!(early.is_err(), "routed before the endpoint propagated");
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mut client = channel(dialer, "spurctld", |e| e).await.expect("routed");
        let ping = client.ping(()).await.expect("ping").into_inner();
        assert_eq!(ping.hostname, "spurctld-0");
        Ok(())
    });
    world.run().unwrap();
}

fn headless() -> WorldConfig {
    with_net(NetConfig {
        service: ServiceKind::Headless,
        ..NetConfig::default()
    })
}

#[test]
fn a_headless_service_with_no_ready_replica_resolves_to_nothing_and_the_dial_fails_at_once() {
    let mut world = World::with_config(5, headless());
    let dialer = world.dialer("operator");
    world.client("operator", async move {
        let started = now();
        let error = channel(dialer, "spurctld", |e| e).await.unwrap_err();
        assert!(
            now() - started < Duration::from_millis(10),
            "no SYN to wait on"
        );
        assert!(
            format!("{error:?}").contains("spurctld resolves to no address"),
            "{error:?}"
        );
        Ok(())
    });
    world.run().unwrap();
}

/// A headless world under `seed` with the three replicas started.
fn headless_replicas(seed: u64) -> World {
    let mut world = World::with_config(seed, headless());
    for slot in 0..3 {
        world.start_replica(slot);
    }
    world
}

#[test]
fn dials_of_a_headless_service_take_the_ready_replicas_in_turn() {
    let mut world = headless_replicas(6);
    let dialer = world.dialer("operator");
    world.client("operator", async move {
        // Each replica is in the records once its readiness propagated (1 s).
        tokio::time::sleep(Duration::from_secs(2)).await;
        let mut answered = Vec::new();
        for _ in 0..4 {
            let mut client = channel(dialer.clone(), "spurctld", |e| e).await.unwrap();
            answered.push(client.ping(()).await.unwrap().into_inner().hostname);
        }
        assert_eq!(
            answered,
            ["spurctld-0", "spurctld-1", "spurctld-2", "spurctld-0"]
        );
        Ok(())
    });
    world.run().unwrap();
}

#[test]
fn a_replica_that_swallows_syns_holds_up_only_the_dials_that_start_at_it() {
    // A black-holed pod stays in the records until its readiness probe fails. tokio's
    // own connect would start every dial at the first record and wait out the bound on it
    // each time; dialing in turn, two dials in three reach a replica at once.
    let mut world = headless_replicas(7);
    world.at(Duration::from_secs(2), |w| {
        w.partition("operator", "spurctld-0")
    });
    let dialer = world.dialer("operator");
    world.client("operator", async move {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let mut outcomes = Vec::new();
        for _ in 0..6 {
            let started = now();
            let dialed = channel(dialer.clone(), "spurctld", |e| {
                e.connect_timeout(Duration::from_secs(1))
            })
            .await;
            outcomes.push((dialed.is_ok(), (now() - started).as_millis() / 100));
        }
        // Tenths of a second each took: the starts at spurctld-0 hit the 1 s bound.
        assert_eq!(
            outcomes,
            [
                (false, 10),
                (true, 0),
                (true, 0),
                (false, 10),
                (true, 0),
                (true, 0)
            ]
        );
        Ok(())
    });
    world.run().unwrap();
}

#[test]
fn axum_serves_and_a_hyper_client_connects_over_turmoil() {
    let mut world = World::new(5);
    world.host("web", || async {
        let router = axum::Router::new().route("/hello", axum::routing::get(|| async { "hi" }));
        axum::serve(SimListener::bind(8080).await?, router).await?;
        Ok(())
    });
    let dialer = world.plain_dialer("client");
    world.client("client", async move {
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build::<_, axum::body::Body>(Connector::new(dialer));
        let response = client.get("http://web:8080/hello".parse()?).await?;
        assert_eq!(response.status(), 200);
        let body = axum::body::to_bytes(axum::body::Body::new(response.into_body()), 1024).await?;
        assert_eq!(&body[..], b"hi");
        Ok(())
    });
    world.run().unwrap();
}

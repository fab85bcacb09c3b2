//! Feeds a [`LeaseHistory`] from the API server's change feed: who each Lease named as
//! holder, as the store applied it.

use std::time::Duration;

pub use spur_judge::leases::{LeaseHistory, Term};

use crate::api_server::ApiServer;
use crate::api_server::store::{Change, ChangeKind};
use crate::api_server::writes::lease_holder;
use crate::clock::WorldTime;

/// A history fed by `api`'s changes from now on (attach it before anyone writes a
/// Lease). `time` gives the simulated time of a change made outside any host.
pub fn attach(api: &ApiServer, time: WorldTime) -> LeaseHistory {
    let history = LeaseHistory::default();
    let feed = history.clone();
    api.observe(move |change| {
        let at = crate::clock::host_elapsed().unwrap_or_else(|| time.elapsed());
        apply(&feed, change, at);
    });
    history
}

fn apply(history: &LeaseHistory, change: &Change, at: Duration) {
    if change.resource.plural != "leases" || change.resource.group != "coordination.k8s.io" {
        return;
    }
    let object = &*change.object;
    let key = format!(
        "{}/{}",
        object["metadata"]["namespace"].as_str().unwrap_or_default(),
        object["metadata"]["name"].as_str().unwrap_or_default()
    );
    let holder = match change.kind {
        ChangeKind::Deleted => None,
        ChangeKind::Added | ChangeKind::Modified => lease_holder(object),
    };
    history.record(&key, change.rv, at, holder);
}

//! Where the controllers' pods run. The fakes have no pod scheduler (the operator binds
//! its own pods), so a pod made here gets `spec.nodeName` round-robin among the Ready,
//! schedulable nodes that are not being deleted; while there is no such node it stays
//! unbound, and a later pass binds it once one appears.

use serde_json::{Value, json};

use super::common::{controller_uid, deleting, name, namespace};
use crate::api_server::ApiServer;

/// Round-robin over the Ready nodes, in name order.
#[derive(Debug, Default)]
pub struct Scheduler {
    next: usize,
}

impl Scheduler {
    /// The next node to run a pod on, if any node is Ready.
    pub fn pick(&mut self, api: &ApiServer) -> Option<String> {
        let nodes: Vec<String> = api
            .list("v1", "Node")
            .ok()?
            .iter()
            .filter(|n| node_ready(n))
            .map(|n| name(n).to_owned())
            .collect();
        if nodes.is_empty() {
            return None;
        }
        let node = nodes[self.next % nodes.len()].clone();
        self.next = self.next.wrapping_add(1);
        Some(node)
    }

    /// Sets `spec.nodeName` on `pod` (not yet created) when a node is Ready.
    pub fn place(&mut self, api: &ApiServer, pod: &mut Value) {
        if let Some(node) = self.pick(api) {
            pod["spec"]["nodeName"] = json!(node);
        }
    }

    /// Binds the unbound pods these controllers made (a controller of `owner_kinds`).
    pub fn bind_unbound(&mut self, api: &ApiServer, owner_kinds: &[&str]) {
        let Ok(pods) = api.list("v1", "Pod") else {
            return;
        };
        for pod in &pods {
            let ours = controller_uid(pod).is_some()
                && pod["metadata"]["ownerReferences"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|r| {
                        r["controller"] == true
                            && owner_kinds.contains(&r["kind"].as_str().unwrap_or_default())
                    });
            if !ours || deleting(pod) || pod["spec"]["nodeName"].is_string() {
                continue;
            }
            let Some(node) = self.pick(api) else {
                return;
            };
            let patch = json!({"spec": {"nodeName": node}});
            let _ = api.merge_patch("v1", "Pod", Some(namespace(pod)), name(pod), &patch, false);
        }
    }
}

fn node_ready(node: &Value) -> bool {
    let ready = node["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    });
    ready && !deleting(node) && node["spec"]["unschedulable"] != true
}

//! `spur-sim kube-api`: the API server over real TCP, with a kubeconfig for kube-rs and kubectl.

use std::{
    io,
    net::SocketAddr,
    path::{Path, PathBuf},
};

use k8s_openapi::jiff::Timestamp;

use super::auth::UserInfo;
use super::server::{ApiServer, ApiServerConfig};
use super::service_ips::ServiceIpRange;
use super::store::StoreConfig;
use crate::clock::TimeSource;

/// Serve the simulated Kubernetes API server over TCP until stopped.
#[derive(clap::Args, Debug, Clone)]
pub struct KubeApiArgs {
    /// Address to listen on; port 0 picks a free one (the kubeconfig gets the real one).
    #[arg(long, default_value = "127.0.0.1:8001")]
    pub listen: SocketAddr,
    /// Where to write a kubeconfig pointing at this server (plain HTTP, an admin's token;
    /// kubectl sends no credentials over HTTP, and a request without any acts as the admin).
    #[arg(long)]
    pub kubeconfig: PathBuf,
    /// Start with this many labelled nodes (node-0, node-1, ...).
    #[arg(long, default_value_t = 0)]
    pub seed_nodes: usize,
    /// Seeds uids and generated names.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Stamp objects with the simulation's clock (2026-01-01 plus elapsed time) instead of
    /// the wall clock; the default is the wall clock, as the operator's own clock on a laptop
    /// is.
    #[arg(long)]
    pub simulated_clock: bool,
}

/// Runs `spur-sim kube-api` (returns only on an I/O error).
pub async fn run(args: KubeApiArgs) -> io::Result<()> {
    let server = ApiServer::new(ApiServerConfig {
        store: StoreConfig {
            seed: args.seed,
            service_cluster_ips: Some(ServiceIpRange::KUBEADM),
            ..StoreConfig::default()
        },
        clock: Some(if args.simulated_clock {
            TimeSource::simulated()
        } else {
            TimeSource::from_fn(Timestamp::now)
        }),
        // kubectl sends the kubeconfig's token only over TLS: without it, it is the admin.
        anonymous: Some(UserInfo::admin()),
        ..ApiServerConfig::default()
    });
    server
        .seed_nodes(args.seed_nodes)
        .map_err(io::Error::other)?;
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let addr = listener.local_addr()?;
    let token = server.admin_token();
    write_kubeconfig(
        &args.kubeconfig,
        &format!("http://{addr}"),
        &token,
        "default",
    )?;
    println!(
        "spur-sim kube-api serving on http://{addr}; kubeconfig at {}",
        args.kubeconfig.display()
    );
    server.serve(listener).await
}

/// Writes a kubeconfig with one cluster, one user holding bearer token `token` (an admin's
/// for kubectl, a ServiceAccount's for the operator), and one context in `namespace` (for
/// the operator its own, as a pod's in-cluster config has it).
pub fn write_kubeconfig(
    path: &Path,
    server_url: &str,
    token: &str,
    namespace: &str,
) -> io::Result<()> {
    let text = format!(
        "apiVersion: v1\n\
         kind: Config\n\
         clusters:\n\
         - name: spur-sim\n  cluster:\n    server: {server_url}\n\
         users:\n\
         - name: spur-sim\n  user:\n    token: {token}\n\
         contexts:\n\
         - name: spur-sim\n  context:\n    cluster: spur-sim\n    user: spur-sim\n    namespace: {namespace}\n\
         current-context: spur-sim\n"
    );
    // Write then rename, so a reader polling for the file never sees half of it.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(tmp, path)
}

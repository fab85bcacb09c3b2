//! The API server over TLS, as pods in a cluster reach it: kube-rs's in-cluster config dials
//! `https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT` and verifies the server
//! against the ServiceAccount's `ca.crt`.
//!
//! [`TlsIdentity::generate`] makes, at start, a CA and a serving certificate it signs for the
//! names of [`TlsConfig`]; [`TlsIdentity::ca_pem`] is what a pod's `ca.crt` holds, and
//! [`super::ApiServer::serve_tls`] serves connections with it. Both certificates are valid
//! from 1975 to 4096 (rcgen's defaults): the lab's clusters live minutes, and a validity
//! drawn from the wall clock would make a pod's clock skew a handshake failure.

use std::{
    net::{IpAddr, Ipv4Addr},
    sync::Arc,
    time::Duration,
};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use tokio_rustls::{
    TlsAcceptor,
    rustls::{
        self, ServerConfig,
        pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer},
    },
};

/// The ALPN protocols offered, in preference order: kube-rs and client-go speak h2 when
/// offered it, kubectl's exec and older clients HTTP/1.1.
const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// What the serving certificate is valid for, and how connections are accepted.
#[derive(Clone, Debug)]
pub struct TlsConfig {
    /// The IP addresses clients dial (default 127.0.0.1; a cluster adds the `kubernetes`
    /// Service's clusterIP, which is what `KUBERNETES_SERVICE_HOST` holds).
    pub ips: Vec<IpAddr>,
    /// The DNS names clients dial (default the `kubernetes` Service's four names and
    /// `localhost`, as kube-apiserver's and kind's certificates carry).
    pub dns_names: Vec<String>,
    /// How long a client has to finish its handshake (default 10 s: a real one takes
    /// milliseconds, and a stalled one must not hold its task for ever).
    pub handshake_timeout: Duration,
}

impl Default for TlsConfig {
    fn default() -> Self {
        Self::with_ips(vec![IpAddr::V4(Ipv4Addr::LOCALHOST)])
    }
}

impl TlsConfig {
    /// The defaults, valid for `ips` instead of 127.0.0.1 alone.
    pub fn with_ips(ips: Vec<IpAddr>) -> Self {
        let dns_names = [
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
            "localhost",
        ];
        Self {
            ips,
            dns_names: dns_names.map(str::to_owned).to_vec(),
            handshake_timeout: Duration::from_secs(10),
        }
    }
}

/// Why an identity could not be made.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("generate a certificate: {0}")]
    Certificate(#[from] rcgen::Error),
    #[error("build the TLS server configuration: {0}")]
    Rustls(#[from] rustls::Error),
}

/// A CA and the serving certificate it signed, ready to accept connections.
#[derive(Clone)]
pub struct TlsIdentity {
    ca_pem: String,
    ca_der: CertificateDer<'static>,
    acceptor: TlsAcceptor,
    handshake_timeout: Duration,
}

impl std::fmt::Debug for TlsIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsIdentity").finish_non_exhaustive()
    }
}

impl TlsIdentity {
    /// A fresh CA (ECDSA P-256, as kubeadm's) and a serving certificate for `config`'s names.
    pub fn generate(config: &TlsConfig) -> Result<Self, TlsError> {
        let ca_key = KeyPair::generate()?;
        let ca_params = ca_params();
        let ca = ca_params.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca_params, ca_key);
        let server_key = KeyPair::generate()?;
        let server = server_params(config)?.signed_by(&server_key, &issuer)?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server_key.serialize_der()));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut server_config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(vec![server.der().clone(), ca.der().clone()], key)?;
        server_config.alpn_protocols = ALPN.map(<[u8]>::to_vec).to_vec();
        Ok(Self {
            ca_pem: ca.pem(),
            ca_der: ca.der().clone(),
            acceptor: TlsAcceptor::from(Arc::new(server_config)),
            handshake_timeout: config.handshake_timeout,
        })
    }

    /// The CA certificate in PEM: a pod's `ca.crt`, a kubeconfig's `certificate-authority-data`.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The CA certificate in DER, as `kube::Config::root_cert` takes it.
    pub fn ca_der(&self) -> &[u8] {
        &self.ca_der
    }

    pub(crate) fn acceptor(&self) -> &TlsAcceptor {
        &self.acceptor
    }

    pub(crate) fn handshake_timeout(&self) -> Duration {
        self.handshake_timeout
    }
}

fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "spur-fakes kubernetes CA");
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyCertSign,
    ];
    params
}

fn server_params(config: &TlsConfig) -> Result<CertificateParams, rcgen::Error> {
    let names: Vec<String> = (config.ips.iter().map(IpAddr::to_string))
        .chain(config.dns_names.iter().cloned())
        .collect();
    let mut params = CertificateParams::new(names)?;
    params
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    params.use_authority_key_identifier_extension = true;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    Ok(params)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Namespace;
    use kube::api::{Api, ListParams};
    use tokio::net::TcpListener;

    use super::*;
    use crate::api_server::{ApiServer, ApiServerConfig};

    /// An API server serving TLS on a loopback port, its identity, and the port.
    async fn serving() -> (ApiServer, TlsIdentity, u16) {
        let api = ApiServer::new(ApiServerConfig::default());
        let identity = TlsIdentity::generate(&TlsConfig::default()).expect("identity");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        let (server, id) = (api.clone(), identity.clone());
        tokio::spawn(async move { server.serve_tls(listener, id).await });
        (api, identity, port)
    }

    /// The namespaces listed over `https://{host}:{port}` with the admin's token, by a
    /// client trusting `ca` (or, with `None`, the platform's roots).
    async fn namespaces(
        api: &ApiServer,
        host: &str,
        port: u16,
        ca: Option<&[u8]>,
    ) -> kube::Result<Vec<String>> {
        let url = format!("https://{host}:{port}").parse().expect("url");
        let mut config = kube::Config::new(url);
        config.root_cert = ca.map(|der| vec![der.to_vec()]);
        config.auth_info = serde_json::from_value(serde_json::json!({"token": api.admin_token()}))
            .expect("auth info");
        config.connect_timeout = Some(Duration::from_secs(5));
        config.read_timeout = Some(Duration::from_secs(5));
        let list = Api::<Namespace>::all(kube::Client::try_from(config)?)
            .list(&ListParams::default())
            .await?;
        Ok(list
            .items
            .into_iter()
            .filter_map(|n| n.metadata.name)
            .collect())
    }

    /// An error and its sources, as one line.
    fn error_chain(error: &dyn std::error::Error) -> String {
        let mut text = error.to_string();
        let mut source = error.source();
        while let Some(cause) = source {
            text = format!("{text}: {cause}");
            source = cause.source();
        }
        text
    }

    #[tokio::test]
    async fn a_client_trusting_the_ca_lists_namespaces_over_tls() {
        let (api, identity, port) = serving().await;
        for host in ["127.0.0.1", "localhost"] {
            let names = namespaces(&api, host, port, Some(identity.ca_der()))
                .await
                .expect("list over TLS");
            assert!(names.contains(&"default".to_owned()), "{host}: {names:?}");
        }
    }

    #[tokio::test]
    async fn a_client_without_the_ca_is_refused() {
        let (api, _identity, port) = serving().await;
        let other = TlsIdentity::generate(&TlsConfig::default()).expect("identity");
        for ca in [None, Some(other.ca_der())] {
            let refused = namespaces(&api, "127.0.0.1", port, ca).await;
            let error = refused.expect_err("a server its CA did not sign must be refused");
            assert!(
                error_chain(&error).contains("invalid peer certificate"),
                "refused by the certificate check: {}",
                error_chain(&error)
            );
        }
    }

    #[test]
    fn the_ca_is_pem() {
        let identity = TlsIdentity::generate(&TlsConfig::default()).expect("identity");
        assert!(identity.ca_pem().starts_with("-----BEGIN CERTIFICATE-----"));
    }
}

//! `pods/NAME/portforward`, as kubectl 1.31 and later speak it: a WebSocket whose
//! subprotocol is `SPDY/3.1+portforward.k8s.io`, its binary messages carrying a SPDY/3.1
//! connection ([`super::spdy`]), which kubectl would otherwise open by a SPDY upgrade.
//!
//! kubectl opens two streams per local connection, both with headers `port` and
//! `requestid`: `streamtype: error` first, then `streamtype: data`. Each is answered at
//! once; once both are open the backend's connection to the port (from inside the pod)
//! is relayed on the data stream both ways, and a failure to connect is written on the
//! error stream, as a kubelet does. When the pod's side ends, the data stream and then
//! the error stream are finished (FIN), which ends kubectl's forwarding of that connection.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::Request;
use axum::response::Response;
use bytes::Bytes;
use futures::{SinkExt as _, StreamExt as _};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::Role;

use super::error::{ApiError, ApiResult};
use super::pod_backend::{PodBackend, PodTarget};
use super::pod_io;
use super::server::Shared;
use super::spdy::{self, Codec, Frame};

/// The WebSocket subprotocol of SPDY tunnelled port-forwarding.
const TUNNEL_PROTOCOL: &str = "SPDY/3.1+portforward.k8s.io";
/// The most bytes one data frame from the pod carries (a kubelet's copy buffer).
const CHUNK: usize = 32 * 1024;
/// Frames waiting to be written to the client, or bytes waiting for the pod, per stream
/// before the reader waits (a bound, so a slow side slows the other instead of filling
/// memory).
const QUEUE: usize = 64;

/// Answers the upgrade and serves the tunnel on its own task.
pub(crate) fn response(
    shared: Arc<Shared>,
    namespace: &str,
    name: &str,
    mut req: Request,
) -> ApiResult<Response> {
    let object = pod_io::pod(&shared, namespace, name)?;
    let phase = object["status"]["phase"].as_str().unwrap_or("Pending");
    if phase != "Running" {
        return Err(ApiError::bad_request(format!(
            "unable to forward ports to pod {name}: its phase is {phase}, not Running"
        )));
    }
    let (key, protocol) = pod_io::websocket_upgrade(req.headers(), &[TUNNEL_PROTOCOL])?;
    let target = PodTarget::new(shared.clone(), object, String::new());
    let backend = shared.pod_backend();
    let upgraded = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let Ok(upgraded) = upgraded.await else {
            return;
        };
        let socket =
            WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
        serve_tunnel(socket, target, backend).await;
    });
    Ok(pod_io::switching_protocols(&key, protocol))
}

/// One SPDY connection over the WebSocket, until either side ends it.
async fn serve_tunnel<S>(
    socket: WebSocketStream<S>,
    target: PodTarget,
    backend: Arc<dyn PodBackend>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (mut sink, mut source) = socket.split();
    let (out, mut outgoing) = mpsc::channel::<Bytes>(QUEUE);
    let writer = async move {
        while let Some(frame) = outgoing.recv().await {
            if sink.send(Message::binary(frame)).await.is_err() {
                return;
            }
        }
    };
    let mut session = Session {
        target,
        backend,
        out,
        codec: Codec::new(),
        opening: BTreeMap::new(),
        to_pod: BTreeMap::new(),
        forwards: JoinSet::new(),
    };
    let reader = async move {
        while let Some(Ok(message)) = source.next().await {
            match message {
                Message::Binary(bytes) => session.codec.feed(&bytes),
                Message::Close(_) => return,
                _ => continue,
            }
            loop {
                match session.codec.next_frame() {
                    Ok(Some(frame)) => {
                        if !session.handle(frame).await {
                            return;
                        }
                    }
                    Ok(None) => break,
                    Err(error) => {
                        tracing::debug!(%error, "port-forward: the client's bytes are not SPDY");
                        return;
                    }
                }
            }
        }
    };
    // Either end stops the tunnel; the session's forwards go with it.
    tokio::select! {
        () = reader => {}
        () = writer => {}
    }
}

/// The streams of one forwarded connection kubectl opened so far.
#[derive(Default)]
struct Opening {
    error: Option<u32>,
    data: Option<u32>,
}

/// One tunnel's state.
struct Session {
    target: PodTarget,
    backend: Arc<dyn PodBackend>,
    /// Frames to the client.
    out: mpsc::Sender<Bytes>,
    codec: Codec,
    /// Streams by `requestid`, until both of a connection's are open.
    opening: BTreeMap<String, Opening>,
    /// The pod side of each forwarded data stream; dropped at the client's FIN or reset.
    to_pod: BTreeMap<u32, mpsc::Sender<Bytes>>,
    forwards: JoinSet<()>,
}

impl Session {
    /// Acts on one frame from the client; `false` ends the tunnel.
    async fn handle(&mut self, frame: Frame) -> bool {
        match frame {
            Frame::SynStream { stream, headers } => {
                let reply = self.codec.syn_reply(stream);
                if self.out.send(reply).await.is_err() {
                    return false;
                }
                self.open(stream, &headers);
            }
            Frame::Data { stream, fin, data } => {
                if let Some(to_pod) = self.to_pod.get(&stream)
                    && !data.is_empty()
                    && to_pod.send(data).await.is_err()
                {
                    self.to_pod.remove(&stream);
                }
                if fin {
                    self.to_pod.remove(&stream);
                }
            }
            Frame::RstStream { stream } => {
                self.to_pod.remove(&stream);
            }
            Frame::Ping(id) => return self.out.send(spdy::ping(id)).await.is_ok(),
            Frame::GoAway => return false,
            Frame::Ignored => {}
        }
        true
    }

    /// Records a stream kubectl opened; starts the forward once its pair is open.
    fn open(&mut self, stream: u32, headers: &[(String, String)]) {
        let header = |name: &str| {
            headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        let request = header("requestid").unwrap_or_default().to_owned();
        let entry = self.opening.entry(request.clone()).or_default();
        match header("streamtype") {
            Some("error") => entry.error = Some(stream),
            Some("data") => entry.data = Some(stream),
            _ => return,
        }
        let (Some(error), Some(data)) = (entry.error, entry.data) else {
            return;
        };
        self.opening.remove(&request);
        let port = header("port").and_then(|p| p.parse::<u16>().ok());
        let (to_pod, from_client) = mpsc::channel(QUEUE);
        self.to_pod.insert(data, to_pod);
        let streams = Streams {
            data,
            error,
            out: self.out.clone(),
        };
        let (backend, target) = (self.backend.clone(), self.target.clone());
        self.forwards
            .spawn(forward(backend, target, port, streams, from_client));
    }
}

/// A forwarded connection's two streams and the way to the client.
struct Streams {
    data: u32,
    error: u32,
    out: mpsc::Sender<Bytes>,
}

impl Streams {
    /// Ends the connection: the data stream, then the error stream, with `error` on it.
    async fn finish(&self, error: Option<String>) {
        let _ = self.out.send(spdy::data(self.data, true, &[])).await;
        if let Some(message) = error {
            let _ = self
                .out
                .send(spdy::data(self.error, false, message.as_bytes()))
                .await;
        }
        let _ = self.out.send(spdy::data(self.error, true, &[])).await;
    }
}

/// Relays one connection: the client's bytes to the pod's port, the pod's back, until the
/// pod's side ends.
async fn forward(
    backend: Arc<dyn PodBackend>,
    target: PodTarget,
    port: Option<u16>,
    streams: Streams,
    mut from_client: mpsc::Receiver<Bytes>,
) {
    let name = target.name().to_owned();
    let Some(port) = port else {
        return streams
            .finish(Some("the port header is not a port number".to_owned()))
            .await;
    };
    let connection = match backend.port_forward(target, port).await {
        Ok(connection) => connection,
        Err(e) => {
            let message = format!("error forwarding port {port} to pod {name}: {}", e.message);
            return streams.finish(Some(message)).await;
        }
    };
    let (mut from_pod, mut to_pod) = tokio::io::split(connection);
    let upstream = async move {
        while let Some(bytes) = from_client.recv().await {
            if to_pod.write_all(&bytes).await.is_err() {
                break;
            }
        }
        let _ = to_pod.shutdown().await;
    };
    let (out, data) = (streams.out.clone(), streams.data);
    let downstream = async move {
        let mut buf = vec![0u8; CHUNK];
        while let Ok(n @ 1..) = from_pod.read(&mut buf).await {
            if out.send(spdy::data(data, false, &buf[..n])).await.is_err() {
                return;
            }
        }
    };
    tokio::pin!(upstream, downstream);
    // The client finishing its side leaves the pod's answer to come; the pod's end ends
    // the connection.
    tokio::select! {
        () = &mut downstream => {}
        () = &mut upstream => downstream.await,
    }
    streams.finish(None).await;
}

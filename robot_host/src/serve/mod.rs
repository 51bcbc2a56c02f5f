//! `frt-robot-host serve`: openpi's websocket policy protocol, so that openpi's robot clients
//! (`openpi-client`'s `WebsocketClientPolicy`, the DROID, ALOHA and LIBERO examples) talk to
//! this runtime unchanged. As openpi's `WebsocketPolicyServer` does:
//!
//! * on connect, the server sends its metadata (a msgpack map, binary frame);
//! * each binary frame from the client is one observation (msgpack with openpi's numpy
//!   encoding, [`numpy`]); the reply is a binary frame with `actions` (`[horizon, dims]`
//!   float32, after the robot's output transform), `policy_timing` and `server_timing`
//!   (`infer_ms`, and from the second request on `prev_total_ms`);
//! * on an error the server sends the message as a text frame, then closes with 1011 (the
//!   client raises it); other connections are not affected;
//! * `GET /healthz` answers `200 OK`.
//!
//! Observations go through the robot's preset ([`preset`]), openpi's image preprocessing and
//! the configured normalization on the connection's side; the one policy runs on a worker
//! thread that serves requests in order of arrival (a bounded queue). Actions get the robot
//! host's guarantees: non-finite inputs never reach the model, non-finite outputs are never
//! sent, every chunk is clamped and step-capped per the configuration's action dimensions
//! (delta dimensions made absolute from the observed state first).

pub mod numpy;
pub mod preset;

use crate::config::{ActionDim, ActionKind, Config};
use crate::policy::Policy;
use crate::timeline::guard_chunk;
use futures_util::{SinkExt, StreamExt};
use preset::{Parsed, Preset};
use rmpv::Value;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};

/// The `serve:` section of a configuration.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ServeConfig {
    /// The robot's observation and action layout.
    pub preset: Preset,
    /// Address to listen on (openpi's default: all interfaces).
    #[serde(default = "default_host")]
    pub host: String,
    /// Port (openpi's default, 8000).
    #[serde(default = "default_port")]
    pub port: u16,
    /// Largest message a client may send, in bytes (a larger one closes its connection).
    #[serde(default = "default_max_message")]
    pub max_message_bytes: usize,
    /// Requests waiting for the policy at most (more: refused with an error reply).
    #[serde(default = "default_queue")]
    pub queue: usize,
}

fn default_host() -> String {
    "0.0.0.0".into()
}
fn default_port() -> u16 {
    8000
}
fn default_max_message() -> usize {
    64 << 20
}
fn default_queue() -> usize {
    64
}

/// A request for the policy worker: one observation, preprocessed.
struct Job {
    images: Vec<Option<frt_vla::ModelImage>>,
    state: Vec<f32>,
    prompt: String,
    /// Where the worker writes the chunk (`horizon × dims`, allocated by the connection: the
    /// worker allocates nothing per request).
    out: Vec<f32>,
    reply: oneshot::Sender<Result<Reply, String>>,
}

/// The worker's answer: the guarded chunk (`horizon × dims`, robot units) and the time the
/// policy took.
struct Reply {
    actions: Vec<f32>,
    infer_ms: f64,
}

/// What a connection needs.
struct Shared {
    preset: Preset,
    side: usize,
    views: usize,
    max_pixels: u64,
    horizon: usize,
    dims: usize,
    metadata: Vec<u8>,
    jobs: crossbeam_channel::Sender<Job>,
}

/// Checks that the configuration fits its preset.
fn check(cfg: &Config, s: &ServeConfig) -> Result<(), String> {
    let p = s.preset;
    if cfg.views() < p.views() {
        return Err(format!(
            "serve.preset {}: {} camera views needed, the configuration has {}",
            p.name(),
            p.views(),
            cfg.views()
        ));
    }
    if cfg.state.joints.len() != p.state_dims() {
        return Err(format!(
            "serve.preset {}: state.joints must name the {} state values it sends, not {}",
            p.name(),
            p.state_dims(),
            cfg.state.joints.len()
        ));
    }
    if cfg.control.action_dim != p.action_dims() {
        return Err(format!(
            "serve.preset {}: control.action_dim must be {} (the dimensions it returns), not {}",
            p.name(),
            p.action_dims(),
            cfg.control.action_dim
        ));
    }
    if s.queue == 0 || s.max_message_bytes < 1024 {
        return Err(
            "serve.queue must be positive and serve.max_message_bytes at least 1024".into(),
        );
    }
    Ok(())
}

/// A running server: its address, and a handle that stops it.
pub struct Server {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<(), String>>>,
}

impl Server {
    /// Stops accepting, lets the worker finish, and joins.
    pub fn stop(mut self) -> Result<(), String> {
        self.shutdown()
    }

    /// Runs until the server ends (an error of the listener or the worker).
    pub fn wait(mut self) -> Result<(), String> {
        match self.thread.take() {
            Some(t) => t
                .join()
                .map_err(|_| "the server thread panicked".to_string())?,
            None => Ok(()),
        }
    }

    fn shutdown(&mut self) -> Result<(), String> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        match self.thread.take() {
            Some(t) => t
                .join()
                .map_err(|_| "the server thread panicked".to_string())?,
            None => Ok(()),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

/// Builds the policy of `cfg`, listens on `serve.host:port` (`port` overrides; 0 picks a free
/// port) and serves in the background.
pub fn start(cfg: &Config, port: Option<u16>) -> Result<Server, String> {
    let s = cfg
        .serve
        .clone()
        .ok_or("the configuration has no `serve:` section (preset, port)")?;
    check(cfg, &s)?;
    let dims_cfg = cfg.action_dims().map_err(|e| e.to_string())?;
    let policy = Policy::build(cfg).map_err(|e| e.to_string())?;
    let spec = policy.spec().clone();
    let metadata = numpy::encode(&numpy::map(vec![
        ("server", Value::from("frt")),
        ("model", Value::from(spec.name)),
        ("preset", Value::from(s.preset.name())),
        ("action_horizon", Value::from(spec.action_horizon as u64)),
        ("action_dim", Value::from(s.preset.action_dims() as u64)),
    ]));
    let (jobs, rx) = crossbeam_channel::bounded::<Job>(s.queue);
    let shared = Arc::new(Shared {
        preset: s.preset,
        side: spec.image_size,
        views: spec.views,
        max_pixels: cfg.safety.max_image_pixels,
        horizon: spec.action_horizon,
        dims: s.preset.action_dims(),
        metadata,
        jobs,
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("serve: {e}"))?;
    let addr = format!("{}:{}", s.host, port.unwrap_or(s.port));
    let listener = rt
        .block_on(TcpListener::bind(&addr))
        .map_err(|e| format!("serve: cannot listen on {addr}: {e}"))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    // The worker signals when it ends, however it ends (a panic included): the server stops
    // with it rather than answering every request with an error.
    let (ended_tx, ended_rx) = oneshot::channel::<()>();
    struct Ended(Option<oneshot::Sender<()>>);
    impl Drop for Ended {
        fn drop(&mut self) {
            if let Some(t) = self.0.take() {
                let _ = t.send(());
            }
        }
    }
    let worker = std::thread::Builder::new()
        .name("frt-serve-policy".into())
        .spawn({
            let (preset, dims) = (s.preset, dims_cfg);
            move || {
                let _ended = Ended(Some(ended_tx));
                worker(policy, rx, preset, dims)
            }
        })
        .map_err(|e| e.to_string())?;
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let ws = WebSocketConfig::default()
        .max_message_size(Some(s.max_message_bytes))
        .max_frame_size(Some(s.max_message_bytes));
    let thread = std::thread::Builder::new()
        .name("frt-serve".into())
        .spawn(move || {
            rt.block_on(async move {
                tokio::select! {
                    _ = stop_rx => {}
                    _ = ended_rx => {}
                    _ = accept_loop(listener, shared, ws) => {}
                }
            });
            // Every connection (and with them the job sender) is gone: the worker ends.
            drop(rt);
            worker
                .join()
                .map_err(|_| "the policy worker panicked".to_string())?
        })
        .map_err(|e| e.to_string())?;
    Ok(Server {
        addr: local,
        stop: Some(stop_tx),
        thread: Some(thread),
    })
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, ws: WebSocketConfig) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of descriptors and the like: try again shortly, without spinning.
                tracing::warn!(target: "frt::serve", "accept: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            if let Err(e) = connection(stream, &shared, ws).await {
                tracing::info!(target: "frt::serve", "{peer}: {e}");
            }
        });
    }
}

/// Answers `GET /healthz` (openpi's health check) without a websocket handshake; `true` if it
/// did. Reads nothing from the stream otherwise.
async fn health_check(stream: &mut TcpStream) -> Result<bool, String> {
    let mut buf = [0u8; 2048];
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let n = stream.peek(&mut buf).await.map_err(|e| e.to_string())?;
        let head = &buf[..n];
        if n == 0 {
            return Err("closed before a request".into());
        }
        if head.windows(4).any(|w| w == b"\r\n\r\n") || n == buf.len() {
            let line = head.split(|b| *b == b'\r').next().unwrap_or_default();
            if line.starts_with(b"GET /healthz ") {
                stream
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 3\r\nConnection: close\r\n\r\nOK\n")
                    .await
                    .map_err(|e| e.to_string())?;
                let _ = stream.shutdown().await;
                return Ok(true);
            }
            return Ok(false);
        }
        if Instant::now() > deadline {
            return Err("no complete request head within 10 s".into());
        }
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
}

async fn connection(
    mut stream: TcpStream,
    shared: &Shared,
    ws: WebSocketConfig,
) -> Result<(), String> {
    let _ = stream.set_nodelay(true);
    if health_check(&mut stream).await? {
        return Ok(());
    }
    let mut socket = tokio_tungstenite::accept_async_with_config(stream, Some(ws))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    socket
        .send(Message::binary(shared.metadata.clone()))
        .await
        .map_err(|e| e.to_string())?;
    let mut prev_total_ms: Option<f64> = None;
    while let Some(msg) = socket.next().await {
        let start = Instant::now();
        let bytes = match msg {
            Ok(Message::Binary(b)) => b,
            Ok(Message::Close(_)) => break,
            Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_)) => continue,
            Ok(Message::Text(_)) => {
                return fail(
                    &mut socket,
                    "a text frame: observations are binary msgpack frames".into(),
                )
                .await;
            }
            Err(e) => return Err(e.to_string()),
        };
        match infer(shared, bytes).await {
            Ok((actions, infer_ms)) => {
                let mut timing = vec![("infer_ms", Value::F64(infer_ms))];
                if let Some(p) = prev_total_ms {
                    timing.push(("prev_total_ms", Value::F64(p)));
                }
                let reply = numpy::map(vec![
                    (
                        "actions",
                        numpy::f32_array(&[shared.horizon, shared.dims], &actions),
                    ),
                    (
                        "policy_timing",
                        numpy::map(vec![("infer_ms", Value::F64(infer_ms))]),
                    ),
                    ("server_timing", numpy::map(timing)),
                ]);
                socket
                    .send(Message::binary(numpy::encode(&reply)))
                    .await
                    .map_err(|e| e.to_string())?;
                prev_total_ms = Some(start.elapsed().as_secs_f64() * 1e3);
            }
            Err(e) => return fail(&mut socket, e).await,
        }
    }
    Ok(())
}

/// openpi's error reply: the message as a text frame, then a close with 1011.
async fn fail<S>(
    socket: &mut tokio_tungstenite::WebSocketStream<S>,
    e: String,
) -> Result<(), String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let _ = socket.send(Message::text(format!("frt: {e}\n"))).await;
    let _ = socket
        .send(Message::Close(Some(CloseFrame {
            code: CloseCode::Error,
            reason: "Internal server error. Traceback included in previous frame.".into(),
        })))
        .await;
    Err(e)
}

/// One observation: decoded, preprocessed (off the runtime's threads), through the policy.
async fn infer(
    shared: &Shared,
    bytes: tokio_tungstenite::tungstenite::Bytes,
) -> Result<(Vec<f32>, f64), String> {
    let (preset, side, views, max_pixels) =
        (shared.preset, shared.side, shared.views, shared.max_pixels);
    let job = tokio::task::spawn_blocking(move || -> Result<_, String> {
        let obs = numpy::decode(&bytes)?;
        let Parsed {
            images,
            state,
            prompt,
        } = preset.parse(&obs, max_pixels)?;
        let mut model_images: Vec<Option<frt_vla::ModelImage>> = Vec::with_capacity(views);
        for (v, im) in images.into_iter().enumerate().take(views) {
            model_images.push(match im {
                None => None,
                Some(im) => Some(
                    frt_vla::inputs::resize_with_pad(&im.data, im.height, im.width, side, side)
                        .map(|px| frt_vla::inputs::to_model_pixels(&px))
                        .map_err(|e| format!("image of view {v}: {e}"))?,
                ),
            });
        }
        model_images.resize_with(views, || None);
        Ok((model_images, state, prompt))
    })
    .await
    .map_err(|e| format!("preprocessing: {e}"))??;
    let (tx, rx) = oneshot::channel();
    let (images, state, prompt) = job;
    shared
        .jobs
        .try_send(Job {
            images,
            state,
            prompt,
            out: vec![0.0; shared.horizon * shared.dims],
            reply: tx,
        })
        .map_err(|e| match e {
            crossbeam_channel::TrySendError::Full(_) => {
                "the server is busy (its queue is full)".to_string()
            }
            crossbeam_channel::TrySendError::Disconnected(_) => {
                "the policy has stopped".to_string()
            }
        })?;
    let r = rx
        .await
        .map_err(|_| "the policy has stopped".to_string())??;
    Ok((r.actions, r.infer_ms))
}

/// The policy thread: requests in order of arrival, each a whole inference, then the output
/// transform and the guards. Allocates nothing per request once warmed up (the chunk goes into
/// the job's own buffer).
fn worker(
    mut policy: Policy,
    jobs: crossbeam_channel::Receiver<Job>,
    preset: Preset,
    dims: Vec<ActionDim>,
) -> Result<(), String> {
    let d = dims.len();
    let mut anchor = vec![0f32; d];
    for mut job in jobs {
        let t = Instant::now();
        let chunk = &mut job.out;
        let r = (|| -> Result<(), String> {
            let mut frames: [Option<frt_vla::ViewImage>; frt_vla::MAX_VIEWS] =
                [None; frt_vla::MAX_VIEWS];
            let views = job.images.len().min(frt_vla::MAX_VIEWS);
            for (f, im) in frames.iter_mut().zip(&job.images) {
                *f = im.as_ref().map(frt_vla::ViewImage::Pixels);
            }
            policy
                .prepare(&frames[..views], &job.state, &job.prompt, None)
                .map_err(|e| e.to_string())?;
            for i in 0..policy.stages().len() {
                let stage = policy.stages()[i];
                policy.replay(stage).map_err(|e| e.to_string())?;
            }
            policy.finish(chunk, d).map_err(|e| e.to_string())?;
            if chunk.iter().any(|x| !x.is_finite()) {
                return Err("the policy produced non-finite actions".into());
            }
            preset.encode_actions(chunk);
            // openpi's `AbsoluteActions`: delta dimensions relative to the observed state.
            for (k, dim) in dims.iter().enumerate() {
                let x = job.state.get(dim.state_index).copied().unwrap_or_default();
                if dim.delta {
                    chunk.iter_mut().skip(k).step_by(d).for_each(|a| *a += x);
                }
                anchor[k] = match dim.kind {
                    ActionKind::Velocity => 0.0,
                    _ => x,
                };
            }
            guard_chunk(chunk, 0, &anchor, &dims);
            Ok(())
        })();
        let reply = r.map(|()| Reply {
            actions: std::mem::take(&mut job.out),
            infer_ms: t.elapsed().as_secs_f64() * 1e3,
        });
        let _ = job.reply.send(reply);
    }
    Ok(())
}

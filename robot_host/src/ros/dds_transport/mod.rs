//! The ROS 2 transport in pure Rust (cargo feature `dds`; no ROS install): a DDS participant
//! and a ROS 2 node from the `ros2-client` crate (on RustDDS), speaking the same wire protocol
//! as rmw_cyclonedds / rmw_fastrtps. Topics are ROS 2's DDS names (`rt/<fully qualified
//! name>`) and types (`<pkg>::msg::dds_::<Type>_`) of `super::wire`; every message, standard or
//! `frt_msgs`, is encoded and decoded by the node's CDR codec (`super::cdr`), the same bytes as
//! the r2r transport sends.
//!
//! Inputs are read on the transport's thread as they arrive (one readiness poll over every
//! reader and the subgoal service); outputs are written by a second thread as the node sends
//! them.
//!
//! The services (`~/set_subgoal`, the parameter and lifecycle services) are served in the
//! framing of the clients' middleware ([`DdsOptions::service_mapping`], from
//! `RMW_IMPLEMENTATION`): rmw_cyclonedds puts a request header in the payload, served on the
//! node's own reader and writer (`server`: a reply waits for the client's reply reader and
//! carries no inline QoS); rmw_fastrtps (and rmw_connextdds) carry the request's identity in
//! inline QoS, served by ros2-client's server. Request and response bodies are the same CDR as
//! the node's codec writes (tested).

mod body;
mod managed;
mod server;
mod services;

use super::msg::{self as m, SetSubgoalRequest, SetSubgoalResponse};
use super::wire::{self, Cdr, Endpoints, Out};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::lifecycle::{State, Transition};
use crate::messages::Outbound;
use crate::node::{Inputs, ManualClock};
use crate::params::Parameters;
use crate::transport::Transport;
use body::Body;
use bytes::Bytes;
use crossbeam_channel::Receiver;
use managed::{MANAGED_TOKEN, Managed};
pub use ros2_client::ServiceMapping;
use ros2_client::dds::rustdds::{
    self,
    mio1::{Events, Interest, Poll, Token},
};
use ros2_client::qos::{History, QosProfile, Reliability};
use ros2_client::{Context, MessageTypeName, NodeName, NodeOptions};
use services::{Services, parameter_services};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

fn dds_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::bad("ROS 2 (DDS)", format!("{what}: {e}"))
}

/// Where the node lives on the ROS 2 graph.
#[derive(Clone, Debug)]
pub struct DdsOptions {
    /// `ROS_DOMAIN_ID` (0 when unset).
    pub domain_id: u16,
    /// The node's namespace (`/` or `/robot1`…).
    pub namespace: String,
    /// The node's name.
    pub node_name: String,
    /// Follow `/clock` (set the clock given to [`Dds::new`]).
    pub sim_time: bool,
    /// How service requests and replies are framed: as the middleware of the node's clients
    /// does it.
    pub service_mapping: ServiceMapping,
    /// Discover and talk to peers on this host only (loopback).
    pub localhost_only: bool,
}

/// Whether discovery is limited to this host, from ROS 2's variables: `ROS_LOCALHOST_ONLY=1`
/// (the older form, taking precedence as in Jazzy) or `ROS_AUTOMATIC_DISCOVERY_RANGE`
/// (`LOCALHOST`; `SUBNET`, `SYSTEM_DEFAULT` or unset: the network). `OFF` (static peers only)
/// and anything else are refused by name: the transport cannot honour them.
pub fn localhost_only_of(localhost_only: Option<&str>, range: Option<&str>) -> Result<bool> {
    match localhost_only.map(str::trim).filter(|v| !v.is_empty()) {
        Some("1") => return Ok(true),
        Some("0") | None => {}
        Some(v) => return Err(Error::bad("ROS_LOCALHOST_ONLY", format!("`{v}`: 0 or 1"))),
    }
    match range.map(str::trim).filter(|v| !v.is_empty()) {
        None | Some("SUBNET") | Some("SYSTEM_DEFAULT") => Ok(false),
        Some("LOCALHOST") => Ok(true),
        Some("OFF") => Err(Error::bad(
            "ROS_AUTOMATIC_DISCOVERY_RANGE",
            "OFF (static peers only) is not supported by the DDS transport; use LOCALHOST, \
             SUBNET or SYSTEM_DEFAULT",
        )),
        Some(v) => Err(Error::bad(
            "ROS_AUTOMATIC_DISCOVERY_RANGE",
            format!("`{v}`: LOCALHOST, SUBNET or SYSTEM_DEFAULT"),
        )),
    }
}

/// The service framing of a ROS 2 middleware (`RMW_IMPLEMENTATION`; unset or unknown: ROS 2's
/// default, rmw_fastrtps).
pub fn service_mapping_of(rmw: Option<&str>) -> ServiceMapping {
    match rmw.map(str::trim) {
        Some("rmw_cyclonedds_cpp") => ServiceMapping::Cyclone,
        _ => ServiceMapping::Enhanced,
    }
}

// The service's bodies go through ros2-client's serde CDR (it frames them); they are the
// node's message definitions, whose serde encoding equals the node's codec (tested).
impl ros2_client::Message for SetSubgoalRequest {}
impl ros2_client::Message for SetSubgoalResponse {}
impl ros2_client::Message for m::ChangeStateRequest {}
impl ros2_client::Message for m::ChangeStateResponse {}
impl ros2_client::Message for m::EmptyRequest {}
impl ros2_client::Message for m::GetStateResponse {}
impl ros2_client::Message for m::GetAvailableStatesResponse {}
impl ros2_client::Message for m::GetAvailableTransitionsResponse {}

impl DdsOptions {
    /// The domain from `ROS_DOMAIN_ID`, the root namespace and the configured node name.
    pub fn from_env(cfg: &Config) -> Result<DdsOptions> {
        let domain_id = match std::env::var("ROS_DOMAIN_ID") {
            Ok(v) if !v.trim().is_empty() => v.trim().parse::<u16>().ok().filter(|d| *d <= 232),
            _ => Some(0),
        }
        .ok_or_else(|| Error::bad("ROS_DOMAIN_ID", "must be a number in 0..=232"))?;
        Ok(DdsOptions {
            domain_id,
            namespace: "/".into(),
            node_name: cfg.node.name.clone(),
            sim_time: false,
            service_mapping: service_mapping_of(
                std::env::var("RMW_IMPLEMENTATION").ok().as_deref(),
            ),
            localhost_only: localhost_only_of(
                std::env::var("ROS_LOCALHOST_ONLY").ok().as_deref(),
                std::env::var("ROS_AUTOMATIC_DISCOVERY_RANGE")
                    .ok()
                    .as_deref(),
            )?,
        })
    }
}

/// The pure-Rust DDS transport: owns the participant and the node.
pub struct Dds {
    context: Context,
    // Keeps the node on the ROS graph (`ros2 node list`) while the transport lives; serves.
    node: ros2_client::Node,
    service_mapping: ServiceMapping,
    endpoints: Endpoints,
    namespace: String,
    node_name: String,
    cfg: Config,
    sim_clock: Option<Arc<ManualClock>>,
    managed: Managed,
    /// The node's fully qualified name (`/robot1/frt_robot_host`).
    fqn: String,
    /// Where what crosses the transport is recorded (`--record`).
    tap: Option<Arc<crate::record::Tap>>,
}

/// `("sensor_msgs", "Image")` of `sensor_msgs/msg/Image` (and of `…/srv/…`).
fn package_and_type(type_name: &str) -> (&str, &str) {
    let mut parts = type_name.split('/');
    (parts.next().unwrap_or(""), parts.nth(1).unwrap_or(""))
}

fn qos(sensor_data: bool) -> QosProfile {
    if sensor_data {
        QosProfile::subscription_default()
            .reliability(Reliability::BestEffort)
            .history(History::KeepLast { depth: 5 })
    } else {
        QosProfile::publisher_default().history(History::KeepLast { depth: 10 })
    }
}

impl Dds {
    /// Records every message received and published from now on into `tap`.
    pub fn set_tap(&mut self, tap: Option<Arc<crate::record::Tap>>) {
        self.managed.tap = tap.clone();
        self.tap = tap;
    }

    /// Joins the domain and creates the node. `sim_clock`: the clock `/clock` drives when
    /// `options.sim_time` is set.
    pub fn new(
        cfg: Config,
        options: &DdsOptions,
        sim_clock: Option<Arc<ManualClock>>,
    ) -> Result<Dds> {
        let endpoints = Endpoints::new(
            &cfg,
            &options.namespace,
            &options.node_name,
            options.sim_time,
        )?;
        let mut builder = rustdds::DomainParticipantBuilder::new(options.domain_id);
        if options.localhost_only {
            builder = builder.with_only_networks([std::net::Ipv4Addr::LOCALHOST]);
        }
        let participant = builder
            .build()
            .map_err(|e| dds_err("joining the domain", e))?;
        let context = Context::from_domain_participant(participant)
            .map_err(|e| dds_err("creating the ROS 2 context", e))?;
        let name = NodeName::new(&options.namespace, &options.node_name)
            .map_err(|e| dds_err("node name", e))?;
        let node = context
            .new_node(
                name,
                // The parameter services are the transport's own, in the clients' framing.
                NodeOptions::new()
                    .enable_rosout(true)
                    .start_parameter_services(false),
            )
            .map_err(|e| dds_err("creating the node", e))?;
        let fqn = match options.namespace.trim_end_matches('/') {
            "" => format!("/{}", options.node_name),
            ns => format!("{ns}/{}", options.node_name),
        };
        let mut node = node;
        let managed = Managed::new(&mut node, &context, options.service_mapping, &fqn)?;
        Ok(Dds {
            tap: None,
            managed,
            fqn,
            context,
            node,
            service_mapping: options.service_mapping,
            endpoints,
            namespace: options.namespace.clone(),
            node_name: options.node_name.clone(),
            cfg,
            sim_clock: sim_clock.filter(|_| options.sim_time),
        })
    }

    /// Applies topic remappings (`-r from:=to`).
    pub fn remap(&mut self, remaps: &[(String, String)]) -> Result<()> {
        let (ns, node) = (&self.namespace, &self.node_name);
        self.endpoints.remap(remaps, ns, node)
    }

    /// The node's lifecycle state.
    pub fn lifecycle_state(&self) -> State {
        self.managed.state
    }

    /// Serves the lifecycle services alone (nothing is configured: no topic is read or
    /// written) until a configure or a shutdown is requested — returned, its request pending
    /// until [`Dds::complete_transition`] — or `stop` is set (`None`).
    pub fn wait_for_transition(&mut self, stop: &AtomicBool) -> Result<Option<Transition>> {
        let mut poll = Poll::new().map_err(|e| dds_err("poll", e))?;
        self.managed.register(&poll, true)?;
        let mut events = Events::with_capacity(16);
        let mut taken = None;
        while taken.is_none() && !stop.load(Ordering::Relaxed) {
            if let Err(e) = poll.poll(&mut events, Some(Duration::from_millis(50))) {
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(dds_err("poll", e));
                }
            }
            self.managed.flush();
            if !events.is_empty() {
                taken = self.managed.answer(None);
            }
        }
        self.managed.register(&poll, false)?;
        Ok(taken)
    }

    /// Answers the pending `change_state` request: `ok` takes the transition (published on
    /// `~/transition_event`).
    pub fn complete_transition(&mut self, ok: bool) {
        self.managed.complete(ok);
    }

    /// A transition the node took by itself (`autostart`: configure, then activate).
    pub fn took(&mut self, t: Transition) {
        self.managed.moved(t);
    }

    /// The transition [`Transport::run`] ended for (cleanup, shutdown), still to answer.
    pub fn pending_transition(&self) -> Option<Transition> {
        self.managed.pending.map(|(_, t)| t)
    }

    /// The topics this transport subscribes to and publishes.
    pub fn endpoints(&self) -> &Endpoints {
        &self.endpoints
    }

    fn topic<K>(&self, e: &wire::Endpoint<K>) -> Result<(rustdds::Topic, QosProfile)> {
        let (pkg, ty) = package_and_type(e.type_name);
        let profile = qos(e.sensor_data);
        // ROS 2's DDS topic name: `rt` + the fully qualified name (resolved and checked by
        // `wire::resolve`).
        let dds_name = format!("rt{}", e.topic);
        let topic = self
            .context
            .create_topic(dds_name, MessageTypeName::new(pkg, ty), &profile)
            .map_err(|err| dds_err(&e.topic, err))?;
        Ok((topic, profile))
    }
}

impl Transport for Dds {
    fn name(&self) -> &str {
        "ros2 (DDS)"
    }

    fn run(
        &mut self,
        inputs: &Inputs,
        outputs: &Receiver<Outbound>,
        stop: &AtomicBool,
    ) -> Result<()> {
        // Every reader and writer is the node's: it announces them in `ros_discovery_info`
        // (`ros2 node info` attributes the topics to it).
        let mut poll = Poll::new().map_err(|e| dds_err("poll", e))?;
        let mut readers = Vec::new();
        for (i, e) in self.endpoints.inputs.iter().enumerate() {
            let (topic, q) = self.topic(e)?;
            let mut r = self
                .node
                .create_subscription::<Body>(&topic, Some(q))
                .map_err(|err| dds_err(&e.topic, err))?;
            poll.registry()
                .register(&mut r, Token(i), Interest::READABLE)
                .map_err(|err| dds_err(&e.topic, err))?;
            readers.push((e.kind.clone(), r));
        }
        // The services, after the readers' tokens.
        let params = Mutex::new(Parameters::new(&self.cfg));
        let fqn = self.fqn.clone();
        let mut services = Services {
            node: &mut self.node,
            context: &self.context,
            mapping: self.service_mapping,
            poll: &poll,
            first_token: readers.len(),
            servers: Vec::new(),
        };
        for e in &self.endpoints.services {
            let wire::Srv::SetSubgoal = e.kind;
            let (pkg, ty) = package_and_type(e.type_name);
            let tap = self.tap.clone();
            services.add(&e.topic, pkg, ty, move |req: SetSubgoalRequest| {
                if let Some(tap) = &tap {
                    let c = crate::messages::Command::Subgoal(req.subgoal.clone());
                    tap.command(inputs.now(), &c);
                }
                wire::set_subgoal(inputs, &req)
            })?;
        }
        parameter_services(&mut services, &fqn, &params, inputs, self.tap.clone())?;
        let servers = services.servers;
        let mut writers = Vec::new();
        for e in &self.endpoints.outputs {
            let (topic, q) = self.topic(e)?;
            let w = self
                .node
                .create_publisher::<Body>(&topic, Some(q))
                .map_err(|err| dds_err(&e.topic, err))?;
            writers.push((e.kind, w));
        }
        let clock = self.sim_clock.clone();
        let cfg = &self.cfg;
        let tap = self.tap.as_deref();
        let managed = &mut self.managed;
        managed.register(&poll, true)?;
        // Set when a cleanup or a shutdown ends this run (after the halt it issued went out).
        let leaving = AtomicBool::new(false);
        // rcl's logger name: the namespace and the node name joined by dots.
        let logger = fqn.trim_start_matches('/').replace('/', ".");
        let log = self.node.logging_handle();
        let r = std::thread::scope(|s| {
            std::thread::Builder::new()
                .name("frt-dds-publish".into())
                .spawn_scoped(s, || {
                    let sink = Sink {
                        writers: &writers,
                        log: &log,
                        logger: &logger,
                        tap: tap.map(|t| (t, inputs)),
                    };
                    publish(cfg, sink, outputs, [stop, &leaving])
                })
                .map_err(|e| dds_err("publish thread", e))?;
            let mut events = Events::with_capacity(64);
            let mut leave_at = None;
            while !stop.load(Ordering::Relaxed) {
                if leave_at.is_some_and(|t| std::time::Instant::now() >= t) {
                    leaving.store(true, Ordering::SeqCst);
                    break;
                }
                if let Err(e) = poll.poll(&mut events, Some(Duration::from_millis(50))) {
                    if e.kind() != std::io::ErrorKind::Interrupted {
                        return Err(dds_err("poll", e));
                    }
                }
                // Replies waiting for their requester's reply reader (at most every 50 ms).
                managed.flush();
                for server in &servers {
                    server.flush();
                }
                for ev in events.iter() {
                    let i = ev.token().0;
                    if i >= MANAGED_TOKEN {
                        if managed.answer(Some(inputs)).is_some() && leave_at.is_none() {
                            // Cleanup or shutdown: halt and hold first; the run ends once
                            // the halt chunk is out.
                            let stop = crate::messages::Command::Stop;
                            if let Some(tap) = tap {
                                tap.command(inputs.now(), &stop);
                            }
                            let _ = inputs.command(stop, crate::messages::Source::Typed);
                            leave_at = Some(std::time::Instant::now() + Duration::from_millis(300));
                        }
                        continue;
                    }
                    if let Some(server) = i.checked_sub(readers.len()).and_then(|j| servers.get(j))
                    {
                        server.answer(inputs);
                        continue;
                    }
                    let Some((kind, r)) = readers.get_mut(i) else {
                        continue;
                    };
                    // Edge-triggered: take everything that has arrived. A sample that does
                    // not read (big-endian CDR) is taken too, and refused as its input kind.
                    loop {
                        match r.take() {
                            Ok(Some((b, _))) => {
                                let _s = tracing::trace_span!("receive").entered();
                                if let Some(tap) = tap {
                                    // As rcl hands it: the CDR little-endian header first.
                                    let mut m = Vec::with_capacity(4 + b.0.len());
                                    m.extend_from_slice(&[0, 1, 0, 0]);
                                    m.extend_from_slice(&b.0);
                                    tap.input(inputs.now(), kind, &m);
                                }
                                wire::receive(kind, Cdr::Body(&b.0), inputs, clock.as_deref());
                            }
                            Ok(None) => break,
                            Err(e) => wire::refuse(kind, &e.to_string(), inputs),
                        }
                    }
                }
            }
            Ok(())
        });
        managed.register(&poll, false)?;
        r
    }
}

type Writer = ros2_client::Publisher<Body>;

/// Writes what the node sends, as it sends it, until `stop`.
/// Publishes one log record on `/rosout` as the node's logger `logger`.
fn rosout(log: &ros2_client::NodeLoggingHandle, logger: &str, r: crate::rosout::Record) {
    use ros2_client::RosoutRaw;
    use ros2_client::ros2::LogLevel;
    let level = match r.level {
        40.. => LogLevel::Error,
        30 => LogLevel::Warn,
        20 => LogLevel::Info,
        _ => LogLevel::Debug,
    };
    let t = super::msg::Time::from_secs(r.stamp);
    let stamp = ros2_client::builtin_interfaces::Time::new(t.sec, t.nanosec);
    log.rosout_raw(stamp, level, logger, &r.msg, &r.file, &r.function, r.line);
}

/// Where the publishing thread sends: the writers, `/rosout` as the node's logger, and the
/// recording (with the inputs for the node's clock).
struct Sink<'a> {
    writers: &'a [(Out, Writer)],
    log: &'a ros2_client::NodeLoggingHandle,
    logger: &'a str,
    tap: Option<(&'a crate::record::Tap, &'a Inputs)>,
}

fn publish(cfg: &Config, sink: Sink, outputs: &Receiver<Outbound>, stop: [&AtomicBool; 2]) {
    let Sink {
        writers,
        log,
        logger,
        tap,
    } = sink;
    let mut publisher = wire::Publisher::new(cfg);
    let never = crossbeam_channel::never();
    let records = crate::rosout::records().unwrap_or(&never);
    while !stop.iter().any(|s| s.load(Ordering::Relaxed)) {
        let o = crossbeam_channel::select! {
            recv(outputs) -> o => match o {
                Ok(o) => o,
                Err(_) => return,
            },
            recv(records) -> r => {
                if let Ok(r) = r {
                    rosout(log, logger, r);
                }
                continue;
            },
            default(Duration::from_millis(50)) => continue,
        };
        let _s = tracing::trace_span!("publish").entered();
        if let Some((tap, inputs)) = tap {
            tap.output(inputs.now(), &o);
        }
        publisher.messages(&o, |p| {
            if let Some((_, w)) = writers.iter().find(|(k, _)| *k == p.kind()) {
                // The body: RustDDS writes the encapsulation header itself.
                let body = Bytes::from(p.encode()).slice(4..);
                if let Err(e) = w.publish(Body(body)) {
                    eprintln!("DDS publish on {:?}: {e}", p.kind());
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ros::msg::RosMessage;
    use rustdds::RepresentationIdentifier;

    /// ros2-client frames the service's bodies with serde's CDR: they must be the bytes of
    /// the node's codec (itself checked against Cyclone DDS in tests/cdr.rs).
    fn serde_body<T: serde::Serialize>(v: &T) -> Vec<u8> {
        let mut out = Vec::new();
        rustdds::serialization::to_writer_with_rep_id(
            &mut out,
            v,
            RepresentationIdentifier::CDR_LE,
        )
        .unwrap();
        out
    }

    #[test]
    fn service_bodies_through_serde_equal_the_codec() {
        for text in ["", "wipe the table", "open the drawer ✓"] {
            let req = SetSubgoalRequest {
                subgoal: text.into(),
            };
            assert_eq!(serde_body(&req), req.encode()[4..], "{text:?}");
            for (accepted, id) in [(true, 7u64), (false, 0)] {
                let resp = SetSubgoalResponse {
                    accepted,
                    subgoal_id: id,
                    message: text.into(),
                };
                assert_eq!(serde_body(&resp), resp.encode()[4..], "{resp:?}");
            }
        }
    }

    /// A body through ros2-client's serde CDR, as its publishers write it and its
    /// subscriptions read it: the same bytes both ways, whatever the length; big-endian refused.
    #[test]
    fn bodies_pass_through_serde_cdr_unchanged() {
        use rustdds::serialization::deserialize_from_cdr_with_rep_id;
        let mut lengths: Vec<usize> = (0..40).collect();
        lengths.push(640 * 480 * 3 + 5);
        for n in lengths {
            let bytes: Vec<u8> = (0..n).map(|i| (i * 131 + n) as u8).collect();
            let body = Body(Bytes::from(bytes.clone()));
            let written = serde_body(&body);
            assert_eq!(written, bytes, "{n} bytes written");
            let (read, used): (Body, usize) =
                deserialize_from_cdr_with_rep_id(&written, RepresentationIdentifier::CDR_LE)
                    .unwrap();
            assert_eq!((&read.0[..], used), (&bytes[..], n), "{n} bytes read");
        }
        let e =
            deserialize_from_cdr_with_rep_id::<Body>(&[1, 2, 3], RepresentationIdentifier::CDR_BE);
        assert!(e.err().unwrap().to_string().contains("big-endian"));
    }

    #[test]
    fn discovery_range_follows_ros_variables() {
        let ok = |a, b| localhost_only_of(a, b).unwrap();
        assert!(!ok(None, None));
        assert!(ok(Some("1"), None));
        assert!(
            ok(Some("1"), Some("SUBNET")),
            "the older variable takes precedence"
        );
        assert!(!ok(Some("0"), Some("SUBNET")));
        assert!(ok(Some("0"), Some("LOCALHOST")));
        assert!(ok(None, Some(" LOCALHOST ")));
        assert!(!ok(Some(""), Some("SYSTEM_DEFAULT")));
        for (a, b, name) in [
            (Some("yes"), None, "ROS_LOCALHOST_ONLY"),
            (None, Some("OFF"), "ROS_AUTOMATIC_DISCOVERY_RANGE"),
            (None, Some("localhost"), "ROS_AUTOMATIC_DISCOVERY_RANGE"),
        ] {
            let e = localhost_only_of(a, b).unwrap_err().to_string();
            assert!(e.contains(name), "{e}");
        }
    }

    #[test]
    fn service_mapping_follows_the_middleware() {
        assert_eq!(
            service_mapping_of(Some("rmw_cyclonedds_cpp")),
            ServiceMapping::Cyclone
        );
        for rmw in [None, Some("rmw_fastrtps_cpp"), Some("rmw_connextdds")] {
            assert_eq!(service_mapping_of(rmw), ServiceMapping::Enhanced);
        }
    }
}

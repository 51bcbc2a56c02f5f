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
//! The `~/set_subgoal` service (`frt_msgs/srv/SetSubgoal`) is served with ros2-client's
//! request/reply framing, in the mapping of the clients' middleware: rmw_cyclonedds puts a
//! request header in the payload, rmw_fastrtps (and rmw_connextdds) carry the request's
//! identity in inline QoS ([`DdsOptions::service_mapping`], from `RMW_IMPLEMENTATION`). Its
//! request and response bodies are the same CDR as the node's codec writes (tested).

use super::msg::{SetSubgoalRequest, SetSubgoalResponse};
use super::wire::{self, Cdr, Endpoints, Out};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::messages::Outbound;
use crate::node::{Inputs, ManualClock};
use crate::transport::Transport;
use bytes::Bytes;
use crossbeam_channel::{Receiver, RecvTimeoutError};
pub use ros2_client::ServiceMapping;
use ros2_client::dds::rustdds::{
    self, QosPolicies, RepresentationIdentifier,
    mio1::{Events, Interest, Poll, Token},
    no_key::{Decode, DefaultDecoder, DeserializerAdapter, SerializerAdapter},
};
use ros2_client::qos::{History, QosProfile, Reliability};
use ros2_client::{Context, MessageTypeName, Name, NodeName, NodeOptions, ServiceTypeName};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

fn dds_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::bad("ROS 2 (DDS)", format!("{what}: {e}"))
}

/// A message's CDR body as it crossed the wire (the encapsulation header stripped or added
/// by RustDDS); our codec encodes and decodes it.
struct Body(Bytes);

/// The adapter that hands RustDDS our bytes unchanged, both ways.
struct Raw;

/// Never produced: taking bytes cannot fail.
#[derive(Debug, thiserror::Error)]
#[error("raw CDR")]
struct RawError;

const LITTLE_ENDIAN: [RepresentationIdentifier; 1] = [RepresentationIdentifier::CDR_LE];

impl SerializerAdapter<Body> for Raw {
    type Error = RawError;
    fn output_encoding() -> RepresentationIdentifier {
        RepresentationIdentifier::CDR_LE
    }
    fn to_bytes(value: &Body) -> std::result::Result<Bytes, RawError> {
        Ok(value.0.clone())
    }
}

impl DeserializerAdapter<Body> for Raw {
    type Error = RawError;
    type Decoded = Body;
    // Big-endian CDR is refused by RustDDS before it reaches us (no ROS 2 middleware on
    // the platforms we target writes it).
    fn supported_encodings() -> &'static [RepresentationIdentifier] {
        &LITTLE_ENDIAN
    }
    fn transform_decoded(decoded: Body) -> Body {
        decoded
    }
}

#[derive(Clone)]
struct RawDecoder;

impl<'de> Decode<'de, Body> for RawDecoder {
    type Error = RawError;
    fn decode_bytes(
        self,
        bytes: &'de [u8],
        _: RepresentationIdentifier,
    ) -> std::result::Result<Body, RawError> {
        Ok(Body(Bytes::copy_from_slice(bytes)))
    }
}

impl DefaultDecoder<Body> for Raw {
    type Decoder = RawDecoder;
    const DECODER: RawDecoder = RawDecoder;
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
        let participant = rustdds::DomainParticipantBuilder::new(options.domain_id)
            .build()
            .map_err(|e| dds_err("joining the domain", e))?;
        let context = Context::from_domain_participant(participant)
            .map_err(|e| dds_err("creating the ROS 2 context", e))?;
        let name = NodeName::new(&options.namespace, &options.node_name)
            .map_err(|e| dds_err("node name", e))?;
        let node = context
            .new_node(name, NodeOptions::new().enable_rosout(false))
            .map_err(|e| dds_err("creating the node", e))?;
        Ok(Dds {
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

    /// The topics this transport subscribes to and publishes.
    pub fn endpoints(&self) -> &Endpoints {
        &self.endpoints
    }

    fn topic<K>(&self, e: &wire::Endpoint<K>) -> Result<(rustdds::Topic, QosPolicies)> {
        let (pkg, ty) = package_and_type(e.type_name);
        let profile = qos(e.sensor_data);
        // ROS 2's DDS topic name: `rt` + the fully qualified name (resolved and checked by
        // `wire::resolve`).
        let dds_name = format!("rt{}", e.topic);
        let topic = self
            .context
            .create_topic(dds_name, MessageTypeName::new(pkg, ty), &profile)
            .map_err(|err| dds_err(&e.topic, err))?;
        Ok((topic, QosPolicies::from(&profile)))
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
        let participant = self.context.domain_participant();
        let subscriber = participant
            .create_subscriber(&QosPolicies::builder().build())
            .map_err(|e| dds_err("subscriber", e))?;
        let publisher = participant
            .create_publisher(&QosPolicies::builder().build())
            .map_err(|e| dds_err("publisher", e))?;
        let poll = Poll::new().map_err(|e| dds_err("poll", e))?;
        let mut readers = Vec::new();
        for (i, e) in self.endpoints.inputs.iter().enumerate() {
            let (topic, q) = self.topic(e)?;
            let mut r = subscriber
                .create_datareader_no_key::<Body, Raw>(&topic, Some(q))
                .map_err(|err| dds_err(&e.topic, err))?;
            poll.registry()
                .register(&mut r, Token(i), Interest::READABLE)
                .map_err(|err| dds_err(&e.topic, err))?;
            readers.push((e.kind.clone(), r));
        }
        // The services, after the readers' tokens.
        let mut servers = Vec::new();
        for e in &self.endpoints.services {
            let wire::Srv::SetSubgoal = e.kind;
            let name = Name::parse(&e.topic).map_err(|err| dds_err(&e.topic, err))?;
            let (pkg, ty) = package_and_type(e.type_name);
            let mut server = self
                .node
                .create_server::<SetSubgoalRequest, SetSubgoalResponse>(
                    self.service_mapping,
                    &name,
                    &ServiceTypeName::new(pkg, ty),
                    qos(false),
                    qos(false),
                )
                .map_err(|err| dds_err(&e.topic, err))?;
            poll.registry()
                .register(
                    &mut server,
                    Token(readers.len() + servers.len()),
                    Interest::READABLE,
                )
                .map_err(|err| dds_err(&e.topic, err))?;
            servers.push(server);
        }
        let mut writers = Vec::new();
        for e in &self.endpoints.outputs {
            let (topic, q) = self.topic(e)?;
            let w = publisher
                .create_datawriter_no_key::<Body, Raw>(&topic, Some(q))
                .map_err(|err| dds_err(&e.topic, err))?;
            writers.push((e.kind, w));
        }
        let clock = self.sim_clock.clone();
        let cfg = &self.cfg;
        std::thread::scope(|s| {
            s.spawn(|| publish(cfg, &writers, outputs, stop));
            let mut poll = poll;
            let mut events = Events::with_capacity(64);
            while !stop.load(Ordering::Relaxed) {
                if let Err(e) = poll.poll(&mut events, Some(Duration::from_millis(50))) {
                    if e.kind() != std::io::ErrorKind::Interrupted {
                        return Err(dds_err("poll", e));
                    }
                }
                for ev in events.iter() {
                    let i = ev.token().0;
                    if let Some(server) = i.checked_sub(readers.len()).and_then(|j| servers.get(j))
                    {
                        serve(server, inputs);
                        continue;
                    }
                    let Some((kind, r)) = readers.get_mut(i) else {
                        continue;
                    };
                    // Edge-triggered: take everything that has arrived.
                    loop {
                        match r.take_next_sample() {
                            Ok(Some(sample)) => {
                                let b = sample.value();
                                wire::receive(kind, Cdr::Body(&b.0), inputs, clock.as_deref());
                            }
                            Ok(None) => break,
                            Err(e) => {
                                eprintln!("DDS read: {e}");
                                break;
                            }
                        }
                    }
                }
            }
            Ok(())
        })
    }
}

/// Answers the requests that have arrived (at most 64 per readiness event; the poll wakes
/// again for the rest).
fn serve(server: &ros2_client::Server<SetSubgoalRequest, SetSubgoalResponse>, inputs: &Inputs) {
    for _ in 0..64 {
        match server.receive_request() {
            Ok(Some((id, req))) => {
                let resp = wire::set_subgoal(inputs, &req);
                if let Err(e) = server.send_response(id, resp) {
                    eprintln!("DDS set_subgoal reply: {e}");
                }
            }
            Ok(None) => return,
            Err(e) => {
                // An undecodable request: counted like a garbage command; no reply can be
                // addressed without its header.
                inputs.refuse_message(crate::node::Refusal::Command, &format!("set_subgoal: {e}"));
            }
        }
    }
}

type Writer = rustdds::no_key::DataWriter<Body, Raw>;

/// Writes what the node sends, as it sends it, until `stop`.
fn publish(
    cfg: &Config,
    writers: &[(Out, Writer)],
    outputs: &Receiver<Outbound>,
    stop: &AtomicBool,
) {
    let mut publisher = wire::Publisher::new(cfg);
    while !stop.load(Ordering::Relaxed) {
        let o = match outputs.recv_timeout(Duration::from_millis(50)) {
            Ok(o) => o,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        publisher.messages(&o, |p| {
            if let Some((_, w)) = writers.iter().find(|(k, _)| *k == p.kind()) {
                // The body: RustDDS writes the encapsulation header itself.
                let body = Bytes::from(p.encode()).slice(4..);
                if let Err(e) = w.write(Body(body), None) {
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

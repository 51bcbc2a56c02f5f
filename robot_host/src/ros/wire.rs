//! What every ROS 2 transport shares: the node's topics with their resolved names, types and
//! QoS, how a serialized message on an input topic reaches the node's inputs, and which ROS
//! messages one outbound item becomes. A transport only creates its endpoints and moves
//! bytes (or typed messages) through these.
//!
//! Topics (relative names resolve under the node's namespace, `~/` under its own name):
//! cameras, state and audio as configured (sensor-data QoS); `~/subgoal` (`std_msgs/String`),
//! `~/command` (`std_msgs/String`: `stop`, `resume`, `subgoal: …`), `~/interrupt` and
//! `~/resume` (`std_msgs/Empty`), `/clock` when on simulation time; published: `~/action_chunk`
//! (`frt_msgs/ActionChunk`), `~/transcript`, `~/status` (every status snapshot), `/diagnostics`
//! (at most 1 Hz) and, when configured, a `trajectory_msgs/JointTrajectory` per chunk.

use super::CdrError;
use super::convert::{self, PcmFormat};
use super::msg::{self, RosMessage, mgonzs13, ros_drivers};
use crate::config::{ActionDim, ActionKind, CommandMessage, Config, ImageFormat, TrajectoryConfig};
use crate::error::{Error, Result};
use crate::messages::Outbound;
use crate::node::{Inputs, ManualClock, Refusal};
use crate::transport::{Inbound, deliver};
use std::time::{Duration, Instant};

/// Resolves a ROS 2 topic name to its fully qualified form: `/abs` stays, `rel` goes under
/// `namespace`, `~/x` (or `~`) under `namespace/node`. Names follow ROS 2's rules: letters,
/// digits, `_` and `/`, no empty or digit-led tokens, no `__`, no trailing `/`.
pub fn resolve(name: &str, namespace: &str, node: &str) -> Result<String> {
    let bad = |why: &str| Err(Error::bad("ROS 2 topic name", format!("`{name}`: {why}")));
    let ns = namespace.trim_end_matches('/');
    if !ns.is_empty() && !ns.starts_with('/') {
        return Err(Error::bad(
            "ROS 2 namespace",
            format!("`{namespace}` must start with `/`"),
        ));
    }
    let full = if name == "~" {
        format!("{ns}/{node}")
    } else if let Some(rest) = name.strip_prefix("~/") {
        format!("{ns}/{node}/{rest}")
    } else if name.starts_with('/') {
        name.to_string()
    } else {
        format!("{ns}/{name}")
    };
    if name.is_empty() {
        return bad("empty");
    }
    if full.ends_with('/') {
        return bad("ends with `/`");
    }
    for tok in full[1..].split('/') {
        if tok.is_empty() {
            return bad("repeated `/`");
        }
        if tok.starts_with(|c: char| c.is_ascii_digit()) {
            return bad("a token starts with a digit");
        }
        if tok.contains("__") {
            return bad("repeated `_`");
        }
        if let Some(c) = tok
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '_'))
        {
            return bad(&format!("character {c:?} is not allowed"));
        }
    }
    Ok(full)
}

/// What arrives on an input topic.
#[derive(Clone, Debug, PartialEq)]
pub enum In {
    /// A camera (`Image` or `CompressedImage`), by its configured name.
    Camera(String, ImageFormat),
    State,
    Subgoal,
    Command,
    Interrupt,
    Resume,
    /// Microphone samples in one of the three formats.
    Audio(AudioIn),
    /// Simulation time.
    Clock,
}

impl In {
    /// The ROS type of the messages of this input.
    pub fn type_name(&self) -> &'static str {
        match self {
            In::Camera(_, ImageFormat::Raw) => msg::Image::NAME,
            In::Camera(_, ImageFormat::Compressed) => msg::CompressedImage::NAME,
            In::State => msg::JointState::NAME,
            In::Subgoal | In::Command => msg::StringMsg::NAME,
            In::Interrupt | In::Resume => msg::Empty::NAME,
            In::Audio(AudioIn::Frt) => msg::AudioChunk::NAME,
            In::Audio(AudioIn::AudioStamped) => mgonzs13::AudioStamped::NAME,
            In::Audio(AudioIn::AudioData { .. }) => ros_drivers::AudioDataStamped::NAME,
            In::Clock => msg::Clock::NAME,
        }
    }
}

/// A microphone format and what raw PCM needs to be read.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum AudioIn {
    Frt,
    AudioStamped,
    AudioData {
        pcm: PcmFormat,
        rate: u32,
        channels: u16,
    },
}

/// What the node publishes on an output topic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Out {
    Chunk,
    Transcript,
    Status,
    Trajectory,
    /// The fixed-rate command stream (`execution.command_stream`).
    Commands,
    Diagnostics,
}

/// One topic: its fully qualified name, its ROS type and whether it takes sensor-data QoS
/// (best effort, keep last 5) rather than the default (reliable, keep last 10).
#[derive(Clone, Debug, PartialEq)]
pub struct Endpoint<K> {
    pub kind: K,
    /// The name as configured (what rcl resolves and remaps itself).
    pub name: String,
    /// The fully qualified name.
    pub topic: String,
    pub type_name: &'static str,
    pub sensor_data: bool,
}

/// What a service the node serves does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Srv {
    /// `frt_msgs/srv/SetSubgoal` (see [`set_subgoal`]).
    SetSubgoal,
}

/// Every topic the node subscribes to and publishes, and the services it serves, from its
/// configuration.
#[derive(Clone, Debug)]
pub struct Endpoints {
    pub inputs: Vec<Endpoint<In>>,
    pub outputs: Vec<Endpoint<Out>>,
    /// `type_name` is the service type (`frt_msgs/srv/SetSubgoal`).
    pub services: Vec<Endpoint<Srv>>,
}

impl Endpoints {
    /// `sim_time`: also subscribe to `/clock`.
    pub fn new(cfg: &Config, namespace: &str, node: &str, sim_time: bool) -> Result<Endpoints> {
        let topic = |n: &str| resolve(n, namespace, node);
        let mut inputs = Vec::new();
        let mut input = |kind, name: &str, type_name, sensor_data| -> Result<()> {
            inputs.push(Endpoint {
                kind,
                name: name.to_string(),
                topic: topic(name)?,
                type_name,
                sensor_data,
            });
            Ok(())
        };
        for c in &cfg.cameras {
            let ty = match c.format {
                ImageFormat::Raw => msg::Image::NAME,
                ImageFormat::Compressed => msg::CompressedImage::NAME,
            };
            input(In::Camera(c.name.clone(), c.format), &c.topic, ty, true)?;
        }
        input(In::State, &cfg.state.topic, msg::JointState::NAME, true)?;
        input(In::Subgoal, "~/subgoal", msg::StringMsg::NAME, false)?;
        input(In::Command, "~/command", msg::StringMsg::NAME, false)?;
        input(In::Interrupt, "~/interrupt", msg::Empty::NAME, false)?;
        input(In::Resume, "~/resume", msg::Empty::NAME, false)?;
        if let Some(a) = &cfg.audio {
            let (kind, ty) = match a.kind.as_str() {
                "audio_stamped" => (AudioIn::AudioStamped, mgonzs13::AudioStamped::NAME),
                "audio_data" => (
                    AudioIn::AudioData {
                        pcm: if a.sample_format == "f32le" {
                            PcmFormat::F32Le
                        } else {
                            PcmFormat::S16Le
                        },
                        rate: a.sample_rate.unwrap_or(16_000),
                        channels: a.channels.unwrap_or(1),
                    },
                    ros_drivers::AudioDataStamped::NAME,
                ),
                _ => (AudioIn::Frt, msg::AudioChunk::NAME),
            };
            input(In::Audio(kind), &a.topic, ty, true)?;
        }
        if sim_time {
            input(In::Clock, "/clock", msg::Clock::NAME, false)?;
        }
        let mut outputs = Vec::new();
        let mut output = |kind, name: &str, type_name| -> Result<()> {
            outputs.push(Endpoint {
                kind,
                name: name.to_string(),
                topic: topic(name)?,
                type_name,
                sensor_data: false,
            });
            Ok(())
        };
        output(Out::Chunk, "~/action_chunk", msg::ActionChunk::NAME)?;
        output(Out::Transcript, "~/transcript", msg::Transcript::NAME)?;
        output(Out::Status, "~/status", msg::HostStatus::NAME)?;
        if let Some(t) = &cfg.ros.joint_trajectory {
            output(Out::Trajectory, &t.topic, msg::JointTrajectory::NAME)?;
        }
        if let Some(c) = &cfg.execution.command_stream {
            let ty = match c.message {
                CommandMessage::Float64MultiArray => msg::Float64MultiArray::NAME,
                CommandMessage::JointState => msg::JointState::NAME,
            };
            output(Out::Commands, &c.topic, ty)?;
        }
        if cfg.ros.diagnostics {
            output(Out::Diagnostics, "/diagnostics", msg::DiagnosticArray::NAME)?;
        }
        let services = vec![Endpoint {
            kind: Srv::SetSubgoal,
            name: "~/set_subgoal".into(),
            topic: topic("~/set_subgoal")?,
            type_name: SET_SUBGOAL,
            sensor_data: false,
        }];
        Ok(Endpoints {
            inputs,
            outputs,
            services,
        })
    }

    /// The topic an input arrives on (a microphone in another format than the configured
    /// one: the configured microphone topic, else `/audio`).
    pub fn input_topic(&self, kind: &In) -> &str {
        let same = |e: &&Endpoint<In>| match (&e.kind, kind) {
            (In::Audio(_), In::Audio(_)) => true,
            (a, b) => a == b,
        };
        match self.inputs.iter().find(same) {
            Some(e) => &e.topic,
            None if matches!(kind, In::Clock) => "/clock",
            None => "/audio",
        }
    }

    /// The input a recorded topic of type `type_name` is (`None`: not an input of this
    /// node). A microphone topic is read in the format its type names.
    pub fn input_for(&self, topic: &str, type_name: &str) -> Option<In> {
        if topic == "/clock" && type_name == msg::Clock::NAME {
            return Some(In::Clock);
        }
        let Some(e) = self.inputs.iter().find(|e| e.topic == topic) else {
            let audio = !self.inputs.iter().any(|e| matches!(e.kind, In::Audio(_)));
            return (audio && topic == "/audio" && type_name == msg::AudioChunk::NAME)
                .then_some(In::Audio(AudioIn::Frt));
        };
        match &e.kind {
            In::Audio(_) if type_name == msg::AudioChunk::NAME => Some(In::Audio(AudioIn::Frt)),
            k if k.type_name() == type_name => Some(k.clone()),
            _ => None,
        }
    }

    /// The topic an output is published on.
    pub fn output_topic(&self, kind: Out) -> Option<&str> {
        self.outputs
            .iter()
            .find(|e| e.kind == kind)
            .map(|e| e.topic.as_str())
    }

    /// Applies topic remappings (`from:=to`, each resolved like a topic name) to the fully
    /// qualified names.
    pub fn remap(
        &mut self,
        remaps: &[(String, String)],
        namespace: &str,
        node: &str,
    ) -> Result<()> {
        for (from, to) in remaps {
            let (from, to) = (
                resolve(from, namespace, node)?,
                resolve(to, namespace, node)?,
            );
            let ins = self.inputs.iter_mut().map(|e| &mut e.topic);
            let outs = self.outputs.iter_mut().map(|e| &mut e.topic);
            for t in ins
                .chain(outs)
                .chain(self.services.iter_mut().map(|e| &mut e.topic))
            {
                if *t == from {
                    t.clone_from(&to);
                }
            }
        }
        Ok(())
    }
}

/// The ROS type of the subgoal service.
pub const SET_SUBGOAL: &str = "frt_msgs/srv/SetSubgoal";

/// Serves one `SetSubgoal` request: the subgoal is queued for the control loop (the next
/// chunk carries it) and answered with the id it will carry, or refused with the reason.
pub fn set_subgoal(inputs: &Inputs, req: &msg::SetSubgoalRequest) -> msg::SetSubgoalResponse {
    match inputs.subgoal(&req.subgoal, crate::messages::Source::Typed) {
        Ok(id) => msg::SetSubgoalResponse {
            accepted: true,
            subgoal_id: id,
            message: String::new(),
        },
        Err(e) => msg::SetSubgoalResponse {
            accepted: false,
            subgoal_id: 0,
            message: e.to_string(),
        },
    }
}

/// A serialized message as a middleware hands it over.
#[derive(Clone, Copy, Debug)]
pub enum Cdr<'a> {
    /// With its 4-byte encapsulation header (rcl's serialized messages).
    Serialized(&'a [u8]),
    /// The body only (the header already read by a DDS reader).
    Body(&'a [u8]),
}

impl Cdr<'_> {
    pub fn decode<M: RosMessage>(self) -> std::result::Result<M, CdrError> {
        match self {
            Cdr::Serialized(b) => M::decode(b),
            Cdr::Body(b) => M::decode_body(b),
        }
    }
}

/// Counts a message from an input topic that could not be read at all (`reason`), as a
/// refused input of its kind.
pub fn refuse(kind: &In, reason: &str, inputs: &Inputs) {
    let refusal = match kind {
        In::Camera(..) => Refusal::Frame,
        In::State => Refusal::State,
        In::Subgoal | In::Command | In::Interrupt | In::Resume => Refusal::Command,
        In::Audio(_) => Refusal::Audio,
        In::Clock => Refusal::Clock,
    };
    inputs.refuse_message(refusal, reason);
}

/// Hands one serialized message from an input topic to the node's inputs: decoded with the
/// node's CDR codec, converted, and validated there. A message that does not decode is counted
/// as a refused input of its kind with the decoder's reason. `clock`: set from `/clock`.
pub fn receive(kind: &In, bytes: Cdr, inputs: &Inputs, clock: Option<&ManualClock>) {
    let (refusal, r) = match kind {
        In::Camera(name, format) => (
            Refusal::Frame,
            match format {
                ImageFormat::Raw => bytes.decode::<msg::Image>().map(convert::image),
                ImageFormat::Compressed => bytes
                    .decode::<msg::CompressedImage>()
                    .map(convert::compressed_image),
            }
            .map(|(stamp, image)| Inbound::Frame {
                camera: name.clone(),
                stamp,
                image,
            })
            .map_err(|e| format!("camera `{name}`: {e}")),
        ),
        In::State => (
            Refusal::State,
            bytes
                .decode::<msg::JointState>()
                .map(|j| Inbound::State(convert::joint_state(j)))
                .map_err(|e| e.to_string()),
        ),
        In::Subgoal | In::Command => (
            Refusal::Command,
            bytes
                .decode::<msg::StringMsg>()
                .map(|s| match kind {
                    In::Subgoal => Inbound::Subgoal(s.data),
                    _ => Inbound::Command(s.data),
                })
                .map_err(|e| e.to_string()),
        ),
        In::Interrupt | In::Resume => (
            Refusal::Command,
            bytes
                .decode::<msg::Empty>()
                .map(|_| match kind {
                    In::Interrupt => Inbound::Stop,
                    _ => Inbound::Resume,
                })
                .map_err(|e| e.to_string()),
        ),
        In::Audio(a) => (Refusal::Audio, audio(*a, bytes).map(Inbound::Audio)),
        In::Clock => {
            match (bytes.decode::<msg::Clock>(), clock) {
                (Ok(c), Some(clock)) => clock.set(c.clock.as_secs()),
                (Ok(_), None) => {}
                // Counted (and kept as the last problem), never logged per message.
                (Err(e), _) => inputs.refuse_message(Refusal::Clock, &e.to_string()),
            }
            return;
        }
    };
    match r {
        // Refusals by the node's inputs are counted there.
        Ok(m) => {
            let _ = deliver(inputs, m);
        }
        Err(e) => inputs.refuse_message(refusal, &e),
    }
}

fn audio(kind: AudioIn, bytes: Cdr) -> std::result::Result<crate::messages::Audio, String> {
    let text = |e: &dyn std::fmt::Display| e.to_string();
    match kind {
        AudioIn::Frt => bytes
            .decode::<msg::AudioChunk>()
            .map(convert::audio_chunk)
            .map_err(|e| text(&e)),
        AudioIn::AudioStamped => {
            let m = bytes
                .decode::<mgonzs13::AudioStamped>()
                .map_err(|e| text(&e))?;
            convert::audio_stamped(m).map_err(|e| text(&e))
        }
        AudioIn::AudioData {
            pcm,
            rate,
            channels,
        } => {
            let m = bytes
                .decode::<ros_drivers::AudioDataStamped>()
                .map_err(|e| text(&e))?;
            let stamp = convert::stamp_of(&m.header);
            convert::audio_data(stamp, &m.audio, pcm, rate, channels).map_err(|e| text(&e))
        }
    }
}

/// One ROS message to publish, for the output topic of its kind.
#[derive(Clone, Debug)]
pub enum Publication {
    Chunk(msg::ActionChunk),
    Trajectory(msg::JointTrajectory),
    Float64Command(msg::Float64MultiArray),
    JointStateCommand(msg::JointState),
    Transcript(msg::Transcript),
    Status(msg::HostStatus),
    Diagnostics(msg::DiagnosticArray),
}

impl Publication {
    pub fn kind(&self) -> Out {
        match self {
            Publication::Chunk(_) => Out::Chunk,
            Publication::Trajectory(_) => Out::Trajectory,
            Publication::Float64Command(_) | Publication::JointStateCommand(_) => Out::Commands,
            Publication::Transcript(_) => Out::Transcript,
            Publication::Status(_) => Out::Status,
            Publication::Diagnostics(_) => Out::Diagnostics,
        }
    }

    /// The ROS type of the message.
    pub fn type_name(&self) -> &'static str {
        match self {
            Publication::Chunk(_) => msg::ActionChunk::NAME,
            Publication::Trajectory(_) => msg::JointTrajectory::NAME,
            Publication::Float64Command(_) => msg::Float64MultiArray::NAME,
            Publication::JointStateCommand(_) => msg::JointState::NAME,
            Publication::Transcript(_) => msg::Transcript::NAME,
            Publication::Status(_) => msg::HostStatus::NAME,
            Publication::Diagnostics(_) => msg::DiagnosticArray::NAME,
        }
    }

    /// The serialized message (encapsulation header included).
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Publication::Chunk(m) => m.encode(),
            Publication::Trajectory(m) => m.encode(),
            Publication::Float64Command(m) => m.encode(),
            Publication::JointStateCommand(m) => m.encode(),
            Publication::Transcript(m) => m.encode(),
            Publication::Status(m) => m.encode(),
            Publication::Diagnostics(m) => m.encode(),
        }
    }
}

/// Turns the node's outbound items into ROS messages: the `frame_id` of headers, the
/// trajectory output, diagnostics at most once a second.
pub struct Publisher {
    frame_id: String,
    node: String,
    trajectory: Option<TrajectoryConfig>,
    /// The action dimensions (joint names and kinds of the trajectory and the commands).
    dims: Vec<ActionDim>,
    /// Whether every dimension is a velocity (the trajectory carries velocities).
    velocity: bool,
    commands: Option<CommandMessage>,
    diagnostics: bool,
    last_diagnostics: Option<Instant>,
}

impl Publisher {
    pub fn new(cfg: &Config) -> Publisher {
        Publisher {
            frame_id: cfg.ros.frame_id.clone(),
            node: cfg.node.name.clone(),
            trajectory: cfg.ros.joint_trajectory.clone(),
            dims: cfg.action_dims().unwrap_or_default(),
            velocity: cfg
                .action_dims()
                .is_ok_and(|d| d.iter().all(|d| d.kind == ActionKind::Velocity)),
            commands: cfg.execution.command_stream.as_ref().map(|c| c.message),
            diagnostics: cfg.ros.diagnostics,
            last_diagnostics: None,
        }
    }

    /// The messages `o` becomes, in publishing order.
    pub fn messages(&mut self, o: &Outbound, mut out: impl FnMut(Publication)) {
        match o {
            Outbound::Chunk(c) => out(Publication::Chunk(convert::action_chunk(c, &self.frame_id))),
            Outbound::Plan(p) => {
                if let Some(t) = &self.trajectory {
                    out(Publication::Trajectory(convert::joint_trajectory(
                        p,
                        &t.joints,
                        self.velocity,
                        &self.frame_id,
                    )));
                }
            }
            Outbound::Command(c) => match self.commands {
                Some(CommandMessage::Float64MultiArray) => {
                    out(Publication::Float64Command(convert::float64_command(c)))
                }
                Some(CommandMessage::JointState) => out(Publication::JointStateCommand(
                    convert::joint_state_command(c, &self.dims, &self.frame_id),
                )),
                None => {}
            },
            Outbound::Transcript(t) => out(Publication::Transcript(convert::transcript(t))),
            Outbound::Status(s) => {
                let due = self
                    .last_diagnostics
                    .is_none_or(|t| t.elapsed() >= Duration::from_secs(1));
                if self.diagnostics && due {
                    self.last_diagnostics = Some(Instant::now());
                    out(Publication::Diagnostics(convert::diagnostics(
                        s, &self.node,
                    )));
                }
                out(Publication::Status(convert::host_status(s)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve_as_ros2_does() {
        let r = |n, ns| resolve(n, ns, "host");
        assert_eq!(r("~/action_chunk", "/").unwrap(), "/host/action_chunk");
        assert_eq!(r("~/action_chunk", "").unwrap(), "/host/action_chunk");
        assert_eq!(r("~/status", "/robot1").unwrap(), "/robot1/host/status");
        assert_eq!(
            r("camera/image", "/robot1/").unwrap(),
            "/robot1/camera/image"
        );
        assert_eq!(r("/diagnostics", "/robot1").unwrap(), "/diagnostics");
        assert_eq!(r("~", "/a").unwrap(), "/a/host");
        for (bad, why) in [
            ("", "empty"),
            ("cam/", "ends with"),
            ("a//b", "repeated `/`"),
            ("2cam", "digit"),
            ("a__b", "repeated `_`"),
            ("cam-left", "'-'"),
        ] {
            let e = r(bad, "/").unwrap_err().to_string();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
        assert!(
            r("x", "robot")
                .unwrap_err()
                .to_string()
                .contains("must start with")
        );
    }

    #[test]
    fn endpoints_follow_the_configuration() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../config");
        let mut cfg = Config::load(std::path::Path::new(&format!("{dir}/pi05_thor.yaml"))).unwrap();
        cfg.ros.diagnostics = true;
        let mut e = Endpoints::new(&cfg, "/robot1", "host", true).unwrap();
        let topics: Vec<_> = e
            .inputs
            .iter()
            .map(|e| (e.topic.as_str(), e.type_name))
            .collect();
        for c in &cfg.cameras {
            let want = resolve(&c.topic, "/robot1", "host").unwrap();
            assert!(
                topics.iter().any(|(t, _)| *t == want),
                "{want} in {topics:?}"
            );
        }
        assert!(topics.contains(&("/robot1/host/subgoal", "std_msgs/msg/String")));
        assert!(topics.contains(&("/robot1/host/interrupt", "std_msgs/msg/Empty")));
        assert!(topics.contains(&("/clock", "rosgraph_msgs/msg/Clock")));
        assert!(
            e.inputs
                .iter()
                .filter(|e| matches!(e.kind, In::Camera(..)))
                .all(|e| e.sensor_data)
        );
        let outs: Vec<_> = e
            .outputs
            .iter()
            .map(|e| (e.kind, e.topic.as_str()))
            .collect();
        assert!(outs.contains(&(Out::Chunk, "/robot1/host/action_chunk")));
        assert!(outs.contains(&(Out::Diagnostics, "/diagnostics")));
        assert_eq!(e.services.len(), 1);
        assert_eq!(e.services[0].topic, "/robot1/host/set_subgoal");
        assert_eq!(e.services[0].type_name, "frt_msgs/srv/SetSubgoal");
        e.remap(
            &[
                ("~/action_chunk".into(), "/arm/actions".into()),
                ("~/set_subgoal".into(), "/arm/set_subgoal".into()),
            ],
            "/robot1",
            "host",
        )
        .unwrap();
        assert_eq!(e.outputs[0].topic, "/arm/actions");
        assert_eq!(e.outputs[0].name, "~/action_chunk");
        assert_eq!(e.services[0].topic, "/arm/set_subgoal");
    }
}

//! Recordings: every message the node received and published, in ROS 2 CDR with `ros2msg`
//! schemas, in an MCAP file (`--record FILE.mcap`), readable by Foxglove and by `ros2 bag`
//! with its MCAP storage; and the reading side for `replay`.
//!
//! Besides the topics, a recording holds:
//! * the configuration the node ran with (attachment `config.yaml`, YAML; the noise seed is
//!   its `control.noise_seed`);
//! * a metadata record `frt` (format, node name and namespace, clock, start, noise seed,
//!   version);
//! * the node's clock at the start of every control tick, on `~/tick`
//!   (`rosgraph_msgs/msg/Clock`): what `replay` runs the ticks on;
//! * commands that came through a service or a lifecycle transition, as the topic message
//!   with the same effect (`~/subgoal`, `~/interrupt`, `~/resume`), and the transitions that
//!   make a managed node inactive or active on `~/transition_event`;
//! * the configuration in effect after each accepted parameter set, on `~/configuration`.
//!
//! Each message's log time is the node's clock when it was received or published (ns).
//! Both are written first, so a recording cut short (a killed process) still replays up to
//! where it ends.

use crate::config::Config;
use crate::error::{Error, Result};
use crate::messages::Stamp;
use crate::ros::schema;
use std::collections::{BTreeMap, HashMap};
use std::io::BufWriter;
use std::path::{Path, PathBuf};

/// The value of the `format` entry of a recording's `frt` metadata.
pub const FORMAT: &str = "frt-recording 1";

/// The name of the tick channel, relative to the node.
pub const TICK: &str = "~/tick";

/// Where a managed node's transitions are recorded (the topic it publishes them on).
pub const TRANSITIONS: &str = "~/transition_event";

/// Where the configuration in effect is recorded after each accepted parameter set (YAML in a
/// `std_msgs/msg/String`).
pub const CONFIGURATION: &str = "~/configuration";

/// How a run was recorded (the `frt` metadata record).
#[derive(Clone, Debug, PartialEq)]
pub struct RunInfo {
    /// `sim` (a script on its own clock: deterministic), `system` or `ros` (live).
    pub clock: String,
    pub node: String,
    pub namespace: String,
    /// The node's clock when the run started.
    pub start: Stamp,
    pub noise_seed: u64,
    pub version: String,
}

impl RunInfo {
    fn to_map(&self) -> BTreeMap<String, String> {
        [
            ("format", FORMAT.to_string()),
            ("clock", self.clock.clone()),
            ("node", self.node.clone()),
            ("namespace", self.namespace.clone()),
            ("start", format!("{:?}", self.start)),
            ("noise_seed", self.noise_seed.to_string()),
            ("version", self.version.clone()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    fn from_map(m: &BTreeMap<String, String>) -> std::result::Result<RunInfo, String> {
        let get = |k: &str| m.get(k).cloned().ok_or_else(|| format!("no `{k}` entry"));
        if get("format")? != FORMAT {
            return Err(format!(
                "format `{}` (this build reads `{FORMAT}`)",
                get("format")?
            ));
        }
        Ok(RunInfo {
            clock: get("clock")?,
            node: get("node")?,
            namespace: get("namespace")?,
            start: get("start")?.parse().map_err(|e| format!("start: {e}"))?,
            noise_seed: get("noise_seed")?
                .parse()
                .map_err(|e| format!("noise_seed: {e}"))?,
            version: get("version")?,
        })
    }
}

/// A stamp as ROS 2 messages carry it (whole nanoseconds): the node's clock is set to such
/// values in a simulation on its own clock, so that a replay sets it to the same ones.
pub fn quantize(t: Stamp) -> Stamp {
    crate::ros::msg::Time::from_secs(t).as_secs()
}

/// The stamp of a log time (nanoseconds), as [`quantize`]d stamps.
pub fn from_nanos(ns: u64) -> Stamp {
    crate::ros::msg::Time {
        sec: (ns / 1_000_000_000) as i32,
        nanosec: (ns % 1_000_000_000) as u32,
    }
    .as_secs()
}

/// Nanoseconds of a stamp (MCAP log times); 0 before the epoch.
pub fn nanos(t: Stamp) -> u64 {
    if t.is_finite() && t > 0.0 {
        (t * 1e9).round() as u64
    } else {
        0
    }
}

fn bad(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::bad("recording", format!("{}: {e}", path.display()))
}

/// Writes a recording.
pub struct Recorder {
    w: mcap::Writer<BufWriter<std::fs::File>>,
    /// Channel ids by topic and type.
    channels: HashMap<(String, String), u16>,
    sequence: u32,
    path: PathBuf,
    /// The fully qualified tick channel, `~/transition_event` and `~/configuration`.
    tick: String,
    transitions: String,
    configuration: String,
}

impl Recorder {
    /// Creates `path` and writes the configuration and `info`.
    pub fn create(path: &Path, cfg: &Config, info: &RunInfo) -> Result<Recorder> {
        let file = std::fs::File::create(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let mut w = mcap::WriteOptions::new()
            .compression(None)
            .profile("ros2")
            .library(format!("frt-robot-host {}", env!("CARGO_PKG_VERSION")))
            .create(BufWriter::new(file))
            .map_err(|e| bad(path, e))?;
        let yaml = serde_yaml::to_string(cfg).map_err(|e| bad(path, e))?;
        let t = nanos(info.start);
        w.attach(&mcap::Attachment {
            log_time: t,
            create_time: t,
            name: "config.yaml".into(),
            media_type: "application/yaml".into(),
            data: yaml.as_bytes().into(),
        })
        .map_err(|e| bad(path, e))?;
        w.write_metadata(&mcap::records::Metadata {
            name: "frt".into(),
            metadata: info.to_map(),
        })
        .map_err(|e| bad(path, e))?;
        let resolve = |n| crate::ros::wire::resolve(n, &info.namespace, &info.node);
        Ok(Recorder {
            w,
            channels: HashMap::new(),
            sequence: 0,
            path: path.to_path_buf(),
            tick: resolve(TICK)?,
            transitions: resolve(TRANSITIONS)?,
            configuration: resolve(CONFIGURATION)?,
        })
    }

    /// Writes one serialized message (CDR with its encapsulation header) of type `type_name`
    /// (`sensor_msgs/msg/Image`) on `topic` (fully qualified) at `t` on the node's clock.
    pub fn write(&mut self, topic: &str, type_name: &str, t: Stamp, data: &[u8]) -> Result<()> {
        let key = (topic.to_string(), type_name.to_string());
        let channel = match self.channels.get(&key) {
            Some(c) => *c,
            None => {
                let text = schema::ros2msg(type_name)
                    .ok_or_else(|| bad(&self.path, format!("no schema for {type_name}")))?;
                let s = self
                    .w
                    .add_schema(type_name, "ros2msg", text.as_bytes())
                    .map_err(|e| bad(&self.path, e))?;
                let c = self
                    .w
                    .add_channel(s, topic, "cdr", &BTreeMap::new())
                    .map_err(|e| bad(&self.path, e))?;
                self.channels.insert(key, c);
                c
            }
        };
        self.sequence = self.sequence.wrapping_add(1);
        let header = mcap::records::MessageHeader {
            channel_id: channel,
            sequence: self.sequence,
            log_time: nanos(t),
            publish_time: nanos(t),
        };
        self.w
            .write_to_known_channel(&header, data)
            .map_err(|e| bad(&self.path, e))
    }

    /// Records the start of a control tick at `t`.
    pub fn tick(&mut self, t: Stamp) -> Result<()> {
        use crate::ros::msg::{self, RosMessage};
        let c = msg::Clock {
            clock: msg::Time::from_secs(t),
        };
        let topic = self.tick.clone();
        self.write(&topic, msg::Clock::NAME, t, &c.encode())
    }

    /// Completes the file (summary and index); returns its path.
    pub fn finish(mut self) -> Result<PathBuf> {
        self.w.finish().map_err(|e| bad(&self.path, e))?;
        Ok(self.path)
    }
}

/// One recorded message.
#[derive(Clone, Debug)]
pub struct Recorded<'a> {
    pub topic: &'a str,
    pub type_name: &'a str,
    /// The node's clock when it was received or published.
    pub t: Stamp,
    pub data: std::borrow::Cow<'a, [u8]>,
}

/// A recording opened for reading (memory-mapped).
pub struct Recording {
    map: memmap2::Mmap,
    path: PathBuf,
    pub config: Config,
    pub info: RunInfo,
    /// Channel topics and types, by channel id.
    channels: BTreeMap<u16, (String, String)>,
}

impl Recording {
    pub fn open(path: &Path) -> Result<Recording> {
        let file = std::fs::File::open(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        // SAFETY: the file is only read; a recording being rewritten while it is replayed
        // would be the caller's mistake, and reads stay within the mapping.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let (mut config, mut info, mut channels) = (None, None, BTreeMap::new());
        let mut schemas = BTreeMap::new();
        let options = mcap::read::Options::IgnoreEndMagic.into();
        for r in
            mcap::read::LinearReader::new_with_options(&map, options).map_err(|e| bad(path, e))?
        {
            // A recording cut short ends in a damaged record: what came before is kept.
            let Ok(r) = r else { break };
            match r {
                mcap::records::Record::Attachment { header, data, .. }
                    if header.name == "config.yaml" =>
                {
                    let text = std::str::from_utf8(&data).map_err(|e| bad(path, e))?;
                    config = Some(
                        Config::parse(text)
                            .map_err(|e| bad(path, format!("its configuration: {e}")))?,
                    );
                }
                mcap::records::Record::Metadata(m) if m.name == "frt" => {
                    info = Some(RunInfo::from_map(&m.metadata).map_err(|e| bad(path, e))?);
                }
                mcap::records::Record::Schema { header, .. } => {
                    schemas.insert(header.id, header.name);
                }
                mcap::records::Record::Channel(c) => {
                    let ty = schemas.get(&c.schema_id).cloned().unwrap_or_default();
                    channels.insert(c.id, (c.topic, ty));
                }
                _ => {}
            }
        }
        let config = config.ok_or_else(|| {
            bad(
                path,
                "no configuration (not a recording of frt-robot-host?)",
            )
        })?;
        let info = info.ok_or_else(|| bad(path, "no `frt` metadata record"))?;
        Ok(Recording {
            map,
            path: path.to_path_buf(),
            config,
            info,
            channels,
        })
    }

    /// Every message in the order of its log time (ties: the order written).
    pub fn messages(&self) -> Result<Vec<Recorded<'_>>> {
        let mut out = Vec::new();
        let options = mcap::read::Options::IgnoreEndMagic.into();
        let stream = mcap::MessageStream::new_with_options(&self.map, options)
            .map_err(|e| bad(&self.path, e))?;
        for m in stream {
            // A recording cut short: what came before the damage is replayed.
            let Ok(m) = m else { break };
            let Some((topic, ty)) = self.channels.get(&m.channel.id) else {
                continue;
            };
            out.push(Recorded {
                topic,
                type_name: ty,
                t: from_nanos(m.log_time),
                data: m.data,
            });
        }
        out.sort_by(|a, b| a.t.total_cmp(&b.t));
        Ok(out)
    }

    /// The fully qualified name of `name` (`~/tick`) for the recorded node.
    pub fn resolve(&self, name: &str) -> Result<String> {
        crate::ros::wire::resolve(name, &self.info.namespace, &self.info.node)
    }
}

/// What a running node records through: its inputs as received, its outputs as the ROS 2
/// transports publish them, its ticks. The threads that see them hand them to a writer thread
/// of its own, so that no transport waits for the disk: a live node's tap drops what does not
/// fit in its queue (counted and logged; a replay then differs and says so), a simulation's
/// waits. A write that fails (a full disk) is logged once and ends the recording, never the
/// node.
pub struct Tap {
    tx: crossbeam_channel::Sender<Item>,
    /// Whether senders wait for room (a simulation) or drop what does not fit (a live node).
    lossless: bool,
    dropped: std::sync::atomic::AtomicU64,
    writer: std::sync::Mutex<Option<std::thread::JoinHandle<Option<Result<PathBuf>>>>>,
}

/// What the writer thread writes.
enum Item {
    Input {
        t: Stamp,
        kind: crate::ros::wire::In,
        data: Vec<u8>,
    },
    Output {
        t: Stamp,
        o: crate::messages::Outbound,
    },
    Tick(Stamp),
    Transition {
        t: Stamp,
        from: crate::lifecycle::State,
        tr: crate::lifecycle::Transition,
    },
    Configuration {
        t: Stamp,
        cfg: Box<Config>,
    },
    Finish,
}

/// Messages a live tap's queue holds.
const QUEUE: usize = 4096;

struct Writer {
    recorder: Recorder,
    endpoints: crate::ros::wire::Endpoints,
    publisher: crate::ros::wire::Publisher,
}

impl Writer {
    fn write(&mut self, item: Item) -> Result<()> {
        use crate::ros::msg::{self, RosMessage};
        let r = &mut self.recorder;
        match item {
            Item::Input { t, kind, data } => {
                let topic = self.endpoints.input_topic(&kind).to_string();
                r.write(&topic, kind.type_name(), t, &data)
            }
            Item::Output { t, o } => {
                let mut res = Ok(());
                let endpoints = &self.endpoints;
                self.publisher.messages(&o, |p| {
                    if let (Ok(()), Some(topic)) = (&res, endpoints.output_topic(p.kind())) {
                        res = r.write(topic, p.type_name(), t, &p.encode());
                    }
                });
                res
            }
            Item::Tick(t) => r.tick(t),
            Item::Transition { t, from, tr } => {
                let state = |s: crate::lifecycle::State| msg::LifecycleState {
                    id: s.id(),
                    label: s.label().into(),
                };
                let e = msg::TransitionEvent {
                    timestamp: nanos(t),
                    transition: msg::LifecycleTransition {
                        id: tr.id(),
                        label: tr.label().into(),
                    },
                    start_state: state(from),
                    goal_state: state(tr.goal()),
                };
                let topic = r.transitions.clone();
                r.write(&topic, msg::TransitionEvent::NAME, t, &e.encode())
            }
            Item::Configuration { t, cfg } => {
                let yaml = serde_yaml::to_string(&cfg).map_err(|e| bad(&r.path, e))?;
                let topic = r.configuration.clone();
                let m = msg::StringMsg { data: yaml };
                r.write(&topic, msg::StringMsg::NAME, t, &m.encode())
            }
            Item::Finish => Ok(()),
        }
    }
}

impl Tap {
    /// Records into `recorder` for a node of configuration `cfg` whose topics are
    /// `endpoints`, on a writer thread; `lossless`: senders wait for room (a simulation on its
    /// own clock) instead of dropping (a live node).
    pub fn new(
        recorder: Recorder,
        cfg: &Config,
        endpoints: crate::ros::wire::Endpoints,
        lossless: bool,
    ) -> Result<Tap> {
        let (tx, rx) = crossbeam_channel::bounded::<Item>(QUEUE);
        let mut w = Writer {
            recorder,
            endpoints,
            publisher: crate::ros::wire::Publisher::new(cfg),
        };
        let writer = std::thread::Builder::new()
            .name("frt-record".into())
            .spawn(move || {
                let mut failed = false;
                for item in rx.iter() {
                    let last = matches!(item, Item::Finish);
                    if !failed {
                        if let Err(e) = w.write(item) {
                            tracing::error!(error = %e, "recording ended");
                            failed = true;
                        }
                    }
                    if last {
                        break;
                    }
                }
                (!failed).then(|| w.recorder.finish())
            })
            .map_err(|e| Error::bad("recording", format!("writer thread: {e}")))?;
        Ok(Tap {
            tx,
            lossless,
            dropped: Default::default(),
            writer: std::sync::Mutex::new(Some(writer)),
        })
    }

    fn send(&self, item: Item) {
        if self.lossless {
            let _ = self.tx.send(item);
        } else {
            self.try_send(item);
        }
    }

    fn try_send(&self, item: Item) {
        if let Err(crossbeam_channel::TrySendError::Full(_)) = self.tx.try_send(item) {
            let n = self
                .dropped
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if n == 0 {
                tracing::warn!("recording: the disk does not keep up; messages are dropped");
            }
        }
    }

    /// An input as received (serialized, with its encapsulation header) at `t`.
    pub fn input(&self, t: Stamp, kind: &crate::ros::wire::In, data: &[u8]) {
        self.send(Item::Input {
            t,
            kind: kind.clone(),
            data: data.to_vec(),
        });
    }

    /// A command that reached the node other than through a topic (a service, a lifecycle
    /// transition), recorded as the topic message with the same effect (`~/interrupt`,
    /// `~/resume`, `~/subgoal`) so that a replay acts on it.
    pub fn command(&self, t: Stamp, c: &crate::messages::Command) {
        use crate::messages::Command;
        use crate::ros::msg::{self, RosMessage};
        use crate::ros::wire::In;
        let (kind, data) = match c {
            Command::Stop => (In::Interrupt, msg::Empty::default().encode()),
            Command::Resume => (In::Resume, msg::Empty::default().encode()),
            Command::Subgoal(g) => (In::Subgoal, msg::StringMsg { data: g.clone() }.encode()),
        };
        self.send(Item::Input { t, kind, data });
    }

    /// A lifecycle transition at `t` (`~/transition_event`): a replay keeps the node inactive
    /// (resumes refused) where the run was.
    pub fn transition(
        &self,
        t: Stamp,
        from: crate::lifecycle::State,
        tr: crate::lifecycle::Transition,
    ) {
        self.send(Item::Transition { t, from, tr });
    }

    /// The configuration in effect after a parameter set at `t`: a replay hands it to the
    /// node as the set did.
    pub fn configuration(&self, t: Stamp, cfg: &Config) {
        self.send(Item::Configuration {
            t,
            cfg: Box::new(cfg.clone()),
        });
    }

    /// What the node published, as the ROS 2 messages it becomes, at `t`.
    pub fn output(&self, t: Stamp, o: &crate::messages::Outbound) {
        self.send(Item::Output { t, o: o.clone() });
    }

    /// The start of a control tick at `t`.
    pub fn tick(&self, t: Stamp) {
        self.send(Item::Tick(t));
    }

    /// The start of a control tick at `t` from the control thread: never waits, allocates
    /// nothing (a full queue loses the tick: the replay then differs and says so).
    pub fn tick_later(&self, t: Stamp) {
        self.try_send(Item::Tick(t));
    }

    /// Writes what is queued and completes the file; `None` when the recording had ended on
    /// an error or was finished already.
    pub fn finish(&self) -> Option<Result<PathBuf>> {
        let writer = self
            .writer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()?;
        let _ = self.tx.send(Item::Finish);
        let r = writer.join().ok().flatten();
        let dropped = self.dropped.load(std::sync::atomic::Ordering::Relaxed);
        if dropped > 0 {
            tracing::warn!(dropped, "recording: messages dropped while the disk lagged");
        }
        r
    }
}

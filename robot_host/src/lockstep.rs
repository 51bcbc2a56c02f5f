//! The node on a clock of its own, one thing at a time: what `run --sim` and `replay` do.
//!
//! A [`Lockstep`] owns the node and a [`ManualClock`]. Inputs arrive as serialized ROS 2
//! messages through the same decoding the ROS 2 transports use ([`wire::receive`]); the clock
//! is set to each input's time before it is delivered, commands are acted on at once (as the
//! control loop does between ticks), and a spoken clip's transcript is waited for before the
//! simulation goes on. Ticks, the fixed-rate commands and the status come at their own times
//! on that clock. Nothing depends on how fast the machine is, so the same inputs give the
//! same chunks, byte for byte.

use crate::config::Config;
use crate::messages::{Outbound, Stamp};
use crate::node::{CommandStream, Inputs, ManualClock, Node, TickOutcome};
use crate::record::{Recording, Tap, quantize};
use crate::ros::msg::{self, RosMessage};
use crate::ros::wire::{self, Cdr, In};
use crossbeam_channel::Receiver;
use std::sync::Arc;

/// The longest a simulation waits for a transcript before it goes on.
const VOICE_LIMIT: std::time::Duration = std::time::Duration::from_secs(120);

/// The node driven on its own clock (see the module docs).
pub struct Lockstep {
    node: Node,
    inputs: Inputs,
    outputs: Receiver<Outbound>,
    clock: Arc<ManualClock>,
    voice: Option<Arc<crate::voice::Progress>>,
    tap: Option<Arc<Tap>>,
    commands: Option<CommandStream>,
    /// The first tick's time, the period, and the ticks so far.
    start: Stamp,
    period: f64,
    ticks: u64,
    next_command: Stamp,
    next_status: Stamp,
}

/// What comes next on the clock of a [`Lockstep`].
#[derive(Clone, Copy, Debug, PartialEq)]
enum Due {
    Tick,
    Command,
    Status,
}

impl Lockstep {
    /// `node` runs on `clock` (its own, set here only) from `start`; `voice`: the speech
    /// thread's progress when it listens; `tap`: where it records.
    pub fn new(
        node: Node,
        outputs: Receiver<Outbound>,
        clock: Arc<ManualClock>,
        start: Stamp,
        voice: Option<Arc<crate::voice::Progress>>,
        tap: Option<Arc<Tap>>,
    ) -> Lockstep {
        let cfg = node.config();
        let period = 1.0 / cfg.control.rate_hz;
        let status = cfg.ros.status_period_s;
        let commands = node.command_stream();
        clock.set(quantize(start));
        Lockstep {
            inputs: node.inputs(),
            node,
            outputs,
            clock,
            voice,
            tap,
            commands,
            start,
            period,
            ticks: 0,
            next_command: start,
            next_status: start + status,
        }
    }

    pub fn node(&self) -> &Node {
        &self.node
    }

    /// The node, once the run is over.
    pub fn into_node(self) -> Node {
        self.node
    }

    pub fn inputs(&self) -> &Inputs {
        &self.inputs
    }

    fn set_clock(&self, t: Stamp) {
        self.clock.set(quantize(t));
    }

    /// Delivers one serialized input (CDR with its encapsulation header) at `t`, then acts
    /// on the commands it brought (a stop halts now).
    pub fn input(&mut self, t: Stamp, kind: &In, data: &[u8]) {
        self.set_clock(t);
        if let Some(tap) = &self.tap {
            tap.input(self.clock_now(), kind, data);
        }
        wire::receive(kind, Cdr::Serialized(data), &self.inputs, Some(&self.clock));
        if let (In::Audio(_), Some(v)) = (kind, &self.voice) {
            if !v.settle(self.inputs.audio_sent(), VOICE_LIMIT) {
                tracing::warn!("the speech thread did not finish a transcript within 120 s");
            }
        }
        self.node.drain_commands();
    }

    fn clock_now(&self) -> Stamp {
        use crate::node::Clock;
        self.clock.now()
    }

    /// The time on the node's clock (the last thing done was due then).
    pub fn now(&self) -> Stamp {
        self.clock_now()
    }

    /// The time of the next tick.
    pub fn next_tick(&self) -> Stamp {
        self.start + self.ticks as f64 * self.period
    }

    fn next_due(&self) -> (Stamp, Due) {
        let mut due = (self.next_tick(), Due::Tick);
        if self.commands.is_some() && self.next_command < due.0 {
            due = (self.next_command, Due::Command);
        }
        if self.next_status < due.0 {
            due = (self.next_status, Due::Status);
        }
        due
    }

    /// The time something of the node's own is next due (a tick, a command, a status).
    pub fn next_at(&self) -> Stamp {
        self.next_due().0
    }

    /// Runs what is due up to and including `t`, in order: ticks (every control period from
    /// the start), the fixed-rate commands, the status. `Err`: a fault ended the run (the
    /// halt is out).
    pub fn run_until(&mut self, t: Stamp) -> Result<(), String> {
        loop {
            let (at, what) = self.next_due();
            if at > t {
                return Ok(());
            }
            self.set_clock(at);
            match what {
                Due::Tick => {
                    self.ticks += 1;
                    self.tick()?;
                }
                Due::Command => {
                    let now = self.clock_now();
                    if let Some(s) = &mut self.commands {
                        self.next_command += s.period();
                        if let Some(c) = s.poll(now) {
                            self.node.output_sender().send(Outbound::Command(c));
                        }
                    }
                }
                Due::Status => {
                    self.next_status += self.node.config().ros.status_period_s;
                    self.node.publish_status();
                }
            }
        }
    }

    /// One tick at the clock's time (recorded as such).
    fn tick(&mut self) -> Result<TickOutcome, String> {
        if let Some(tap) = &self.tap {
            tap.tick(self.clock_now());
        }
        self.node.step()
    }

    /// One tick at `t` (a replay: the recorded tick times).
    pub fn tick_at(&mut self, t: Stamp) -> Result<TickOutcome, String> {
        self.set_clock(t);
        self.tick()
    }

    /// Takes what the node published so far: recorded (at the clock's time) and handed to
    /// `sink` in order.
    pub fn drain(&self, mut sink: impl FnMut(Outbound)) {
        while let Ok(o) = self.outputs.try_recv() {
            if let Some(tap) = &self.tap {
                tap.output(self.clock_now(), &o);
            }
            sink(o);
        }
    }
}

/// How a replay compared with its recording.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report {
    /// Chunks in the recording and in the replay.
    pub recorded: usize,
    pub replayed: usize,
    /// Leading chunks that are byte-identical.
    pub identical: usize,
    /// The first difference, described.
    pub first_difference: Option<String>,
    /// Chunks that differ among those in both streams, and the largest difference of an
    /// action value between them.
    pub differing: usize,
    pub max_action_delta: f32,
    pub ticks: usize,
    pub inputs: usize,
    /// Recorded messages that are neither inputs of this node nor its chunks or ticks.
    pub other: usize,
}

impl Report {
    /// Whether the replayed chunk stream is byte-identical to the recorded one.
    pub fn identical(&self) -> bool {
        self.first_difference.is_none() && self.recorded == self.replayed
    }
}

/// Describes how chunk `i` of two streams differs (the fields that do).
fn chunk_difference(i: usize, a: &[u8], b: &[u8]) -> (String, f32) {
    let (Ok(a), Ok(b)) = (msg::ActionChunk::decode(a), msg::ActionChunk::decode(b)) else {
        return ("a chunk does not decode".into(), f32::NAN);
    };
    let mut fields = Vec::new();
    if a.header != b.header {
        fields.push("stamp");
    }
    if a.seq != b.seq {
        fields.push("seq");
    }
    if (a.horizon, a.action_dim) != (b.horizon, b.action_dim) {
        fields.push("shape");
    }
    if a.subgoal != b.subgoal || a.subgoal_id != b.subgoal_id {
        fields.push("subgoal");
    }
    if a.halt != b.halt {
        fields.push("halt");
    }
    if a.inference_latency.to_bits() != b.inference_latency.to_bits() {
        fields.push("inference_latency");
    }
    if (a.due_row, a.execution_horizon) != (b.due_row, b.execution_horizon) {
        fields.push("due_row");
    }
    let delta = if a.actions.len() == b.actions.len() {
        a.actions
            .iter()
            .zip(&b.actions)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, |m, d| if d.is_nan() { f32::NAN } else { m.max(d) })
    } else {
        f32::NAN
    };
    if a.actions
        .iter()
        .map(|x| x.to_bits())
        .ne(b.actions.iter().map(|x| x.to_bits()))
    {
        fields.push("actions");
    }
    let text = if fields.is_empty() {
        "bytes differ".to_string()
    } else {
        format!("{} differ", fields.join(", "))
    };
    (
        format!(
            "chunk #{i} (seq {}): {text} (max |Δ action| {delta:.3e})",
            a.seq
        ),
        delta,
    )
}

/// Re-runs a node of configuration `node`'s from a recording: its inputs delivered at their
/// recorded times, its ticks at the recorded ones, on `clock`; compares the chunks with the
/// recorded chunk stream. `voice`: the speech thread's progress when the node listens.
pub fn replay(
    rec: &Recording,
    node: Node,
    outputs: Receiver<Outbound>,
    clock: Arc<ManualClock>,
    voice: Option<Arc<crate::voice::Progress>>,
) -> crate::Result<(Report, Node)> {
    let cfg = node.config().clone();
    let endpoints = wire::Endpoints::new(&cfg, &rec.info.namespace, &rec.info.node, false)?;
    let chunks_topic = endpoints
        .output_topic(wire::Out::Chunk)
        .unwrap_or_default()
        .to_string();
    let tick_topic = rec.resolve(crate::record::TICK)?;
    let transitions = rec.resolve(crate::record::TRANSITIONS)?;
    let configuration = rec.resolve(crate::record::CONFIGURATION)?;
    let messages = rec.messages()?;
    let recorded: Vec<&[u8]> = messages
        .iter()
        .filter(|m| m.topic == chunks_topic && m.type_name == msg::ActionChunk::NAME)
        .map(|m| &*m.data)
        .collect();
    let mut publisher = wire::Publisher::new(&cfg);
    let mut replayed: Vec<Vec<u8>> = Vec::new();
    let mut report = Report {
        recorded: recorded.len(),
        ..Default::default()
    };
    let mut lock = Lockstep::new(node, outputs, clock, rec.info.start, voice, None);
    let mut collect = |lock: &Lockstep| {
        lock.drain(|o| {
            if let Outbound::Chunk(_) = &o {
                publisher.messages(&o, |p| replayed.push(p.encode()));
            }
        })
    };
    for m in &messages {
        if m.topic == tick_topic && m.type_name == msg::Clock::NAME {
            let t = msg::Clock::decode(&m.data)
                .map(|c| c.clock.as_secs())
                .unwrap_or(m.t);
            report.ticks += 1;
            if let Err(cause) = lock.tick_at(t) {
                collect(&lock);
                report.first_difference = Some(format!("the replay ended on a fault: {cause}"));
                break;
            }
        } else if m.topic == transitions && m.type_name == msg::TransitionEvent::NAME {
            // A managed node refuses resumes while inactive.
            if let Ok(e) = msg::TransitionEvent::decode(&m.data) {
                let active = crate::lifecycle::State::Active.id();
                lock.inputs().set_inactive(e.goal_state.id != active);
            }
        } else if m.topic == configuration && m.type_name == msg::StringMsg::NAME {
            // A parameter set: the configuration it put in effect.
            let c = msg::StringMsg::decode(&m.data)
                .map_err(|e| e.to_string())
                .and_then(|s| Config::parse(&s.data).map_err(|e| e.to_string()))
                .and_then(|c| {
                    lock.inputs()
                        .reconfigure(c, false)
                        .map_err(|e| e.to_string())
                });
            if let Err(e) = c {
                report.first_difference = Some(format!("a recorded parameter set: {e}"));
            }
            lock.node.drain_commands();
        } else if let Some(kind) = endpoints.input_for(m.topic, m.type_name) {
            report.inputs += 1;
            lock.input(m.t, &kind, &m.data);
        } else if m.topic != chunks_topic {
            report.other += 1;
        }
        collect(&lock);
    }
    collect(&lock);
    report.replayed = replayed.len();
    for (i, (a, b)) in recorded.iter().zip(&replayed).enumerate() {
        if *a == b.as_slice() {
            if report.differing == 0 {
                report.identical += 1;
            }
            continue;
        }
        let (what, delta) = chunk_difference(i, a, b);
        report.differing += 1;
        report.max_action_delta = if delta.is_nan() || report.max_action_delta.is_nan() {
            f32::NAN
        } else {
            report.max_action_delta.max(delta)
        };
        if report.first_difference.is_none() {
            report.first_difference = Some(what);
        }
    }
    if report.ticks == 0 {
        report.first_difference = Some("the recording holds no ticks: nothing was replayed".into());
    }
    if report.first_difference.is_none() && report.recorded != report.replayed {
        report.first_difference = Some(format!(
            "the recording has {} chunks, the replay {}",
            report.recorded, report.replayed
        ));
    }
    Ok((report, lock.into_node()))
}

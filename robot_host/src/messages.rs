//! What the node exchanges with the outside, independent of the transport.

use std::sync::Arc;

/// Seconds on the node's clock (ROS time on a robot, a virtual clock in simulation).
pub type Stamp = f64;

/// A command, typed (topic, service) or spoken.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// A new instruction for the policy.
    Subgoal(String),
    /// Hard interrupt: halt now, stay halted until resumed.
    Stop,
    /// Leave the halted state.
    Resume,
}

/// Where a command came from (voice commands are gated by the configuration).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Typed,
    Voice,
}

/// A camera image as a transport receives it (not decoded yet).
#[derive(Clone, Debug)]
pub enum Image {
    /// `sensor_msgs/Image`.
    Raw {
        encoding: String,
        width: u32,
        height: u32,
        step: u32,
        data: Vec<u8>,
    },
    /// `sensor_msgs/CompressedImage`.
    Compressed { format: String, data: Vec<u8> },
}

/// Robot state (`sensor_msgs/JointState`: names and positions).
#[derive(Clone, Debug, Default)]
pub struct JointState {
    pub stamp: Stamp,
    pub names: Vec<String>,
    pub position: Vec<f64>,
}

/// Microphone samples.
#[derive(Clone, Debug)]
pub struct Audio {
    pub stamp: Stamp,
    pub sample_rate: u32,
    /// Interleaved samples in [-1, 1].
    pub samples: Vec<f32>,
    pub channels: u16,
}

/// One published chunk of actions (`frt_msgs/ActionChunk`).
#[derive(Clone, Debug, PartialEq)]
pub struct ActionChunk {
    /// Time of the oldest observation the chunk was computed from (for a halt chunk: the
    /// time it was issued).
    pub stamp: Stamp,
    pub seq: u64,
    pub horizon: u32,
    pub action_dim: u32,
    /// `horizon × action_dim`, row-major, in the robot's units. Shared: the node reuses a
    /// chunk's buffer once every receiver has dropped it (a tick allocates nothing).
    pub actions: Arc<Vec<f32>>,
    /// Seconds between two actions.
    pub dt: f64,
    pub subgoal: Arc<str>,
    pub subgoal_id: u64,
    /// A hold chunk after a stop.
    pub halt: bool,
    /// Seconds from the start of the tick (or of the stop) to publication.
    pub latency: f64,
    /// The row due when the chunk was published (row k is due at `stamp + k·dt`; the rows
    /// before it were already in the past). 0 for a halt chunk.
    pub due_row: u32,
    /// Rows a consumer should execute before it takes the next chunk (`execution_horizon`).
    pub execution_horizon: u32,
}

/// The commands the robot executes from `stamp` on, row j due at `stamp + j·dt`
/// (`trajectory_msgs/JointTrajectory`): after each chunk, the timeline's aligned and blended
/// rows; after a halt, the hold (no rows: no targets, ros2_control's "stop and hold").
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub stamp: Stamp,
    pub dt: f64,
    pub action_dim: u32,
    pub rows: Arc<Vec<f32>>,
    pub halt: bool,
}

/// One command of the fixed-rate command stream: the value due now for every action
/// dimension (robot units).
#[derive(Clone, Debug, PartialEq)]
pub struct JointCommand {
    pub stamp: Stamp,
    pub values: Vec<f32>,
    /// The hold after a stop.
    pub halt: bool,
}

/// A transcript of one utterance and what the node made of it.
#[derive(Clone, Debug, PartialEq)]
pub struct Transcript {
    pub stamp: Stamp,
    pub text: String,
    pub avg_logprob: f32,
    pub no_speech_prob: f32,
    /// `"stop"`, `"resume"`, `"subgoal"` or `"ignored: <why>"`.
    pub decision: String,
}

/// Counters and state of the node (`frt_msgs/HostStatus`, diagnostics).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Status {
    pub stamp: Stamp,
    pub halted: bool,
    pub subgoal: String,
    pub subgoal_id: u64,
    pub ticks: u64,
    pub chunks: u64,
    pub halts: u64,
    /// Ticks abandoned at a graph boundary (subgoal change or stop arrived mid-tick).
    pub abandoned: u64,
    /// Ticks skipped because an observation was missing or older than the bound.
    pub stale: u64,
    pub bad_frames: u64,
    pub bad_states: u64,
    pub bad_audio: u64,
    pub bad_commands: u64,
    /// `/clock` messages that did not decode (simulation time).
    pub bad_clock: u64,
    /// Chunks withheld because the policy produced non-finite values.
    pub non_finite: u64,
    /// Ticks that ended after the next tick was due.
    pub deadline_misses: u64,
    /// Actions changed by clamping or the delta cap.
    pub clamped: u64,
    /// Halts published without targets (position control with no fresh, finite measured
    /// position).
    pub holds_without_target: u64,
    /// Times the clock jumped backwards and the observations were dropped.
    pub clock_resets: u64,
    /// Chunks refused because every row was already in the past when they were ready.
    pub late_chunks: u64,
    /// Chunks refused because a joint was measured further outside its limits than one step
    /// can bring back (no command is within both).
    pub outside_limits: u64,
    /// Fixed-rate commands skipped because the command thread came late (or the output
    /// channel held their share).
    pub missed_commands: u64,
    /// Messages the output channel had no room for (a consumer behind), commands past their
    /// share included; halt chunks keep room of their own ([`crate::outbox`]).
    pub dropped_outputs: u64,
    /// The sequence number of the last policy chunk published before the latest stop was
    /// latched (0: none). Chunks numbered above it and below that stop's halt chunk never
    /// exist: a stop withholds every chunk that was not out when it arrived.
    pub last_chunk_before_stop: u64,
    /// The last problem, for diagnostics.
    pub last_error: String,
    /// Latency per stage (tick, prepare, device, finish, halt): name, p50 ms, p99 ms, count.
    pub latency: Vec<(String, f64, f64, u64)>,
    /// Seconds since the control thread last finished a tick (∞: none yet). Large while ticks
    /// are slow or stuck: the status keeps coming on its own timer.
    pub since_tick_s: f64,
    /// The span `recent` and the input rates cover (seconds; up to `ros.status_window_s`).
    pub window_s: f64,
    /// The counters over the last window.
    pub recent: crate::status::Recent,
    /// Each input's count, rate and age.
    pub inputs: Vec<crate::status::InputActivity>,
}

impl Status {
    /// Copies what the control thread owns: every counter and flag, the last error; not the
    /// subgoal (the node keeps it apart), the latency, nor what the status thread fills in.
    /// Allocates nothing once `last_error` has grown to its length.
    pub fn copy_counters_from(&mut self, o: &Status) {
        let Status {
            stamp,
            halted,
            subgoal: _,
            subgoal_id,
            ticks,
            chunks,
            halts,
            abandoned,
            stale,
            bad_frames,
            bad_states,
            bad_audio,
            bad_commands,
            bad_clock,
            non_finite,
            deadline_misses,
            clamped,
            holds_without_target,
            clock_resets,
            late_chunks,
            outside_limits,
            missed_commands,
            dropped_outputs,
            last_chunk_before_stop,
            last_error,
            latency: _,
            since_tick_s: _,
            window_s: _,
            recent: _,
            inputs: _,
        } = o;
        self.stamp = *stamp;
        self.halted = *halted;
        self.subgoal_id = *subgoal_id;
        self.ticks = *ticks;
        self.chunks = *chunks;
        self.halts = *halts;
        self.abandoned = *abandoned;
        self.stale = *stale;
        self.bad_frames = *bad_frames;
        self.bad_states = *bad_states;
        self.bad_audio = *bad_audio;
        self.bad_commands = *bad_commands;
        self.bad_clock = *bad_clock;
        self.non_finite = *non_finite;
        self.deadline_misses = *deadline_misses;
        self.clamped = *clamped;
        self.holds_without_target = *holds_without_target;
        self.clock_resets = *clock_resets;
        self.late_chunks = *late_chunks;
        self.outside_limits = *outside_limits;
        self.missed_commands = *missed_commands;
        self.dropped_outputs = *dropped_outputs;
        self.last_chunk_before_stop = *last_chunk_before_stop;
        if self.last_error != *last_error {
            self.last_error.clone_from(last_error);
        }
    }
}

/// Everything the node publishes.
#[derive(Clone, Debug, PartialEq)]
pub enum Outbound {
    Chunk(ActionChunk),
    Plan(Plan),
    Command(JointCommand),
    Transcript(Transcript),
    /// Boxed: far larger than the other messages.
    Status(Box<Status>),
}

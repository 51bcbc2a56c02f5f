//! # frt_robot_host
//!
//! The real-time robot host: the Pi0.5 policy and Whisper wired into a control loop that turns
//! camera frames and robot state into action chunks, switches subgoals without recapturing
//! anything, and stops within one graph replay when told to.
//!
//! * [`config`]: the YAML configuration and its validation;
//! * [`frame`]: decoding and validation of camera images (raw encodings, JPEG, PNG);
//! * [`lifecycle`]: the managed node's states and transitions;
//! * [`lockstep`]: the node on a clock of its own (`run --sim`, `replay`): deterministic;
//! * [`record`]: recordings (MCAP, ROS 2 CDR) and reading them back;
//! * [`messages`]: what the node exchanges, independent of the transport;
//! * [`policy`]: Pi0.5 as the loop drives it (preprocessing, stage replays, the halt graph);
//! * [`node`]: the inputs shared with the I/O side and the control loop;
//! * [`voice`]: spoken commands (Whisper on a low-priority stream, its replays waiting for
//!   ticks on a shared GPU, confidence gates);
//! * [`transport`]: the transport trait, the loopback and the scripted simulation;
//! * [`ros`]: ROS 2 messages with their CDR codec, conversions, the shared topic table
//!   (`ros::wire`), `--ros-args` parsing, the r2r transport (`ros2`) and the pure-Rust DDS
//!   transport (`dds`);
//! * [`params`]: the configuration as ROS 2 parameters (which may change while running);
//! * [`observations`]: a folder of observations (`calibrate --from DIR`);
//! * [`observe`]: latency histograms and Chrome/Perfetto traces;
//! * [`status`]: the status on its own timer (windows, input rates and ages);
//! * [`rosout`]: log records for ROS 2's `/rosout`;
//! * [`safety`]: the stop latch, the hold, faults and the watchdog;
//! * [`timeline`]: the chunk time model (rows due, hand-over between chunks, limits along the
//!   timeline, the fixed-rate command clock);
//! * [`realtime`]: CPU pinning, SCHED_FIFO and locked memory for the control thread;
//! * [`bench`](mod@bench): the `bench` subcommand's measurements.

pub mod bench;
pub mod config;
mod error;
pub mod frame;
pub mod lifecycle;
pub mod lockstep;
pub mod messages;
pub mod node;
pub mod observations;
pub mod observe;
pub mod outbox;
pub mod params;
pub mod policy;
pub mod realtime;
pub mod record;
pub mod ros;
pub mod rosout;
pub mod safety;
pub mod serve;
pub mod status;
pub mod timeline;
pub mod transport;
pub mod voice;

pub use config::Config;
pub use error::{Error, Result};
pub use node::{
    Clock, Drill, FaultHalt, Inputs, ManualClock, Node, Outputs, SystemClock, TickOutcome,
};

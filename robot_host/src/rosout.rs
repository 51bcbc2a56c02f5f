//! Log records for ROS 2's `/rosout` (`rcl_interfaces/msg/Log`): a `tracing` layer, installed
//! by the `ros` command behind the same level filter as stderr, hands every record to the
//! transport through a bounded queue (records beyond it are dropped, never waited for); the
//! transport publishes them from its own thread.
//!
//! Records of the DDS library and of ros2-client are not forwarded (ros2-client logs each
//! `/rosout` publication itself: forwarding those would loop).

use crossbeam_channel::{Receiver, Sender};
use std::fmt::Write;
use std::sync::OnceLock;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::Context;

/// Records queued for the transport at most.
const QUEUE: usize = 256;

/// One log record as `/rosout` carries it.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    /// Seconds since the Unix epoch (wall clock, as rcl stamps log records).
    pub stamp: f64,
    /// `rcl_interfaces/msg/Log`'s level: 10 debug, 20 info, 30 warn, 40 error.
    pub level: u8,
    pub msg: String,
    pub file: String,
    /// The module the record comes from.
    pub function: String,
    pub line: u32,
}

static QUEUE_RX: OnceLock<Receiver<Record>> = OnceLock::new();

/// The records for `/rosout`, once [`layer`] was installed.
pub fn records() -> Option<&'static Receiver<Record>> {
    QUEUE_RX.get()
}

/// The layer that queues records for `/rosout` (one per process: a second call returns
/// `None`).
pub fn layer() -> Option<RosoutLayer> {
    let (tx, rx) = crossbeam_channel::bounded(QUEUE);
    QUEUE_RX.set(rx).ok()?;
    Some(RosoutLayer { tx })
}

pub struct RosoutLayer {
    tx: Sender<Record>,
}

/// The message and the other fields (`key=value`) of an event.
struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let rest = std::mem::take(&mut self.0);
            let _ = write!(self.0, "{value:?}");
            self.0.push_str(&rest);
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0.insert_str(0, value);
        } else {
            let _ = write!(self.0, " {}={value}", field.name());
        }
    }
}

fn ros_level(l: &tracing::Level) -> u8 {
    match *l {
        tracing::Level::ERROR => 40,
        tracing::Level::WARN => 30,
        tracing::Level::INFO => 20,
        _ => 10,
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for RosoutLayer {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let m = event.metadata();
        let t = m.target();
        if t.starts_with("rustdds") || t.starts_with("ros2_client") {
            return;
        }
        let mut msg = Message(String::new());
        event.record(&mut msg);
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let _ = self.tx.try_send(Record {
            stamp,
            level: ros_level(m.level()),
            msg: msg.0.trim_start().to_string(),
            file: m.file().unwrap_or("").to_string(),
            function: m.module_path().unwrap_or(t).to_string(),
            line: m.line().unwrap_or(0),
        });
    }
}

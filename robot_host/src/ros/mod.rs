//! The ROS 2 boundary that needs no ROS install: the CDR wire encoding and one Rust
//! definition per message (standard messages and `frt_msgs`), the topics and what crosses
//! them (`wire`). The transports build on it.

pub mod args;
pub mod cdr;
pub mod convert;
#[cfg(feature = "dds")]
pub mod dds_transport;
pub mod msg;
#[cfg(feature = "ros2")]
pub mod r2r_transport;
pub mod schema;
pub mod wire;

pub use cdr::{CdrError, CdrReader, CdrWriter};
pub use msg::RosMessage;

//! The ROS 2 boundary that needs no ROS install: the CDR wire encoding and one Rust
//! definition per message (standard messages and `frt_msgs`). The transports build on it.

pub mod cdr;
pub mod convert;
pub mod msg;
#[cfg(feature = "ros2")]
pub mod r2r_transport;

pub use cdr::{CdrError, CdrReader, CdrWriter};
pub use msg::RosMessage;

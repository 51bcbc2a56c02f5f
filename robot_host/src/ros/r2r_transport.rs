//! The ROS 2 transport on rcl through r2r (cargo feature `ros2`; needs a sourced ROS 2
//! install to link). Standard messages are typed r2r messages converted to and from the
//! node's definitions (`super::msg`); `frt_msgs` and the audio_common messages travel as raw
//! CDR through `subscribe_raw` / `publish_raw` with the codec of `super::cdr`, so nothing here
//! depends on generated code for packages outside ROS 2's core.
//!
//! Topics (relative names resolve under the node's namespace and name):
//! cameras and state as configured (sensor-data QoS for cameras and audio); `~/subgoal`
//! (`std_msgs/String`), `~/interrupt` and `~/resume` (`std_msgs/Empty`), `~/command`
//! (`std_msgs/String`: `stop`, `resume`, `subgoal: …`); published: `~/action_chunk`
//! (`frt_msgs/ActionChunk`), `~/transcript`, `~/status` (1 Hz), `/diagnostics` (1 Hz) and, when
//! configured, a `trajectory_msgs/JointTrajectory` per chunk.

use super::convert;
use super::msg::{self, RosMessage};
use crate::config::{Config, ImageFormat};
use crate::error::{Error, Result};
use crate::messages::Outbound;
use crate::node::{Inputs, ManualClock};
use crate::transport::Transport;
use crossbeam_channel::Receiver;
use futures::StreamExt;
use futures::task::LocalSpawnExt;
use r2r::QosProfile;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

fn ros_err(e: r2r::Error) -> Error {
    Error::bad("ROS 2", e.to_string())
}

fn header_in(h: r2r::std_msgs::msg::Header) -> msg::Header {
    msg::Header {
        stamp: msg::Time {
            sec: h.stamp.sec,
            nanosec: h.stamp.nanosec,
        },
        frame_id: h.frame_id,
    }
}

fn header_out(h: &msg::Header) -> r2r::std_msgs::msg::Header {
    r2r::std_msgs::msg::Header {
        stamp: r2r::builtin_interfaces::msg::Time {
            sec: h.stamp.sec,
            nanosec: h.stamp.nanosec,
        },
        frame_id: h.frame_id.clone(),
    }
}

fn trajectory_out(t: &msg::JointTrajectory) -> r2r::trajectory_msgs::msg::JointTrajectory {
    r2r::trajectory_msgs::msg::JointTrajectory {
        header: header_out(&t.header),
        joint_names: t.joint_names.clone(),
        points: t
            .points
            .iter()
            .map(|p| r2r::trajectory_msgs::msg::JointTrajectoryPoint {
                positions: p.positions.clone(),
                velocities: p.velocities.clone(),
                accelerations: p.accelerations.clone(),
                effort: p.effort.clone(),
                time_from_start: r2r::builtin_interfaces::msg::Duration {
                    sec: p.time_from_start.sec,
                    nanosec: p.time_from_start.nanosec,
                },
            })
            .collect(),
    }
}

fn diagnostics_out(d: &msg::DiagnosticArray) -> r2r::diagnostic_msgs::msg::DiagnosticArray {
    r2r::diagnostic_msgs::msg::DiagnosticArray {
        header: header_out(&d.header),
        status: d
            .status
            .iter()
            .map(|s| r2r::diagnostic_msgs::msg::DiagnosticStatus {
                level: s.level,
                name: s.name.clone(),
                message: s.message.clone(),
                hardware_id: s.hardware_id.clone(),
                values: s
                    .values
                    .iter()
                    .map(|kv| r2r::diagnostic_msgs::msg::KeyValue {
                        key: kv.key.clone(),
                        value: kv.value.clone(),
                    })
                    .collect(),
            })
            .collect(),
    }
}

/// The r2r transport: owns the rcl node.
pub struct R2r {
    node: r2r::Node,
    cfg: Config,
    /// Set from `/clock` when the node runs on simulation time (`use_sim_time`).
    sim_clock: Option<Arc<ManualClock>>,
}

impl R2r {
    /// Wraps a node created from the process arguments (`--ros-args` are read by
    /// `r2r::Context::create`). `sim_clock`: the clock to drive from `/clock`.
    pub fn new(node: r2r::Node, cfg: Config, sim_clock: Option<Arc<ManualClock>>) -> R2r {
        R2r {
            node,
            cfg,
            sim_clock,
        }
    }

    /// Creates the context and node: `name` and `namespace` are defaults that `--ros-args`
    /// remappings (and the launch file) override. Returns the node and the `config`
    /// parameter (the configuration file) and `use_sim_time`.
    pub fn create_node(name: &str, namespace: &str) -> Result<(r2r::Node, String, bool)> {
        let ctx = r2r::Context::create().map_err(ros_err)?;
        let node = r2r::Node::create(ctx, name, namespace).map_err(ros_err)?;
        let config: String = node.get_parameter("config").map_err(|e| {
            Error::bad(
                "ROS 2 parameter `config`",
                format!("{e} (give it with --ros-args -p config:=FILE or the launch file)"),
            )
        })?;
        let sim = node.get_parameter::<bool>("use_sim_time").unwrap_or(false);
        Ok((node, config, sim))
    }
}

impl Transport for R2r {
    fn name(&self) -> &str {
        "ros2 (r2r)"
    }

    fn run(
        &mut self,
        inputs: &Inputs,
        outputs: &Receiver<Outbound>,
        stop: &AtomicBool,
    ) -> Result<()> {
        let mut pool = futures::executor::LocalPool::new();
        let spawner = pool.spawner();
        let spawn = |f: std::pin::Pin<Box<dyn futures::Future<Output = ()>>>| {
            spawner
                .spawn_local(f)
                .map_err(|e| Error::bad("ROS 2", e.to_string()))
        };
        let node = &mut self.node;
        for cam in &self.cfg.cameras {
            let (inp, name) = (inputs.clone(), cam.name.clone());
            match cam.format {
                ImageFormat::Raw => {
                    let s = node
                        .subscribe::<r2r::sensor_msgs::msg::Image>(
                            &cam.topic,
                            QosProfile::sensor_data(),
                        )
                        .map_err(ros_err)?;
                    spawn(Box::pin(s.for_each(move |m| {
                        let (t, img) = convert::image(msg::Image {
                            header: header_in(m.header),
                            height: m.height,
                            width: m.width,
                            encoding: m.encoding,
                            is_bigendian: m.is_bigendian,
                            step: m.step,
                            data: m.data,
                        });
                        let _ = inp.frame(&name, t, &img);
                        futures::future::ready(())
                    })))?;
                }
                ImageFormat::Compressed => {
                    let s = node
                        .subscribe::<r2r::sensor_msgs::msg::CompressedImage>(
                            &cam.topic,
                            QosProfile::sensor_data(),
                        )
                        .map_err(ros_err)?;
                    spawn(Box::pin(s.for_each(move |m| {
                        let (t, img) = convert::compressed_image(msg::CompressedImage {
                            header: header_in(m.header),
                            format: m.format,
                            data: m.data,
                        });
                        let _ = inp.frame(&name, t, &img);
                        futures::future::ready(())
                    })))?;
                }
            }
        }
        let inp = inputs.clone();
        let s = node
            .subscribe::<r2r::sensor_msgs::msg::JointState>(
                &self.cfg.state.topic,
                QosProfile::sensor_data(),
            )
            .map_err(ros_err)?;
        spawn(Box::pin(s.for_each(move |m| {
            let _ = inp.state(&convert::joint_state(msg::JointState {
                header: header_in(m.header),
                name: m.name,
                position: m.position,
                velocity: m.velocity,
                effort: m.effort,
            }));
            futures::future::ready(())
        })))?;
        for (topic, kind) in [("~/subgoal", 0), ("~/command", 1)] {
            let inp = inputs.clone();
            let s = node
                .subscribe::<r2r::std_msgs::msg::String>(topic, QosProfile::default())
                .map_err(ros_err)?;
            spawn(Box::pin(s.for_each(move |m| {
                let _ = if kind == 0 {
                    crate::transport::deliver(&inp, crate::transport::Inbound::Subgoal(m.data))
                } else {
                    inp.command_text(&m.data)
                };
                futures::future::ready(())
            })))?;
        }
        for (topic, stop_cmd) in [("~/interrupt", true), ("~/resume", false)] {
            let inp = inputs.clone();
            let s = node
                .subscribe::<r2r::std_msgs::msg::Empty>(topic, QosProfile::default())
                .map_err(ros_err)?;
            spawn(Box::pin(s.for_each(move |_| {
                let m = if stop_cmd {
                    crate::transport::Inbound::Stop
                } else {
                    crate::transport::Inbound::Resume
                };
                let _ = crate::transport::deliver(&inp, m);
                futures::future::ready(())
            })))?;
        }
        if let Some(a) = &self.cfg.audio {
            let inp = inputs.clone();
            let (ty, kind) = match a.kind.as_str() {
                "audio_stamped" => ("audio_common_msgs/msg/AudioStamped", 1),
                "audio_data" => ("audio_common_msgs/msg/AudioDataStamped", 2),
                _ => ("frt_msgs/msg/AudioChunk", 0),
            };
            let (rate, channels) = (a.sample_rate.unwrap_or(16_000), a.channels.unwrap_or(1));
            let pcm = if a.sample_format == "f32le" {
                convert::PcmFormat::F32Le
            } else {
                convert::PcmFormat::S16Le
            };
            let s = node
                .subscribe_raw(&a.topic, ty, QosProfile::sensor_data())
                .map_err(ros_err)?;
            spawn(Box::pin(s.for_each(move |bytes| {
                let audio = match kind {
                    1 => msg::mgonzs13::AudioStamped::decode(&bytes)
                        .map_err(|e| e.to_string())
                        .and_then(|m| convert::audio_stamped(m).map_err(|e| e.to_string())),
                    2 => msg::ros_drivers::AudioDataStamped::decode(&bytes)
                        .map_err(|e| e.to_string())
                        .and_then(|m| {
                            convert::audio_data(
                                convert::stamp_of(&m.header),
                                &m.audio,
                                pcm,
                                rate,
                                channels,
                            )
                            .map_err(|e| e.to_string())
                        }),
                    _ => msg::AudioChunk::decode(&bytes)
                        .map(convert::audio_chunk)
                        .map_err(|e| e.to_string()),
                };
                match audio {
                    Ok(a) => {
                        let _ = inp.audio(a);
                    }
                    Err(e) => inp.refuse_audio(&e),
                }
                futures::future::ready(())
            })))?;
        }
        if let Some(clock) = self.sim_clock.clone() {
            let s = node
                .subscribe::<r2r::rosgraph_msgs::msg::Clock>("/clock", QosProfile::default())
                .map_err(ros_err)?;
            spawn(Box::pin(s.for_each(move |m| {
                clock.set(m.clock.sec as f64 + m.clock.nanosec as f64 * 1e-9);
                futures::future::ready(())
            })))?;
        }
        let chunk_pub = node
            .create_publisher_untyped(
                "~/action_chunk",
                msg::ActionChunk::NAME,
                QosProfile::default(),
            )
            .map_err(ros_err)?;
        let transcript_pub = node
            .create_publisher_untyped("~/transcript", msg::Transcript::NAME, QosProfile::default())
            .map_err(ros_err)?;
        let status_pub = node
            .create_publisher_untyped("~/status", msg::HostStatus::NAME, QosProfile::default())
            .map_err(ros_err)?;
        let traj_pub = match &self.cfg.ros.joint_trajectory {
            Some(t) => Some(
                node.create_publisher::<r2r::trajectory_msgs::msg::JointTrajectory>(
                    &t.topic,
                    QosProfile::default(),
                )
                .map_err(ros_err)?,
            ),
            None => None,
        };
        let diag_pub = if self.cfg.ros.diagnostics {
            Some(
                node.create_publisher::<r2r::diagnostic_msgs::msg::DiagnosticArray>(
                    "/diagnostics",
                    QosProfile::default(),
                )
                .map_err(ros_err)?,
            )
        } else {
            None
        };
        let frame = self.cfg.ros.frame_id.clone();
        let velocity = self.cfg.safety.action_space == crate::config::ActionSpace::Velocity;
        let mut last_diag = Instant::now() - Duration::from_secs(2);
        while !stop.load(Ordering::Relaxed) {
            node.spin_once(Duration::from_millis(2));
            pool.run_until_stalled();
            for o in outputs.try_iter() {
                let r = match &o {
                    Outbound::Chunk(c) => {
                        if let (Some(p), Some(t)) = (&traj_pub, &self.cfg.ros.joint_trajectory) {
                            let tr = convert::joint_trajectory(c, &t.joints, velocity, &frame);
                            let _ = p.publish(&trajectory_out(&tr));
                        }
                        chunk_pub.publish_raw(&convert::action_chunk(c, &frame).encode())
                    }
                    Outbound::Transcript(t) => {
                        transcript_pub.publish_raw(&convert::transcript(t).encode())
                    }
                    Outbound::Status(s) => {
                        if let Some(p) = &diag_pub {
                            if last_diag.elapsed() >= Duration::from_secs(1) {
                                last_diag = Instant::now();
                                let d = convert::diagnostics(s, &self.cfg.node.name);
                                let _ = p.publish(&diagnostics_out(&d));
                            }
                        }
                        status_pub.publish_raw(&convert::host_status(s).encode())
                    }
                };
                if let Err(e) = r {
                    eprintln!("ROS 2 publish: {e}");
                }
            }
        }
        Ok(())
    }
}

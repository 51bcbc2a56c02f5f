//! The ROS 2 transport on rcl through r2r (cargo feature `ros2`; needs a sourced ROS 2
//! install to link). Standard messages are typed r2r messages converted to and from the
//! node's definitions (`super::msg`); `frt_msgs` and the audio_common messages travel as raw
//! CDR through `subscribe_raw` / `publish_raw` with the codec of `super::cdr`, so nothing here
//! depends on generated code for packages outside ROS 2's core.
//!
//! The topics are those of `super::wire`; rcl resolves and remaps their names.

use super::convert;
use super::msg;
use super::wire::{self, Cdr, Endpoints, In, Out, Publication};
use crate::config::{Config, ImageFormat};
use crate::error::{Error, Result};
use crate::messages::Outbound;
use crate::node::{Inputs, ManualClock};
use crate::transport::{Inbound, Transport, deliver};
use crossbeam_channel::Receiver;
use futures::StreamExt;
use futures::task::LocalSpawnExt;
use r2r::QosProfile;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

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

/// `frt_msgs/srv/SetSubgoal` as r2r generates it, converted to and from the node's
/// definitions. r2r generates bindings only for the interface packages it finds when it is
/// built, so the implementation for `r2r::frt_msgs::srv::SetSubgoal::Service` exists with the
/// cargo feature `ros2-set-subgoal` (frt_msgs built and sourced first, as colcon does for a
/// package that depends on it); everything else here is type-checked without it.
pub trait SetSubgoalService: r2r::WrappedServiceTypeSupport + 'static {
    fn request(m: Self::Request) -> msg::SetSubgoalRequest;
    fn response(m: msg::SetSubgoalResponse) -> Self::Response;
}

#[cfg(feature = "ros2-set-subgoal")]
impl SetSubgoalService for r2r::frt_msgs::srv::SetSubgoal::Service {
    fn request(m: r2r::frt_msgs::srv::SetSubgoal::Request) -> msg::SetSubgoalRequest {
        msg::SetSubgoalRequest { subgoal: m.subgoal }
    }
    fn response(m: msg::SetSubgoalResponse) -> r2r::frt_msgs::srv::SetSubgoal::Response {
        r2r::frt_msgs::srv::SetSubgoal::Response {
            accepted: m.accepted,
            subgoal_id: m.subgoal_id,
            message: m.message,
        }
    }
}

/// Serves `~/set_subgoal` (services QoS): each request is answered by [`wire::set_subgoal`].
#[cfg_attr(not(feature = "ros2-set-subgoal"), allow(dead_code))]
fn serve_set_subgoal<S: SetSubgoalService>(
    node: &mut r2r::Node,
    name: &str,
    inputs: &Inputs,
    spawn: &dyn Fn(std::pin::Pin<Box<dyn futures::Future<Output = ()>>>) -> Result<()>,
) -> Result<()> {
    let requests = node
        .create_service::<S>(name, QosProfile::services_default())
        .map_err(ros_err)?;
    let inp = inputs.clone();
    spawn(Box::pin(requests.for_each(move |mut r| {
        let req = S::request(std::mem::take(&mut r.message));
        if let Err(e) = r.respond(S::response(wire::set_subgoal(&inp, &req))) {
            eprintln!("ROS 2 set_subgoal reply: {e}");
        }
        futures::future::ready(())
    })))
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
        let ends = Endpoints::new(
            &self.cfg,
            self.node.namespace().map_err(ros_err)?.as_str(),
            &self.node.name().map_err(ros_err)?,
            self.sim_clock.is_some(),
        )?;
        let node = &mut self.node;
        let qos = |e: &wire::Endpoint<In>| {
            if e.sensor_data {
                QosProfile::sensor_data()
            } else {
                QosProfile::default()
            }
        };
        for e in &ends.inputs {
            let inp = inputs.clone();
            let topic = e.name.as_str();
            match e.kind.clone() {
                In::Camera(name, ImageFormat::Raw) => {
                    let s = node
                        .subscribe::<r2r::sensor_msgs::msg::Image>(topic, qos(e))
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
                In::Camera(name, ImageFormat::Compressed) => {
                    let s = node
                        .subscribe::<r2r::sensor_msgs::msg::CompressedImage>(topic, qos(e))
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
                In::State => {
                    let s = node
                        .subscribe::<r2r::sensor_msgs::msg::JointState>(topic, qos(e))
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
                }
                kind @ (In::Subgoal | In::Command) => {
                    let s = node
                        .subscribe::<r2r::std_msgs::msg::String>(topic, qos(e))
                        .map_err(ros_err)?;
                    spawn(Box::pin(s.for_each(move |m| {
                        let _ = deliver(
                            &inp,
                            if kind == In::Subgoal {
                                Inbound::Subgoal(m.data)
                            } else {
                                Inbound::Command(m.data)
                            },
                        );
                        futures::future::ready(())
                    })))?;
                }
                kind @ (In::Interrupt | In::Resume) => {
                    let s = node
                        .subscribe::<r2r::std_msgs::msg::Empty>(topic, qos(e))
                        .map_err(ros_err)?;
                    spawn(Box::pin(s.for_each(move |_| {
                        let _ = deliver(
                            &inp,
                            if kind == In::Interrupt {
                                Inbound::Stop
                            } else {
                                Inbound::Resume
                            },
                        );
                        futures::future::ready(())
                    })))?;
                }
                // Not among rcl's core packages: raw CDR through the node's codec.
                kind @ In::Audio(_) => {
                    let s = node
                        .subscribe_raw(topic, e.type_name, qos(e))
                        .map_err(ros_err)?;
                    spawn(Box::pin(s.for_each(move |bytes| {
                        wire::receive(&kind, Cdr::Serialized(&bytes), &inp, None);
                        futures::future::ready(())
                    })))?;
                }
                In::Clock => {
                    let Some(clock) = self.sim_clock.clone() else {
                        continue;
                    };
                    let s = node
                        .subscribe::<r2r::rosgraph_msgs::msg::Clock>(topic, qos(e))
                        .map_err(ros_err)?;
                    spawn(Box::pin(s.for_each(move |m| {
                        clock.set(m.clock.sec as f64 + m.clock.nanosec as f64 * 1e-9);
                        futures::future::ready(())
                    })))?;
                }
            }
        }
        for e in &ends.services {
            let wire::Srv::SetSubgoal = e.kind;
            #[cfg(feature = "ros2-set-subgoal")]
            serve_set_subgoal::<r2r::frt_msgs::srv::SetSubgoal::Service>(
                node, &e.name, inputs, &spawn,
            )?;
            #[cfg(not(feature = "ros2-set-subgoal"))]
            eprintln!(
                "{} is not served: built without the `ros2-set-subgoal` feature (it needs frt_msgs \
                 built and sourced first); use ~/subgoal or ~/command",
                e.topic
            );
        }
        let mut raw = Vec::new();
        let mut trajectory = None;
        let mut diagnostics = None;
        let default = QosProfile::default;
        for e in &ends.outputs {
            let topic = e.name.as_str();
            match e.kind {
                Out::Trajectory => {
                    trajectory = Some(
                        node.create_publisher::<r2r::trajectory_msgs::msg::JointTrajectory>(
                            topic,
                            default(),
                        )
                        .map_err(ros_err)?,
                    )
                }
                Out::Diagnostics => {
                    diagnostics = Some(
                        node.create_publisher::<r2r::diagnostic_msgs::msg::DiagnosticArray>(
                            topic,
                            default(),
                        )
                        .map_err(ros_err)?,
                    )
                }
                kind => raw.push((
                    kind,
                    node.create_publisher_untyped(topic, e.type_name, default())
                        .map_err(ros_err)?,
                )),
            }
        }
        let mut publisher = wire::Publisher::new(&self.cfg);
        while !stop.load(Ordering::Relaxed) {
            node.spin_once(Duration::from_millis(2));
            pool.run_until_stalled();
            for o in outputs.try_iter() {
                publisher.messages(&o, |p| {
                    let r = match (&p, &trajectory, &diagnostics) {
                        (Publication::Trajectory(t), Some(tp), _) => tp.publish(&trajectory_out(t)),
                        (Publication::Diagnostics(d), _, Some(dp)) => {
                            dp.publish(&diagnostics_out(d))
                        }
                        _ => match raw.iter().find(|(k, _)| *k == p.kind()) {
                            Some((_, rp)) => rp.publish_raw(&p.encode()),
                            None => Ok(()),
                        },
                    };
                    if let Err(e) = r {
                        eprintln!("ROS 2 publish on {:?}: {e}", p.kind());
                    }
                });
            }
        }
        Ok(())
    }
}

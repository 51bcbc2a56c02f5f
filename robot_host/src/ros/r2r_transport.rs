//! The ROS 2 transport on rcl through r2r (cargo feature `ros2`; needs a sourced ROS 2
//! install to link). Every message travels as serialized CDR (`subscribe_raw` /
//! `publish_raw`) through the node's own codec (`super::msg`, `super::wire`), as with the DDS
//! transport: decoding, conversion and the counting of refused inputs happen in one place.
//! Besides the topics: the configuration as parameters (r2r's parameter services), the log
//! records on `/rosout`, and a recording tap.
//!
//! The topics are those of `super::wire`; rcl resolves and remaps their names.

use super::msg;
use super::wire::{self, Cdr, Endpoints, In};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::messages::Outbound;
use crate::node::{Inputs, ManualClock};
use crate::params::{ParamValue, Parameters};
use crate::transport::Transport;
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
    tap: Option<Arc<crate::record::Tap>>,
    spawn: &dyn Fn(std::pin::Pin<Box<dyn futures::Future<Output = ()>>>) -> Result<()>,
) -> Result<()> {
    let requests = node
        .create_service::<S>(name, QosProfile::services_default())
        .map_err(ros_err)?;
    let inp = inputs.clone();
    spawn(Box::pin(requests.for_each(move |mut r| {
        let req = S::request(std::mem::take(&mut r.message));
        if let Some(tap) = &tap {
            let c = crate::messages::Command::Subgoal(req.subgoal.clone());
            tap.command(inp.now(), &c);
        }
        if let Err(e) = r.respond(S::response(wire::set_subgoal(&inp, &req))) {
            eprintln!("ROS 2 set_subgoal reply: {e}");
        }
        futures::future::ready(())
    })))
}

const LIVE: &str = "configuration field; may be set while running (taken between two ticks)";
const READ_ONLY: &str = "configuration field; read at start-up (set it with -p or --params-file)";

/// The configuration as the node's parameters through r2r's parameter services (`ros2 param
/// list/get/set/describe`): every field of its dotted name; a set of a live field is taken
/// by the running node between two ticks, any other set is refused with the reason
/// ([`crate::params`]).
struct ConfigParams {
    params: Parameters,
    inputs: Inputs,
    tap: Option<Arc<crate::record::Tap>>,
}

fn to_r2r(v: &ParamValue) -> r2r::ParameterValue {
    use r2r::ParameterValue as R;
    match v.clone() {
        ParamValue::NotSet => R::NotSet,
        ParamValue::Bool(b) => R::Bool(b),
        ParamValue::Integer(i) => R::Integer(i),
        ParamValue::Double(d) => R::Double(d),
        ParamValue::String(s) => R::String(s),
        ParamValue::BoolArray(v) => R::BoolArray(v),
        ParamValue::IntegerArray(v) => R::IntegerArray(v),
        ParamValue::DoubleArray(v) => R::DoubleArray(v),
        ParamValue::StringArray(v) => R::StringArray(v),
    }
}

fn from_r2r(name: &str, v: &r2r::ParameterValue) -> r2r::Result<ParamValue> {
    use r2r::ParameterValue as R;
    Ok(match v.clone() {
        R::NotSet => ParamValue::NotSet,
        R::Bool(b) => ParamValue::Bool(b),
        R::Integer(i) => ParamValue::Integer(i),
        R::Double(d) => ParamValue::Double(d),
        R::String(s) => ParamValue::String(s),
        R::BoolArray(v) => ParamValue::BoolArray(v),
        R::IntegerArray(v) => ParamValue::IntegerArray(v),
        R::DoubleArray(v) => ParamValue::DoubleArray(v),
        R::StringArray(v) => ParamValue::StringArray(v),
        R::ByteArray(_) => {
            return Err(refused(
                name,
                "no configuration field is a byte array".into(),
            ));
        }
    })
}

fn refused(name: &str, msg: String) -> r2r::Error {
    r2r::Error::ParameterValueConv {
        name: name.to_string(),
        msg,
    }
}

impl r2r::RosParams for ConfigParams {
    fn register_parameters(
        &mut self,
        _prefix: &str,
        _param: Option<r2r::Parameter>,
        params: &mut r2r::indexmap::IndexMap<String, r2r::Parameter>,
    ) -> r2r::Result<()> {
        // The values in effect (the command line's `-p` were applied to the configuration).
        for (name, v, live) in self.params.iter() {
            params.insert(
                name.to_string(),
                r2r::Parameter {
                    value: to_r2r(v),
                    description: if live { LIVE } else { READ_ONLY },
                },
            );
        }
        Ok(())
    }

    fn get_parameter(&mut self, name: &str) -> r2r::Result<r2r::ParameterValue> {
        self.params
            .get(name)
            .map(to_r2r)
            .ok_or_else(|| r2r::Error::InvalidParameterName { name: name.into() })
    }

    fn set_parameter(&mut self, name: &str, v: &r2r::ParameterValue) -> r2r::Result<()> {
        let v = from_r2r(name, v)?;
        self.params
            .apply(&self.inputs, &[(name.to_string(), v)], self.tap.as_deref())
            .map_err(|why| refused(name, why))
    }

    fn check_parameter(&self, name: &str, v: &r2r::ParameterValue) -> r2r::Result<()> {
        let v = from_r2r(name, v)?;
        self.params
            .check(&[(name.to_string(), v)])
            .map(|_| ())
            .map_err(|why| refused(name, why))
    }
}

/// The configuration overrides of the command line: every `-p name:=value` whose name is a
/// dotted configuration field (not `config`, `use_sim_time`, `autostart`), as YAML text.
pub fn overrides(node: &r2r::Node) -> Result<Vec<(String, String)>> {
    let params = node.params.lock().unwrap_or_else(|p| p.into_inner());
    let mut out = Vec::new();
    for (name, p) in params.iter() {
        if matches!(name.as_str(), "config" | "use_sim_time" | "autostart") {
            continue;
        }
        let v = from_r2r(name, &p.value).map_err(ros_err)?;
        let text = serde_yaml::to_string(&v.to_yaml())
            .map_err(|e| Error::bad(format!("parameter `{name}`"), e.to_string()))?;
        out.push((name.clone(), text));
    }
    Ok(out)
}

/// Publishes the log records (`crate::rosout`) on `/rosout` as `rcl_interfaces/msg/Log`,
/// named after the node's logger (as rcl's own rosout publisher does, without writing them
/// to the console a second time).
struct Rosout {
    publisher: r2r::Publisher<r2r::rcl_interfaces::msg::Log>,
    logger: String,
}

impl Rosout {
    fn new(node: &mut r2r::Node) -> Result<Rosout> {
        // rcl's rosout QoS: reliable, transient local, the last 1000, 10 s lifespan.
        let qos = QosProfile::default()
            .reliable()
            .transient_local()
            .keep_last(1000)
            .lifespan(Duration::from_secs(10));
        let publisher = node
            .create_publisher::<r2r::rcl_interfaces::msg::Log>("/rosout", qos)
            .map_err(ros_err)?;
        let fqn = node.fully_qualified_name().map_err(ros_err)?;
        Ok(Rosout {
            publisher,
            logger: fqn.trim_start_matches('/').replace('/', "."),
        })
    }

    /// Publishes what was logged since the last call.
    fn forward(&self) {
        let Some(records) = crate::rosout::records() else {
            return;
        };
        for r in records.try_iter() {
            let t = msg::Time::from_secs(r.stamp);
            let m = r2r::rcl_interfaces::msg::Log {
                stamp: r2r::builtin_interfaces::msg::Time {
                    sec: t.sec,
                    nanosec: t.nanosec,
                },
                level: r.level,
                name: self.logger.clone(),
                msg: r.msg,
                file: r.file,
                function: r.function,
                line: r.line,
            };
            if let Err(e) = self.publisher.publish(&m) {
                eprintln!("/rosout: {e}");
            }
        }
    }
}

/// The r2r transport: owns the rcl node.
pub struct R2r {
    node: r2r::Node,
    cfg: Config,
    /// Set from `/clock` when the node runs on simulation time (`use_sim_time`).
    sim_clock: Option<Arc<ManualClock>>,
    /// Where what crosses the transport is recorded (`--record`).
    tap: Option<Arc<crate::record::Tap>>,
}

impl R2r {
    /// Wraps a node created from the process arguments (`--ros-args` are read by
    /// `r2r::Context::create`). `sim_clock`: the clock to drive from `/clock`.
    pub fn new(node: r2r::Node, cfg: Config, sim_clock: Option<Arc<ManualClock>>) -> R2r {
        R2r {
            node,
            cfg,
            sim_clock,
            tap: None,
        }
    }

    /// Records every message received and published from now on into `tap`.
    pub fn set_tap(&mut self, tap: Option<Arc<crate::record::Tap>>) {
        self.tap = tap;
    }

    /// The node's name and namespace as rcl resolved them (remappings and the launch file
    /// included).
    pub fn names(&self) -> Result<(String, String)> {
        let ns = self.node.namespace().map_err(ros_err)?;
        Ok((
            self.node.name().map_err(ros_err)?,
            if ns.is_empty() { "/".into() } else { ns },
        ))
    }

    /// The node's topics (remappings are rcl's).
    pub fn endpoints(&self) -> Result<Endpoints> {
        let (name, ns) = self.names()?;
        Endpoints::new(&self.cfg, &ns, &name, self.sim_clock.is_some())
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
        // A node that must wait for `configure` and `activate` never starts active here.
        let autostart = node
            .params
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get("autostart")
            .map(|p| p.value.clone());
        let waits = match autostart {
            None | Some(r2r::ParameterValue::Bool(true)) => false,
            Some(r2r::ParameterValue::String(s)) => !s.eq_ignore_ascii_case("true"),
            Some(_) => true,
        };
        if waits {
            return Err(Error::bad(
                "ROS 2 parameter `autostart`",
                "the rcl transport is not a managed (lifecycle) node yet, so it cannot wait \
                 for configure and activate: it refuses to start rather than start active \
                 (use the DDS transport, transport:=dds, whose node is managed, or \
                 autostart:=true)",
            ));
        }
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
        let ends = self.endpoints()?;
        // The parameter services (and their set events, drained: a set is applied when it
        // is answered).
        let params = Arc::new(std::sync::Mutex::new(ConfigParams {
            params: Parameters::new(&self.cfg),
            inputs: inputs.clone(),
            tap: self.tap.clone(),
        }));
        let (serve_params, param_events) = self
            .node
            .make_derived_parameter_handler(params)
            .map_err(ros_err)?;
        spawn(Box::pin(serve_params))?;
        spawn(Box::pin(
            param_events.for_each(|_| futures::future::ready(())),
        ))?;
        let rosout = Rosout::new(&mut self.node)?;
        let tap = self.tap.clone();
        let node = &mut self.node;
        let qos = |e: &wire::Endpoint<In>| {
            if e.sensor_data {
                QosProfile::sensor_data()
            } else {
                QosProfile::default()
            }
        };
        // Every input as serialized CDR, decoded, converted and counted by the node's codec
        // (`wire::receive`) as the DDS transport does: a message that does not decode is a
        // refused input of its kind.
        for e in &ends.inputs {
            let kind = e.kind.clone();
            if kind == In::Clock && self.sim_clock.is_none() {
                continue;
            }
            let s = node
                .subscribe_raw(&e.name, e.type_name, qos(e))
                .map_err(ros_err)?;
            let (inp, clock, tap) = (inputs.clone(), self.sim_clock.clone(), tap.clone());
            spawn(Box::pin(s.for_each(move |bytes| {
                if let Some(tap) = &tap {
                    tap.input(inp.now(), &kind, &bytes);
                }
                wire::receive(&kind, Cdr::Serialized(&bytes), &inp, clock.as_deref());
                futures::future::ready(())
            })))?;
        }
        for e in &ends.services {
            let wire::Srv::SetSubgoal = e.kind;
            #[cfg(feature = "ros2-set-subgoal")]
            serve_set_subgoal::<r2r::frt_msgs::srv::SetSubgoal::Service>(
                node,
                &e.name,
                inputs,
                tap.clone(),
                &spawn,
            )?;
            #[cfg(not(feature = "ros2-set-subgoal"))]
            eprintln!(
                "{} is not served: built without the `ros2-set-subgoal` feature (it needs frt_msgs \
                 built and sourced first); use ~/subgoal or ~/command",
                e.topic
            );
        }
        let mut raw = Vec::new();
        for e in &ends.outputs {
            raw.push((
                e.kind,
                node.create_publisher_untyped(&e.name, e.type_name, QosProfile::default())
                    .map_err(ros_err)?,
            ));
        }
        let mut publisher = wire::Publisher::new(&self.cfg);
        while !stop.load(Ordering::Relaxed) {
            node.spin_once(Duration::from_millis(2));
            pool.run_until_stalled();
            rosout.forward();
            for o in outputs.try_iter() {
                if let Some(tap) = &tap {
                    tap.output(inputs.now(), &o);
                }
                publisher.messages(&o, |p| {
                    if let Some((_, rp)) = raw.iter().find(|(k, _)| *k == p.kind()) {
                        if let Err(e) = rp.publish_raw(&p.encode()) {
                            eprintln!("ROS 2 publish on {:?}: {e}", p.kind());
                        }
                    }
                });
            }
        }
        Ok(())
    }
}

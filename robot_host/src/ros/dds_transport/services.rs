//! The node's services on the transport's thread: `~/set_subgoal` and ROS 2's parameter
//! services over the configuration (see [`crate::params`]), in the clients' framing.

use super::server::Server;
use super::{dds_err, qos};
use crate::error::Result;
use crate::node::Inputs;
use crate::params::{ParamValue, Parameters};
use ros2_client::dds::rustdds::mio1::{Poll, Token};
use ros2_client::parameters::raw;
use ros2_client::{Context, MessageTypeName, Name, ServiceMapping};
use std::sync::Mutex;

/// A service the transport answers on its thread.
pub(super) trait Answer {
    /// Answers the requests that have arrived (at most 64 per readiness event; the poll
    /// wakes again for the rest).
    fn answer(&self, inputs: &Inputs);
    /// Sends the replies that wait for their requester's reply reader (see
    /// [`Server::flush`]).
    fn flush(&self);
}

struct Handler<Req: ros2_client::Message, Resp: ros2_client::Message, F> {
    server: Server<Req, Resp>,
    name: String,
    f: F,
}

impl<Req, Resp, F> Answer for Handler<Req, Resp, F>
where
    Req: ros2_client::Message + Clone + 'static,
    Resp: ros2_client::Message + 'static,
    F: Fn(Req) -> Resp,
{
    fn answer(&self, inputs: &Inputs) {
        for _ in 0..64 {
            // An undecodable request is counted like a garbage command and skipped: no reply
            // can be addressed without its header.
            let Some((id, req)) = self.server.next_request(&self.name, Some(inputs)) else {
                return;
            };
            if let Err(e) = self.server.send_response(id, (self.f)(req)) {
                tracing::warn!(service = %self.name, "reply not sent: {e}");
            }
        }
    }

    fn flush(&self) {
        self.server.flush();
    }
}

/// The node's services as they are created: each registered with the poll under the next
/// token.
pub(super) struct Services<'a, 'f> {
    pub(super) node: &'a mut ros2_client::Node,
    pub(super) context: &'a Context,
    pub(super) mapping: ServiceMapping,
    pub(super) poll: &'a Poll,
    pub(super) first_token: usize,
    pub(super) servers: Vec<Box<dyn Answer + 'f>>,
}

impl<'f> Services<'_, 'f> {
    /// Serves `name` (fully qualified) of type `pkg/srv/ty` with `f`.
    pub(super) fn add<Req, Resp, F>(&mut self, name: &str, pkg: &str, ty: &str, f: F) -> Result<()>
    where
        Req: ros2_client::Message + Clone + 'static,
        Resp: ros2_client::Message + 'static,
        F: Fn(Req) -> Resp + 'f,
    {
        let mut server = Server::new(self.node, self.context, self.mapping, name, (pkg, ty))?;
        let token = Token(self.first_token + self.servers.len());
        server
            .register(self.poll, token, true)
            .map_err(|err| dds_err(name, err))?;
        self.servers.push(Box::new(Handler {
            server,
            name: name.to_string(),
            f,
        }));
        Ok(())
    }
}

fn to_raw(v: &ParamValue) -> raw::ParameterValue {
    let mut r = raw::ParameterValue {
        ptype: v.type_id(),
        boolean_value: false,
        int_value: 0,
        double_value: 0.0,
        string_value: String::new(),
        byte_array: Vec::new(),
        bool_array: Vec::new(),
        int_array: Vec::new(),
        double_array: Vec::new(),
        string_array: Vec::new(),
    };
    match v {
        ParamValue::NotSet => {}
        ParamValue::Bool(b) => r.boolean_value = *b,
        ParamValue::Integer(i) => r.int_value = *i,
        ParamValue::Double(d) => r.double_value = *d,
        ParamValue::String(s) => r.string_value = s.clone(),
        ParamValue::BoolArray(a) => r.bool_array = a.clone(),
        ParamValue::IntegerArray(a) => r.int_array = a.clone(),
        ParamValue::DoubleArray(a) => r.double_array = a.clone(),
        ParamValue::StringArray(a) => r.string_array = a.clone(),
    }
    r
}

fn from_raw(r: raw::ParameterValue) -> std::result::Result<ParamValue, String> {
    use ros2_client::ParameterValue as V;
    Ok(match V::from(r) {
        V::NotSet => ParamValue::NotSet,
        V::Boolean(b) => ParamValue::Bool(b),
        V::Integer(i) => ParamValue::Integer(i),
        V::Double(d) => ParamValue::Double(d),
        V::String(s) => ParamValue::String(s),
        V::BooleanArray(a) => ParamValue::BoolArray(a),
        V::IntegerArray(a) => ParamValue::IntegerArray(a),
        V::DoubleArray(a) => ParamValue::DoubleArray(a),
        V::StringArray(a) => ParamValue::StringArray(a),
        V::ByteArray(_) => return Err("no parameter of this node is a byte array".into()),
    })
}

fn set_result(r: std::result::Result<(), String>) -> raw::SetParametersResult {
    raw::SetParametersResult {
        successful: r.is_ok(),
        reason: r.err().unwrap_or_default(),
    }
}

/// Checks a set of changes as one and hands the configuration to the node.
/// Where a parameter change is announced (`/parameter_events`) and as which node.
struct Events {
    publisher: ros2_client::Publisher<raw::ParameterEvent>,
    node: String,
    tap: Option<std::sync::Arc<crate::record::Tap>>,
}

/// Checks a set of changes as one, hands the configuration to the node and announces the
/// values now in effect on `/parameter_events`.
fn apply(
    params: &Mutex<Parameters>,
    inputs: &Inputs,
    events: &Events,
    changes: Vec<raw::Parameter>,
) -> std::result::Result<(), String> {
    let changes = changes
        .into_iter()
        .map(|p| from_raw(p.value).map(|v| (p.name, v)))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let mut params = params.lock().unwrap_or_else(|p| p.into_inner());
    params.apply(inputs, &changes, events.tap.as_deref())?;
    let names: Vec<&str> = changes.iter().map(|(n, _)| n.as_str()).collect();
    let event = raw::ParameterEvent {
        stamp: ros2_client::builtin_interfaces::Time::now(),
        node: events.node.clone(),
        new_parameters: Vec::new(),
        changed_parameters: names
            .iter()
            .map(|n| raw::Parameter {
                name: n.to_string(),
                value: to_raw(params.get(n).unwrap_or(&ParamValue::NotSet)),
            })
            .collect(),
        deleted_parameters: Vec::new(),
    };
    if let Err(e) = events.publisher.publish(event) {
        tracing::warn!("/parameter_events: {e}");
    }
    Ok(())
}

/// ROS 2's parameter services (`rcl_interfaces`) over the configuration (see
/// [`crate::params`]), in the clients' service framing.
pub(super) fn parameter_services<'f>(
    services: &mut Services<'_, 'f>,
    node: &str,
    params: &'f Mutex<Parameters>,
    inputs: &'f Inputs,
    tap: Option<std::sync::Arc<crate::record::Tap>>,
) -> Result<()> {
    use ros2_client::rcl_interfaces as rcl;
    let lock = move || params.lock().unwrap_or_else(|p| p.into_inner());
    let name = |s: &str| format!("{node}/{s}");
    let topic_name =
        Name::new("/", "parameter_events").map_err(|e| dds_err("parameter_events", e))?;
    let topic = services
        .node
        .create_topic(
            &topic_name,
            MessageTypeName::new("rcl_interfaces", "ParameterEvent"),
            &qos(false),
        )
        .map_err(|e| dds_err("parameter_events", e))?;
    let events = std::sync::Arc::new(Events {
        publisher: services
            .node
            .create_publisher(&topic, None)
            .map_err(|e| dds_err("parameter_events", e))?,
        node: node.to_string(),
        tap,
    });
    let events2 = events.clone();
    services.add(
        &name("list_parameters"),
        "rcl_interfaces",
        "ListParameters",
        move |r: rcl::ListParametersRequest| {
            let (names, prefixes) = lock().list(&r.prefixes, r.depth);
            rcl::ListParametersResponse {
                result: rcl::ListParametersResult { names, prefixes },
            }
        },
    )?;
    services.add(
        &name("get_parameters"),
        "rcl_interfaces",
        "GetParameters",
        move |r: rcl::GetParametersRequest| {
            let p = lock();
            rcl::GetParametersResponse {
                values: r
                    .names
                    .iter()
                    .map(|n| to_raw(p.get(n).unwrap_or(&ParamValue::NotSet)))
                    .collect(),
            }
        },
    )?;
    services.add(
        &name("get_parameter_types"),
        "rcl_interfaces",
        "GetParameterTypes",
        move |r: rcl::GetParameterTypesRequest| {
            let p = lock();
            rcl::GetParameterTypesResponse {
                values: r
                    .names
                    .iter()
                    .map(|n| p.get(n).map_or(0, ParamValue::type_id))
                    .collect(),
            }
        },
    )?;
    services.add(
        &name("describe_parameters"),
        "rcl_interfaces",
        "DescribeParameters",
        move |r: rcl::DescribeParametersRequest| {
            let p = lock();
            rcl::DescribeParametersResponse {
                values: r
                    .names
                    .iter()
                    .map(|n| {
                        let d = p.describe(n);
                        raw::ParameterDescriptor {
                            name: d.name,
                            r#type: d.type_id,
                            description: d.description,
                            additional_constraints: String::new(),
                            read_only: d.read_only,
                            dynamic_typing: false,
                            floating_point_range: Vec::new(),
                            integer_range: Vec::new(),
                        }
                    })
                    .collect(),
            }
        },
    )?;
    services.add(
        &name("set_parameters"),
        "rcl_interfaces",
        "SetParameters",
        move |r: rcl::SetParametersRequest| rcl::SetParametersResponse {
            // One at a time, as ROS 2 sets them: each result its own.
            results: r
                .parameter
                .into_iter()
                .map(|p| set_result(apply(params, inputs, &events, vec![p])))
                .collect(),
        },
    )?;
    services.add(
        &name("set_parameters_atomically"),
        "rcl_interfaces",
        "SetParametersAtomically",
        move |r: rcl::SetParametersRequest| rcl::SetParametersAtomicallyResponse {
            result: set_result(apply(params, inputs, &events2, r.parameter)),
        },
    )?;
    Ok(())
}

//! The managed node's lifecycle services and `~/transition_event` (see
//! [`crate::lifecycle`]), in the clients' service framing.

use super::server::{RequestId, Server};
use super::{dds_err, qos};
use crate::error::Result;
use crate::lifecycle::{State, Transition};
use crate::node::Inputs;
use crate::ros::msg as m;
use ros2_client::dds::rustdds::mio1::{Poll, Token};
use ros2_client::{Context, MessageTypeName, ServiceMapping};

/// The managed node's services, topic and state (see [`crate::lifecycle`]).
pub(super) struct Managed {
    pub(super) state: State,
    change: Server<m::ChangeStateRequest, m::ChangeStateResponse>,
    get_state: Server<m::EmptyRequest, m::GetStateResponse>,
    states: Server<m::EmptyRequest, m::GetAvailableStatesResponse>,
    transitions: Server<m::EmptyRequest, m::GetAvailableTransitionsResponse>,
    graph: Server<m::EmptyRequest, m::GetAvailableTransitionsResponse>,
    events: ros2_client::Publisher<m::TransitionEvent>,
    /// A `change_state` request the process carries out (configure, cleanup, shutdown),
    /// answered by [`super::Dds::complete_transition`].
    pub(super) pending: Option<(RequestId, Transition)>,
    /// Where the stops and resumes of transitions are recorded (`--record`).
    pub(super) tap: Option<std::sync::Arc<crate::record::Tap>>,
}

fn state_msg(s: State) -> m::LifecycleState {
    m::LifecycleState {
        id: s.id(),
        label: s.label().into(),
    }
}

fn describe(from: State, t: Transition) -> m::TransitionDescription {
    m::TransitionDescription {
        transition: m::LifecycleTransition {
            id: t.id(),
            label: t.label().into(),
        },
        start_state: state_msg(from),
        goal_state: state_msg(t.goal()),
    }
}

/// The lifecycle services' poll tokens start here (after any reader's and server's).
pub(super) const MANAGED_TOKEN: usize = 1 << 20;

impl Managed {
    pub(super) fn new(
        node: &mut ros2_client::Node,
        context: &Context,
        mapping: ServiceMapping,
        fqn: &str,
    ) -> Result<Managed> {
        fn server<Req, Resp>(
            node: &mut ros2_client::Node,
            context: &Context,
            mapping: ServiceMapping,
            name: &str,
            ty: &str,
        ) -> Result<Server<Req, Resp>>
        where
            Req: ros2_client::Message + Clone + 'static,
            Resp: ros2_client::Message + 'static,
        {
            Server::new(node, context, mapping, name, ("lifecycle_msgs", ty))
        }
        let name = |s: &str| format!("{fqn}/{s}");
        let topic = context
            .create_topic(
                format!("rt{}", name("transition_event")),
                MessageTypeName::new("lifecycle_msgs", "TransitionEvent"),
                &qos(false),
            )
            .map_err(|e| dds_err("transition_event", e))?;
        Ok(Managed {
            state: State::Unconfigured,
            change: server(node, context, mapping, &name("change_state"), "ChangeState")?,
            get_state: server(node, context, mapping, &name("get_state"), "GetState")?,
            states: server(
                node,
                context,
                mapping,
                &name("get_available_states"),
                "GetAvailableStates",
            )?,
            transitions: server(
                node,
                context,
                mapping,
                &name("get_available_transitions"),
                "GetAvailableTransitions",
            )?,
            graph: server(
                node,
                context,
                mapping,
                &name("get_transition_graph"),
                "GetAvailableTransitions",
            )?,
            events: node
                .create_publisher(&topic, None)
                .map_err(|e| dds_err("transition_event", e))?,
            pending: None,
            tap: None,
        })
    }

    /// Registers the services with a poll (tokens from [`MANAGED_TOKEN`]) or deregisters them.
    pub(super) fn register(&mut self, poll: &Poll, on: bool) -> Result<()> {
        let token = |k: usize| Token(MANAGED_TOKEN + k);
        self.change
            .register(poll, token(0), on)
            .and(self.get_state.register(poll, token(1), on))
            .and(self.states.register(poll, token(2), on))
            .and(self.transitions.register(poll, token(3), on))
            .and(self.graph.register(poll, token(4), on))
            .map_err(|e| dds_err("lifecycle services", e))
    }

    /// Sends the replies that wait for their requester's reply reader (see
    /// [`Server::flush`]).
    pub(super) fn flush(&self) {
        self.change.flush();
        self.get_state.flush();
        self.states.flush();
        self.transitions.flush();
        self.graph.flush();
    }

    /// Publishes `~/transition_event` and takes the new state.
    pub(super) fn moved(&mut self, t: Transition) {
        let from = self.state;
        self.state = t.goal();
        let d = describe(from, t);
        let timestamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let e = m::TransitionEvent {
            timestamp,
            transition: d.transition,
            start_state: d.start_state,
            goal_state: d.goal_state,
        };
        if let Err(e) = self.events.publish(e) {
            tracing::warn!("transition_event not published: {e}");
        }
        tracing::info!(state = self.state.label(), "lifecycle: {}", t.label());
    }

    /// Answers what has arrived. Activate and deactivate are carried out here when the node
    /// runs (`inputs`: a resume, a stop); configure, cleanup and shutdown are left pending
    /// for the process and returned.
    pub(super) fn answer(&mut self, inputs: Option<&Inputs>) -> Option<Transition> {
        let info = |r: std::result::Result<(), String>| {
            if let Err(e) = r {
                tracing::warn!("lifecycle reply not sent: {e}");
            }
        };
        let s = self.state;
        while let Some((id, _)) = self.get_state.next_request("get_state", inputs) {
            let resp = m::GetStateResponse {
                current_state: state_msg(s),
            };
            info(self.get_state.send_response(id, resp));
        }
        while let Some((id, _)) = self.states.next_request("get_available_states", inputs) {
            let resp = m::GetAvailableStatesResponse {
                available_states: State::ALL.iter().map(|s| state_msg(*s)).collect(),
            };
            info(self.states.send_response(id, resp));
        }
        while let Some((id, _)) = self
            .transitions
            .next_request("get_available_transitions", inputs)
        {
            let resp = m::GetAvailableTransitionsResponse {
                available_transitions: s.transitions().iter().map(|t| describe(s, *t)).collect(),
            };
            info(self.transitions.send_response(id, resp));
        }
        while let Some((id, _)) = self.graph.next_request("get_transition_graph", inputs) {
            let all = State::ALL
                .iter()
                .flat_map(|s| s.transitions().iter().map(move |t| describe(*s, *t)));
            let resp = m::GetAvailableTransitionsResponse {
                available_transitions: all.collect(),
            };
            info(self.graph.send_response(id, resp));
        }
        let mut taken = None;
        while let Some((id, req)) = self.change.next_request("change_state", inputs) {
            let t = Transition::requested(self.state, req.transition.id, &req.transition.label);
            let ok = match (t, inputs) {
                (Err(why), _) => {
                    tracing::warn!("lifecycle: {why}");
                    false
                }
                (Ok(_), _) if self.pending.is_some() || taken.is_some() => {
                    tracing::warn!("lifecycle: a transition is in progress");
                    false
                }
                (Ok(t @ (Transition::Activate | Transition::Deactivate)), Some(inputs)) => {
                    let tap = self.tap.as_deref();
                    let c = if t == Transition::Activate {
                        inputs.set_inactive(false);
                        tap.inspect(|tap| tap.transition(inputs.now(), s, t));
                        crate::messages::Command::Resume
                    } else {
                        crate::messages::Command::Stop
                    };
                    tap.inspect(|tap| tap.command(inputs.now(), &c));
                    let r = inputs.command(c, crate::messages::Source::Typed);
                    if t == Transition::Deactivate {
                        inputs.set_inactive(true);
                        tap.inspect(|tap| tap.transition(inputs.now(), s, t));
                    }
                    if r.is_ok() {
                        self.moved(t);
                    }
                    r.is_ok()
                }
                // Activate / deactivate without a running node: not reachable (the node is
                // configured in the states they leave from).
                (Ok(Transition::Activate | Transition::Deactivate), None) => false,
                (Ok(t), _) => {
                    self.pending = Some((id, t));
                    taken = Some(t);
                    continue;
                }
            };
            let resp = m::ChangeStateResponse { success: ok };
            info(self.change.send_response(id, resp));
        }
        taken
    }

    /// Answers the pending `change_state` request: `ok` takes the transition.
    pub(super) fn complete(&mut self, ok: bool) {
        if let Some((id, t)) = self.pending.take() {
            if ok {
                self.moved(t);
            }
            let resp = m::ChangeStateResponse { success: ok };
            if let Err(e) = self.change.send_response(id, resp) {
                tracing::warn!("lifecycle reply not sent: {e}");
            }
        }
    }
}

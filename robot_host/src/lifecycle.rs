//! The node's ROS 2 lifecycle (a managed node, `lifecycle_msgs`): its primary states and
//! transitions, as rclcpp's state machine has them.
//!
//! What each transition does in the node: **configure** loads the model and captures its
//! graphs (the node is then *inactive*: the control loop runs halted, holding — it publishes
//! no chunk that moves the robot); **activate** resumes it (chunks); **deactivate** halts and
//! holds; **cleanup** ends the control loop and frees the model (*unconfigured*);
//! **shutdown** halts and ends the process (*finalized*). With `autostart` (the default) the
//! node configures and activates itself at start, as an unmanaged node does.

/// A primary state (`lifecycle_msgs/msg/State`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Unconfigured,
    Inactive,
    Active,
    Finalized,
}

impl State {
    pub fn id(self) -> u8 {
        match self {
            State::Unconfigured => 1,
            State::Inactive => 2,
            State::Active => 3,
            State::Finalized => 4,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            State::Unconfigured => "unconfigured",
            State::Inactive => "inactive",
            State::Active => "active",
            State::Finalized => "finalized",
        }
    }

    pub const ALL: [State; 4] = [
        State::Unconfigured,
        State::Inactive,
        State::Active,
        State::Finalized,
    ];

    /// The transitions available from this state.
    pub fn transitions(self) -> &'static [Transition] {
        use Transition::*;
        match self {
            State::Unconfigured => &[Configure, UnconfiguredShutdown],
            State::Inactive => &[Cleanup, Activate, InactiveShutdown],
            State::Active => &[Deactivate, ActiveShutdown],
            State::Finalized => &[],
        }
    }
}

/// A transition (`lifecycle_msgs/msg/Transition`, ids as rclcpp's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transition {
    Configure,
    Cleanup,
    Activate,
    Deactivate,
    UnconfiguredShutdown,
    InactiveShutdown,
    ActiveShutdown,
}

impl Transition {
    pub fn id(self) -> u8 {
        match self {
            Transition::Configure => 1,
            Transition::Cleanup => 2,
            Transition::Activate => 3,
            Transition::Deactivate => 4,
            Transition::UnconfiguredShutdown => 5,
            Transition::InactiveShutdown => 6,
            Transition::ActiveShutdown => 7,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Transition::Configure => "configure",
            Transition::Cleanup => "cleanup",
            Transition::Activate => "activate",
            Transition::Deactivate => "deactivate",
            _ => "shutdown",
        }
    }

    /// The primary state it leads to when it succeeds.
    pub fn goal(self) -> State {
        match self {
            Transition::Configure | Transition::Deactivate => State::Inactive,
            Transition::Cleanup => State::Unconfigured,
            Transition::Activate => State::Active,
            _ => State::Finalized,
        }
    }

    /// Whether this is a shutdown (from any primary state).
    pub fn is_shutdown(self) -> bool {
        matches!(
            self,
            Transition::UnconfiguredShutdown
                | Transition::InactiveShutdown
                | Transition::ActiveShutdown
        )
    }

    /// The transition a `ChangeState` request asks for in `state`: by id when not 0, else by
    /// label (`shutdown` from any state). `Err` says why it cannot be taken.
    pub fn requested(state: State, id: u8, label: &str) -> Result<Transition, String> {
        let available = state.transitions();
        let t = if id != 0 {
            available.iter().find(|t| t.id() == id)
        } else {
            available.iter().find(|t| t.label() == label)
        };
        t.copied().ok_or_else(|| {
            let what = if id != 0 {
                format!("transition {id}")
            } else {
                format!("transition `{label}`")
            };
            format!(
                "{what} is not available in state `{}` (available: {})",
                state.label(),
                available
                    .iter()
                    .map(|t| format!("{} ({})", t.label(), t.id()))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transitions_follow_the_ros2_state_machine() {
        use State::*;
        let goal = |s, id| Transition::requested(s, id, "").map(Transition::goal);
        assert_eq!(goal(Unconfigured, 1), Ok(Inactive));
        assert_eq!(goal(Inactive, 3), Ok(Active));
        assert_eq!(goal(Active, 4), Ok(Inactive));
        assert_eq!(goal(Inactive, 2), Ok(Unconfigured));
        for (s, id) in [(Unconfigured, 5), (Inactive, 6), (Active, 7)] {
            assert_eq!(goal(s, id), Ok(Finalized));
        }
        // By label, shutdown from any primary state.
        assert_eq!(
            Transition::requested(Active, 0, "shutdown"),
            Ok(Transition::ActiveShutdown)
        );
        // Not from here.
        let e = Transition::requested(Unconfigured, 3, "").unwrap_err();
        assert!(e.contains("not available in state `unconfigured`"), "{e}");
        assert!(Transition::requested(Finalized, 0, "configure").is_err());
        assert!(Transition::requested(Active, 1, "").is_err());
    }
}

//! One Rust definition per ROS 2 message the node exchanges — the standard ones and
//! `frt_msgs` (msgs/frt_msgs) — each with its CDR encoding. Field order and types follow the
//! `.msg` definitions exactly (that order is the wire layout).

use super::cdr::{CdrError, CdrReader, CdrWriter};

/// A ROS 2 message with its wire encoding.
pub trait RosMessage: Sized {
    /// The ROS type name, e.g. `sensor_msgs/msg/Image`.
    const NAME: &'static str;
    /// Field names and their wire kinds, in order (checked against the `.msg` files).
    const FIELDS: &'static [(&'static str, &'static str)];
    fn write(&self, w: &mut CdrWriter);
    fn read(r: &mut CdrReader) -> Result<Self, CdrError>;

    /// The DDS type name ROS 2 middlewares register, e.g. `sensor_msgs::msg::dds_::Image_`.
    fn dds_type() -> String {
        let mut parts = Self::NAME.split('/');
        let (pkg, kind, name) = (
            parts.next().unwrap_or_default(),
            parts.next().unwrap_or_default(),
            parts.next().unwrap_or_default(),
        );
        format!("{pkg}::{kind}::dds_::{name}_")
    }

    /// The serialized message (encapsulation header included).
    fn encode(&self) -> Vec<u8> {
        let mut w = CdrWriter::new();
        self.write(&mut w);
        w.finish()
    }

    fn decode(bytes: &[u8]) -> Result<Self, CdrError> {
        let mut r = CdrReader::new(bytes)?;
        Self::read(&mut r)
    }

    /// Decodes a CDR little-endian body (no encapsulation header), as a DDS reader hands it.
    fn decode_body(bytes: &[u8]) -> Result<Self, CdrError> {
        Self::read(&mut CdrReader::body(bytes))
    }
}

macro_rules! put {
    (msg, $w:ident, $v:expr) => {
        $v.write($w)
    };
    (msgs($t:ty), $w:ident, $v:expr) => {{
        $w.len($v.len());
        for m in $v.iter() {
            m.write($w);
        }
    }};
    (string, $w:ident, $v:expr) => {
        $w.string(&$v)
    };
    (bytes, $w:ident, $v:expr) => {
        $w.bytes(&$v)
    };
    (i8s, $w:ident, $v:expr) => {
        $w.i8s(&$v)
    };
    (i16s, $w:ident, $v:expr) => {
        $w.i16s(&$v)
    };
    (i32s, $w:ident, $v:expr) => {
        $w.i32s(&$v)
    };
    (f32s, $w:ident, $v:expr) => {
        $w.f32s(&$v)
    };
    (f64s, $w:ident, $v:expr) => {
        $w.f64s(&$v)
    };
    (strings, $w:ident, $v:expr) => {
        $w.strings(&$v)
    };
    ($k:ident, $w:ident, $v:expr) => {
        $w.$k($v)
    };
}

macro_rules! get {
    (msg, $r:ident, $t:ty) => {
        <$t>::read($r)
    };
    (msgs($e:ty), $r:ident, $t:ty) => {{
        match $r.len(1) {
            Ok(n) => (0..n)
                .map(|_| <$e>::read($r))
                .collect::<Result<Vec<_>, _>>(),
            Err(e) => Err(e),
        }
    }};
    ($k:ident, $r:ident, $t:ty) => {
        $r.$k()
    };
}

macro_rules! ros_message {
    ($(#[$m:meta])* $name:ident = $ros:literal {
        $($(#[$fm:meta])* $f:ident : $t:ty => $k:ident $(($e:ty))?),* $(,)?
    }) => {
        $(#[$m])*
        #[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            $($(#[$fm])* pub $f: $t),*
        }
        impl RosMessage for $name {
            const NAME: &'static str = $ros;
            const FIELDS: &'static [(&'static str, &'static str)] =
                &[$((stringify!($f), concat!(stringify!($k) $(, "(", stringify!($e), ")")?))),*];
            #[allow(unused_variables)]
            fn write(&self, w: &mut CdrWriter) {
                $(put!($k $(($e))?, w, self.$f);)*
            }
            #[allow(unused_variables)]
            fn read(r: &mut CdrReader) -> Result<Self, CdrError> {
                Ok($name { $($f: get!($k $(($e))?, r, $t)?),* })
            }
        }
    };
}

// ---------------------------------------------------------------- standard messages

ros_message!(
    /// builtin_interfaces/Time.
    Time = "builtin_interfaces/msg/Time" { sec: i32 => i32, nanosec: u32 => u32 }
);
ros_message!(
    /// builtin_interfaces/Duration.
    Duration = "builtin_interfaces/msg/Duration" { sec: i32 => i32, nanosec: u32 => u32 }
);
ros_message!(
    /// std_msgs/Header.
    Header = "std_msgs/msg/Header" { stamp: Time => msg, frame_id: String => string }
);
ros_message!(
    /// std_msgs/String.
    StringMsg = "std_msgs/msg/String" { data: String => string }
);
ros_message!(
    /// std_msgs/Empty (DDS types need one member: a `uint8` that is always 0).
    Empty = "std_msgs/msg/Empty" { structure_needs_at_least_one_member: u8 => u8 }
);
ros_message!(
    /// sensor_msgs/Image.
    Image = "sensor_msgs/msg/Image" {
        header: Header => msg,
        height: u32 => u32,
        width: u32 => u32,
        encoding: String => string,
        is_bigendian: u8 => u8,
        step: u32 => u32,
        data: Vec<u8> => bytes,
    }
);
ros_message!(
    /// sensor_msgs/CompressedImage.
    CompressedImage = "sensor_msgs/msg/CompressedImage" {
        header: Header => msg,
        format: String => string,
        data: Vec<u8> => bytes,
    }
);
ros_message!(
    /// sensor_msgs/JointState.
    JointState = "sensor_msgs/msg/JointState" {
        header: Header => msg,
        name: Vec<String> => strings,
        position: Vec<f64> => f64s,
        velocity: Vec<f64> => f64s,
        effort: Vec<f64> => f64s,
    }
);
ros_message!(
    /// std_msgs/MultiArrayDimension.
    MultiArrayDimension = "std_msgs/msg/MultiArrayDimension" {
        label: String => string,
        size: u32 => u32,
        stride: u32 => u32,
    }
);
ros_message!(
    /// std_msgs/MultiArrayLayout.
    MultiArrayLayout = "std_msgs/msg/MultiArrayLayout" {
        dim: Vec<MultiArrayDimension> => msgs(MultiArrayDimension),
        data_offset: u32 => u32,
    }
);
ros_message!(
    /// std_msgs/Float64MultiArray (ros2_control's forward command controllers).
    Float64MultiArray = "std_msgs/msg/Float64MultiArray" {
        layout: MultiArrayLayout => msg,
        data: Vec<f64> => f64s,
    }
);
ros_message!(
    /// rosgraph_msgs/Clock (simulation time on `/clock`).
    Clock = "rosgraph_msgs/msg/Clock" { clock: Time => msg }
);
ros_message!(
    /// trajectory_msgs/JointTrajectoryPoint.
    JointTrajectoryPoint = "trajectory_msgs/msg/JointTrajectoryPoint" {
        positions: Vec<f64> => f64s,
        velocities: Vec<f64> => f64s,
        accelerations: Vec<f64> => f64s,
        effort: Vec<f64> => f64s,
        time_from_start: Duration => msg,
    }
);
ros_message!(
    /// trajectory_msgs/JointTrajectory.
    JointTrajectory = "trajectory_msgs/msg/JointTrajectory" {
        header: Header => msg,
        joint_names: Vec<String> => strings,
        points: Vec<JointTrajectoryPoint> => msgs(JointTrajectoryPoint),
    }
);
ros_message!(
    /// diagnostic_msgs/KeyValue.
    KeyValue = "diagnostic_msgs/msg/KeyValue" { key: String => string, value: String => string }
);
ros_message!(
    /// diagnostic_msgs/DiagnosticStatus (`level`: 0 OK, 1 WARN, 2 ERROR, 3 STALE).
    DiagnosticStatus = "diagnostic_msgs/msg/DiagnosticStatus" {
        level: u8 => u8,
        name: String => string,
        message: String => string,
        hardware_id: String => string,
        values: Vec<KeyValue> => msgs(KeyValue),
    }
);
ros_message!(
    /// diagnostic_msgs/DiagnosticArray.
    DiagnosticArray = "diagnostic_msgs/msg/DiagnosticArray" {
        header: Header => msg,
        status: Vec<DiagnosticStatus> => msgs(DiagnosticStatus),
    }
);

/// audio_common_msgs of ros-drivers/audio_common (ROS 2): raw bytes in the format the
/// capture node was configured with.
pub mod ros_drivers {
    use super::*;
    ros_message!(
        /// audio_common_msgs/AudioData: encoded or raw PCM bytes.
        AudioData = "audio_common_msgs/msg/AudioData" { data: Vec<u8> => bytes }
    );
    ros_message!(
        /// audio_common_msgs/AudioDataStamped.
        AudioDataStamped = "audio_common_msgs/msg/AudioDataStamped" {
            header: Header => msg,
            audio: AudioData => msg,
        }
    );
}

/// audio_common_msgs of mgonzs13/audio_common: samples in one of five typed arrays, the
/// format given by a PortAudio constant.
pub mod mgonzs13 {
    use super::*;
    /// PortAudio sample formats of `AudioInfo.format`.
    pub const PA_FLOAT32: i32 = 1;
    pub const PA_INT32: i32 = 2;
    pub const PA_INT16: i32 = 8;
    pub const PA_INT8: i32 = 16;
    pub const PA_UINT8: i32 = 32;
    ros_message!(
        /// audio_common_msgs/AudioData.
        AudioData = "audio_common_msgs/msg/AudioData" {
            float32_data: Vec<f32> => f32s,
            int32_data: Vec<i32> => i32s,
            int16_data: Vec<i16> => i16s,
            int8_data: Vec<i8> => i8s,
            uint8_data: Vec<u8> => bytes,
        }
    );
    ros_message!(
        /// audio_common_msgs/AudioInfo.
        AudioInfo = "audio_common_msgs/msg/AudioInfo" {
            format: i32 => i32,
            channels: i32 => i32,
            rate: i32 => i32,
            chunk: i32 => i32,
        }
    );
    ros_message!(
        /// audio_common_msgs/Audio.
        Audio = "audio_common_msgs/msg/Audio" { audio_data: AudioData => msg, info: AudioInfo => msg }
    );
    ros_message!(
        /// audio_common_msgs/AudioStamped.
        AudioStamped = "audio_common_msgs/msg/AudioStamped" { header: Header => msg, audio: Audio => msg }
    );
}

// ---------------------------------------------------------------- frt_msgs

ros_message!(
    /// frt_msgs/ActionChunk: one chunk of actions (see msgs/frt_msgs/msg/ActionChunk.msg).
    ActionChunk = "frt_msgs/msg/ActionChunk" {
        header: Header => msg,
        seq: u64 => u64,
        horizon: u32 => u32,
        action_dim: u32 => u32,
        actions: Vec<f32> => f32s,
        dt: f64 => f64,
        subgoal: String => string,
        subgoal_id: u64 => u64,
        halt: bool => bool,
        inference_latency: f64 => f64,
        due_row: u32 => u32,
        execution_horizon: u32 => u32,
    }
);
ros_message!(
    /// frt_msgs/AudioChunk: microphone samples.
    AudioChunk = "frt_msgs/msg/AudioChunk" {
        header: Header => msg,
        sample_rate: u32 => u32,
        channels: u16 => u16,
        samples: Vec<f32> => f32s,
    }
);
ros_message!(
    /// frt_msgs/Transcript: one utterance and the node's decision.
    Transcript = "frt_msgs/msg/Transcript" {
        header: Header => msg,
        text: String => string,
        avg_logprob: f32 => f32,
        no_speech_prob: f32 => f32,
        decision: String => string,
    }
);
ros_message!(
    /// frt_msgs/StageLatency.
    StageLatency = "frt_msgs/msg/StageLatency" {
        name: String => string,
        p50_ms: f64 => f64,
        p99_ms: f64 => f64,
        count: u64 => u64,
    }
);
ros_message!(
    /// frt_msgs/InputActivity: one input's count, rate and age.
    InputActivity = "frt_msgs/msg/InputActivity" {
        name: String => string,
        count: u64 => u64,
        rate_hz: f64 => f64,
        age_s: f64 => f64,
        stale: bool => bool,
    }
);
ros_message!(
    /// frt_msgs/HostStatus: counters and state of the node.
    HostStatus = "frt_msgs/msg/HostStatus" {
        header: Header => msg,
        halted: bool => bool,
        subgoal: String => string,
        subgoal_id: u64 => u64,
        ticks: u64 => u64,
        chunks: u64 => u64,
        halts: u64 => u64,
        abandoned: u64 => u64,
        stale: u64 => u64,
        bad_frames: u64 => u64,
        bad_states: u64 => u64,
        bad_audio: u64 => u64,
        bad_commands: u64 => u64,
        non_finite: u64 => u64,
        deadline_misses: u64 => u64,
        clamped: u64 => u64,
        last_error: String => string,
        latency: Vec<StageLatency> => msgs(StageLatency),
        since_tick_s: f64 => f64,
        window_s: f64 => f64,
        recent_stale: u64 => u64,
        recent_bad_inputs: u64 => u64,
        recent_deadline_misses: u64 => u64,
        recent_withheld: u64 => u64,
        recent_halts: u64 => u64,
        inputs: Vec<InputActivity> => msgs(InputActivity),
    }
);
// ---------------------------------------------------------------- lifecycle_msgs

ros_message!(
    /// lifecycle_msgs/State.
    LifecycleState = "lifecycle_msgs/msg/State" { id: u8 => u8, label: String => string }
);
ros_message!(
    /// lifecycle_msgs/Transition.
    LifecycleTransition = "lifecycle_msgs/msg/Transition" { id: u8 => u8, label: String => string }
);
ros_message!(
    /// lifecycle_msgs/TransitionDescription.
    TransitionDescription = "lifecycle_msgs/msg/TransitionDescription" {
        transition: LifecycleTransition => msg,
        start_state: LifecycleState => msg,
        goal_state: LifecycleState => msg,
    }
);
ros_message!(
    /// lifecycle_msgs/TransitionEvent (`timestamp`: nanoseconds).
    TransitionEvent = "lifecycle_msgs/msg/TransitionEvent" {
        timestamp: u64 => u64,
        transition: LifecycleTransition => msg,
        start_state: LifecycleState => msg,
        goal_state: LifecycleState => msg,
    }
);
ros_message!(
    /// lifecycle_msgs/ChangeState request.
    ChangeStateRequest = "lifecycle_msgs/srv/ChangeState_Request" {
        transition: LifecycleTransition => msg,
    }
);
ros_message!(
    /// lifecycle_msgs/ChangeState response.
    ChangeStateResponse = "lifecycle_msgs/srv/ChangeState_Response" { success: bool => bool }
);
ros_message!(
    /// The request of lifecycle_msgs' GetState, GetAvailableStates and
    /// GetAvailableTransitions (no field: DDS types need one member, always 0).
    EmptyRequest = "lifecycle_msgs/srv/GetState_Request" { structure_needs_at_least_one_member: u8 => u8 }
);
ros_message!(
    /// lifecycle_msgs/GetState response.
    GetStateResponse = "lifecycle_msgs/srv/GetState_Response" {
        current_state: LifecycleState => msg,
    }
);
ros_message!(
    /// lifecycle_msgs/GetAvailableStates response.
    GetAvailableStatesResponse = "lifecycle_msgs/srv/GetAvailableStates_Response" {
        available_states: Vec<LifecycleState> => msgs(LifecycleState),
    }
);
ros_message!(
    /// lifecycle_msgs/GetAvailableTransitions response.
    GetAvailableTransitionsResponse = "lifecycle_msgs/srv/GetAvailableTransitions_Response" {
        available_transitions: Vec<TransitionDescription> => msgs(TransitionDescription),
    }
);
ros_message!(
    /// frt_msgs/SetSubgoal request.
    SetSubgoalRequest = "frt_msgs/srv/SetSubgoal_Request" { subgoal: String => string }
);
ros_message!(
    /// frt_msgs/SetSubgoal response.
    SetSubgoalResponse = "frt_msgs/srv/SetSubgoal_Response" {
        accepted: bool => bool,
        subgoal_id: u64 => u64,
        message: String => string,
    }
);

impl Time {
    /// From seconds (ROS time: whole seconds and nanoseconds, nanoseconds in 0..1e9).
    pub fn from_secs(t: f64) -> Time {
        let sec = t.floor();
        let mut nanosec = ((t - sec) * 1e9).round() as u32;
        let mut sec = sec as i32;
        if nanosec >= 1_000_000_000 {
            sec += 1;
            nanosec -= 1_000_000_000;
        }
        Time { sec, nanosec }
    }

    pub fn as_secs(&self) -> f64 {
        self.sec as f64 + self.nanosec as f64 * 1e-9
    }
}

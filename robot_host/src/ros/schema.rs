//! Message definitions in ROS 2's `ros2msg` schema encoding (what `ros2 bag` writes into MCAP
//! files and Foxglove reads): a type's `.msg` fields, then every type it uses, each after a
//! separator line and `MSG: pkg/Name`.
//!
//! The `frt_msgs` definitions are the package's own `.msg` files; the standard ones are their
//! fields as the ROS 2 interface packages define them (Jazzy), checked against the CDR codec's
//! field lists by the tests below.

/// One definition per type: `pkg/Name` and its fields.
const DEFINITIONS: &[(&str, &str)] = &[
    ("builtin_interfaces/Time", "int32 sec\nuint32 nanosec\n"),
    ("builtin_interfaces/Duration", "int32 sec\nuint32 nanosec\n"),
    (
        "std_msgs/Header",
        "builtin_interfaces/Time stamp\nstring frame_id\n",
    ),
    ("std_msgs/String", "string data\n"),
    ("std_msgs/Empty", ""),
    (
        "std_msgs/MultiArrayDimension",
        "string label\nuint32 size\nuint32 stride\n",
    ),
    (
        "std_msgs/MultiArrayLayout",
        "MultiArrayDimension[] dim\nuint32 data_offset\n",
    ),
    (
        "std_msgs/Float64MultiArray",
        "MultiArrayLayout layout\nfloat64[] data\n",
    ),
    (
        "sensor_msgs/Image",
        "std_msgs/Header header\nuint32 height\nuint32 width\nstring encoding\nuint8 is_bigendian\nuint32 step\nuint8[] data\n",
    ),
    (
        "sensor_msgs/CompressedImage",
        "std_msgs/Header header\nstring format\nuint8[] data\n",
    ),
    (
        "sensor_msgs/JointState",
        "std_msgs/Header header\nstring[] name\nfloat64[] position\nfloat64[] velocity\nfloat64[] effort\n",
    ),
    ("rosgraph_msgs/Clock", "builtin_interfaces/Time clock\n"),
    (
        "trajectory_msgs/JointTrajectoryPoint",
        "float64[] positions\nfloat64[] velocities\nfloat64[] accelerations\nfloat64[] effort\nbuiltin_interfaces/Duration time_from_start\n",
    ),
    (
        "trajectory_msgs/JointTrajectory",
        "std_msgs/Header header\nstring[] joint_names\nJointTrajectoryPoint[] points\n",
    ),
    ("lifecycle_msgs/State", "uint8 id\nstring label\n"),
    ("lifecycle_msgs/Transition", "uint8 id\nstring label\n"),
    (
        "lifecycle_msgs/TransitionEvent",
        "uint64 timestamp\nTransition transition\nState start_state\nState goal_state\n",
    ),
    ("diagnostic_msgs/KeyValue", "string key\nstring value\n"),
    (
        "diagnostic_msgs/DiagnosticStatus",
        "byte OK=0\nbyte WARN=1\nbyte ERROR=2\nbyte STALE=3\nbyte level\nstring name\nstring message\nstring hardware_id\nKeyValue[] values\n",
    ),
    (
        "diagnostic_msgs/DiagnosticArray",
        "std_msgs/Header header\nDiagnosticStatus[] status\n",
    ),
    (
        "frt_msgs/ActionChunk",
        include_str!("../../../msgs/frt_msgs/msg/ActionChunk.msg"),
    ),
    (
        "frt_msgs/AudioChunk",
        include_str!("../../../msgs/frt_msgs/msg/AudioChunk.msg"),
    ),
    (
        "frt_msgs/Transcript",
        include_str!("../../../msgs/frt_msgs/msg/Transcript.msg"),
    ),
    (
        "frt_msgs/StageLatency",
        include_str!("../../../msgs/frt_msgs/msg/StageLatency.msg"),
    ),
    (
        "frt_msgs/InputActivity",
        include_str!("../../../msgs/frt_msgs/msg/InputActivity.msg"),
    ),
    (
        "frt_msgs/HostStatus",
        include_str!("../../../msgs/frt_msgs/msg/HostStatus.msg"),
    ),
];

const PRIMITIVES: &[&str] = &[
    "bool", "byte", "char", "float32", "float64", "int8", "uint8", "int16", "uint16", "int32",
    "uint32", "int64", "uint64", "string", "wstring",
];

/// `pkg/msg/Name` → `pkg/Name`.
fn short(type_name: &str) -> String {
    type_name.replacen("/msg/", "/", 1)
}

fn fields_of(name: &str) -> Option<&'static str> {
    DEFINITIONS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, f)| *f)
}

/// Whether a field line defines a constant (`byte OK=0`; `string<=8 name` is a bounded field).
fn is_constant(line: &str) -> bool {
    line.replace("<=", "").contains('=')
}

/// The types a definition uses (`pkg/Name`), in order of appearance; a bare name is in the
/// definition's own package.
fn used_types(pkg: &str, fields: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in fields.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        let Some(ty) = line.split_whitespace().next() else {
            continue;
        };
        if is_constant(line) {
            continue;
        }
        let base = ty.split(['[', '<']).next().unwrap_or(ty);
        if PRIMITIVES.contains(&base) {
            continue;
        }
        let full = if base.contains('/') {
            base.to_string()
        } else if base == "Header" {
            "std_msgs/Header".to_string()
        } else {
            format!("{pkg}/{base}")
        };
        if !out.contains(&full) {
            out.push(full);
        }
    }
    out
}

/// The `ros2msg` schema of a ROS type (`sensor_msgs/msg/Image`): its fields, then each type
/// it uses (transitively, once). `None` for a type without a definition here.
pub fn ros2msg(type_name: &str) -> Option<String> {
    if type_name.starts_with("audio_common_msgs/") {
        return audio_common(type_name);
    }
    let top = short(type_name);
    let mut text = fields_of(&top)?.to_string();
    let pkg = |n: &str| n.split('/').next().unwrap_or_default().to_string();
    let mut queue = used_types(&pkg(&top), fields_of(&top)?);
    let mut done = vec![top];
    while let Some(t) = (!queue.is_empty()).then(|| queue.remove(0)) {
        if done.contains(&t) {
            continue;
        }
        let fields = fields_of(&t)?;
        if !text.ends_with('\n') && !text.is_empty() {
            text.push('\n');
        }
        text.push_str(&"=".repeat(80));
        text.push_str(&format!("\nMSG: {t}\n"));
        text.push_str(fields);
        queue.extend(used_types(&pkg(&t), fields));
        done.push(t);
    }
    Some(text)
}

/// The two `audio_common_msgs` in use define `AudioData` differently; their stamped messages
/// have different names: ros-drivers/audio_common's `AudioDataStamped` (raw PCM bytes) and
/// mgonzs13/audio_common's `AudioStamped` (typed sample arrays with their format).
fn audio_common(type_name: &str) -> Option<String> {
    let sep = "=".repeat(80);
    let header = format!(
        "{sep}\nMSG: std_msgs/Header\n{}{sep}\nMSG: builtin_interfaces/Time\n{}",
        fields_of("std_msgs/Header")?,
        fields_of("builtin_interfaces/Time")?
    );
    match type_name {
        "audio_common_msgs/msg/AudioDataStamped" => Some(format!(
            "std_msgs/Header header\nAudioData audio\n{header}{sep}\nMSG: audio_common_msgs/AudioData\nuint8[] data\n"
        )),
        "audio_common_msgs/msg/AudioStamped" => Some(format!(
            "std_msgs/Header header\nAudio audio\n{header}{sep}\nMSG: audio_common_msgs/Audio\n\
             AudioData audio_data\nAudioInfo info\n{sep}\nMSG: audio_common_msgs/AudioData\n\
             float32[] float32_data\nint32[] int32_data\nint16[] int16_data\nint8[] int8_data\n\
             uint8[] uint8_data\n{sep}\nMSG: audio_common_msgs/AudioInfo\n\
             int32 format\nint32 channels\nint32 rate\nint32 chunk\n"
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ros::msg::{self, RosMessage};

    /// The field names of a definition, in order (constants and comments left out).
    fn names(fields: &str) -> Vec<String> {
        fields
            .lines()
            .map(|l| l.split('#').next().unwrap_or("").trim())
            .filter(|l| !l.is_empty() && !is_constant(l))
            .filter_map(|l| l.split_whitespace().nth(1).map(str::to_string))
            .collect()
    }

    fn check<M: RosMessage>() {
        let s = ros2msg(M::NAME).unwrap_or_else(|| panic!("no schema for {}", M::NAME));
        let own = s.split(&"=".repeat(80)).next().unwrap();
        let want: Vec<_> = M::FIELDS.iter().map(|(n, _)| n.to_string()).collect();
        let got = names(own);
        // `std_msgs/Empty` has no field; its CDR form carries one placeholder byte.
        if M::NAME != msg::Empty::NAME {
            assert_eq!(got, want, "{}", M::NAME);
        } else {
            assert!(got.is_empty());
        }
        // Every type a section uses is defined in a section of its own.
        for (i, section) in s.split(&"=".repeat(80)).enumerate() {
            let (pkg, fields) = match section.trim_start().strip_prefix("MSG: ") {
                Some(rest) => {
                    let (name, fields) = rest.split_once('\n').unwrap();
                    (name.split('/').next().unwrap(), fields)
                }
                None => {
                    assert_eq!(i, 0, "{}: a section without its name\n{s}", M::NAME);
                    (M::NAME.split('/').next().unwrap(), section)
                }
            };
            for t in used_types(pkg, fields) {
                assert!(
                    s.contains(&format!("MSG: {t}\n")),
                    "{}: {t} missing\n{s}",
                    M::NAME
                );
            }
        }
    }

    #[test]
    fn every_recorded_type_has_a_schema_matching_its_codec() {
        check::<msg::Time>();
        check::<msg::Header>();
        check::<msg::StringMsg>();
        check::<msg::Empty>();
        check::<msg::Image>();
        check::<msg::CompressedImage>();
        check::<msg::JointState>();
        check::<msg::Float64MultiArray>();
        check::<msg::MultiArrayLayout>();
        check::<msg::Clock>();
        check::<msg::JointTrajectory>();
        check::<msg::JointTrajectoryPoint>();
        check::<msg::DiagnosticArray>();
        check::<msg::DiagnosticStatus>();
        check::<msg::ActionChunk>();
        check::<msg::AudioChunk>();
        check::<msg::Transcript>();
        check::<msg::HostStatus>();
        check::<msg::InputActivity>();
        check::<msg::StageLatency>();
        check::<msg::TransitionEvent>();
        check::<msg::ros_drivers::AudioDataStamped>();
        check::<msg::mgonzs13::AudioStamped>();
    }

    #[test]
    fn dependencies_follow_once_each_after_a_separator() {
        let s = ros2msg("frt_msgs/msg/HostStatus").unwrap();
        for t in [
            "std_msgs/Header",
            "builtin_interfaces/Time",
            "frt_msgs/StageLatency",
            "frt_msgs/InputActivity",
        ] {
            assert_eq!(s.matches(&format!("MSG: {t}\n")).count(), 1, "{t}\n{s}");
        }
        assert!(s.contains(&format!("\n{}\nMSG: std_msgs/Header\n", "=".repeat(80))));
        assert_eq!(ros2msg("sensor_msgs/msg/Imu"), None);
        assert_eq!(ros2msg("std_msgs/msg/Empty").as_deref(), Some(""));
    }
}

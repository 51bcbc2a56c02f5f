//! The CDR codec against an independent XCDR1 implementation: every message's bytes equal those
//! the `cyclonedds` serializer produced for the same values (tests/data/cdr-references.json,
//! scripts/ros-cdr-references.py), decode back to the same values, and every truncation or
//! corruption is an error, never a panic.

use frt_robot_host::ros::msg::{self, mgonzs13, ros_drivers};
use frt_robot_host::ros::{CdrError, RosMessage};
use serde::de::DeserializeOwned;
use serde_json::Value;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn check<T: RosMessage + DeserializeOwned + PartialEq + std::fmt::Debug>(key: &str, e: &Value) {
    let v: T =
        serde_json::from_value(e["values"].clone()).unwrap_or_else(|err| panic!("{key}: {err}"));
    let want = e["hex"].as_str().unwrap();
    assert_eq!(hex(&v.encode()), want, "{key}: encoding");
    let bytes = unhex(want);
    assert_eq!(T::decode(&bytes).unwrap(), v, "{key}: decoding");
    // As a DDS reader hands it: the body after the encapsulation header.
    assert_eq!(T::decode_body(&bytes[4..]).unwrap(), v, "{key}: body");
    // Trailing alignment padding some writers add is accepted.
    let mut padded = bytes.clone();
    padded.extend_from_slice(&[0, 0, 0]);
    assert_eq!(T::decode(&padded).unwrap(), v, "{key}: padded");
    // Every truncation is an error (a message whose tail is empty sequences may decode from
    // a prefix only if nothing but those is missing: never with a panic).
    for n in 0..bytes.len() {
        let _ = T::decode(&bytes[..n]);
    }
    assert!(T::decode(&bytes[..bytes.len().min(3)]).is_err());
    let name = key.split('#').next().unwrap();
    assert_eq!(T::NAME, name);
}

#[test]
fn every_message_matches_cyclonedds_byte_for_byte() {
    let refs: serde_json::Map<String, Value> = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/cdr-references.json"
        ))
        .unwrap(),
    )
    .unwrap();
    assert_eq!(refs.len(), 22);
    for (key, e) in &refs {
        match key.as_str() {
            "builtin_interfaces/msg/Time" => check::<msg::Time>(key, e),
            "std_msgs/msg/Header" => check::<msg::Header>(key, e),
            "rosgraph_msgs/msg/Clock" => check::<msg::Clock>(key, e),
            "std_msgs/msg/String" => check::<msg::StringMsg>(key, e),
            "std_msgs/msg/Empty" => check::<msg::Empty>(key, e),
            "sensor_msgs/msg/Image" => check::<msg::Image>(key, e),
            "sensor_msgs/msg/CompressedImage" => check::<msg::CompressedImage>(key, e),
            "sensor_msgs/msg/JointState" | "sensor_msgs/msg/JointState#empty" => {
                check::<msg::JointState>(key, e)
            }
            "trajectory_msgs/msg/JointTrajectory" => check::<msg::JointTrajectory>(key, e),
            "std_msgs/msg/Float64MultiArray" => check::<msg::Float64MultiArray>(key, e),
            "diagnostic_msgs/msg/DiagnosticArray" => check::<msg::DiagnosticArray>(key, e),
            "audio_common_msgs/msg/AudioDataStamped#ros_drivers" => {
                check::<ros_drivers::AudioDataStamped>(key, e)
            }
            "audio_common_msgs/msg/AudioStamped#mgonzs13"
            | "audio_common_msgs/msg/AudioStamped#mgonzs13_float" => {
                check::<mgonzs13::AudioStamped>(key, e)
            }
            "frt_msgs/msg/ActionChunk" | "frt_msgs/msg/ActionChunk#halt" => {
                check::<msg::ActionChunk>(key, e)
            }
            "frt_msgs/msg/AudioChunk" => check::<msg::AudioChunk>(key, e),
            "frt_msgs/msg/Transcript" => check::<msg::Transcript>(key, e),
            "frt_msgs/msg/HostStatus" => check::<msg::HostStatus>(key, e),
            "frt_msgs/srv/SetSubgoal_Request" => check::<msg::SetSubgoalRequest>(key, e),
            "frt_msgs/srv/SetSubgoal_Response" => check::<msg::SetSubgoalResponse>(key, e),
            k => panic!("no Rust type for {k}"),
        }
    }
}

#[test]
fn names_follow_ros2_conventions() {
    assert_eq!(msg::Image::dds_type(), "sensor_msgs::msg::dds_::Image_");
    assert_eq!(
        msg::ActionChunk::dds_type(),
        "frt_msgs::msg::dds_::ActionChunk_"
    );
    assert_eq!(
        msg::SetSubgoalRequest::dds_type(),
        "frt_msgs::srv::dds_::SetSubgoal_Request_"
    );
    let t = msg::Time::from_secs(1.999_999_999_9);
    assert_eq!((t.sec, t.nanosec), (2, 0));
    assert_eq!(
        msg::Time::from_secs(-0.5),
        msg::Time {
            sec: -1,
            nanosec: 500_000_000
        }
    );
}

#[test]
fn malformed_messages_are_errors() {
    let good = msg::StringMsg {
        data: "stop".into(),
    }
    .encode();
    // Big-endian and unknown encapsulations.
    let mut be = good.clone();
    be[1] = 0x00;
    assert!(matches!(
        msg::StringMsg::decode(&be),
        Err(CdrError::Encapsulation(_))
    ));
    // A string without its NUL, and one that is not UTF-8.
    let mut no_nul = good.clone();
    *no_nul.last_mut().unwrap() = b'!';
    assert!(matches!(
        msg::StringMsg::decode(&no_nul),
        Err(CdrError::BadString { .. })
    ));
    let mut bad_utf8 = good.clone();
    bad_utf8[8] = 0xff;
    assert!(matches!(
        msg::StringMsg::decode(&bad_utf8),
        Err(CdrError::BadString { .. })
    ));
    // A sequence count far beyond the message (no allocation of it is attempted).
    let mut img = msg::Image::default().encode();
    let n = img.len();
    img[n - 4..].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(
        msg::Image::decode(&img),
        Err(CdrError::Count { .. })
    ));
    // A bool that is neither 0 nor 1.
    let mut r = msg::SetSubgoalResponse::default().encode();
    r[4] = 7;
    assert!(matches!(
        msg::SetSubgoalResponse::decode(&r),
        Err(CdrError::Bool { .. })
    ));
    assert!(msg::ActionChunk::decode(&[]).is_err());
}

/// The wire kind a `.msg` field type maps to.
fn kind_of(ty: &str) -> String {
    let (base, seq) = match ty.strip_suffix("[]") {
        Some(b) => (b, true),
        None => (ty, false),
    };
    let prim = match base {
        "bool" => "bool",
        "uint8" | "byte" | "char" => "u8",
        "int8" => "i8",
        "int16" => "i16",
        "uint16" => "u16",
        "int32" => "i32",
        "uint32" => "u32",
        "uint64" => "u64",
        "float32" => "f32",
        "float64" => "f64",
        "string" => "string",
        other => {
            let name = other.rsplit('/').next().unwrap();
            return if seq {
                format!("msgs({name})")
            } else {
                "msg".into()
            };
        }
    };
    match (prim, seq) {
        ("u8", true) => "bytes".into(),
        ("string", true) => "strings".into(),
        (p, true) => format!("{p}s"),
        (p, false) => p.into(),
    }
}

/// (name, kind) of the fields of a `.msg` body (comments, blank lines and constants skipped).
fn msg_fields(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(|l| l.split('#').next().unwrap().trim())
        .filter(|l| !l.is_empty() && !l.contains('='))
        .map(|l| {
            let mut it = l.split_whitespace();
            let (ty, name) = (it.next().unwrap(), it.next().unwrap());
            (name.to_string(), kind_of(ty))
        })
        .collect()
}

fn rust_fields<T: RosMessage>() -> Vec<(String, String)> {
    T::FIELDS
        .iter()
        .map(|(n, k)| (n.to_string(), k.replace(' ', "")))
        .collect()
}

#[test]
fn rust_definitions_match_the_interface_files() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../msgs/frt_msgs");
    let read = |p: &str| std::fs::read_to_string(format!("{dir}/{p}")).unwrap();
    assert_eq!(
        msg_fields(&read("msg/ActionChunk.msg")),
        rust_fields::<msg::ActionChunk>()
    );
    assert_eq!(
        msg_fields(&read("msg/AudioChunk.msg")),
        rust_fields::<msg::AudioChunk>()
    );
    assert_eq!(
        msg_fields(&read("msg/Transcript.msg")),
        rust_fields::<msg::Transcript>()
    );
    assert_eq!(
        msg_fields(&read("msg/StageLatency.msg")),
        rust_fields::<msg::StageLatency>()
    );
    assert_eq!(
        msg_fields(&read("msg/InputActivity.msg")),
        rust_fields::<msg::InputActivity>()
    );
    assert_eq!(
        msg_fields(&read("msg/HostStatus.msg")),
        rust_fields::<msg::HostStatus>()
    );
    let srv = read("srv/SetSubgoal.srv");
    let (req, resp) = srv.split_once("\n---\n").unwrap();
    assert_eq!(msg_fields(req), rust_fields::<msg::SetSubgoalRequest>());
    assert_eq!(msg_fields(resp), rust_fields::<msg::SetSubgoalResponse>());
    // Every interface file is covered, and CMakeLists lists them all.
    let cmake = read("CMakeLists.txt");
    for sub in ["msg", "srv"] {
        for e in std::fs::read_dir(format!("{dir}/{sub}")).unwrap() {
            let name = e.unwrap().file_name().into_string().unwrap();
            assert!(
                cmake.contains(&format!("\"{sub}/{name}\"")),
                "{sub}/{name} not in CMakeLists.txt"
            );
        }
    }
    assert_eq!(std::fs::read_dir(format!("{dir}/msg")).unwrap().count(), 6);
}

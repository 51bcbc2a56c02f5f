//! Conversions between the node's messages and ROS 2 messages (shared by the ROS transports).

use frt_robot_host::messages as m;
use frt_robot_host::ros::convert::{self, PcmFormat};
use frt_robot_host::ros::msg::{self, mgonzs13, ros_drivers};
use frt_robot_host::status::{InputActivity, Recent};

fn chunk() -> m::ActionChunk {
    m::ActionChunk {
        stamp: 12.25,
        seq: 3,
        horizon: 3,
        action_dim: 2,
        actions: vec![0.5, 1.0, 1.5, 2.0, 2.5, 3.0].into(),
        dt: 0.4,
        subgoal: "wave".into(),
        subgoal_id: 2,
        halt: false,
        latency: 0.018,
        due_row: 1,
        execution_horizon: 2,
    }
}

fn plan() -> m::Plan {
    m::Plan {
        stamp: 12.25,
        dt: 0.4,
        action_dim: 2,
        rows: vec![0.5, 1.0, 1.5, 2.0, 2.5, 3.0].into(),
        halt: false,
    }
}

#[test]
fn chunks_become_action_chunks_and_plans_joint_trajectories() {
    let a = convert::action_chunk(&chunk(), "arm");
    assert_eq!(
        (a.header.stamp.sec, a.header.stamp.nanosec),
        (12, 250_000_000)
    );
    assert_eq!(a.header.frame_id, "arm");
    assert_eq!((a.seq, a.horizon, a.action_dim, a.subgoal_id), (3, 3, 2, 2));
    assert_eq!(a.inference_latency, 0.018);
    assert_eq!((a.due_row, a.execution_horizon), (1, 2));
    let joints = vec!["shoulder".to_string(), "elbow".to_string()];
    let t = convert::joint_trajectory(&plan(), &joints, false, "arm");
    assert_eq!(
        (t.header.stamp.sec, t.header.stamp.nanosec),
        (12, 250_000_000)
    );
    assert_eq!(t.joint_names, joints);
    assert_eq!(t.points.len(), 3);
    assert_eq!(t.points[1].positions, vec![1.5, 2.0]);
    assert!(t.points[1].velocities.is_empty());
    // time_from_start = k·dt from the stamp, when row 0 is due
    let tfs: Vec<(i32, u32)> = t
        .points
        .iter()
        .map(|p| (p.time_from_start.sec, p.time_from_start.nanosec))
        .collect();
    assert_eq!(tfs, vec![(0, 0), (0, 400_000_000), (0, 800_000_000)]);
    let v = convert::joint_trajectory(&plan(), &joints, true, "arm");
    assert_eq!(v.points[2].velocities, vec![2.5, 3.0]);
    assert!(v.points[2].positions.is_empty());
}

#[test]
fn the_three_microphone_formats_become_samples() {
    let h = msg::Header {
        stamp: msg::Time { sec: 5, nanosec: 0 },
        frame_id: String::new(),
    };
    let a = convert::audio_chunk(msg::AudioChunk {
        header: h.clone(),
        sample_rate: 16000,
        channels: 1,
        samples: vec![0.25, -0.5],
    });
    assert_eq!((a.stamp, a.sample_rate, a.channels), (5.0, 16000, 1));
    assert_eq!(a.samples, vec![0.25, -0.5]);
    let mg = |format, data: mgonzs13::AudioData| mgonzs13::AudioStamped {
        header: h.clone(),
        audio: mgonzs13::Audio {
            audio_data: data,
            info: mgonzs13::AudioInfo {
                format,
                channels: 2,
                rate: 48000,
                chunk: 2,
            },
        },
    };
    let s16 = convert::audio_stamped(mg(
        mgonzs13::PA_INT16,
        mgonzs13::AudioData {
            int16_data: vec![-32768, 16384, 0, 32767],
            ..Default::default()
        },
    ))
    .unwrap();
    assert_eq!((s16.sample_rate, s16.channels), (48000, 2));
    assert_eq!(s16.samples[..3], [-1.0, 0.5, 0.0]);
    let f = convert::audio_stamped(mg(
        mgonzs13::PA_FLOAT32,
        mgonzs13::AudioData {
            float32_data: vec![0.125],
            ..Default::default()
        },
    ))
    .unwrap();
    assert_eq!(f.samples, vec![0.125]);
    assert!(
        convert::audio_stamped(mg(3, Default::default())).is_err(),
        "unknown format"
    );
    let raw = ros_drivers::AudioData {
        data: [(-16384i16).to_le_bytes(), 8192i16.to_le_bytes()].concat(),
    };
    let r = convert::audio_data(1.0, &raw, PcmFormat::S16Le, 16000, 1).unwrap();
    assert_eq!(r.samples, vec![-0.5, 0.25]);
    let odd = ros_drivers::AudioData {
        data: vec![1, 2, 3],
    };
    assert!(convert::audio_data(1.0, &odd, PcmFormat::S16Le, 16000, 1).is_err());
}

#[test]
fn status_becomes_host_status_and_diagnostics() {
    let s = m::Status {
        stamp: 3.5,
        halted: true,
        subgoal: "wave".into(),
        subgoal_id: 2,
        ticks: 10,
        bad_frames: 1,
        last_error: "camera `base`: empty image data".into(),
        latency: vec![("tick".into(), 17.5, 18.0, 10)],
        since_tick_s: 0.05,
        window_s: 10.0,
        recent: Recent {
            bad_inputs: 1,
            ..Default::default()
        },
        inputs: vec![InputActivity {
            name: "camera base".into(),
            count: 12,
            rate_hz: 1.2,
            age_s: 0.5,
            stale: false,
        }],
        ..Default::default()
    };
    let h = convert::host_status(&s);
    assert!(h.halted);
    assert_eq!(h.latency[0].name, "tick");
    assert_eq!(h.latency[0].count, 10);
    let d = convert::diagnostics(&s, "frt_robot_host");
    let names: Vec<&str> = d.status.iter().map(|x| x.name.as_str()).collect();
    assert_eq!(
        names,
        ["frt_robot_host: control loop", "frt_robot_host: inputs"]
    );
    assert_eq!(d.status[0].level, 1, "halted is a warning");
    assert_eq!(d.status[1].level, 1, "refused inputs are a warning");
    assert_eq!(d.status[1].message, s.last_error);
    assert_eq!(h.inputs[0].name, "camera base");
    assert_eq!((h.inputs[0].count, h.recent_bad_inputs), (12, 1));
    // Levels follow the window: with the refusal out of it (the total stays), the inputs
    // recover; a running loop with nothing recent is OK.
    let calm = m::Status {
        halted: false,
        recent: Recent::default(),
        ..s.clone()
    };
    let d = convert::diagnostics(&calm, "frt_robot_host");
    assert_eq!((d.status[0].level, d.status[1].level), (0, 0));
    assert!(
        d.status[1]
            .values
            .iter()
            .any(|kv| kv.key == "bad_frames" && kv.value == "1")
    );
    // Recent deadline misses warn; no tick for longer than the bound is an error, whatever
    // else holds; a stale input warns and is named.
    let late = m::Status {
        recent: Recent {
            deadline_misses: 3,
            ..Default::default()
        },
        ..calm.clone()
    };
    assert_eq!(convert::diagnostics(&late, "n").status[0].level, 1);
    let stuck = m::Status {
        since_tick_s: 8.2,
        inputs: vec![InputActivity {
            stale: true,
            ..calm.inputs[0].clone()
        }],
        ..late.clone()
    };
    let d = convert::diagnostics(&stuck, "n");
    assert_eq!(d.status[0].level, 2);
    assert_eq!(d.status[0].message, "no tick finished for 8.2 s");
    assert_eq!(d.status[1].level, 1);
    assert_eq!(d.status[1].message, "no recent message: camera base");
    // Conversions in produce the node's types.
    let (t, img) = convert::image(msg::Image {
        header: msg::Header {
            stamp: msg::Time {
                sec: 1,
                nanosec: 500_000_000,
            },
            frame_id: "cam".into(),
        },
        height: 1,
        width: 1,
        encoding: "mono8".into(),
        is_bigendian: 0,
        step: 1,
        data: vec![9],
    });
    assert_eq!(t, 1.5);
    assert!(matches!(img, m::Image::Raw { ref encoding, .. } if encoding == "mono8"));
}

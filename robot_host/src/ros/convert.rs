//! Conversions between the node's messages and ROS 2 messages, shared by every ROS 2 transport
//! (so a transport only moves bytes): images and joint states in, the three microphone formats
//! in, action chunks, joint trajectories, transcripts, status and diagnostics out.

use super::msg::{self, mgonzs13, ros_drivers};
use crate::messages::{self as m, Stamp};

pub fn stamp_of(h: &msg::Header) -> Stamp {
    h.stamp.as_secs()
}

fn header(t: Stamp, frame_id: &str) -> msg::Header {
    msg::Header {
        stamp: msg::Time::from_secs(t),
        frame_id: frame_id.to_string(),
    }
}

/// `sensor_msgs/Image` → a raw frame (validated later, once, by the node's inputs).
pub fn image(i: msg::Image) -> (Stamp, m::Image) {
    let t = stamp_of(&i.header);
    (
        t,
        m::Image::Raw {
            encoding: i.encoding,
            width: i.width,
            height: i.height,
            step: i.step,
            data: i.data,
        },
    )
}

/// `sensor_msgs/CompressedImage` → a compressed frame.
pub fn compressed_image(i: msg::CompressedImage) -> (Stamp, m::Image) {
    (
        stamp_of(&i.header),
        m::Image::Compressed {
            format: i.format,
            data: i.data,
        },
    )
}

/// `sensor_msgs/JointState` → the node's joint state (names and positions; reordered and
/// checked by the node's inputs).
pub fn joint_state(j: msg::JointState) -> m::JointState {
    m::JointState {
        stamp: stamp_of(&j.header),
        names: j.name,
        position: j.position,
    }
}

/// A problem with an audio message.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("audio message: {0}")]
pub struct AudioError(pub String);

/// `frt_msgs/AudioChunk` → samples.
pub fn audio_chunk(a: msg::AudioChunk) -> m::Audio {
    m::Audio {
        stamp: stamp_of(&a.header),
        sample_rate: a.sample_rate,
        samples: a.samples,
        channels: a.channels,
    }
}

/// mgonzs13 `audio_common_msgs/AudioStamped` → samples: the array named by the PortAudio format
/// (float32, int32, int16, int8, uint8), scaled to [-1, 1].
pub fn audio_stamped(a: mgonzs13::AudioStamped) -> Result<m::Audio, AudioError> {
    let info = &a.audio.info;
    let d = &a.audio.audio_data;
    let samples: Vec<f32> = match info.format {
        mgonzs13::PA_FLOAT32 => d.float32_data.clone(),
        mgonzs13::PA_INT32 => d
            .int32_data
            .iter()
            .map(|x| *x as f32 / 2_147_483_648.0)
            .collect(),
        mgonzs13::PA_INT16 => d.int16_data.iter().map(|x| *x as f32 / 32768.0).collect(),
        mgonzs13::PA_INT8 => d.int8_data.iter().map(|x| *x as f32 / 128.0).collect(),
        mgonzs13::PA_UINT8 => d
            .uint8_data
            .iter()
            .map(|x| (*x as f32 - 128.0) / 128.0)
            .collect(),
        f => return Err(AudioError(format!("unknown PortAudio sample format {f}"))),
    };
    if info.channels <= 0 || info.rate <= 0 {
        return Err(AudioError(format!(
            "{} channels at {} Hz",
            info.channels, info.rate
        )));
    }
    Ok(m::Audio {
        stamp: stamp_of(&a.header),
        sample_rate: info.rate as u32,
        samples,
        channels: info.channels as u16,
    })
}

/// Raw PCM sample formats of ros-drivers `AudioData` (set in the configuration, as the capture
/// node's `sample_format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PcmFormat {
    S16Le,
    F32Le,
}

/// ros-drivers `audio_common_msgs/AudioData(Stamped)` with raw PCM → samples.
pub fn audio_data(
    stamp: Stamp,
    a: &ros_drivers::AudioData,
    format: PcmFormat,
    sample_rate: u32,
    channels: u16,
) -> Result<m::Audio, AudioError> {
    let width = match format {
        PcmFormat::S16Le => 2,
        PcmFormat::F32Le => 4,
    };
    if a.data.len() % width != 0 {
        return Err(AudioError(format!(
            "{} bytes is not a whole number of {width}-byte samples",
            a.data.len()
        )));
    }
    let samples = match format {
        PcmFormat::S16Le => a
            .data
            .chunks_exact(2)
            .map(|c| i16::from_le_bytes([c[0], c[1]]) as f32 / 32768.0)
            .collect(),
        PcmFormat::F32Le => a
            .data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    };
    Ok(m::Audio {
        stamp,
        sample_rate,
        samples,
        channels,
    })
}

/// An action chunk as `frt_msgs/ActionChunk`.
pub fn action_chunk(c: &m::ActionChunk, frame_id: &str) -> msg::ActionChunk {
    msg::ActionChunk {
        header: header(c.stamp, frame_id),
        seq: c.seq,
        horizon: c.horizon,
        action_dim: c.action_dim,
        actions: c.actions.to_vec(),
        dt: c.dt,
        subgoal: c.subgoal.to_string(),
        subgoal_id: c.subgoal_id,
        halt: c.halt,
        inference_latency: c.latency,
        due_row: c.due_row,
        execution_horizon: c.execution_horizon,
    }
}

/// A plan as a `trajectory_msgs/JointTrajectory` for ros2_control: header stamped when its
/// first row is due (now or ahead: no point is in the past on arrival), one point per row,
/// `time_from_start = j·dt`, positions (or velocities when every dimension is a velocity). A
/// plan without rows is an empty trajectory (joint_trajectory_controller: stop and hold).
pub fn joint_trajectory(
    p: &m::Plan,
    joints: &[String],
    velocity: bool,
    frame_id: &str,
) -> msg::JointTrajectory {
    let d = p.action_dim as usize;
    let points = p
        .rows
        .chunks(d.max(1))
        .enumerate()
        .map(|(k, row)| {
            let values: Vec<f64> = row.iter().take(joints.len()).map(|x| *x as f64).collect();
            let (positions, velocities) = if velocity {
                (Vec::new(), values)
            } else {
                (values, Vec::new())
            };
            msg::JointTrajectoryPoint {
                positions,
                velocities,
                time_from_start: duration(k as f64 * p.dt),
                ..Default::default()
            }
        })
        .collect();
    msg::JointTrajectory {
        header: header(p.stamp, frame_id),
        joint_names: joints.iter().take(d).cloned().collect(),
        points,
    }
}

/// Seconds as a `builtin_interfaces/Duration` (non-negative).
fn duration(t: f64) -> msg::Duration {
    let t = t.max(0.0);
    msg::Duration {
        sec: t.floor().min(i32::MAX as f64) as i32,
        nanosec: ((t - t.floor()) * 1e9).round().min(999_999_999.0) as u32,
    }
}

/// A fixed-rate command as `std_msgs/Float64MultiArray`: one value per action dimension, in
/// the configured order (a forward command controller's `commands` topic).
pub fn float64_command(c: &m::JointCommand) -> msg::Float64MultiArray {
    let n = c.values.len() as u32;
    msg::Float64MultiArray {
        layout: msg::MultiArrayLayout {
            dim: vec![msg::MultiArrayDimension {
                label: "joints".into(),
                size: n,
                stride: n,
            }],
            data_offset: 0,
        },
        data: c.values.iter().map(|x| *x as f64).collect(),
    }
}

/// A fixed-rate command as `sensor_msgs/JointState`: the action joints, `position` for
/// position and gripper dimensions and `velocity` for velocity dimensions (each array present
/// only when some dimension is of its kind, NaN for the joints commanded the other way).
pub fn joint_state_command(
    c: &m::JointCommand,
    dims: &[crate::config::ActionDim],
    frame_id: &str,
) -> msg::JointState {
    use crate::config::ActionKind;
    let of = |velocity: bool| -> Vec<f64> {
        if !dims
            .iter()
            .any(|d| (d.kind == ActionKind::Velocity) == velocity)
        {
            return Vec::new();
        }
        dims.iter()
            .zip(&c.values)
            .map(|(d, x)| {
                if (d.kind == ActionKind::Velocity) == velocity {
                    *x as f64
                } else {
                    f64::NAN
                }
            })
            .collect()
    };
    msg::JointState {
        header: header(c.stamp, frame_id),
        name: dims.iter().map(|d| d.joint.clone()).collect(),
        position: of(false),
        velocity: of(true),
        effort: Vec::new(),
    }
}

pub fn transcript(t: &m::Transcript) -> msg::Transcript {
    msg::Transcript {
        header: header(t.stamp, ""),
        text: t.text.clone(),
        avg_logprob: t.avg_logprob,
        no_speech_prob: t.no_speech_prob,
        decision: t.decision.clone(),
    }
}

pub fn host_status(s: &m::Status) -> msg::HostStatus {
    msg::HostStatus {
        header: header(s.stamp, ""),
        halted: s.halted,
        subgoal: s.subgoal.clone(),
        subgoal_id: s.subgoal_id,
        ticks: s.ticks,
        chunks: s.chunks,
        halts: s.halts,
        abandoned: s.abandoned,
        stale: s.stale,
        bad_frames: s.bad_frames,
        bad_states: s.bad_states,
        bad_audio: s.bad_audio,
        bad_commands: s.bad_commands,
        non_finite: s.non_finite,
        deadline_misses: s.deadline_misses,
        clamped: s.clamped,
        last_error: s.last_error.clone(),
        latency: s
            .latency
            .iter()
            .map(|(name, p50, p99, n)| msg::StageLatency {
                name: name.clone(),
                p50_ms: *p50,
                p99_ms: *p99,
                count: *n,
            })
            .collect(),
        since_tick_s: s.since_tick_s,
        window_s: s.window_s,
        recent_stale: s.recent.stale,
        recent_bad_inputs: s.recent.bad_inputs,
        recent_deadline_misses: s.recent.deadline_misses,
        recent_withheld: s.recent.withheld,
        recent_halts: s.recent.halts,
        inputs: s
            .inputs
            .iter()
            .map(|i| msg::InputActivity {
                name: i.name.clone(),
                count: i.count,
                rate_hz: i.rate_hz,
                age_s: i.age_s,
                stale: i.stale,
            })
            .collect(),
    }
}

/// Seconds without a finished tick after which the control loop is reported as an error
/// (the status comes on its own timer; ticks normally finish many times a second).
pub const STUCK_AFTER_S: f64 = 2.0;

/// The status as `/diagnostics` (`"<node>: <task>"` names). Levels follow the recent window,
/// so they recover once a problem stops; totals are listed beside. The control loop: ERROR
/// when no tick finished for [`STUCK_AFTER_S`], WARN when halted or with recent deadline
/// misses, withheld chunks or halts, else OK. The inputs: WARN with recent stale ticks or
/// refused inputs, or an input older than the observation age bound. The last problem is
/// the message of the task it concerns.
pub fn diagnostics(s: &m::Status, node: &str) -> msg::DiagnosticArray {
    let kv = |k: &str, v: String| msg::KeyValue {
        key: k.into(),
        value: v,
    };
    let r = &s.recent;
    let window = format!("last {:.0} s", s.window_s);
    let (level, message) =
        if (s.since_tick_s > STUCK_AFTER_S || s.since_tick_s.is_nan()) && s.ticks > 0 {
            (2u8, format!("no tick finished for {:.1} s", s.since_tick_s))
        } else if s.halted {
            (1, "halted (waiting for resume)".to_string())
        } else if r.deadline_misses > 0 || r.withheld > 0 || r.halts > 0 {
            (
                1,
                format!(
                    "{} deadline misses, {} chunks withheld, {} halts in the {window}",
                    r.deadline_misses, r.withheld, r.halts
                ),
            )
        } else {
            (0, "running".into())
        };
    let mut values = vec![
        kv("subgoal", s.subgoal.clone()),
        kv("subgoal_id", s.subgoal_id.to_string()),
        kv("ticks", s.ticks.to_string()),
        kv("chunks", s.chunks.to_string()),
        kv("since_tick_s", format!("{:.3}", s.since_tick_s)),
        kv("window_s", format!("{:.1}", s.window_s)),
        kv("halts", s.halts.to_string()),
        kv("halts (window)", r.halts.to_string()),
        kv("abandoned", s.abandoned.to_string()),
        kv("deadline_misses", s.deadline_misses.to_string()),
        kv("deadline_misses (window)", r.deadline_misses.to_string()),
        kv("non_finite", s.non_finite.to_string()),
        kv("late_chunks", s.late_chunks.to_string()),
        kv("outside_limits", s.outside_limits.to_string()),
        kv("withheld (window)", r.withheld.to_string()),
        kv("clamped", s.clamped.to_string()),
        kv("missed_commands", s.missed_commands.to_string()),
        kv("dropped_outputs", s.dropped_outputs.to_string()),
        kv("holds_without_target", s.holds_without_target.to_string()),
    ];
    for (name, p50, p99, _) in &s.latency {
        values.push(kv(
            &format!("{name} p50/p99 ms"),
            format!("{p50:.3} / {p99:.3}"),
        ));
    }
    let stale_inputs: Vec<&str> = s
        .inputs
        .iter()
        .filter(|i| i.stale)
        .map(|i| i.name.as_str())
        .collect();
    let (in_level, in_message) = if r.stale > 0 || r.bad_inputs > 0 {
        (
            1u8,
            if s.last_error.is_empty() {
                format!(
                    "{} stale ticks, {} refused inputs in the {window}",
                    r.stale, r.bad_inputs
                )
            } else {
                s.last_error.clone()
            },
        )
    } else if !stale_inputs.is_empty() {
        (1, format!("no recent message: {}", stale_inputs.join(", ")))
    } else {
        (0, "ok".to_string())
    };
    let mut in_values = vec![
        kv("stale_ticks", s.stale.to_string()),
        kv("stale_ticks (window)", r.stale.to_string()),
        kv("bad_frames", s.bad_frames.to_string()),
        kv("bad_states", s.bad_states.to_string()),
        kv("bad_audio", s.bad_audio.to_string()),
        kv("bad_commands", s.bad_commands.to_string()),
        kv("refused (window)", r.bad_inputs.to_string()),
    ];
    for i in &s.inputs {
        in_values.push(kv(
            &i.name,
            format!(
                "{:.1} Hz, age {:.3} s, {} messages",
                i.rate_hz, i.age_s, i.count
            ),
        ));
    }
    msg::DiagnosticArray {
        header: header(s.stamp, ""),
        status: vec![
            msg::DiagnosticStatus {
                level,
                name: format!("{node}: control loop"),
                message,
                hardware_id: String::new(),
                values,
            },
            msg::DiagnosticStatus {
                level: in_level,
                name: format!("{node}: inputs"),
                message: in_message,
                hardware_id: String::new(),
                values: in_values,
            },
        ],
    }
}

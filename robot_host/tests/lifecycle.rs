//! The managed node on the wire: `frt-robot-host ros --dds -p autostart:=false` driven
//! through its lifecycle services by an independent ROS 2 peer on Cyclone DDS
//! (tests/lifecycle_peer.py, rmw_cyclonedds framing): unconfigured until `configure`,
//! inactive (no chunk) until `activate`, chunks while active, a halt chunk on `deactivate`,
//! unconfigured again after `cleanup`, and a clean exit on `shutdown`; each transition
//! published on `~/transition_event`. The run writes a Perfetto trace (`--trace`): a track
//! per thread with its spans nested, and the policy stream's replays on a track of their own.
//! It records (`--record`): the peer's messages as received, the node's as published, its
//! ticks; an independent MCAP reader decodes them all, and `replay` re-runs the recording
//! (a live one: the differences its timing made are reported).

mod cyclone;
mod mcap;
use cyclone::{cyclonedds, run_peer};
use serde_json::Value;
use std::process::{Command, Stdio};

const CONFIG: &str = r#"
node: { name: managed_host }
model: { random: { size: tiny, seed: 3 }, precision: f32, backend: host, max_token_len: 96 }
cameras:
  - { name: base, topic: /camera/base, format: raw, view: 0 }
state: { topic: /joint_states, joints: [j1, j2, j3, j4, j5, j6, gripper] }
control: { rate_hz: 10, initial_subgoal: pick up the red block, action_dim: 7, dt: 0.02 }
safety:
  max_observation_age_ms: 1000
  missing_camera: halt
  action_space: position
  action_min: [-2.0]
  action_max: [2.0]
  # The host backend on a loaded CI machine: ticks may take far longer than on a GPU.
  watchdog_factor: 200
"#;

#[test]
fn the_managed_node_follows_lifecycle_transitions_over_the_wire() {
    // The peer can run (else a clear message, before anything starts).
    cyclonedds();
    let dir = std::env::temp_dir().join(format!("frt-lifecycle-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("robot.yaml");
    std::fs::write(&config, CONFIG).unwrap();
    let domain = (150 + std::process::id() % 80).to_string();
    let trace = dir.join("trace.json");
    let recording = dir.join("run.mcap");
    let mut node = Command::new(env!("CARGO_BIN_EXE_frt-robot-host"))
        .arg("--trace")
        .arg(&trace)
        .args(["ros", "--dds", "--record"])
        .arg(&recording)
        .args(["--ros-args", "-p"])
        .arg(format!("config:={}", config.display()))
        .args(["-p", "autostart:=false"])
        .env("ROS_DOMAIN_ID", &domain)
        .env("ROS_LOCALHOST_ONLY", "1")
        .env("RMW_IMPLEMENTATION", "rmw_cyclonedds_cpp")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (lines, peer_status) = run_peer("lifecycle_peer.py", &[&domain, "managed_host"]);
    // The node ends by itself on `shutdown`; a hang is a failure.
    let t = std::time::Instant::now();
    let node_status = loop {
        if let Some(s) = node.try_wait().unwrap() {
            break Some(s);
        }
        if t.elapsed() > std::time::Duration::from_secs(10) {
            let _ = node.kill();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut node.stderr.take().unwrap(), &mut stderr).unwrap();
    let trace: Option<Value> = std::fs::read_to_string(&trace)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
    assert!(peer_status.success(), "peer failed: {lines:#?}\n{stderr}");
    assert!(
        node_status.is_some_and(|s| s.success()),
        "the node did not exit cleanly on shutdown ({node_status:?}):\n{stderr}"
    );
    let recorded = mcap::read(&recording);
    let replayed = Command::new(env!("CARGO_BIN_EXE_frt-robot-host"))
        .arg("replay")
        .arg(&recording)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);

    let of =
        |event: &str| -> Vec<&Value> { lines.iter().filter(|l| l["event"] == event).collect() };
    let states: Vec<&str> = of("state")
        .iter()
        .map(|l| l["state"].as_str().unwrap())
        .collect();
    assert_eq!(
        states,
        ["unconfigured", "inactive", "inactive", "unconfigured"]
    );
    assert_eq!(
        of("available")[0]["transitions"],
        serde_json::json!(["configure", "shutdown"])
    );
    let changes: Vec<(&str, bool)> = of("change_state")
        .iter()
        .map(|l| {
            (
                l["transition"].as_str().unwrap(),
                l["success"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        changes,
        [
            ("activate", false),
            ("configure", true),
            ("activate", true),
            ("deactivate", true),
            ("cleanup", true),
            ("shutdown", true)
        ]
    );
    // Inactive: no chunk that moves the robot; active: chunks; deactivated: a halt chunk.
    assert_eq!(of("inactive")[0]["chunks"], 0);
    assert!(
        of("active")[0]["chunks"].as_u64().unwrap() >= 3,
        "{lines:#?}"
    );
    // Since deactivate: perhaps chunks already on their way, then one halt chunk, then
    // nothing.
    let since = of("deactivated")[0]["since"].as_str().unwrap();
    assert_eq!(
        since.matches('H').count(),
        1,
        "one halt chunk on deactivate: {since}"
    );
    assert!(since.ends_with('H'), "no chunk after the halt: {since}");
    let events: Vec<(&str, &str, &str)> = of("transition_event")
        .iter()
        .map(|l| {
            (
                l["transition"].as_str().unwrap(),
                l["start"].as_str().unwrap(),
                l["goal"].as_str().unwrap(),
            )
        })
        .collect();
    for e in [
        ("configure", "unconfigured", "inactive"),
        ("activate", "inactive", "active"),
        ("deactivate", "active", "inactive"),
        ("cleanup", "inactive", "unconfigured"),
    ] {
        assert!(events.contains(&e), "{e:?} not in {events:?}");
    }
    assert!(stderr.contains("lifecycle: configure"), "{stderr}");

    // The recording: the peer's camera and state as received, the ticks, the chunks as
    // published (the halt on deactivate among them), the run's clock and node.
    let topics = &recorded["topics"];
    let count = |t: &str| topics[t]["count"].as_u64().unwrap_or(0);
    assert!(count("/camera/base") >= 3, "{topics}");
    assert!(count("/joint_states") >= 3, "{topics}");
    assert!(count("/managed_host/tick") >= 3, "{topics}");
    assert_eq!(
        topics["/managed_host/tick"]["schema"],
        "rosgraph_msgs/msg/Clock"
    );
    let chunks = recorded["chunks"].as_array().unwrap();
    assert!(
        chunks.len() as u64 >= of("active")[0]["chunks"].as_u64().unwrap(),
        "{} chunks recorded",
        chunks.len()
    );
    // Halts: the start inactive, deactivate and cleanup; the last chunk is one.
    assert!(
        chunks.last().is_some_and(|c| c["halt"] == true),
        "{chunks:?}"
    );
    assert_eq!(recorded["metadata"]["frt"]["clock"], "system");
    assert_eq!(recorded["metadata"]["frt"]["node"], "managed_host");
    let out = String::from_utf8_lossy(&replayed.stdout);
    assert!(
        matches!(replayed.status.code(), Some(0 | 1)),
        "{out}\n{}",
        String::from_utf8_lossy(&replayed.stderr)
    );
    assert!(
        out.contains(&format!(
            "| chunks recorded / replayed | {} /",
            chunks.len()
        )),
        "{out}"
    );

    // The trace: named tracks for the threads and the policy stream; the control thread's
    // stages nested in its ticks; the replays on the stream's track; the transport's spans.
    let trace = trace.expect("a trace file");
    let events = trace["traceEvents"].as_array().unwrap();
    let track = |name: &str| -> u64 {
        events
            .iter()
            .find(|e| e["ph"] == "M" && e["args"]["name"] == name)
            .unwrap_or_else(|| panic!("no track {name:?}"))["tid"]
            .as_u64()
            .unwrap()
    };
    let spans = |tid: u64, name: &str| -> Vec<(f64, f64)> {
        events
            .iter()
            .filter(|e| e["ph"] == "X" && e["tid"] == tid && e["name"] == name)
            .map(|e| {
                let t = e["ts"].as_f64().unwrap();
                (t, t + e["dur"].as_f64().unwrap())
            })
            .collect()
    };
    let control = track("frt-control");
    let ticks = spans(control, "tick");
    let prepares = spans(control, "prepare");
    assert!(
        ticks.len() >= 3 && !prepares.is_empty(),
        "{} ticks",
        ticks.len()
    );
    assert!(
        prepares
            .iter()
            .all(|(a, b)| ticks.iter().any(|(s, e)| s <= a && b <= e)),
        "every prepare inside a tick"
    );
    let stream = track("stream policy");
    assert!(!spans(stream, "vision").is_empty() && !spans(stream, "step 0").is_empty());
    assert!(
        !spans(track("main"), "receive").is_empty(),
        "the transport's reads"
    );
    assert!(!spans(track("frt-dds-publish"), "publish").is_empty());
    assert!(!spans(track("frt-status"), "status").is_empty());
}

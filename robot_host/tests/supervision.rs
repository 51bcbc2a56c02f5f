//! The binary under faults: `frt-robot-host run` with a fault drill in its simulation script
//! (a panic on the control thread, a tick stalled past the watchdog), or with a deadline
//! shorter than an inference, publishes a halt chunk and exits non-zero, with the cause on
//! stderr, instead of running on or hanging.

use std::process::Command;
use std::time::Instant;

const CONFIG: &str = r#"
model:
  random: { size: tiny, seed: 7 }
  precision: f32
  backend: host
  max_token_len: 96
cameras:
  - { name: base, topic: /camera/base/image_raw, format: raw, view: 0 }
state:
  topic: /joint_states
  joints: [joint1, joint2, joint3, joint4, joint5, joint6, gripper]
control:
  rate_hz: {rate}
  initial_subgoal: pick up the red block
  action_dim: 7
  dt: 0.02
safety:
  max_observation_age_ms: 2000
  missing_camera: degrade
  action_space: position
  action_min: [-3.0]
  action_max: [3.0]
  watchdog_factor: {watchdog}
"#;

/// Runs the binary on a script with one fault at 2 s; returns (exit code, stdout, stderr,
/// seconds it ran).
fn run_with_fault(fault: &str) -> (Option<i32>, String, String, f64) {
    // The panic drill's watchdog is far (a panic on a starved machine must be reported as
    // the panic, not outrun by the watchdog); the stall drill's trips at 2 s.
    let watchdog = if fault == "stall" { "20" } else { "1000" };
    run(
        fault,
        &CONFIG
            .replace("{watchdog}", watchdog)
            .replace("{rate}", "10"),
        &format!("duration_s: 30\nevents:\n  - {{ at: 2.0, fault: {fault} }}\n"),
    )
}

/// Runs the binary on `config` and the simulation `sim`; returns (exit code, stdout, stderr,
/// seconds it ran).
fn run(name: &str, config: &str, sim: &str) -> (Option<i32>, String, String, f64) {
    let dir = std::env::temp_dir().join(format!("frt-supervision-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("robot.yaml"), config).unwrap();
    std::fs::write(dir.join("sim.yaml"), sim).unwrap();
    let t = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_frt-robot-host"))
        .args(["run", "--config"])
        .arg(dir.join("robot.yaml"))
        .arg("--sim")
        .arg(dir.join("sim.yaml"))
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    let secs = t.elapsed().as_secs_f64();
    let _ = std::fs::remove_dir_all(&dir);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        secs,
    )
}

fn check(fault: &str, cause: &str) {
    check_run(run_with_fault(fault), cause);
}

/// The run ended in a halt chunk and exit status 1 (not a signal: an abort or a crash shows
/// as none), with `cause` on stderr, well before its script's 30 s.
fn check_run((code, stdout, stderr, secs): (Option<i32>, String, String, f64), cause: &str) {
    assert_eq!(code, Some(1), "exit status\n{stdout}\n{stderr}");
    assert!(
        stdout.contains("HALT chunk"),
        "no halt chunk:\n{stdout}\n{stderr}"
    );
    assert!(stderr.contains(cause), "cause not reported:\n{stderr}");
    // The script runs 30 s: the process ended on the fault, not at the script's end.
    assert!(
        secs < 20.0,
        "ran {secs:.1} s (the fault came within 2 s)\n{stdout}"
    );
}

#[test]
fn a_panic_on_the_control_thread_ends_in_a_halt_and_a_non_zero_exit() {
    check("panic", "fault drill: a panic on the control thread");
}

#[test]
fn a_stalled_tick_trips_the_watchdog_halts_and_exits_non_zero() {
    check("stall", "watchdog");
}

/// A tick past the watchdog's deadline while its inference runs (no drill: a control period
/// of 1 ms and a deadline of 1.5 ms, shorter than any inference here): the process must not
/// wait for the inference, nor run its exit handlers under it.
#[test]
fn a_watchdog_trip_during_an_inference_halts_and_exits_non_zero() {
    let config = CONFIG
        .replace("{watchdog}", "1.5")
        .replace("{rate}", "1000");
    check_run(
        run("inference", &config, "duration_s: 30\n"),
        "watchdog: a tick has run for",
    );
}

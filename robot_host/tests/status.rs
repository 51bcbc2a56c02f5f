//! The status on its own timer: it keeps coming while a tick is stuck (with the time since
//! the last tick growing), carries each input's rate and age, and its recent counts forget a
//! refusal once it leaves the window while the total keeps it.

mod common;
use common::frame;
use frt_robot_host::messages::{JointState, Outbound, Status};
use frt_robot_host::{Clock, Config, Drill, Node, SystemClock};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const CONFIG: &str = r#"
model:
  random: { size: tiny, seed: 3 }
  precision: f32
  backend: host
  max_token_len: 96
cameras:
  - { name: base, topic: /base/image_raw, format: raw, view: 0 }
state:
  topic: /joint_states
  joints: [j1, j2, j3, j4, j5, j6, gripper]
control:
  rate_hz: 10
  initial_subgoal: pick up the red block
  action_dim: 7
  dt: 0.02
safety:
  max_observation_age_ms: 1000
  missing_camera: degrade
  action_space: position
  action_min: [-2.0]
  action_max: [2.0]
  # The stall drill sleeps 10 s; the watchdog must not end the run meanwhile.
  watchdog_factor: 1000
ros: { status_period_s: 0.1, status_window_s: 0.6 }
"#;

fn statuses(rx: &crossbeam_channel::Receiver<Outbound>, for_: Duration) -> Vec<Status> {
    let end = Instant::now() + for_;
    let mut v = Vec::new();
    while let Some(left) = end.checked_duration_since(Instant::now()) {
        if let Ok(Outbound::Status(s)) = rx.recv_timeout(left) {
            v.push(*s);
        }
    }
    v
}

#[test]
fn status_keeps_coming_while_a_tick_is_stuck_and_its_window_recovers() {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let (mut node, inputs, out) =
        Node::new(Config::parse(CONFIG).unwrap(), clock.clone(), None).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    // Frames at ~20 Hz and states at ~20 Hz, stamped now, until the test ends.
    let feeder = {
        let (inputs, clock, stop) = (inputs.clone(), clock.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut k = 0u32;
            while !stop.load(Ordering::SeqCst) {
                let t = clock.now();
                let _ = inputs.frame("base", t, &frame(k));
                let _ = inputs.state(&JointState {
                    stamp: t,
                    names: ["j1", "j2", "j3", "j4", "j5", "j6", "gripper"]
                        .map(String::from)
                        .to_vec(),
                    position: vec![0.1; 7],
                });
                k += 1;
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    // One refused frame at the start.
    assert!(inputs.frame("nope", clock.now(), &frame(0)).is_err());
    {
        let stop = stop.clone();
        // Not joined: the stalled tick sleeps on after the test has seen what it needs.
        std::thread::spawn(move || node.run(&stop));
    }
    let mut running = statuses(&out.0, Duration::from_millis(1500));
    assert!(running.len() >= 8, "{} statuses in 1.5 s", running.len());
    // On a loaded machine the tiny model's ticks can fall behind the 10 Hz rate (3 ticks in the
    // first 1.5 s were seen while the machine was also compiling): then more statuses, until a
    // few ticks are done and the refusal has left the window, or 10 s more have passed.
    let settled = |s: &Status| s.ticks > 3 && s.since_tick_s < 0.5 && s.recent.bad_inputs == 0;
    let give_up = Instant::now() + Duration::from_secs(10);
    while !running.last().is_some_and(settled) && Instant::now() < give_up {
        running.extend(statuses(&out.0, Duration::from_millis(250)));
    }
    let first = &running[0];
    assert_eq!((first.bad_frames, first.recent.bad_inputs), (1, 1));
    let last = running.last().unwrap();
    assert_eq!(last.bad_frames, 1, "the total keeps the refusal");
    assert_eq!(last.recent.bad_inputs, 0, "the window forgot it: {last:?}");
    assert!(last.ticks > 3 && last.since_tick_s < 0.5, "{last:?}");
    assert!(
        last.window_s > 0.4 && last.window_s < 0.8,
        "{}",
        last.window_s
    );
    let names: Vec<&str> = last.inputs.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["camera base", "state"]);
    for i in &last.inputs {
        assert!(i.rate_hz > 8.0 && i.rate_hz < 30.0, "{i:?}");
        assert!(i.age_s >= 0.0 && i.age_s < 0.5 && !i.stale, "{i:?}");
        assert!(i.count > 10, "{i:?}");
    }
    // A tick stalls: the status keeps coming, the time since the last tick grows, the tick
    // count stands still.
    inputs.drill(Drill::Stall);
    let stuck = statuses(&out.0, Duration::from_millis(2600));
    stop.store(true, Ordering::SeqCst);
    assert!(
        stuck.len() >= 12,
        "{} statuses in 2.6 s of a stuck tick",
        stuck.len()
    );
    let s = stuck.last().unwrap();
    assert!(
        s.since_tick_s > 2.0,
        "since the last tick: {} s",
        s.since_tick_s
    );
    assert_eq!(s.ticks, stuck[stuck.len() / 2].ticks);
    let d = frt_robot_host::ros::convert::diagnostics(s, "n");
    assert_eq!(d.status[0].level, 2, "{:?}", d.status[0]);
    feeder.join().unwrap();
}

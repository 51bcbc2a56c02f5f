//! The control loop on the host backend with the tiny random Pi0.5: chunks, subgoal switches
//! without recapture, interrupts at graph boundaries, stale and bad inputs, determinism.

mod common;
use common::{edit, frame};
use frt_robot_host::messages::{Command, Image, JointState, Outbound, Source};
use frt_robot_host::{Config, Inputs, ManualClock, Node, Outputs, TickOutcome};
use std::sync::Arc;

const JOINTS: [&str; 7] = ["j1", "j2", "j3", "j4", "j5", "j6", "gripper"];

fn config(subgoal: &str, extra_safety: &str) -> Config {
    Config::parse(&config_text(subgoal, extra_safety)).unwrap()
}

fn config_text(subgoal: &str, extra_safety: &str) -> String {
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
  initial_subgoal: {subgoal}
  action_dim: 7
  dt: 0.02
  noise_seed: 5
safety:
  max_observation_age_ms: 200
  missing_camera: degrade
  action_space: position
  action_min: [-2.0]
  action_max: [2.0]
{extra_safety}
"#
    )
}

struct Rig {
    node: Node,
    inputs: Inputs,
    out: Outputs,
    clock: Arc<ManualClock>,
}

fn rig(subgoal: &str, extra_safety: &str) -> Rig {
    rig_with(config(subgoal, extra_safety))
}

fn rig_with(config: Config) -> Rig {
    let clock = Arc::new(ManualClock::default());
    let (node, inputs, out) = Node::new(config, clock.clone(), None).unwrap();
    Rig {
        node,
        inputs,
        out,
        clock,
    }
}

fn state(t: f64, k: u32) -> JointState {
    JointState {
        stamp: t,
        names: JOINTS.iter().rev().map(|s| s.to_string()).collect(),
        position: (0..7)
            .rev()
            .map(|j| 0.1 * j as f64 - 0.2 + 0.01 * k as f64)
            .collect(),
    }
}

impl Rig {
    /// Observations stamped `t`, the clock at `t`.
    fn observe(&self, t: f64, k: u32) {
        self.clock.set(t);
        self.inputs.frame("base", t, &frame(k)).unwrap();
        self.inputs.frame("wrist", t, &frame(k + 100)).unwrap();
        self.inputs.state(&state(t, k)).unwrap();
    }

    fn chunks(&self) -> Vec<frt_robot_host::messages::ActionChunk> {
        self.out
            .0
            .try_iter()
            .filter_map(|o| match o {
                Outbound::Chunk(c) => Some(c),
                _ => None,
            })
            .collect()
    }
}

#[test]
fn ticks_publish_guarded_chunks_stamped_with_the_observation_time() {
    let mut r = rig("pick up the red block", "  max_delta_per_step: [0.05]");
    r.observe(1.0, 0);
    r.clock.set(1.05);
    assert_eq!(r.node.tick(), TickOutcome::Published);
    let c = r.chunks();
    assert_eq!(c.len(), 1);
    let c = &c[0];
    assert_eq!((c.horizon, c.action_dim, c.seq, c.halt), (50, 7, 1, false));
    assert_eq!(c.actions.len(), 50 * 7);
    assert_eq!(c.stamp, 1.0, "stamped with the observation time");
    assert_eq!(&*c.subgoal, "pick up the red block");
    assert!(c.actions.iter().all(|a| a.is_finite() && a.abs() <= 2.0));
    for k in 0..7 {
        for row in 1..50 {
            let d = c.actions[row * 7 + k] - c.actions[(row - 1) * 7 + k];
            assert!(d.abs() <= 0.05 + 1e-6, "delta cap");
        }
    }
}

#[test]
fn subgoal_change_takes_effect_on_the_next_chunk_without_recapture() {
    let mut a = rig("pick up the red block", "");
    let captures = a.node.policy().capture_count();
    a.observe(1.0, 0);
    assert_eq!(a.node.tick(), TickOutcome::Published);
    a.inputs
        .command(
            Command::Subgoal("open the top drawer".into()),
            Source::Typed,
        )
        .unwrap();
    a.observe(1.1, 1);
    assert_eq!(a.node.tick(), TickOutcome::Published);
    let ca = a.chunks();
    assert_eq!(ca[0].subgoal_id, 1);
    assert_eq!(
        (&*ca[1].subgoal, ca[1].subgoal_id),
        ("open the top drawer", 2)
    );
    assert_eq!(a.node.policy().capture_count(), captures);
    assert_ne!(ca[0].actions, ca[1].actions);

    // Subgoals given their id when submitted (what the subgoal service answers): ids follow
    // the submission order, a refused one takes none, and the chunk carries the last one.
    assert_eq!(
        a.inputs
            .subgoal("  wipe the table ", Source::Typed)
            .unwrap(),
        3
    );
    assert!(a.inputs.subgoal(" \t ", Source::Typed).is_err());
    assert_eq!(
        a.inputs.subgoal("close the drawer", Source::Voice).unwrap(),
        4
    );
    a.observe(1.2, 2);
    assert_eq!(a.node.tick(), TickOutcome::Published);
    let last = a.chunks().pop().unwrap();
    assert_eq!((&*last.subgoal, last.subgoal_id), ("close the drawer", 4));

    // A node set up with the new subgoal from the start, same observations and noise stream:
    // its second chunk is bit-identical.
    let mut b = rig("open the top drawer", "");
    b.observe(1.0, 0);
    b.node.tick();
    b.observe(1.1, 1);
    b.node.tick();
    let cb = b.chunks();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&ca[1].actions), bits(&cb[1].actions));
}

/// `prompt_mode: exact`: prefix graphs per prompt length (captured when a length is new), the
/// same chunks as fixed mode on the host backend, bit for bit, across a subgoal change.
#[test]
fn exact_prompt_mode_gives_the_chunks_of_fixed_mode() {
    let text = edit(
        &config_text("pick up the red block", ""),
        &[(
            "  max_token_len: 96",
            "  prompt_mode: exact\n  max_token_len: 96",
        )],
    );
    let mut exact = rig_with(Config::parse(&text).unwrap());
    let mut fixed = rig("pick up the red block", "");
    let before = exact.node.policy().capture_count();
    for (k, r) in [&mut exact, &mut fixed].into_iter().enumerate() {
        for tick in 0..3u32 {
            if tick == 2 {
                r.inputs
                    .command(Command::Subgoal("wipe the table".into()), Source::Typed)
                    .unwrap();
            }
            r.observe(1.0 + 0.1 * tick as f64, tick);
            assert_eq!(r.node.tick(), TickOutcome::Published, "rig {k} tick {tick}");
        }
    }
    let bits = |c: &frt_robot_host::messages::ActionChunk| {
        c.actions.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    };
    let (ce, cf) = (exact.chunks(), fixed.chunks());
    assert_eq!(ce.len(), 3);
    for (e, f) in ce.iter().zip(&cf) {
        assert_eq!(bits(e), bits(f));
        assert_eq!(e.subgoal, f.subgoal);
    }
    // The two subgoals' prompts differ in length: at least two prefix graphs were captured.
    assert!(exact.node.policy().capture_count() >= before + 2);
}

#[test]
fn stop_between_two_replays_publishes_only_the_halt_chunk() {
    let mut r = rig("pick up the red block", "");
    r.observe(1.0, 0);
    assert_eq!(r.node.tick(), TickOutcome::Published);
    r.chunks();
    // The stop arrives before the 6th replay of the next tick.
    let inputs = r.inputs.clone();
    r.node.set_stage_hook(Some(Box::new(move |i| {
        if i == 5 {
            inputs.command(Command::Stop, Source::Typed).unwrap();
        }
    })));
    r.observe(1.1, 1);
    assert_eq!(r.node.tick(), TickOutcome::Halted);
    r.node.set_stage_hook(None);
    let c = r.chunks();
    assert_eq!(
        c.len(),
        1,
        "no chunk from the interrupted tick, one halt chunk"
    );
    assert!(c[0].halt);
    assert_eq!(c[0].seq, 2);
    // Position control: the halt chunk holds the latest measured position (the state of
    // `observe(1.1, 1)` in the configured joint order), never the chunk's future targets.
    let measured: Vec<f32> = (0..7)
        .map(|j| (0.1 * j as f64 - 0.2 + 0.01) as f32)
        .collect();
    assert_eq!(c[0].horizon, 50);
    assert_eq!(c[0].actions.len(), 50 * 7);
    for row in c[0].actions.chunks(7) {
        assert_eq!(row, &measured[..]);
    }
    let s = r.node.status();
    assert!(s.halted && s.halts == 1 && s.abandoned == 1);
    assert_eq!(s.last_error, "", "the halt graph wrote the hold chunk");
    // Halted: ticks do nothing until resumed.
    r.observe(1.2, 2);
    assert_eq!(r.node.tick(), TickOutcome::Idle);
    assert!(r.chunks().is_empty());
    r.inputs.command_text("resume").unwrap();
    r.observe(1.3, 3);
    assert_eq!(r.node.tick(), TickOutcome::Published);
}

/// A consumer that fell behind: with the output channel filled up to the room kept for
/// halts, a tick's chunk is dropped (and counted, as every dropped message is), and a stop's
/// halt chunk still gets in: the last chunk the consumer sees once it catches up.
#[test]
fn a_stop_gets_through_a_full_output_channel() {
    let mut r = rig("pick up the red block", "");
    let out = r.node.output_sender();
    let filler = Outbound::Transcript(frt_robot_host::messages::Transcript {
        stamp: 0.0,
        text: "filler".into(),
        avg_logprob: 0.0,
        no_speech_prob: 0.0,
        decision: "ignored: test".into(),
    });
    while out.send(filler.clone()) {}
    let dropped = r.node.status().dropped_outputs;
    assert_eq!(dropped, 1, "the filler that did not fit");
    r.observe(1.0, 0);
    match r.node.tick() {
        TickOutcome::Refused(e) => assert!(e.contains("output channel is full"), "{e}"),
        o => panic!("the tick's chunk had no room: {o:?}"),
    }
    let s = r.node.status();
    assert_eq!(s.dropped_outputs, dropped + 1, "the tick's chunk, dropped");
    assert_eq!(s.chunks, 0, "a dropped chunk is not counted as published");
    assert!(s.last_error.contains("dropped"), "{}", s.last_error);
    // Nor does it become the timeline: there is still no command to execute.
    assert_eq!(
        r.inputs.command_at(1.0),
        None,
        "a dropped chunk's rows commanded"
    );
    r.inputs.command(Command::Stop, Source::Typed).unwrap();
    r.observe(1.1, 1);
    assert_eq!(r.node.tick(), TickOutcome::Idle);
    let c = r.chunks();
    assert_eq!(c.len(), 1, "only the halt chunk got in");
    assert!(c[0].halt);
    assert_eq!(c[0].seq, 2);
    let s = r.node.status();
    assert!(s.halted && s.halts == 1);
    assert_eq!(s.dropped_outputs, dropped + 1);
    assert_eq!(s.last_chunk_before_stop, 0, "chunk 1 never went out");
}

#[test]
fn subgoal_mid_tick_abandons_the_tick() {
    let mut r = rig("pick up the red block", "");
    let inputs = r.inputs.clone();
    r.node.set_stage_hook(Some(Box::new(move |i| {
        if i == 1 {
            inputs.command_text("subgoal: wipe the table").unwrap();
        }
    })));
    r.observe(1.0, 0);
    assert_eq!(r.node.tick(), TickOutcome::Abandoned);
    assert!(r.chunks().is_empty());
    r.node.set_stage_hook(None);
    r.observe(1.1, 1);
    assert_eq!(r.node.tick(), TickOutcome::Published);
    let c = r.chunks();
    assert_eq!((&*c[0].subgoal, c[0].subgoal_id), ("wipe the table", 2));
}

#[test]
fn stale_or_missing_observations_give_no_chunk() {
    let mut r = rig("pick up the red block", "");
    r.clock.set(1.0);
    assert!(
        matches!(r.node.tick(), TickOutcome::Stale(_)),
        "nothing received yet"
    );
    r.observe(1.0, 0);
    r.clock.set(1.5);
    assert!(
        matches!(r.node.tick(), TickOutcome::Stale(_)),
        "older than 200 ms"
    );
    // The optional wrist camera may be missing (its view is masked).
    r.clock.set(2.0);
    r.inputs.frame("base", 2.0, &frame(1)).unwrap();
    r.inputs.state(&state(2.0, 1)).unwrap();
    assert_eq!(r.node.tick(), TickOutcome::Published);
    // State older than the bound.
    r.clock.set(2.3);
    r.inputs.frame("base", 2.3, &frame(2)).unwrap();
    assert!(matches!(r.node.tick(), TickOutcome::Stale(m) if m.contains("state")));
    // A fresh state, the only required camera's frame older than the bound.
    r.clock.set(2.6);
    r.inputs.state(&state(2.6, 3)).unwrap();
    assert!(matches!(r.node.tick(), TickOutcome::Stale(m) if m.contains("camera `base`")));
    assert_eq!(r.chunks().len(), 1);
    assert_eq!(r.node.status().stale, 4);
}

#[test]
fn bad_inputs_are_counted_and_never_reach_the_policy() {
    let mut r = rig("pick up the red block", "");
    r.clock.set(1.0);
    let raw = |enc: &str, w: u32, h: u32, step: u32, n: usize| Image::Raw {
        encoding: enc.into(),
        width: w,
        height: h,
        step,
        data: vec![7u8; n],
    };
    let bad_frames = [
        raw("yuv422", 4, 4, 8, 32),        // unsupported encoding
        raw("rgb8", 4, 4, 10, 40),         // step below width × 3
        raw("rgb8", 4, 4, 12, 47),         // data shorter than step × height
        raw("rgb8", 4, 4, 12, 0),          // empty
        raw("rgb8", 7680, 4320, 23040, 8), // 8K
        raw("mono8", 0, 4, 0, 4),          // zero width
        Image::Compressed {
            format: "jpeg".into(),
            data: b"\xff\xd8\xff\xe0 not really a jpeg".to_vec(),
        },
        Image::Compressed {
            format: "png".into(),
            data: b"garbage".to_vec(),
        },
    ];
    for f in &bad_frames {
        assert!(r.inputs.frame("base", 1.0, f).is_err(), "{f:?}");
    }
    assert!(
        r.inputs.frame("nope", 1.0, &frame(0)).is_err(),
        "unknown camera"
    );
    let mut nan = state(1.0, 0);
    nan.position[2] = f64::NAN;
    let mut short = state(1.0, 0);
    short.names.pop();
    short.position.pop();
    let mut mismatch = state(1.0, 0);
    mismatch.position.pop();
    for s in [&nan, &short, &mismatch] {
        assert!(r.inputs.state(s).is_err());
    }
    assert!(r.inputs.command_text("fly to the moon").is_err());
    assert!(r.inputs.command_text("subgoal:   ").is_err());
    assert!(r.inputs.command_text("subgoal: a\u{7}b").is_err());
    let audio = |samples: Vec<f32>, channels, rate| frt_robot_host::messages::Audio {
        stamp: 1.0,
        sample_rate: rate,
        samples,
        channels,
    };
    assert!(
        r.inputs
            .audio(audio(vec![0.0, f32::NAN], 1, 16000))
            .is_err()
    );
    assert!(r.inputs.audio(audio(vec![0.0; 3], 2, 16000)).is_err());
    assert!(r.inputs.audio(audio(vec![0.0; 4], 1, 100)).is_err());
    assert!(r.inputs.audio(audio(vec![4.0; 4], 1, 16000)).is_err());
    // Nothing valid arrived: no chunk.
    assert!(matches!(r.node.tick(), TickOutcome::Stale(_)));
    let s = r.node.status();
    assert_eq!(
        (s.bad_frames, s.bad_states, s.bad_commands, s.bad_audio),
        (9, 3, 3, 4)
    );
    assert!(!s.last_error.is_empty());
    assert!(r.chunks().is_empty());
    // Valid input afterwards works.
    r.observe(1.0, 0);
    assert_eq!(r.node.tick(), TickOutcome::Published);
}

#[test]
fn other_encodings_and_compressed_frames_decode_to_the_same_pixels() {
    use frt_robot_host::frame::{Rgb8, decode_compressed, decode_raw};
    let (w, h) = (5u32, 3u32);
    let rgb: Vec<u8> = (0..w * h * 3).map(|i| (i * 13 % 256) as u8).collect();
    let mut want = Rgb8::default();
    decode_raw("rgb8", w, h, w * 3, &rgb, &mut want).unwrap();
    let mut got = Rgb8::default();
    // bgr8 with 2 bytes of row padding.
    let mut bgr = Vec::new();
    for row in rgb.chunks(15) {
        for p in row.chunks(3) {
            bgr.extend_from_slice(&[p[2], p[1], p[0]]);
        }
        bgr.extend_from_slice(&[0, 0]);
    }
    decode_raw("bgr8", w, h, w * 3 + 2, &bgr, &mut got).unwrap();
    assert_eq!(got, want);
    // bgr8 packed (converted whole, not a row at a time).
    let packed: Vec<u8> = bgr
        .chunks(w as usize * 3 + 2)
        .flat_map(|row| row[..w as usize * 3].to_vec())
        .collect();
    decode_raw("bgr8", w, h, w * 3, &packed, &mut got).unwrap();
    assert_eq!(got, want);
    let bgra: Vec<u8> = rgb
        .chunks(3)
        .flat_map(|p| [p[2], p[1], p[0], 255])
        .collect();
    decode_raw("bgra8", w, h, w * 4, &bgra, &mut got).unwrap();
    assert_eq!(got, want);
    // rgba8 with 3 bytes of row padding.
    let mut rgba = Vec::new();
    for row in rgb.chunks(15) {
        rgba.extend(row.chunks(3).flat_map(|p| [p[0], p[1], p[2], 7]));
        rgba.extend_from_slice(&[9, 9, 9]);
    }
    decode_raw("rgba8", w, h, w * 4 + 3, &rgba, &mut got).unwrap();
    assert_eq!(got, want);
    let mono: Vec<u8> = (0..w * h).map(|i| i as u8).collect();
    decode_raw("mono8", w, h, w, &mono, &mut got).unwrap();
    assert_eq!(got.data[3..6], [1, 1, 1]);
    // PNG round trip.
    let mut png = Vec::new();
    use image::ImageEncoder;
    image::codecs::png::PngEncoder::new(&mut png)
        .write_image(&rgb, w, h, image::ExtendedColorType::Rgb8)
        .unwrap();
    decode_compressed("png", &png, &mut got).unwrap();
    assert_eq!(got, want);
}

#[test]
fn a_scripted_run_replayed_gives_byte_identical_chunks() {
    let run = || {
        let mut r = rig("pick up the red block", "  max_delta_per_step: [0.2]");
        for k in 0..4u32 {
            r.observe(1.0 + 0.1 * k as f64, k);
            if k == 2 {
                r.inputs.command_text("subgoal: stack the cups").unwrap();
            }
            r.node.tick();
        }
        r.chunks()
            .iter()
            .flat_map(|c| c.actions.iter().flat_map(|a| a.to_le_bytes()))
            .collect::<Vec<u8>>()
    };
    let (a, b) = (run(), run());
    assert_eq!(a.len(), 4 * 50 * 7 * 4);
    assert_eq!(a, b);
}

#[test]
fn the_example_configs_are_valid() {
    for f in [
        "demo.yaml",
        "dev_gpu.yaml",
        "pi05_thor.yaml",
        "serve_droid.yaml",
        "serve_demo.yaml",
    ] {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../config")
            .join(f);
        let c = Config::load(&path).unwrap_or_else(|e| panic!("{f}: {e}"));
        assert!(c.views() >= 1);
    }
    let thor = Config::load(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/pi05_thor.yaml"),
    )
    .unwrap();
    assert_eq!(thor.action_dims().unwrap().len(), thor.control.action_dim);
    assert!(thor.execution.command_stream.is_some());
}

#[test]
fn config_errors_name_the_field() {
    let base = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../config/demo.yaml"))
        .unwrap();
    Config::parse(&base).unwrap();
    let cases = [
        ("rate_hz: 5", "rate_hz: -1", "control.rate_hz"),
        ("action_dim: 7", "action_dim: 40", "control.action_dim"),
        (
            "action_min: [-3.0]",
            "action_min: [-3.0, 1, 2]",
            "safety.action_min",
        ),
        (
            "action_max: [3.0]",
            "action_max: [-4.0]",
            "safety.action_min",
        ),
        ("view: 1", "view: 0", "cameras[1].view"),
        (
            "max_token_len: 96",
            "max_token_len: 0",
            "model.max_token_len",
        ),
        (
            "max_observation_age_ms: 250",
            "max_observation_age_ms: 0",
            "safety.max_observation_age_ms",
        ),
        ("topic: /joint_states", "topic: joint states", "state.topic"),
        ("kind: frt", "kind: mp3", "audio.kind"),
        ("precision: f32", "precision: f8", "config"),
        ("kind: pi05", "kind: pi07", "config"),
        ("dt: 0.02", "dt: 0.02\n  colour: blue", "config"),
    ];
    for (from, to, field) in cases {
        assert!(base.contains(from), "{from}");
        let e = Config::parse(&base.replacen(from, to, 1)).unwrap_err();
        assert_eq!(e.field, field, "{to}: {e}");
    }
}

#[test]
fn the_loopback_transport_carries_a_live_run() {
    use frt_robot_host::transport::{Inbound, Loopback, Transport};
    use std::sync::atomic::{AtomicBool, Ordering};
    let mut cfg = config("pick up the red block", "");
    cfg.control.rate_hz = 20.0;
    cfg.safety.max_observation_age_ms = 2000.0;
    // The host backend on a loaded CI machine: ticks may take far longer than on a GPU.
    cfg.safety.watchdog_factor = 200.0;
    let clock = Arc::new(frt_robot_host::SystemClock);
    let (mut node, inputs, outputs) = Node::new(cfg, clock.clone(), None).unwrap();
    let (mut lb, peer) = Loopback::new();
    // The stop is sent through the transport by the control thread itself, once armed, just
    // after a tick's last replay and before its chunk is published (the narrowest place a
    // chunk from before the stop could slip out): the wait lets the transport deliver it.
    let armed = Arc::new(AtomicBool::new(false));
    {
        let (armed, tx, last) = (armed.clone(), peer.tx.clone(), node.policy().stages().len());
        node.set_stage_hook(Some(Box::new(move |i| {
            if i == last && armed.swap(false, Ordering::SeqCst) {
                tx.send(Inbound::Stop).unwrap();
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
        })));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let control = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let r = node.run(&stop);
            (node.status(), r)
        })
    };
    let transport = {
        let stop = stop.clone();
        std::thread::spawn(move || lb.run(&inputs, &outputs.0, &stop))
    };
    let now = || frt_robot_host::Clock::now(&frt_robot_host::SystemClock);
    let send_obs = |k: u32| {
        let t = now();
        peer.tx
            .send(Inbound::Frame {
                camera: "base".into(),
                stamp: t,
                image: frame(k),
            })
            .unwrap();
        peer.tx.send(Inbound::State(state(t, k))).unwrap();
    };
    let next_chunk = |want: &dyn Fn(&frt_robot_host::messages::ActionChunk) -> bool,
                      k: &mut u32| {
        for _ in 0..400 {
            send_obs(*k);
            *k += 1;
            while let Ok(o) = peer.rx.recv_timeout(std::time::Duration::from_millis(25)) {
                if let Outbound::Chunk(c) = o {
                    if want(&c) {
                        return c;
                    }
                }
            }
        }
        panic!("no such chunk arrived");
    };
    let mut k = 0;
    let c = next_chunk(&|c| !c.halt, &mut k);
    assert_eq!(c.subgoal_id, 1);
    peer.tx
        .send(Inbound::Subgoal("wipe the table".into()))
        .unwrap();
    let c = next_chunk(&|c| c.subgoal_id == 2, &mut k);
    assert_eq!(&*c.subgoal, "wipe the table");
    armed.store(true, Ordering::SeqCst);
    // Every chunk until the halt was out before the node had the stop; after the halt, with
    // fresh observations still arriving, nothing.
    let before = std::cell::RefCell::new(Vec::new());
    let c = next_chunk(
        &|c| {
            if !c.halt {
                before.borrow_mut().push(c.seq);
            }
            c.halt
        },
        &mut k,
    );
    assert!(c.latency < 1.0, "halt {} s after the stop", c.latency);
    let halt_seq = c.seq;
    let t_end = std::time::Instant::now() + std::time::Duration::from_millis(600);
    let mut later = Vec::new();
    while std::time::Instant::now() < t_end {
        send_obs(k);
        k += 1;
        while let Ok(o) = peer.rx.recv_timeout(std::time::Duration::from_millis(25)) {
            if let Outbound::Chunk(c) = o {
                later.push((c.seq, c.halt));
            }
        }
    }
    assert!(later.is_empty(), "chunks after the halt: {later:?}");
    peer.tx.send(Inbound::Command("garbage".into())).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(100));
    stop.store(true, Ordering::Relaxed);
    transport.join().unwrap().unwrap();
    let (s, r) = control.join().unwrap();
    assert_eq!(r, Ok(()), "{s:?}");
    assert!(s.halted);
    assert_eq!(s.bad_commands, 1);
    assert_eq!(halt_seq, s.last_chunk_before_stop + 1);
    for seq in before.into_inner() {
        assert!(
            seq <= s.last_chunk_before_stop,
            "chunk {seq} published after the node had the stop (last before it: {})",
            s.last_chunk_before_stop
        );
    }
}

#[test]
fn kernel_options_come_from_the_config() {
    let base = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../config/demo.yaml"))
        .unwrap();
    assert_eq!(
        Config::parse(&base).unwrap().kernels,
        frt_kernels::KernelOptions::default()
    );
    let cfg = Config::parse(&format!(
        "{base}\nkernels:\n  attention: gemm\n  gemm_tuning: false\n"
    ))
    .unwrap();
    assert_eq!(cfg.kernels.attention, frt_kernels::AttentionPath::Gemm);
    assert!(!cfg.kernels.gemm_tuning && cfg.kernels.split_k);
    let cfg = Config::parse(&format!("{base}\nkernels:\n  pdl: false\n")).unwrap();
    assert!(!cfg.kernels.pdl && frt_kernels::KernelOptions::default().pdl);
    for bad in ["  attention: fast\n", "  fused_mlp: true\n"] {
        let e = Config::parse(&format!("{base}\nkernels:\n{bad}")).unwrap_err();
        assert_eq!(e.field, "config", "{bad}: {e}");
    }
}

/// `model.kind: pi0` runs Pi0 through the same node: guarded chunks are published, the prompt
/// is the task alone, and the state reaches the model as its own input (two robots at
/// different joint positions, same frames and task, get different chunks).
#[test]
fn pi0_runs_from_the_config() {
    let text = edit(
        &config_text("pick up the red block", ""),
        &[("  random: {", "  kind: pi0\n  random: {")],
    );
    let cfg = Config::parse(&text).unwrap();
    let (mut a, mut b) = (rig_with(cfg.clone()), rig_with(cfg));
    let p = a.node.policy();
    assert_eq!(p.spec().name, "Pi0");
    assert_eq!(
        p.prompt_tokens("pick up the red block", &[0.1; 7]).unwrap(),
        p.prompt_tokens("pick up the red block", &[0.7; 7]).unwrap(),
        "Pi0's prompt does not carry the state"
    );
    for (r, k) in [(&mut a, 0), (&mut b, 9)] {
        r.clock.set(1.0);
        r.inputs.frame("base", 1.0, &frame(0)).unwrap();
        r.inputs.frame("wrist", 1.0, &frame(100)).unwrap();
        r.inputs.state(&state(1.0, k)).unwrap();
        r.clock.set(1.05);
        assert_eq!(r.node.tick(), TickOutcome::Published);
    }
    let (ca, cb) = (a.chunks(), b.chunks());
    assert_eq!((ca.len(), cb.len()), (1, 1));
    assert_eq!((ca[0].horizon, ca[0].action_dim), (50, 7));
    assert!(
        ca[0]
            .actions
            .iter()
            .all(|x| x.is_finite() && x.abs() <= 2.0)
    );
    assert_ne!(ca[0].actions, cb[0].actions, "the state reaches Pi0");
}

/// A checkpoint of one model kind with the other configured is refused, naming `model.kind`.
#[test]
fn a_checkpoint_of_the_other_kind_is_refused() {
    let dir = std::env::temp_dir().join(format!("frt-node-kind-{}", std::process::id()));
    frt_vla::Pi05Weights::random(&frt_vla::Pi05Config::tiny(), 1)
        .write(&dir, false, 1, false)
        .unwrap();
    let text = edit(
        &config_text("pick up the red block", ""),
        &[(
            "  random: { size: tiny, seed: 3 }",
            &format!(
                "  kind: pi0\n  checkpoint: {}\n  tokenizer: {}/assets/demo-tokenizer.json",
                dir.display(),
                env!("CARGO_MANIFEST_DIR")
            ),
        )],
    );
    let err = Node::new(
        Config::parse(&text).unwrap(),
        Arc::new(ManualClock::default()),
        None,
    )
    .err()
    .expect("refused");
    let _ = std::fs::remove_dir_all(&dir);
    let msg = err.to_string();
    assert!(msg.contains("model.kind") && msg.contains("Pi0.5"), "{msg}");
}

/// Configuration fields overridden by dotted name (ROS 2 parameters): values read as YAML,
/// list items by index, missing optional sections created; a name that is not a field or a
/// value of the wrong kind is an error naming the parameter; the result is validated.
#[test]
fn config_fields_are_overridden_by_dotted_name() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/demo.yaml");
    let o = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let c = Config::load_with(
        &path,
        &o(&[
            ("control.rate_hz", "20"),
            ("model.precision", "bf16"),
            ("safety.action_min", "[-1.0]"),
            ("cameras.1.required", "true"),
            ("serve.preset", "droid"),
        ]),
    )
    .unwrap();
    assert_eq!(c.control.rate_hz, 20.0);
    assert_eq!(c.model.precision, frt_robot_host::config::Precision::Bf16);
    assert_eq!(c.safety.action_min, Some(vec![-1.0]));
    assert!(c.cameras[1].required);
    assert_eq!(
        c.serve.as_ref().map(|s| s.preset),
        Some(frt_robot_host::serve::preset::Preset::Droid)
    );
    // Relative paths still from the file's folder.
    assert!(c.asr.as_ref().unwrap().model.is_absolute());
    for (name, value, says) in [
        ("rate_hz", "20", "unknown field `rate_hz`"),
        ("control.rate_hz", "fast", "invalid type"),
        ("cameras.5.topic", "/x", "the list has 2 items"),
        ("control.rate_hz.x", "1", "not a section"),
        ("control.rate_hz", "-1", "rate_hz"),
    ] {
        let e = Config::load_with(&path, &o(&[(name, value)])).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains(says), "{name}:={value}: {msg}");
        if says != "rate_hz" {
            assert_eq!(e.field, format!("parameter `{name}`"), "{msg}");
        }
    }
}

#[test]
fn limits_set_while_running_bound_the_next_chunk() {
    let mut r = rig("pick up the red block", "");
    r.observe(1.0, 0);
    r.clock.set(1.05);
    assert_eq!(r.node.tick(), TickOutcome::Published);
    let before = r.chunks().pop().unwrap();
    assert!(
        before.actions.iter().any(|a| a.abs() > 0.3),
        "the model moves past ±0.3"
    );
    let params = frt_robot_host::params::Parameters::new(r.node.config());
    let tighter = params
        .check(&[
            (
                "safety.action_max".into(),
                frt_robot_host::params::ParamValue::DoubleArray(vec![0.3]),
            ),
            (
                "safety.action_min".into(),
                frt_robot_host::params::ParamValue::DoubleArray(vec![-0.3]),
            ),
        ])
        .unwrap();
    r.inputs.reconfigure(tighter, false).unwrap();
    r.observe(1.1, 1);
    r.clock.set(1.15);
    assert_eq!(r.node.tick(), TickOutcome::Published);
    let after = r.chunks().pop().unwrap();
    assert!(
        after.actions.iter().all(|a| a.abs() <= 0.3 + 1e-6),
        "{:?}",
        after.actions
    );
    assert_eq!(
        r.node.config().safety.action_max.as_deref(),
        Some(&[0.3f32][..])
    );
}

/// Prompts made on the I/O side as states arrive give the chunks the tick's own tokenization
/// gives, bit for bit, through state changes and a subgoal change; a tick whose subgoal
/// differs from the one a prompt was made for makes its own.
#[test]
fn prompts_made_on_the_io_side_change_nothing() {
    let run = |made: bool| {
        let mut r = rig("pick up the red block", "");
        r.inputs.set_tokenize_states(made);
        let mut chunks = Vec::new();
        for k in 0..6u32 {
            let t = 1.0 + 0.1 * k as f64;
            r.observe(t, k * 7);
            if k == 3 {
                r.inputs
                    .command(Command::Subgoal("open the drawer".into()), Source::Typed)
                    .unwrap();
            }
            // A subgoal change abandons the tick it arrives in: tick again.
            while r.node.tick() != TickOutcome::Published {}
            chunks.extend(r.chunks());
        }
        (chunks, r.node.prompts_made())
    };
    let (a, made) = run(true);
    let (b, none) = run(false);
    assert_eq!(a.len(), 6);
    assert_eq!(none, 0);
    // Every tick but the one after the subgoal change (its state's prompt has the old one).
    assert_eq!(made, 5);
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(&*x.subgoal, &*y.subgoal);
        assert!(
            x.actions
                .iter()
                .zip(y.actions.iter())
                .all(|(p, q)| p.to_bits() == q.to_bits()),
            "chunk {}: actions differ",
            x.seq
        );
    }
    assert_eq!(&*a[5].subgoal, "open the drawer");
}

/// `model.calibration` set while a `precision: fp8` node runs: the file is read and checked
/// when set (a missing file, another model's calibration are refused with the reason, nothing
/// changes), its scales are written between two ticks with no new capture, and the next chunk
/// is computed with them.
#[test]
fn a_new_calibration_is_taken_while_running_without_recapture() {
    use frt_robot_host::params::{ParamValue, Parameters};
    let dir = std::env::temp_dir().join(format!("frt-live-cal-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // A calibration recorded on the 16-bit node, and one with every range tripled.
    let mut r = rig("pick up the red block", "");
    r.node.calibrate(100.0).unwrap();
    for k in 0..3u32 {
        r.observe(1.0 + 0.1 * k as f64, k);
        assert_eq!(r.node.tick(), TickOutcome::Published);
    }
    let a = r.node.calibration().unwrap().unwrap();
    let mut b = a.clone();
    for v in b.ranges.values_mut() {
        *v *= 3.0;
    }
    let (file_a, file_b) = (dir.join("a.json"), dir.join("b.json"));
    a.write(&file_a).unwrap();
    b.write(&file_b).unwrap();
    let mut other = a.clone();
    other.model = "pi05 expert: width 1024, 18 layers".into();
    let file_other = dir.join("other.json");
    other.write(&file_other).unwrap();
    let fp8 = |file: &std::path::Path| {
        edit(
            &config_text("pick up the red block", ""),
            &[(
                "  precision: f32\n",
                &format!("  precision: fp8\n  calibration: {}\n", file.display()),
            )],
        )
    };
    // Two ticks on the same observations: with file a throughout, and with b set between.
    let run = |switch: bool| {
        let mut r = rig_with(Config::parse(&fp8(&file_a)).unwrap());
        let captures = r.node.policy().capture_count();
        // The FP8 node holds only its FP8 stacks' quantized weights: recording a calibration
        // on it (which runs the 16-bit path) is refused by reason.
        let e = r.node.calibrate(100.0).unwrap_err().to_string();
        assert!(e.contains("16-bit weights"), "{e}");
        let mut params = Parameters::new(r.node.config());
        r.observe(1.0, 0);
        assert_eq!(r.node.tick(), TickOutcome::Published);
        let first = r.chunks().pop().unwrap();
        if switch {
            let set = |params: &mut Parameters, p: &std::path::Path| {
                let v = ParamValue::String(p.display().to_string());
                params.apply(&r.inputs, &[("model.calibration".into(), v)], None)
            };
            for (bad, says) in [
                (dir.join("missing.json"), "missing.json"),
                (file_other.clone(), "not on this node's model"),
            ] {
                let e = set(&mut params, &bad).unwrap_err();
                assert!(e.contains("model.calibration") && e.contains(says), "{e}");
            }
            assert_eq!(
                params.get("model.calibration"),
                Some(&ParamValue::String(file_a.display().to_string())),
                "refused: nothing changed"
            );
            set(&mut params, &file_b).unwrap();
        }
        r.observe(1.1, 1);
        assert_eq!(r.node.tick(), TickOutcome::Published);
        let second = r.chunks().pop().unwrap();
        assert_eq!(r.node.policy().capture_count(), captures, "no new capture");
        let file = r.node.config().model.calibration.clone().unwrap();
        (first, second, file)
    };
    let (a1, a2, fa) = run(false);
    let (b1, b2, fb) = run(true);
    assert_eq!((fa, fb), (file_a.clone(), file_b.clone()));
    let bits = |c: &frt_robot_host::messages::ActionChunk| -> Vec<u32> {
        c.actions.iter().map(|v| v.to_bits()).collect()
    };
    assert_eq!(bits(&a1), bits(&b1), "the same calibration: the same chunk");
    assert_ne!(bits(&a2), bits(&b2), "the new scales are used");
    let _ = std::fs::remove_dir_all(&dir);
}

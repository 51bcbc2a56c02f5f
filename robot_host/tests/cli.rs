//! The command line as a user meets it: help and version exit 0, unknown flags and missing
//! arguments are errors (exit 2) that say what is wrong, and a closed stdout never panics.

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

//! What the openpi server's test files share: a configuration of the tiny random model on the
//! host backend for a preset, and the real openpi-client (the peer script) against a server.
#![allow(dead_code)]

use frt_robot_host::Config;
use frt_robot_host::serve::Server;
use std::path::PathBuf;
use std::process::Command;

/// The tiny random Pi0.5 on the host backend serving `preset` on a free port, its views, state
/// joints and action dimensions those of the preset, actions limited to ±1.5.
pub fn config(preset: &str) -> Config {
    config_with(preset, "")
}

/// [`config`] with more lines in its `serve:` section.
pub fn config_with(preset: &str, serve_extra: &str) -> Config {
    let (joints, dims, views) = match preset {
        "droid" => (8, 8, 2),
        "libero" => (8, 7, 2),
        "aloha" => (14, 14, 3),
        _ => unreachable!(),
    };
    let cameras: Vec<String> = ["base", "left", "right"][..views]
        .iter()
        .enumerate()
        .map(|(v, n)| {
            format!(
                "  - {{ name: {n}, topic: /{n}/image_raw, format: raw, view: {v}, required: {} }}",
                v == 0
            )
        })
        .collect();
    let names: Vec<String> = (0..joints).map(|j| format!("j{j}")).collect();
    Config::parse(&format!(
        r#"
model:
  random: {{ size: tiny, seed: 3 }}
  precision: f32
  backend: host
  max_token_len: 96
cameras:
{}
state:
  topic: /joint_states
  joints: [{}]
control:
  rate_hz: 10
  initial_subgoal: pick up the red block
  action_dim: {dims}
  dt: 0.02
safety:
  max_observation_age_ms: 200
  missing_camera: degrade
  action_space: position
  action_min: [-1.5]
  action_max: [1.5]
serve:
  preset: {preset}
  port: 0
{serve_extra}
"#,
        cameras.join("\n"),
        names.join(", ")
    ))
    .unwrap()
}

/// Where openpi-client is installed.
pub fn client_path() -> PathBuf {
    std::env::var_os("FRT_OPENPI_CLIENT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.cache/pip-openpi"))
}

/// The peer script (`openpi_peer.py`) with openpi-client against `server`, running `args`.
pub fn client(server: &Server, args: &[&str]) -> Command {
    let dir = client_path();
    assert!(
        dir.join("openpi_client").is_dir(),
        "openpi-client is not at {} — run scripts/fetch-models.sh (or set FRT_OPENPI_CLIENT)",
        dir.display()
    );
    let mut c = Command::new("python3");
    c.arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/openpi_peer.py"))
        .arg(server.addr.port().to_string())
        .args(args)
        .env("PYTHONPATH", dir);
    c
}

/// The peer's `sequential N` scenario: N requests on one connection; `at_warm` runs while the
/// peer waits after its 10th (the server warmed up). The peer's findings.
pub fn sequential(server: &Server, n: usize, at_warm: impl FnOnce()) -> serde_json::Value {
    use std::io::{BufRead, BufReader, Write};
    use std::process::Stdio;
    let mut child = client(server, &["sequential", &n.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert!(line.contains("warm"), "{line}");
    at_warm();
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    assert!(child.wait().unwrap().success());
    serde_json::from_str(&line).unwrap()
}

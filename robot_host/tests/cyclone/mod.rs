//! What the tests against a Cyclone DDS peer share: where its Python wheel is, and its
//! configuration for this host.

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};

/// Cyclone DDS restricted to loopback with unicast discovery (no multicast needed).
pub const CYCLONE: &str = r#"<CycloneDDS><Domain><General><Interfaces><NetworkInterface name="lo" multicast="false"/></Interfaces></General><Discovery><Peers><Peer address="127.0.0.1"/></Peers><ParticipantIndex>auto</ParticipantIndex></Discovery></Domain></CycloneDDS>"#;

/// The folder holding the `cyclonedds` wheel (scripts/fetch-models.sh installs it into
/// .cache/pip-cyclonedds; `$FRT_CYCLONEDDS` overrides).
pub fn cyclonedds() -> PathBuf {
    let dir = std::env::var_os("FRT_CYCLONEDDS").map_or_else(
        || {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../.cache/pip-cyclonedds"
            ))
        },
        PathBuf::from,
    );
    assert!(
        dir.join("cyclonedds").is_dir(),
        "the cyclonedds wheel is not installed in {} (bash scripts/fetch-models.sh)",
        dir.display()
    );
    dir
}

/// Runs a peer script of tests/ (`args` after the script) on Cyclone DDS restricted to this
/// host, until it exits: the JSON events it printed, one per line, and its exit status.
pub fn run_peer(script: &str, args: &[&str]) -> (Vec<Value>, ExitStatus) {
    let tests = concat!(env!("CARGO_MANIFEST_DIR"), "/tests");
    let mut peer = Command::new("python3")
        .arg(format!("{tests}/{script}"))
        .args(args)
        .env("PYTHONPATH", format!("{}:{tests}", cyclonedds().display()))
        .env("CYCLONEDDS_URI", CYCLONE)
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let lines = BufReader::new(peer.stdout.take().unwrap())
        .lines()
        .map_while(|l| l.ok())
        .filter_map(|l| serde_json::from_str(&l).ok())
        .collect();
    (lines, peer.wait().unwrap())
}

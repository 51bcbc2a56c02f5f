//! Recordings as an independent reader sees them: `reader.py` with the Python `mcap` and
//! `mcap-ros2-support` packages (scripts/fetch-models.sh installs them in .cache/pip-mcap).

use serde_json::Value;
use std::path::Path;
use std::process::Command;

/// The recording summarized by `reader.py` (every message decoded; see there).
pub fn read(recording: &Path) -> Value {
    let here = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcap");
    let pip = concat!(env!("CARGO_MANIFEST_DIR"), "/../.cache/pip-mcap");
    assert!(
        Path::new(pip).join("mcap_ros2").is_dir(),
        "{pip}: run scripts/fetch-models.sh"
    );
    let out = Command::new("python3")
        .arg(format!("{here}/reader.py"))
        .arg(recording)
        .env("PYTHONPATH", pip)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

//! What the tests against a Cyclone DDS peer share: where its Python wheel is, and its
//! configuration for this host.

use std::path::PathBuf;

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

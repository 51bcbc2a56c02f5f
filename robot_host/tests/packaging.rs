//! The ROS 2 packaging holds together without a ROS install: the ament_cargo package's name is
//! the cargo package's (cargo-ament-build installs under it), what it installs to `share`
//! exists, the launch file names this package and binary, and `frt_msgs` generates exactly
//! the interface files it has.

use std::path::Path;

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The text of the first `<tag>…</tag>` in `xml`.
fn tag<'a>(xml: &'a str, tag: &str) -> &'a str {
    let open = format!("<{tag}>");
    let start = xml.find(&open).unwrap_or_else(|| panic!("no <{tag}>")) + open.len();
    let end = xml[start..].find(&format!("</{tag}>")).unwrap() + start;
    xml[start..end].trim()
}

#[test]
fn the_ament_cargo_package_matches_the_cargo_package() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let xml = read(&here.join("package.xml"));
    assert_eq!(tag(&xml, "name"), env!("CARGO_PKG_NAME"));
    assert_eq!(tag(&xml, "build_type"), "ament_cargo");
    assert_eq!(tag(&xml, "version"), env!("CARGO_PKG_VERSION"));

    let manifest = read(&here.join("Cargo.toml"));
    let meta = manifest
        .split("[package.metadata.ros]")
        .nth(1)
        .expect("[package.metadata.ros]");
    let line = meta
        .lines()
        .find(|l| l.starts_with("install_to_share"))
        .unwrap();
    let dirs: Vec<&str> = line.split('"').skip(1).step_by(2).collect();
    assert_eq!(dirs, ["launch", "config"]);
    for d in &dirs {
        assert!(
            here.join(d).is_dir(),
            "{d} is installed to share but missing"
        );
    }
    assert!(here.join("launch/robot_host.launch.py").is_file());
    assert!(here.join("config/pi05_thor.yaml").is_file());
    assert!(here.join("config/dev_gpu.yaml").is_file());

    // The launch file starts this package's binary.
    let launch = read(&here.join("launch/robot_host.launch.py"));
    assert!(launch.contains(&format!("package=\"{}\"", env!("CARGO_PKG_NAME"))));
    assert!(launch.contains(&format!("FindPackageShare(\"{}\")", env!("CARGO_PKG_NAME"))));
    assert!(launch.contains("executable=\"frt-robot-host\""));
    assert!(manifest.contains("[[bin]]\nname = \"frt-robot-host\""));
    for arg in [
        "config",
        "namespace",
        "use_sim_time",
        "log_level",
        "respawn",
        "transport",
    ] {
        assert!(
            launch.contains(&format!("DeclareLaunchArgument(\"{arg}\"")),
            "launch argument {arg}"
        );
    }
}

#[test]
fn frt_msgs_generates_every_interface_file_it_has() {
    let pkg = Path::new(env!("CARGO_MANIFEST_DIR")).join("../msgs/frt_msgs");
    let cmake = read(&pkg.join("CMakeLists.txt"));
    let mut on_disk = Vec::new();
    for sub in ["msg", "srv"] {
        for e in std::fs::read_dir(pkg.join(sub)).unwrap() {
            on_disk.push(format!(
                "{sub}/{}",
                e.unwrap().file_name().to_string_lossy()
            ));
        }
    }
    on_disk.sort();
    let mut listed: Vec<String> = cmake
        .split('"')
        .filter(|s| s.starts_with("msg/") || s.starts_with("srv/"))
        .map(String::from)
        .collect();
    listed.sort();
    assert_eq!(listed, on_disk);
    let xml = read(&pkg.join("package.xml"));
    assert_eq!(tag(&xml, "name"), "frt_msgs");
    assert!(cmake.contains("project(frt_msgs)"));
    assert!(xml.contains("<member_of_group>rosidl_interface_packages</member_of_group>"));
}

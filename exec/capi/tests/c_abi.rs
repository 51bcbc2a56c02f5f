//! Builds `tests/c/abi_test.c` with the system C compiler against the public header and
//! `libflashrt_exec.so`, and runs it on the host backend. Also checks that the shared
//! library exports exactly the `frt_*` functions the header declares.
//!
//! On a GPU machine the same program runs on CUDA: `abi_test cuda` (see scripts/stage-gpu.sh).

use std::path::{Path, PathBuf};
use std::process::Command;

/// `target/<profile>`, where cargo puts `libflashrt_exec.so`.
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// The cdylib cargo built for this test run: `cargo test` leaves it in `deps/` (only
/// `cargo build` copies it up to `target/<profile>/`).
fn cdylib() -> PathBuf {
    let candidates = [
        target_dir().join("deps/libflashrt_exec.so"),
        target_dir().join("libflashrt_exec.so"),
    ];
    candidates
        .iter()
        .find(|p| p.exists())
        .cloned()
        .unwrap_or_else(|| panic!("libflashrt_exec.so not found in {candidates:?}"))
}

/// Compiles the C test program; returns its path.
pub fn build_c_test(out_dir: &Path) -> PathBuf {
    let so = cdylib();
    let exe = out_dir.join("abi_test");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args([
            "-std=c11",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-pedantic",
            "-O1",
        ])
        .arg("-I")
        .arg(repo().join("exec/include"))
        .arg(repo().join("exec/capi/tests/c/abi_test.c"))
        .arg("-o")
        .arg(&exe)
        .arg("-L")
        .arg(so.parent().unwrap())
        .arg("-lflashrt_exec")
        .arg(format!("-Wl,-rpath,{}", so.parent().unwrap().display()))
        .status()
        .unwrap_or_else(|e| panic!("cannot run the C compiler `{cc}`: {e}"));
    assert!(
        status.success(),
        "the C test program does not compile against exec.h"
    );
    exe
}

#[test]
fn c_program_exercises_the_abi_on_the_host_backend() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("c_abi");
    std::fs::create_dir_all(&dir).unwrap();
    let exe = build_c_test(&dir);
    let out = Command::new(&exe).arg("host").output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    assert!(out.status.success(), "abi_test host failed:\n{text}");
    assert!(text.contains("C ABI (host): all checks passed"), "{text}");
}

#[test]
fn shared_library_exports_exactly_the_header() {
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(cdylib())
        .output()
        .expect("nm (binutils)");
    assert!(out.status.success());
    let mut exported: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .filter(|s| s.starts_with("frt_"))
        .map(String::from)
        .collect();
    exported.sort();
    let header = std::fs::read_to_string(repo().join("exec/include/flashrt/exec.h")).unwrap();
    let mut declared: Vec<String> = header
        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("frt_"))
        .filter(|w| header.contains(&format!("{w}(")))
        .map(String::from)
        .collect();
    declared.sort();
    declared.dedup();
    assert_eq!(exported, declared);
}

//! FlashRT's own exec tests (`exec/python/flashrt/tests`, vendored unchanged under their
//! Apache-2.0 license) run against this `libflashrt_exec.so` on the host backend, through
//! the ctypes `_flashrt_exec` module and the host stand-in for the bit of torch they use.
//! On a GPU, `scripts/gpu-suite.sh` runs them with the real torch on CUDA.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// The cdylib cargo built for this test run (`cargo test` leaves it in `deps/`).
fn cdylib() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let target = exe.parent().unwrap().parent().unwrap().to_path_buf();
    [
        target.join("deps/libflashrt_exec.so"),
        target.join("libflashrt_exec.so"),
    ]
    .into_iter()
    .find(|p| p.exists())
    .expect("libflashrt_exec.so next to the test")
}

fn run_flashrt_test(file: &str, done: &str) {
    let dir = repo().join("exec/python/flashrt");
    let out = Command::new("python3")
        .arg(dir.join("tests").join(file))
        .env("FRT_EXEC_LIB", cdylib())
        .env("FRT_EXEC_BACKEND", "host")
        .env(
            "PYTHONPATH",
            format!("{}:{}", dir.display(), dir.join("host").display()),
        )
        .output()
        .expect("python3 (the CI set-up installs it)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{file}: {}\n{text}", out.status);
    assert!(text.contains(done), "{file} did not finish:\n{text}");
}

#[test]
fn flashrt_test_exec_passes_on_the_host_backend() {
    run_flashrt_test("test_exec.py", "ALL PHASE-A CONTRACT TESTS PASSED");
}

#[test]
fn flashrt_test_plan_vla_passes_on_the_host_backend() {
    run_flashrt_test("test_plan_vla.py", "PHASE-C PLAN DEMO PASSED");
}

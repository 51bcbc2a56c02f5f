//! The openpi server's policy worker allocates nothing per request once warmed up: a counting
//! global allocator that counts on the worker thread only (`frt-serve-policy`), while the real
//! `openpi-client` sends 20 DROID observations after 10 warm-up requests (the connection side
//! decodes and preprocesses, which allocates, on other threads).
//!
//! One test in this file: nothing else runs on the worker while it is counted.

use frt_robot_host::{Config, serve};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// 0: not known yet, 1: the worker, 2: another thread, 3: being found out.
    static ON_WORKER: Cell<u8> = const { Cell::new(0) };
}

/// Whether this thread is the policy worker (its name, read once per thread).
fn on_worker() -> bool {
    ON_WORKER
        .try_with(|c| match c.get() {
            1 => true,
            0 => {
                c.set(3);
                let yes = std::thread::current().name() == Some("frt-serve-policy");
                c.set(if yes { 1 } else { 2 });
                yes
            }
            _ => false,
        })
        .unwrap_or(false)
}

fn count() {
    if COUNTING.load(Ordering::Relaxed) && on_worker() {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: the caller's contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn the_policy_worker_allocates_nothing_per_request() {
    let cfg = Config::parse(
        r#"
model:
  random: { size: tiny, seed: 3 }
  precision: f32
  backend: host
  max_token_len: 96
cameras:
  - { name: base, topic: /base/image_raw, format: raw, view: 0 }
  - { name: wrist, topic: /wrist/image_raw, format: raw, view: 1 }
state:
  topic: /joint_states
  joints: [j1, j2, j3, j4, j5, j6, j7, gripper]
control:
  rate_hz: 10
  initial_subgoal: pick up the red block
  action_dim: 8
  dt: 0.02
safety:
  max_observation_age_ms: 200
  missing_camera: degrade
  action_space: position
  action_min: [-1.5]
  action_max: [1.5]
serve:
  preset: droid
  port: 0
"#,
    )
    .unwrap();
    let server = serve::start(&cfg, None).unwrap();
    let client = std::env::var_os("FRT_OPENPI_CLIENT")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.cache/pip-openpi")
        });
    assert!(
        client.join("openpi_client").is_dir(),
        "openpi-client is not at {} — run scripts/fetch-models.sh (or set FRT_OPENPI_CLIENT)",
        client.display()
    );
    let mut child = Command::new("python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/openpi_peer.py"))
        .arg(server.addr.port().to_string())
        .args(["sequential", "30"])
        .env("PYTHONPATH", client)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert!(line.contains("warm"), "{line}");
    ALLOCATIONS.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    COUNTING.store(false, Ordering::SeqCst);
    assert!(child.wait().unwrap().success());
    assert!(line.contains("\"ok\": 30"), "{line}");
    let n = ALLOCATIONS.load(Ordering::SeqCst);
    assert_eq!(n, 0, "the policy worker allocated {n} times in 20 requests");
    server.stop().unwrap();
}

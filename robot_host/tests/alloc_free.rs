//! A control tick allocates nothing once warmed up: a counting global allocator around
//! `Node::tick` (host backend, tiny random Pi0.5, two cameras, the bundled tokenizer),
//! counting allocations on every thread. The observations are delivered between ticks (the
//! I/O side decodes and preprocesses frames, which allocates, off the control thread), and the
//! chunks are taken and dropped between ticks as a transport does.
//!
//! One test in this file: nothing else runs in the process while a tick is counted.

mod common;
use common::frame;
use frt_robot_host::messages::{JointState, Outbound, Source};
use frt_robot_host::{Config, ManualClock, Node, TickOutcome};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: the caller's contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: the caller's contract.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
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

/// Allocations made while `f` runs.
fn allocations<T>(f: impl FnOnce() -> T) -> (T, u64) {
    ALLOCATIONS.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    let r = f();
    COUNTING.store(false, Ordering::SeqCst);
    (r, ALLOCATIONS.load(Ordering::SeqCst))
}

const CONFIG: &str = r#"
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
  joints: [j1, j2, j3, j4, j5, j6, gripper]
control:
  rate_hz: 10
  initial_subgoal: pick up the red block
  action_dim: 7
  dt: 0.02
  noise_seed: 5
safety:
  max_observation_age_ms: 200
  missing_camera: degrade
  action_space: position
  action_min: [-2.0]
  action_max: [2.0]
  max_delta_per_step: [0.5]
"#;

#[test]
fn a_control_tick_allocates_nothing_after_warm_up() {
    let clock = Arc::new(ManualClock::default());
    let (mut node, inputs, out) =
        Node::new(Config::parse(CONFIG).unwrap(), clock.clone(), None).unwrap();
    let joints = ["j1", "j2", "j3", "j4", "j5", "j6", "gripper"];
    let mut counts = Vec::new();
    for k in 0..12u32 {
        // The I/O side: new frames and a new state (the state changes the prompt's bins).
        let t = 1.0 + 0.1 * k as f64;
        clock.set(t);
        inputs.frame("base", t, &frame(k)).unwrap();
        inputs.frame("wrist", t, &frame(k + 50)).unwrap();
        inputs
            .state(&JointState {
                stamp: t,
                names: joints.iter().map(|s| s.to_string()).collect(),
                position: (0..7)
                    .map(|j| 0.3 * j as f64 - 0.9 + 0.07 * k as f64)
                    .collect(),
            })
            .unwrap();
        if k == 6 {
            // A subgoal change in the middle (allocates when it arrives, not per tick).
            inputs.subgoal("wipe the table", Source::Typed).unwrap();
        }
        let (outcome, n) = allocations(|| node.tick());
        assert_eq!(outcome, TickOutcome::Published, "tick {k}");
        counts.push(n);
        // The transport's side: every chunk taken and dropped.
        let chunks: Vec<_> = out
            .0
            .try_iter()
            .filter(|o| matches!(o, Outbound::Chunk(_)))
            .collect();
        assert_eq!(chunks.len(), 1, "tick {k}");
    }
    // The first tick makes the chunk pool's buffer and the last-action row; the tick that
    // takes the new subgoal makes its shared text (one allocation per subgoal change). Every
    // other tick allocates nothing.
    eprintln!("allocations per tick: {counts:?}");
    for (k, &n) in counts.iter().enumerate().skip(1) {
        let allowed = if k == 6 { 1 } else { 0 };
        assert!(n <= allowed, "tick {k}: {n} allocations ({counts:?})");
    }
}

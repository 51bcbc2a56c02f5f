//! The openpi server's policy worker allocates nothing per request once warmed up: a counting
//! global allocator that counts on the worker thread only (`frt-serve-policy`), while the real
//! `openpi-client` sends 20 DROID observations after 10 warm-up requests (the connection side
//! decodes and preprocesses, which allocates, on other threads).
//!
//! One test in this file: nothing else runs on the worker while it is counted.

mod serving;
use frt_robot_host::serve;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
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
    let server = serve::start(&serving::config("droid"), None).unwrap();
    let r = serving::sequential(&server, 30, || {
        ALLOCATIONS.store(0, Ordering::SeqCst);
        COUNTING.store(true, Ordering::SeqCst);
    });
    COUNTING.store(false, Ordering::SeqCst);
    assert_eq!(r["ok"], 30);
    let n = ALLOCATIONS.load(Ordering::SeqCst);
    assert_eq!(n, 0, "the policy worker allocated {n} times in 20 requests");
    server.stop().unwrap();
}

//! The allocation guard: a global allocator that refuses any single allocation above
//! [`LIMIT`]. Before refusing (which aborts the process), it writes the input being run to
//! the dump path set by [`set_dump`], so that the parent process can report it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Mutex;

/// The largest single allocation an input may cause: 1 GiB (the largest legitimate one, a
/// checkpoint's tensor, is far below this for every seed).
pub const LIMIT: usize = 1 << 30;

pub struct Guard;

static DUMP: Mutex<Option<(PathBuf, Vec<u8>)>> = Mutex::new(None);

#[global_allocator]
static GUARD: Guard = Guard;

/// Where to write `input` if it asks for too much memory (set before each run of a child
/// process's input; `None`: nowhere).
pub fn set_dump(path: Option<PathBuf>, input: &[u8]) {
    let mut d = DUMP.lock().unwrap_or_else(|e| e.into_inner());
    match (path, d.as_mut()) {
        (Some(p), Some((q, buf))) if *q == p => {
            buf.clear();
            buf.extend_from_slice(input);
        }
        (Some(p), _) => *d = Some((p, input.to_vec())),
        (None, _) => *d = None,
    }
}

fn refuse(size: usize) {
    // Allocations below the limit re-enter the allocator safely from here.
    let mut err = std::io::stderr();
    let _ = writeln!(
        err,
        "frt-fuzz: an allocation of {size} bytes (limit {LIMIT}) — aborting"
    );
    if let Ok(d) = DUMP.try_lock()
        && let Some((path, input)) = d.as_ref()
    {
        let _ = std::fs::write(path, input);
        let _ = writeln!(err, "frt-fuzz: input written to {}", path.display());
    }
}

unsafe impl GlobalAlloc for Guard {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > LIMIT {
            refuse(layout.size());
            return std::ptr::null_mut();
        }
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() > LIMIT {
            refuse(layout.size());
            return std::ptr::null_mut();
        }
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > LIMIT {
            refuse(new_size);
            return std::ptr::null_mut();
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

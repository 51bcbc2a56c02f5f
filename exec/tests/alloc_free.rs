//! After warm-up, `Graph::replay`, `Plan::execute`, event record/wait and stream sync perform
//! no heap allocation (counted by a global allocator, on every thread, the host backend's
//! executor included).
//!
//! A plain binary (no test harness, so nothing else allocates meanwhile). Host:
//! `cargo test -p frt-exec --test alloc_free`; CUDA as well: append `-- --ignored`.

mod common;

use frt_exec::{Buffer, Graph, Plan, ShapeKey};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded unchanged.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static A: Counting = Counting;

fn hot_path_allocates_nothing(b: &common::Backend) {
    let ctx = &b.ctx;
    let s1 = ctx.stream(0).unwrap();
    let s2 = ctx.stream(-3).unwrap();
    let x = Buffer::alloc(ctx, "x", 256 * 4).unwrap();
    let y = Buffer::alloc(ctx, "y", 256 * 4).unwrap();
    let step = Graph::new(ctx, "step", 16);
    for k in 0..10u64 {
        step.capture(ShapeKey(k), |cs| b.k.axpb(ctx, cs, &x, 1.0, k as f32))
            .unwrap();
    }
    let read = Graph::new(ctx, "read", 1);
    read.capture(ShapeKey(0), |cs| b.k.add_from(ctx, cs, &y, &x, 0.0))
        .unwrap();
    // A 12-node plan over two streams with a cross-stream dependency every other node.
    let mut plan = Plan::new(ctx);
    let mut prev = None;
    for i in 0..12u64 {
        let (g, k, s) = if i % 2 == 0 {
            (&step, ShapeKey(i % 10), s1)
        } else {
            (&read, ShapeKey::INHERIT, s2)
        };
        let n = plan.add(g, k, s).unwrap();
        if let Some(p) = prev {
            plan.after(n, p).unwrap();
        }
        prev = Some(n);
    }
    let ev = ctx.event().unwrap();
    let run = || {
        for k in 0..10u64 {
            step.replay(ShapeKey(k), s1).unwrap();
        }
        ev.record(s1).unwrap();
        ctx.stream_wait(s2, &ev).unwrap();
        read.replay(ShapeKey(0), s2).unwrap();
        plan.execute(ShapeKey(0)).unwrap();
        plan.sync().unwrap();
        ctx.sync_stream(s1).unwrap();
    };
    for _ in 0..20 {
        run(); // warm-up: queues reach their working size
    }
    let before = ALLOCS.load(Ordering::SeqCst);
    for _ in 0..200 {
        run();
    }
    let allocs = ALLOCS.load(Ordering::SeqCst) - before;
    println!(
        "[{}] allocations in 200 iterations of 11 replays + 1 twelve-node plan: {allocs}",
        b.name
    );
    assert_eq!(allocs, 0, "[{}] the hot path allocated", b.name);
    // Outside the hot path, allocation is normal: the counter does count.
    let before = ALLOCS.load(Ordering::SeqCst);
    let _v = x.to_vec::<f32>(s1).unwrap();
    assert!(
        ALLOCS.load(Ordering::SeqCst) > before,
        "the counting allocator counts"
    );
}

fn main() {
    let ignored = std::env::args().any(|a| a == "--ignored" || a == "--include-ignored");
    hot_path_allocates_nothing(&common::host());
    println!("alloc_free host ... ok");
    if ignored {
        hot_path_allocates_nothing(&common::cuda());
        println!("alloc_free cuda ... ok");
    } else {
        println!("alloc_free cuda ... ignored, needs a CUDA GPU (run with --ignored)");
    }
}

//! Behaviour specific to the host backend: its scheduler, and misuse it must survive.

use frt_exec::{Buffer, Ctx, Error, Graph, HostOpError, Plan, ShapeKey, Stream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A gate that holds the executor until released, so that work piles up on several streams.
fn gate(ctx: &Ctx, s: Stream) -> Arc<AtomicBool> {
    let open = Arc::new(AtomicBool::new(false));
    let o = open.clone();
    ctx.launch_host(s, move || {
        while !o.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_micros(50));
        }
        Ok(())
    })
    .unwrap();
    open
}

fn log_op(ctx: &Ctx, s: Stream, log: &Arc<Mutex<Vec<&'static str>>>, tag: &'static str) {
    let l = log.clone();
    ctx.launch_host(s, move || {
        l.lock().unwrap().push(tag);
        Ok(())
    })
    .unwrap();
}

#[test]
fn pending_work_runs_by_priority_then_submission_order() {
    let ctx = Ctx::host().unwrap();
    let lo = ctx.stream(0).unwrap();
    let mid = ctx.stream(-2).unwrap();
    let hi = ctx.stream(-5).unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let open = gate(&ctx, Stream::DEFAULT);
    std::thread::sleep(Duration::from_millis(5)); // the executor is now inside the gate
    log_op(&ctx, lo, &log, "lo1");
    log_op(&ctx, mid, &log, "mid1");
    log_op(&ctx, lo, &log, "lo2");
    log_op(&ctx, hi, &log, "hi1");
    log_op(&ctx, mid, &log, "mid2");
    log_op(&ctx, hi, &log, "hi2");
    open.store(true, Ordering::Release);
    ctx.synchronize().unwrap();
    assert_eq!(
        *log.lock().unwrap(),
        vec!["hi1", "hi2", "mid1", "mid2", "lo1", "lo2"]
    );
}

#[test]
fn high_priority_gets_between_operations_of_a_low_priority_graph() {
    let ctx = Ctx::host().unwrap();
    let lo = ctx.stream(0).unwrap();
    let hi = ctx.stream(-5).unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let long = Graph::new(&ctx, "long", 0);
    long.capture(ShapeKey(0), |cs| {
        for tag in ["g1", "g2", "g3"] {
            log_op(&ctx, cs, &log, tag);
        }
        Ok::<(), frt_exec::Error>(())
    })
    .unwrap();
    let open = gate(&ctx, lo);
    long.replay(ShapeKey(0), lo).unwrap();
    std::thread::sleep(Duration::from_millis(5));
    // While the low stream is stuck in its first operation, high-priority work arrives.
    log_op(&ctx, hi, &log, "stop");
    open.store(true, Ordering::Release);
    ctx.synchronize().unwrap();
    assert_eq!(*log.lock().unwrap(), vec!["stop", "g1", "g2", "g3"]);
}

#[test]
fn blocking_from_inside_a_host_operation_is_an_error_not_a_deadlock() {
    let ctx = Ctx::host().unwrap();
    let s = ctx.stream(0).unwrap();
    let c = ctx.clone();
    ctx.launch_host(s, move || match c.sync_stream(Stream::DEFAULT) {
        Err(Error::WouldDeadlock { .. }) => Ok(()),
        other => Err(HostOpError::msg(format!(
            "expected WouldDeadlock, got {other:?}"
        ))),
    })
    .unwrap();
    ctx.sync_stream(s).unwrap();
}

#[test]
fn objects_of_another_context_are_rejected() {
    let a = Ctx::host().unwrap();
    let b = Ctx::host().unwrap();
    let xa = Buffer::alloc(&a, "xa", 8).unwrap();
    let xb = Buffer::alloc(&b, "xb", 8).unwrap();
    assert!(matches!(
        Buffer::copy(&xa, 0, &xb, 0, 8, Stream::DEFAULT),
        Err(Error::Invalid { .. })
    ));
    let ga = Graph::new(&a, "ga", 0);
    assert!(matches!(ga.bind("p", &xb), Err(Error::Invalid { .. })));
    let mut plan = Plan::new(&b);
    assert!(matches!(
        plan.add(&ga, ShapeKey(0), Stream::DEFAULT),
        Err(Error::Invalid { .. })
    ));
    let eb = b.event().unwrap();
    assert!(matches!(
        a.stream_wait(Stream::DEFAULT, &eb),
        Err(Error::Invalid { .. })
    ));
    // Host graphs cannot adopt arbitrary pointers.
    let mut junk = 0u64;
    // SAFETY: rejected before use.
    let r = unsafe { ga.adopt(ShapeKey(1), &mut junk as *mut u64 as *mut _) };
    assert!(matches!(r, Err(Error::Invalid { .. })));
    // The host backend has no external streams.
    // SAFETY: rejected before use.
    assert!(matches!(
        unsafe { a.wrap_stream(&mut junk as *mut u64 as *mut _) },
        Err(Error::Invalid { .. })
    ));
}

#[test]
fn events_cannot_be_captured_on_the_host_backend() {
    let ctx = Ctx::host().unwrap();
    let ev = ctx.event().unwrap();
    let g = Graph::new(&ctx, "g", 0);
    let e = g.capture(ShapeKey(0), |cs| ev.record(cs)).unwrap_err();
    assert!(matches!(e, Error::Capture { .. }), "{e}");
    let e = g
        .capture(ShapeKey(0), |cs| ctx.sync_stream(cs))
        .unwrap_err();
    assert!(matches!(e, Error::Capture { .. }), "{e}");
}

#[test]
fn graphs_replay_from_several_threads() {
    let ctx = Ctx::host().unwrap();
    let x = Buffer::alloc(&ctx, "x", 8 * 4).unwrap();
    let count = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let g = Graph::new(&ctx, "count", 0);
    let c = count.clone();
    g.bind("x", &x).unwrap();
    g.capture(ShapeKey(0), |cs| {
        ctx.launch_host(cs, move || {
            c.fetch_add(1, Ordering::Relaxed);
            Ok(())
        })
    })
    .unwrap();
    std::thread::scope(|sc| {
        for p in [0, -1, -2, -3] {
            let (ctx, g) = (ctx.clone(), g.clone());
            sc.spawn(move || {
                let s = ctx.stream(p).unwrap();
                for _ in 0..500 {
                    g.replay(ShapeKey(0), s).unwrap();
                }
                ctx.sync_stream(s).unwrap();
            });
        }
    });
    assert_eq!(count.load(Ordering::Relaxed), 2000);
}

#[test]
fn dropping_everything_with_work_pending_is_clean() {
    let ctx = Ctx::host().unwrap();
    let s = ctx.stream(0).unwrap();
    let x = Buffer::alloc(&ctx, "x", 1 << 20).unwrap();
    let y = Buffer::alloc(&ctx, "y", 1 << 20).unwrap();
    for _ in 0..100 {
        Buffer::copy(&y, 0, &x, 0, 1 << 20, s).unwrap();
    }
    let w = x.downgrade();
    drop((x, y, ctx));
    // The queued copies hold the buffers (and the context) until they ran.
    for _ in 0..2000 {
        if !w.is_alive() {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("the buffer was never released");
}

#[test]
fn stream_limit_is_an_error() {
    let ctx = Ctx::host().unwrap();
    let mut n = 1;
    loop {
        match ctx.stream(0) {
            Ok(_) => n += 1,
            Err(e) => {
                assert!(matches!(e, Error::Invalid { .. }), "{e}");
                break;
            }
        }
    }
    assert_eq!(n, frt_exec::MAX_STREAMS);
}

/// A record closure may fail with the caller's own error type: it comes back unchanged (the
/// caller's cause, not a string), and `exec`'s errors inside the closure convert into it.
#[test]
fn a_capture_returns_the_callers_own_error() {
    #[derive(Debug)]
    enum Mine {
        Exec(Error),
        Model { layer: usize },
    }
    impl From<Error> for Mine {
        fn from(e: Error) -> Self {
            Mine::Exec(e)
        }
    }
    impl frt_exec::CaptureError for Mine {}
    let ctx = Ctx::host().unwrap();
    let g = Graph::new(&ctx, "g", 0);
    let e = g
        .capture(ShapeKey(0), |_| Err(Mine::Model { layer: 7 }))
        .unwrap_err();
    assert!(matches!(e, Mine::Model { layer: 7 }), "{e:?}");
    let e = g
        .capture(ShapeKey(0), |cs| Ok(ctx.sync_stream(cs)?))
        .unwrap_err();
    assert!(matches!(e, Mine::Exec(Error::Invalid { .. })), "{e:?}");
    assert_eq!(g.variant_count(), 0);
}

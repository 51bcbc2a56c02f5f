//! Overhead of the execution contract's hot path.
//!
//! `frt-exec-bench [--backend host|cuda] [--rounds N]`
//!
//! * Graph replay: a graph of one empty kernel, submitted by a bare `cuGraphLaunch` of its
//!   executable graph, by `Graph::replay`, and by the C ABI's `frt_graph_replay` (interleaved
//!   A/B/C rounds of 100 submissions; the table gives per-submission host time), and the
//!   round-trip latency of one submission + stream sync.
//! * Plan: a 12-node plan over two streams (a cross-stream dependency between every two
//!   consecutive nodes) by `Plan::execute`, against the same launches, event records and
//!   waits issued by hand with the driver API.
//!
//! On the host backend (no bare driver path) it reports `Graph::replay`, the C ABI and
//! `Plan::execute`. Times are host wall-clock over many iterations after warm-up; median and
//! p99 over rounds.

use flashrt_exec::{
    frt_ctx_create_cuda, frt_ctx_create_host, frt_ctx_destroy, frt_ctx_stream, frt_graph_capture,
    frt_graph_create, frt_graph_replay, frt_launch_host,
};
use frt_exec::cudarc::driver::{result, sys};
use frt_exec::cudarc::nvrtc;
use frt_exec::{BackendKind, Ctx, Graph, Plan, ShapeKey, Stream};
use std::ffi::{CString, c_void};
use std::time::Instant;

const PER_ROUND: usize = 100;

fn stats(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99))
}

fn row(what: &str, v: Vec<f64>) -> (f64, f64) {
    let (m, p) = stats(v);
    println!("| {what:<58} | {m:>9.3} | {p:>9.3} |");
    (m, p)
}

fn header(title: &str) {
    println!("\n{title}\n");
    println!(
        "| {:<58} | {:>9} | {:>9} |",
        "what (per call)", "median µs", "p99 µs"
    );
    println!("|{}|{}|{}|", "-".repeat(60), "-".repeat(11), "-".repeat(11));
}

/// An empty kernel (CUDA) or an empty host operation (host) enqueued on `s`.
struct Noop {
    f: Option<sys::CUfunction>,
}

impl Noop {
    fn new(ctx: &Ctx) -> Noop {
        let Some(_) = ctx.cuda_context() else {
            return Noop { f: None };
        };
        ctx.bind_to_thread().unwrap();
        let ptx = nvrtc::compile_ptx("extern \"C\" __global__ void noop() {}").expect("NVRTC");
        let src = CString::new(ptx.to_src()).unwrap();
        // SAFETY: NUL-terminated PTX; the context is current; the module lives for the process.
        let module = unsafe { result::module::load_data(src.as_ptr() as *const c_void) }.unwrap();
        // SAFETY: the module is loaded.
        let f =
            unsafe { result::module::get_function(module, CString::new("noop").unwrap()) }.unwrap();
        Noop { f: Some(f) }
    }

    fn enqueue(&self, ctx: &Ctx, s: Stream) -> frt_exec::Result<()> {
        match self.f {
            Some(f) => {
                let raw = ctx.raw_stream(s)? as sys::CUstream;
                // SAFETY: `noop` takes no parameters and touches nothing.
                unsafe { result::launch_kernel(f, (1, 1, 1), (32, 1, 1), 0, raw, &mut []) }.map_err(
                    |e| frt_exec::Error::Driver {
                        call: "cuLaunchKernel",
                        code: frt_exec::DriverCode(e.0),
                    },
                )
            }
            None => ctx.launch_host(s, || Ok(())),
        }
    }
}

unsafe extern "C" fn c_noop(_: *mut c_void) {}

unsafe extern "C" fn c_record(user: *mut c_void, stream: *mut c_void) {
    // SAFETY: `user` points to the tuple `main` passes to frt_graph_capture.
    let (ctx, f) = unsafe { *(user as *const (*mut c_void, Option<sys::CUfunction>)) };
    match f {
        // SAFETY: `stream` is the capture stream; `noop` takes no parameters.
        Some(f) => unsafe {
            let _ = result::launch_kernel(
                f,
                (1, 1, 1),
                (32, 1, 1),
                0,
                stream as sys::CUstream,
                &mut [],
            );
        },
        // SAFETY: the host backend's capture stream handle, as documented.
        None => unsafe {
            frt_launch_host(ctx, stream, Some(c_noop), std::ptr::null_mut());
        },
    }
}

fn main() {
    let mut backend = String::from("auto");
    let mut rounds = 300usize;
    let args: Vec<String> = std::env::args().collect();
    let mut i = 1;
    while i < args.len() {
        match args[i].as_str() {
            "--backend" => {
                backend = args.get(i + 1).cloned().unwrap_or_default();
                i += 1;
            }
            "--rounds" => {
                rounds = args
                    .get(i + 1)
                    .and_then(|r| r.parse().ok())
                    .expect("--rounds N");
                i += 1;
            }
            "-h" | "--help" => {
                println!("usage: frt-exec-bench [--backend host|cuda|auto] [--rounds N]");
                return;
            }
            other => {
                eprintln!("unknown argument `{other}` (try --help)");
                std::process::exit(2);
            }
        }
        i += 1;
    }
    let ctx = match backend.as_str() {
        "host" => Ctx::host(),
        "cuda" => Ctx::cuda(0),
        "auto" => Ctx::auto(),
        other => {
            eprintln!("unknown backend `{other}`");
            std::process::exit(2);
        }
    }
    .unwrap_or_else(|e| {
        eprintln!("cannot create the context: {e}");
        std::process::exit(1);
    });
    let cuda = matches!(ctx.backend(), BackendKind::Cuda { .. });
    match ctx.cuda_context() {
        Some(cu) => {
            let mut v = 0;
            // SAFETY: valid out pointer.
            unsafe { sys::cuDriverGetVersion(&mut v) };
            println!(
                "device: {} (CUDA driver API {}.{}), {rounds} rounds",
                cu.name().unwrap_or_default(),
                v / 1000,
                v % 1000 / 10
            );
        }
        None => println!(
            "device: host backend ({} CPUs), {rounds} rounds",
            std::thread::available_parallelism().map_or(1, |n| n.get())
        ),
    }
    let noop = Noop::new(&ctx);
    let s = ctx.stream(0).unwrap();
    let g = Graph::new(&ctx, "noop", 1);
    g.capture(ShapeKey(1), |cs| noop.enqueue(&ctx, cs)).unwrap();
    let exec = g.native_exec(ShapeKey(1)).unwrap() as sys::CUgraphExec;
    let raw = if cuda {
        ctx.raw_stream(s).unwrap() as sys::CUstream
    } else {
        std::ptr::null_mut()
    };

    // The same kind of graph through the C ABI, in a context of its own.
    let cctx = if cuda {
        frt_ctx_create_cuda(0)
    } else {
        frt_ctx_create_host()
    };
    assert!(!cctx.is_null());
    let cs = frt_ctx_stream(cctx, 0);
    // SAFETY: valid name; the handles are live.
    let cg = unsafe { frt_graph_create(cctx, c"noop".as_ptr(), 1) };
    let mut user = (cctx, noop.f);
    // SAFETY: `user` outlives the capture; c_record matches the callback type.
    assert_eq!(
        unsafe { frt_graph_capture(cg, 1, Some(c_record), &mut user as *mut _ as *mut c_void) },
        0
    );
    let c_sync = |c: *mut c_void, st: i32| assert_eq!(flashrt_exec::frt_stream_sync(c, st), 0);

    // --- submission cost, interleaved rounds
    let (mut bare, mut rep, mut capi) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..rounds + 20 {
        if cuda {
            let t = Instant::now();
            for _ in 0..PER_ROUND {
                // SAFETY: `exec` is owned by `g`, alive; `raw` is a stream of this context.
                unsafe { sys::cuGraphLaunch(exec, raw) };
            }
            let dt = t.elapsed().as_secs_f64() * 1e6 / PER_ROUND as f64;
            ctx.sync_stream(s).unwrap();
            if r >= 20 {
                bare.push(dt);
            }
        }
        let t = Instant::now();
        for _ in 0..PER_ROUND {
            g.replay(ShapeKey(1), s).unwrap();
        }
        let dt = t.elapsed().as_secs_f64() * 1e6 / PER_ROUND as f64;
        ctx.sync_stream(s).unwrap();
        if r >= 20 {
            rep.push(dt);
        }
        let t = Instant::now();
        for _ in 0..PER_ROUND {
            frt_graph_replay(cg, 1, cs);
        }
        let dt = t.elapsed().as_secs_f64() * 1e6 / PER_ROUND as f64;
        c_sync(cctx, cs);
        if r >= 20 {
            capi.push(dt);
        }
    }
    header("Graph replay: host time to submit one replay of a 1-kernel graph (100 per round)");
    let b = if cuda {
        Some(row("bare cuGraphLaunch", bare))
    } else {
        None
    };
    let r = row("Graph::replay", rep);
    let c = row("frt_graph_replay (C ABI)", capi);
    if let Some(b) = b {
        println!(
            "| {:<58} | {:>9.3} | {:>9} |",
            "added by Graph::replay (median difference)",
            r.0 - b.0,
            ""
        );
        println!(
            "| {:<58} | {:>9.3} | {:>9} |",
            "added by frt_graph_replay (median difference)",
            c.0 - b.0,
            ""
        );
    }

    // --- round trip: one submission + sync
    let (mut bare, mut rep) = (Vec::new(), Vec::new());
    for it in 0..rounds * 10 + 100 {
        if cuda {
            let t = Instant::now();
            // SAFETY: as above.
            unsafe { sys::cuGraphLaunch(exec, raw) };
            ctx.sync_stream(s).unwrap();
            if it >= 100 {
                bare.push(t.elapsed().as_secs_f64() * 1e6);
            }
        }
        let t = Instant::now();
        g.replay(ShapeKey(1), s).unwrap();
        ctx.sync_stream(s).unwrap();
        if it >= 100 {
            rep.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    header("Graph replay round trip: submit one replay + stream sync");
    if cuda {
        row("bare cuGraphLaunch + cuStreamSynchronize", bare);
    }
    row("Graph::replay + Ctx::sync_stream", rep);

    // --- plan: 12 nodes, 2 streams
    let s2 = ctx.stream(-2).unwrap();
    let mut plan = Plan::new(&ctx);
    let mut prev = None;
    for n in 0..12 {
        let node = plan
            .add(&g, ShapeKey(1), if n % 2 == 0 { s } else { s2 })
            .unwrap();
        if let Some(p) = prev {
            plan.after(node, p).unwrap();
        }
        prev = Some(node);
    }
    let raw2 = if cuda {
        ctx.raw_stream(s2).unwrap() as sys::CUstream
    } else {
        std::ptr::null_mut()
    };
    let bare_evs: Vec<sys::CUevent> = if cuda {
        (0..12)
            .map(|_| {
                let mut e = std::ptr::null_mut();
                // SAFETY: valid out pointer; the context is current.
                unsafe {
                    sys::cuEventCreate(&mut e, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
                };
                e
            })
            .collect()
    } else {
        Vec::new()
    };
    let (mut bare_sub, mut plan_sub, mut bare_rt, mut plan_rt) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for it in 0..rounds * 3 + 50 {
        if cuda {
            let t = Instant::now();
            for n in 0..12 {
                let st = if n % 2 == 0 { raw } else { raw2 };
                // SAFETY: live events, streams and executable graph of this context.
                unsafe {
                    if n > 0 {
                        sys::cuStreamWaitEvent(st, bare_evs[n - 1], 0);
                    }
                    sys::cuGraphLaunch(exec, st);
                    if n < 11 {
                        sys::cuEventRecord(bare_evs[n], st);
                    }
                }
            }
            let sub = t.elapsed().as_secs_f64() * 1e6;
            ctx.sync_stream(s).unwrap();
            ctx.sync_stream(s2).unwrap();
            if it >= 50 {
                bare_sub.push(sub);
                bare_rt.push(t.elapsed().as_secs_f64() * 1e6);
            }
        }
        let t = Instant::now();
        plan.execute(ShapeKey(1)).unwrap();
        let sub = t.elapsed().as_secs_f64() * 1e6;
        plan.sync().unwrap();
        if it >= 50 {
            plan_sub.push(sub);
            plan_rt.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    header(
        "Plan: 12 nodes (1-kernel graphs) over 2 streams, a cross-stream dependency between consecutive nodes",
    );
    let bs = if cuda {
        Some(row(
            "bare driver calls: submit (12 launches, 11 records, 11 waits)",
            bare_sub,
        ))
    } else {
        None
    };
    let ps = row("Plan::execute: submit", plan_sub);
    if cuda {
        row("bare driver calls: submit + sync both streams", bare_rt);
    }
    row("Plan::execute + Plan::sync", plan_rt);
    if let Some(bs) = bs {
        println!(
            "| {:<58} | {:>9.3} | {:>9} |",
            "added by Plan::execute per execute (median difference)",
            ps.0 - bs.0,
            ""
        );
    }
    for e in bare_evs {
        // SAFETY: created above, idle after the syncs.
        unsafe { sys::cuEventDestroy_v2(e) };
    }
    frt_ctx_destroy(cctx);
}

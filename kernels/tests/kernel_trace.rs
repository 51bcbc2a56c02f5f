//! `frt_exec::kernel_trace` on a replayed graph of library kernels and a copy: every kernel and
//! copy of every replay is recorded once, kernels with their entry point's name, in stream
//! order.
//!
//! CUDA only: `cargo test --release -p frt-kernels --test kernel_trace -- --ignored`, with
//! CUPTI's folder on `LD_LIBRARY_PATH`.

use frt_exec::kernel_trace::{KernelTrace, ReplayProfile};
use frt_exec::{Ctx, Graph, ShapeKey};
use frt_kernels::{DType, Kernels, Tensor};

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_trace_records_each_replayed_kernel_once_in_stream_order() {
    let ctx = Ctx::cuda(0).expect("CUDA device 0 (this test needs a CUDA GPU)");
    let s = ctx.stream(0).unwrap();
    let trace = KernelTrace::start().expect("CUPTI (its folder on LD_LIBRARY_PATH)");
    let k = Kernels::new(&ctx).unwrap();
    let t = |name: &str, dt| Tensor::alloc(&ctx, name, dt, &[64, 256]).unwrap();
    let (x, h, y, y2, z) = (
        t("x", DType::F32),
        t("h", DType::BF16),
        t("y", DType::BF16),
        t("y2", DType::BF16),
        t("z", DType::F32),
    );
    x.write_f32(s, &vec![0.5; 64 * 256]).unwrap();
    let g = Graph::new(&ctx, "traced", 0);
    g.capture(ShapeKey(1), |cs| {
        k.cast(cs, &x, &h)?;
        k.softmax(cs, &h, &y)?;
        // A copy node between the kernels.
        let bytes = 64 * 256 * 2;
        frt_exec::Buffer::copy(y2.buffer(), 0, y.buffer(), 0, bytes, cs)?;
        k.cast(cs, &y2, &z)
    })
    .unwrap();
    ctx.sync_stream(s).unwrap();
    trace.take().unwrap();
    let replays = 5;
    for _ in 0..replays {
        g.replay(ShapeKey(1), s).unwrap();
    }
    ctx.sync_stream(s).unwrap();
    let records = trace.take().unwrap();
    assert_eq!(records.len(), 4 * replays, "{records:#?}");
    assert!(records.iter().all(|r| r.start_ns < r.end_ns && r.node != 0));
    let p = ReplayProfile::new(&records, replays).unwrap();
    let names: Vec<&str> = p.kernels.iter().map(|k| k.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "cast_f32_bf16",
            "softmax_bf16",
            "[memcpy 32768 bytes]",
            "cast_bf16_f32"
        ]
    );
    // Plain launches on one stream: each starts after the one before has ended.
    assert!(p.kernels.iter().all(|k| k.gap_us >= 0.0), "{p:#?}");
    assert!(p.busy_us <= p.span_us && p.busy_us > 0.0);
    // Softmax of equal values: 1/256 everywhere, through the graph.
    assert!(z.read_f32(s).unwrap().iter().all(|&v| v == 1.0 / 256.0));
    // One trace at a time.
    assert!(KernelTrace::start().is_err());
}

//! The disk caches (CUDA only): NVRTC kernels compiled once, reused, a damaged entry rebuilt;
//! GEMM tuning results kept, reused by the next start without timing again, a damaged line
//! tuned again, an entry of its own for ops whose graphs keep their memset nodes. `cargo test -p frt-kernels --test cache -- --ignored` (one test: it sets
//! FRT_KERNEL_CACHE).

use frt_exec::Ctx;
use frt_kernels::{DType, Kernels, Tensor};
use std::time::{Duration, SystemTime};

fn cubins(dir: &std::path::Path) -> Vec<(std::path::PathBuf, SystemTime)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "cubin"))
        .map(|p| {
            let t = std::fs::metadata(&p).unwrap().modified().unwrap();
            (p, t)
        })
        .collect();
    v.sort();
    v
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn kernels_are_compiled_once_and_cached_on_disk() {
    let dir = std::env::temp_dir().join(format!("frt-kernel-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // SAFETY: this test binary has one test; nothing else reads the environment concurrently.
    unsafe { std::env::set_var("FRT_KERNEL_CACHE", &dir) };
    let ctx = Ctx::cuda(0).unwrap();
    let t = std::time::Instant::now();
    let k = Kernels::new(&ctx).unwrap();
    let cold = t.elapsed();
    let first = cubins(&dir);
    assert_eq!(
        first.len(),
        frt_kernels::CUDA_SOURCE_COUNT,
        "one cubin per kernels/cuda/*.cu: {first:?}"
    );
    for (p, _) in &first {
        assert!(
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .contains(&k.target()),
            "{p:?} names the architecture"
        );
    }
    std::thread::sleep(Duration::from_millis(20));
    let t = std::time::Instant::now();
    let _k2 = Kernels::new(&ctx).unwrap();
    let warm = t.elapsed();
    assert_eq!(
        cubins(&dir),
        first,
        "a second start reuses the cache (no file rewritten)"
    );
    // A damaged entry is compiled again and replaced.
    std::fs::write(&first[0].0, b"not a cubin").unwrap();
    let _k3 = Kernels::new(&ctx).unwrap();
    assert!(
        std::fs::read(&first[0].0).unwrap().len() > 100,
        "the damaged entry was rebuilt"
    );
    println!("kernel registry: cold start {cold:?} (NVRTC), warm start {warm:?} (disk cache)");

    // GEMM tuning: a GEMM large enough to be tuned, planned by three "processes" (Kernels
    // registries read the disk cache when they load).
    let s = ctx.stream(0).unwrap();
    let (m, n, kk) = (512, 1024, 1024);
    let x = Tensor::alloc(&ctx, "x", DType::BF16, &[m, kk]).unwrap();
    let w = Tensor::alloc(&ctx, "w", DType::BF16, &[n, kk]).unwrap();
    let out = Tensor::alloc(&ctx, "out", DType::BF16, &[m, n]).unwrap();
    x.write_f32(
        s,
        &(0..m * kk)
            .map(|i| ((i % 97) as f32 - 48.0) / 64.0)
            .collect::<Vec<_>>(),
    )
    .unwrap();
    w.write_f32(
        s,
        &(0..n * kk)
            .map(|i| ((i % 89) as f32 - 44.0) / 512.0)
            .collect::<Vec<_>>(),
    )
    .unwrap();
    let tuning = || -> std::path::PathBuf {
        std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("gemm-tuning-")
            })
            .expect("a GEMM tuning file")
    };
    let product = |k: &Kernels| -> (Vec<f32>, Duration) {
        let t = std::time::Instant::now();
        let g = k.linear(&x, &w, &out, false, false).unwrap();
        let planned = t.elapsed();
        g.run(s, &x, &w, &out, None).unwrap();
        (out.read_f32(s).unwrap(), planned)
    };
    let (first_out, tuned) = product(&Kernels::new(&ctx).unwrap());
    let lines = std::fs::read_to_string(tuning()).unwrap();
    assert_eq!(lines.lines().count(), 1, "one line per GEMM: {lines}");
    let (again, cached) = product(&Kernels::new(&ctx).unwrap());
    assert_eq!(
        std::fs::read_to_string(tuning()).unwrap(),
        lines,
        "the next start reuses the result (nothing appended)"
    );
    assert!(
        again
            .iter()
            .zip(&first_out)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "the same algorithm: the same bits"
    );
    std::fs::write(tuning(), "garbage\tline\n").unwrap();
    let (third, _) = product(&Kernels::new(&ctx).unwrap());
    let after = std::fs::read_to_string(tuning()).unwrap();
    assert_eq!(
        after.lines().count(),
        2,
        "tuned again and appended: {after}"
    );
    assert!(
        third
            .iter()
            .zip(&first_out)
            .all(|(a, b)| (a - b).abs() <= 1e-2 * b.abs().max(1.0))
    );
    // Ops whose graphs keep their memset nodes time their candidates in other graphs: their
    // own entry, appended once, and the first entry still serves the default.
    let plain = frt_kernels::KernelOptions {
        memset_kernels: false,
        ..frt_kernels::KernelOptions::default()
    };
    product(&Kernels::with_options(&ctx, plain).unwrap());
    let with_plain = std::fs::read_to_string(tuning()).unwrap();
    assert_eq!(
        with_plain.lines().count(),
        3,
        "an entry for memset nodes as captured: {with_plain}"
    );
    product(&Kernels::with_options(&ctx, plain).unwrap());
    product(&Kernels::new(&ctx).unwrap());
    assert_eq!(
        std::fs::read_to_string(tuning()).unwrap(),
        with_plain,
        "both settings' entries reused"
    );
    println!("GEMM {m}×{n}×{kk} bf16 plan: tuned {tuned:?}, from the disk cache {cached:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

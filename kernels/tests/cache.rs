//! The NVRTC disk cache (CUDA only): compiled once, reused, and a damaged entry is rebuilt.
//! `cargo test -p frt-kernels --test cache -- --ignored` (one test: it sets FRT_KERNEL_CACHE).

use frt_exec::Ctx;
use frt_kernels::Kernels;
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
    assert_eq!(first.len(), 6, "one cubin per kernels/cuda/*.cu: {first:?}");
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
    let _ = std::fs::remove_dir_all(&dir);
}

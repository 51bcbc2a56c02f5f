//! The CUDA kernels build for the GPUs this project targets but that are not at hand: every
//! `kernels/cuda/*.cu` compiled by the machine's NVRTC for Ampere (sm_80), Jetson Orin
//! (sm_87), Ada (sm_89), Hopper (sm_90, and sm_90a, as a Hopper device builds them: `wgmma`),
//! Blackwell (sm_100, sm_120) and Jetson AGX Thor (sm_110). Needs NVRTC (a CUDA install, or NVIDIA's `nvidia-cuda-nvrtc` wheel, which
//! `scripts/test.sh` installs for CI), not a GPU of any kind:
//! `cargo test -p frt-kernels --test targets -- --ignored --nocapture`.

#[test]
#[ignore = "needs NVRTC (scripts/test.sh provides it)"]
fn kernels_compile_for_every_target_architecture() {
    let archs = [
        "sm_80", "sm_87", "sm_89", "sm_90", "sm_90a", "sm_100", "sm_110", "sm_120",
    ];
    // The architectures compile on threads of their own (NVRTC programs are independent).
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = archs
            .iter()
            .map(|&arch| s.spawn(move || (arch, frt_kernels::cuda_compile_for(arch))))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut failed = Vec::new();
    for (arch, result) in results {
        match result {
            Ok(files) => {
                assert_eq!(files.len(), frt_kernels::CUDA_SOURCE_COUNT);
                let sizes: Vec<String> = files
                    .iter()
                    .map(|(f, n)| format!("{f} {} KiB", n.div_ceil(1024)))
                    .collect();
                println!("{arch}: {}", sizes.join(", "));
            }
            Err(e) => {
                println!("{arch}: {e}");
                failed.push(arch);
            }
        }
    }
    assert!(failed.is_empty(), "no build for {failed:?}");
    // An architecture NVRTC does not know is an error naming it, not a crash.
    let e = frt_kernels::cuda_compile_for("sm_1")
        .unwrap_err()
        .to_string();
    assert!(e.contains("sm_1"), "{e}");
}

//! The CUDA kernels build for the GPUs this project targets but that are not at hand: every
//! `kernels/cuda/*.cu` compiled by the machine's NVRTC for Ampere (sm_80), Jetson Orin
//! (sm_87), Ada (sm_89), Hopper (sm_90, and sm_90a, as a Hopper device builds them: `wgmma`),
//! Blackwell (sm_100, sm_120) and Jetson AGX Thor (sm_110), without ptxas serializing any
//! `wgmma` kernel's MMAs. Needs NVRTC (a CUDA install, or NVIDIA's `nvidia-cuda-nvrtc` wheel, which
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
    let mut serialized = Vec::new();
    for (arch, result) in results {
        match result {
            Ok(files) => {
                assert_eq!(files.len(), frt_kernels::CUDA_SOURCE_COUNT);
                let sizes: Vec<String> = files
                    .iter()
                    .map(|c| format!("{} {} KiB", c.file, c.bytes.div_ceil(1024)))
                    .collect();
                println!("{arch}: {}", sizes.join(", "));
                serialized.extend(files.iter().flat_map(|c| wgmma_losses(arch, c)));
            }
            Err(e) => {
                println!("{arch}: {e}");
                failed.push(arch);
            }
        }
    }
    assert!(failed.is_empty(), "no build for {failed:?}");
    // ptxas runs a `wgmma` kernel's MMAs one after another (or waits where the source does
    // not) when something may read their sums while they are in flight: a slow kernel that
    // still computes the right numbers, which only its log tells.
    assert!(serialized.is_empty(), "{}", serialized.join("\n"));
    // An architecture NVRTC does not know is an error naming it, not a crash.
    let e = frt_kernels::cuda_compile_for("sm_1")
        .unwrap_err()
        .to_string();
    assert!(e.contains("sm_1"), "{e}");
}

/// ptxas's notes in `c`'s log that it serialized `wgmma`s or added a wait for them (C7514 to
/// C7520, "Potential Performance Loss" / "wgmma.wait_group is injected"), each naming the
/// architecture and file.
fn wgmma_losses(arch: &str, c: &frt_kernels::CudaCompiled) -> Vec<String> {
    c.log
        .lines()
        .filter(|l| l.contains("wgmma") && (l.contains("(C75") || l.contains("Performance Loss")))
        .map(|l| format!("{arch} {}: {}", c.file, l.trim()))
        .collect()
}

/// The check above finds what ptxas says of a `wgmma` loop that reads its sum while an MMA is
/// in flight, and nothing in a log without such a note.
#[test]
fn wgmma_losses_are_found_in_a_log() {
    let noted = frt_kernels::CudaCompiled {
        file: "mlp.cu",
        bytes: 1,
        log: "ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions \
              are serialized due to non wgmma instructions reading accumulator registers of a \
              wgmma between start and end of the pipeline stage in the function 'k'\n\
              ptxas info    : (C7517) wgmma.wait_group is injected in around line 8017 by \
              compiler to allow use of registers defined by GMMA in function 'k'"
            .into(),
    };
    let found = wgmma_losses("sm_90a", &noted);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found[0].starts_with("sm_90a mlp.cu: ") && found[0].contains("C7514"));
    let plain = frt_kernels::CudaCompiled {
        file: "mlp.cu",
        bytes: 1,
        log: "mlp.cu(414): warning #1556-D: name linkage conflicts".into(),
    };
    assert!(wgmma_losses("sm_90a", &plain).is_empty());
}

//! The CUDA kernels build for the GPUs this project targets but that are not at hand: every
//! `kernels/cuda/*.cu` compiled by the machine's NVRTC for Ampere (sm_80), Jetson Orin
//! (sm_87), Ada (sm_89), Hopper (sm_90, and sm_90a, as a Hopper device builds them: `wgmma`),
//! Blackwell (sm_100, sm_120) and Jetson AGX Thor (sm_110), without a warning, without ptxas
//! serializing any `wgmma` kernel's MMAs, and with the row kernels (norms, softmax,
//! elementwise) within a register budget on Hopper. Needs NVRTC (a CUDA install, or NVIDIA's
//! `nvidia-cuda-nvrtc` wheel, which `scripts/test.sh` installs for CI), not a GPU of any kind:
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
    let mut heavy = Vec::new();
    let mut warned = Vec::new();
    for (arch, result) in results {
        match result {
            Ok(files) => {
                if arch == "sm_90a" {
                    heavy = heavy_row_kernels(&files);
                }
                assert_eq!(files.len(), frt_kernels::CUDA_SOURCE_COUNT);
                let sizes: Vec<String> = files
                    .iter()
                    .map(|c| format!("{} {} KiB", c.file, c.bytes.div_ceil(1024)))
                    .collect();
                println!("{arch}: {}", sizes.join(", "));
                serialized.extend(files.iter().flat_map(|c| wgmma_losses(arch, c)));
                warned.extend(files.iter().flat_map(|c| compiler_warnings(arch, c)));
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
    assert!(heavy.is_empty(), "{}", heavy.join("\n"));
    // A warning is a source the compiler reads otherwise than written (a `#pragma` inside a
    // macro's argument is dropped, say): none is let through.
    assert!(warned.is_empty(), "{}", warned.join("\n"));
    // An architecture NVRTC does not know is an error naming it, not a crash.
    let e = frt_kernels::cuda_compile_for("sm_1")
        .unwrap_err()
        .to_string();
    assert!(e.contains("sm_1"), "{e}");
}

/// Kernels launched with a block per row (or a thread per few elements) over many rows: with
/// the block sizes they launch with, more registers than this would leave an SM fewer rows in
/// flight than it can hold (a rarely used form compiled into the same kernel once took
/// `rms_norm` to 96).
const ROW_KERNEL_REGISTERS: u32 = 64;
const ROW_KERNELS: [&str; 14] = [
    "rms_norm_plain_bf16",
    "rms_norm_few_bf16",
    "layer_norm_bf16",
    "softmax_bf16",
    "masked_softmax_vec3_bf16",
    "binary_bf16",
    "unary_bf16",
    "gated_residual_bf16",
    "rope_qkv_bf16",
    "rope_qkv_table_bf16",
    "cast_f32_bf16",
    "embedding_bf16",
    "quantize_e4m3_bf16",
    "resize_pad_pixels",
];

/// The row kernels of [`ROW_KERNELS`] that take more than [`ROW_KERNEL_REGISTERS`] registers
/// or spill, or that the compiled sources lack; printing every kernel's registers.
fn heavy_row_kernels(files: &[frt_kernels::CudaCompiled]) -> Vec<String> {
    let all: Vec<_> = files
        .iter()
        .flat_map(|c| frt_kernels::cuda_kernel_resources(&c.log))
        .collect();
    let listed: Vec<String> = all
        .iter()
        .filter(|k| k.name.ends_with("_bf16") || !k.name.contains("_f"))
        .map(|k| format!("{} {}", k.name, k.registers))
        .collect();
    println!("sm_90a registers a thread: {}", listed.join(", "));
    ROW_KERNELS
        .iter()
        .filter_map(|&name| match all.iter().find(|k| k.name == name) {
            None => Some(format!("{name}: not in any source's ptxas report")),
            Some(k) if k.registers > ROW_KERNEL_REGISTERS || k.spill_stores > 0 => Some(format!(
                "{name}: {} registers, {} bytes spilled (at most {ROW_KERNEL_REGISTERS}, none)",
                k.registers, k.spill_stores
            )),
            Some(_) => None,
        })
        .collect()
}

/// What ptxas reports of each kernel is read from its verbose log, the last kernel included.
#[test]
fn kernel_resources_are_read_from_a_log() {
    let log = "ptxas info    : 0 bytes gmem\n\
               ptxas info    : Compiling entry function 'rms_norm_bf16' for 'sm_90a'\n\
               ptxas info    : Function properties for rms_norm_bf16\n\
               ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
               ptxas info    : Used 96 registers, used 1 barriers, 128 bytes smem\n\
               ptxas info    : Compiling entry function 'flash_attention_d256_bf16' for 'sm_90a'\n\
               ptxas info    : Function properties for flash_attention_d256_bf16\n\
               ptxas         .     40 bytes stack frame, 36 bytes spill stores, 36 bytes spill loads\n\
               ptxas info    : Used 254 registers, used 1 barriers, 40 bytes cumulative stack size";
    let found = frt_kernels::cuda_kernel_resources(log);
    let want = |name: &str, registers, spill_stores| frt_kernels::CudaKernelResources {
        name: name.into(),
        registers,
        spill_stores,
    };
    assert_eq!(
        found,
        [
            want("rms_norm_bf16", 96, 0),
            want("flash_attention_d256_bf16", 254, 36)
        ]
    );
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

/// The compiler's and ptxas's warnings in `c`'s log, each naming the architecture and file.
fn compiler_warnings(arch: &str, c: &frt_kernels::CudaCompiled) -> Vec<String> {
    c.log
        .lines()
        .filter(|l| l.to_ascii_lowercase().contains("warning"))
        .map(|l| format!("{arch} {}: {}", c.file, l.trim()))
        .collect()
}

/// The checks above find what ptxas says of a `wgmma` loop that reads its sum while an MMA is
/// in flight, and nothing in a log without such a note; and a warning, but not ptxas's notes.
#[test]
fn wgmma_losses_and_warnings_are_found_in_a_log() {
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
    // The same log is a warning to the warnings check, and a log of ptxas's reports is not.
    assert_eq!(compiler_warnings("sm_90a", &plain).len(), 1);
    assert!(compiler_warnings("sm_90a", &noted).is_empty());
}

//! What a build reads of the stored weights: `Pi05Weights::bytes_a_build_reads` is exactly what
//! `frt_nn::bytes_read` counts while a tiny model builds on the host, in 16 bits and in FP8
//! with and without SigLIP (whose projections an FP8 vision reads twice), also from a
//! checkpoint with its FP8 weights pre-quantized. One test in its own
//! binary: the counter is the process's, so no other build may run beside it.

use frt_exec::Ctx;
use frt_kernels::DType;
use frt_vla::{ModelImage, Observation, Pi05, Pi05Config, Pi05Options, Pi05Weights, ViewImage};

mod common;
use common::rand;

#[test]
fn a_build_reads_what_bytes_a_build_reads_says() {
    let ctx = Ctx::host().unwrap();
    let s = ctx.stream(0).unwrap();
    let c = Pi05Config::tiny();
    let w = Pi05Weights::random(&c, 3);
    let build = |o: &Pi05Options| {
        let before = frt_nn::bytes_read();
        let m = Pi05::build(&ctx, s, &w, o).unwrap();
        (m, frt_nn::bytes_read() - before)
    };
    let sixteen = Pi05Options::new(DType::BF16);
    let (base, read) = build(&sixteen);
    assert_eq!(read, w.bytes_a_build_reads(&sixteen));
    // Every stored tensor once, but the language model's final norm (64 f32 values).
    assert_eq!(read, w.stored_bytes() - 64 * 4, "16 bits");

    let px = c.siglip.image_size * c.siglip.image_size * 3;
    let images: Vec<ModelImage> = (0..c.views as u32)
        .map(|v| ModelImage::new(rand(v, px, 1.0)).unwrap())
        .collect();
    let views: Vec<Option<ViewImage>> = images.iter().map(|i| Some(ViewImage::Pixels(i))).collect();
    let noise = rand(9, c.action_horizon * c.action_dim, 1.0);
    let obs = Observation {
        state: &[],
        images: &views,
        tokens: &[2, 17, 99, 301, 5],
        noise: &noise,
    };
    let cal = base.calibrate(std::slice::from_ref(&obs), 100.0).unwrap();
    for vision in [false, true] {
        let mut o = Pi05Options::new(DType::BF16);
        o.fp8 = Some(cal.clone());
        o.fp8_vision = vision;
        o.fp8_keep_16bit = false;
        let (_, read) = build(&o);
        assert_eq!(read, w.bytes_a_build_reads(&o), "FP8, vision {vision}");
        let twice = w.bytes_a_build_reads(&o) - w.bytes_a_build_reads(&sixteen);
        // SigLIP's q, k, v, out, fc1 and fc2 weights, stored in f32.
        let sg = &c.siglip;
        let projections = sg.depth * (4 * sg.width * sg.width + 2 * sg.width * sg.mlp) * 4;
        assert_eq!(
            twice,
            if vision { projections as u64 } else { 0 },
            "vision {vision}"
        );
    }
    // From a checkpoint whose FP8 weights are pre-quantized (codes and their scales): what
    // the build reads, every stored tensor once (SigLIP's codes and scales twice in FP8).
    let dir = std::env::temp_dir().join(format!("frt-vla-build-reads-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    w.write(&dir.join("bf16"), true, 1, false).unwrap();
    Pi05Weights::load(&dir.join("bf16"), &c)
        .unwrap()
        .write_fp8(true, true, &dir.join("fp8"))
        .unwrap();
    let q = Pi05Weights::load(&dir.join("fp8"), &c).unwrap();
    for vision in [false, true] {
        let mut o = Pi05Options::new(DType::BF16);
        o.fp8 = Some(cal.clone());
        o.fp8_vision = vision;
        o.fp8_keep_16bit = false;
        let before = frt_nn::bytes_read();
        Pi05::build(&ctx, s, &q, &o).unwrap();
        let read = frt_nn::bytes_read() - before;
        assert_eq!(
            read,
            q.bytes_a_build_reads(&o),
            "pre-quantized, vision {vision}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

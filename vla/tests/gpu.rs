//! Pi0.5 and Pi0 on CUDA against the host backend (same weights, inputs, noise).
//! `cargo test -p frt-vla --test gpu -- --ignored --nocapture` on a machine with a GPU.

use frt_exec::Ctx;
use frt_kernels::{DType, KernelOptions};
use frt_vla::{
    ModelImage, Observation, Pi05, Pi05Config, Pi05Options, Pi05Weights, PromptMode, ViewImage,
};

mod common;
use common::rand;

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

/// CUDA in `cuda_dtype` against the host in f32 (fixed prompt mode), once per prompt mode: the
/// actions' cosine at least `min_cos` and their largest difference at most `max_rel` times
/// the host actions' root mean square.
fn compare(c: &Pi05Config, cuda_dtype: DType, min_cos: f64, max_rel: f64) {
    let t = std::time::Instant::now();
    let w = Pi05Weights::random(c, 42);
    println!("random weights: {:?}", t.elapsed());
    let px = c.siglip.image_size * c.siglip.image_size * 3;
    let images: Vec<ModelImage> = (0..c.views as u32)
        .map(|v| ModelImage::new(rand(10 + v, px, 1.0)).unwrap())
        .collect();
    let imgs: Vec<Option<ViewImage>> = images
        .iter()
        .enumerate()
        .map(|(v, im)| (v != 1 || c.views < 3).then_some(ViewImage::Pixels(im)))
        .collect();
    let tokens: Vec<u32> = (0..40u32)
        .map(|i| 2 + (i * 7919) % (c.vocab as u32 - 2))
        .collect();
    let noise = rand(7, c.action_horizon * c.action_dim, 1.7);
    // Pi0's state input (Pi0.5 does not read it).
    let state = rand(3, 14, 0.8);
    let obs = Observation {
        state: &state,
        images: &imgs,
        tokens: &tokens,
        noise: &noise,
    };
    let run = |ctx: Ctx, dt: DType, mode: PromptMode| -> Vec<f32> {
        let t = std::time::Instant::now();
        let s = ctx.stream(0).unwrap();
        // The kernel options from the environment (FRT_GEMM_TUNING=0 etc., for A/B runs).
        let mut o = Pi05Options::new(dt);
        o.prompt_mode = mode;
        o.kernels = KernelOptions::from_env().unwrap();
        let m = Pi05::build(&ctx, s, &w, &o).unwrap();
        let built = t.elapsed();
        let a = m.infer(&obs).unwrap();
        println!(
            "{:?} {} {mode:?}: built in {built:?}, inference in {:?}",
            ctx.backend(),
            dt.name(),
            t.elapsed() - built
        );
        a
    };
    let host = run(Ctx::host().unwrap(), DType::F32, PromptMode::Fixed);
    for mode in [PromptMode::Fixed, PromptMode::Exact] {
        let cuda = run(Ctx::cuda(0).unwrap(), cuda_dtype, mode);
        let cos = cosine(&host, &cuda);
        let max_abs = host
            .iter()
            .zip(&cuda)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max) as f64;
        let rms =
            (host.iter().map(|a| (*a as f64).powi(2)).sum::<f64>() / host.len() as f64).sqrt();
        println!(
            "CUDA {} ({mode:?} prompt) vs host f32: cosine {cos:.7} (1 − cos {:.2e}), max |Δ| {max_abs:.4} ({:.2e} of the actions' rms {rms:.3}) over {} actions",
            cuda_dtype.name(),
            1.0 - cos,
            max_abs / rms,
            host.len()
        );
        // Cosine is blind to scale: the largest difference is bounded too.
        assert!(
            max_abs <= max_rel * rms,
            "{mode:?}: max |Δ| {max_abs} > {max_rel} × rms {rms}"
        );
        assert!(cos >= min_cos, "{mode:?}: cosine {cos} < {min_cos}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn tiny_cuda_f32_matches_the_host() {
    compare(&Pi05Config::tiny(), DType::F32, 0.9999, 1e-5);
}

#[test]
#[ignore = "needs a CUDA GPU (and ~50 GB of host memory: the host reference runs at full size)"]
fn full_size_cuda_bf16_matches_host_f32() {
    let mut c = Pi05Config::base();
    c.views = 2;
    c.max_token_len = 64;
    compare(&c, DType::BF16, 0.999, 0.05);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn tiny_pi0_cuda_f32_matches_the_host() {
    compare(&Pi05Config::pi0_tiny(), DType::F32, 0.9999, 1e-5);
}

#[test]
#[ignore = "needs a CUDA GPU (and ~50 GB of host memory: the host reference runs at full size)"]
fn full_size_pi0_cuda_bf16_matches_host_f32() {
    let mut c = Pi05Config::pi0_base();
    c.views = 2;
    compare(&c, DType::BF16, 0.999, 0.05);
}

/// The tiny model's inputs: every view a random image (seed `image_seed` + its slot), a fixed
/// prompt and random noise (seed `noise_seed`).
struct TinyInputs {
    images: Vec<ModelImage>,
    tokens: [u32; 8],
    noise: Vec<f32>,
}

impl TinyInputs {
    fn new(c: &Pi05Config, image_seed: u32, noise_seed: u32) -> TinyInputs {
        let px = c.siglip.image_size * c.siglip.image_size * 3;
        TinyInputs {
            images: (0..c.views as u32)
                .map(|v| ModelImage::new(rand(image_seed + v, px, 1.0)).unwrap())
                .collect(),
            tokens: [2, 17, 99, 301, 5, 42, 7, 108],
            noise: rand(noise_seed, c.action_horizon * c.action_dim, 1.7),
        }
    }

    /// Every view present.
    fn views(&self) -> Vec<Option<ViewImage<'_>>> {
        self.images
            .iter()
            .map(|i| Some(ViewImage::Pixels(i)))
            .collect()
    }

    fn observation<'a>(&'a self, views: &'a [Option<ViewImage<'a>>]) -> Observation<'a> {
        Observation {
            state: &[],
            images: views,
            tokens: &self.tokens,
            noise: &self.noise,
        }
    }
}

/// Options in `dt` with cuBLASLt's first choice of algorithm for every GEMM: builds compared bit
/// for bit must not time candidates, which tests running beside them on the GPU can make
/// another one win (seen with the suite on several threads).
fn untuned(dt: DType) -> Pi05Options {
    Pi05Options {
        kernels: KernelOptions {
            gemm_tuning: false,
            ..KernelOptions::default()
        },
        ..Pi05Options::new(dt)
    }
}

/// Frozen-prefix denoising on CUDA: with 0 frozen rows bit-identical to the model built
/// without it, the frozen rows equal to the given actions, and the whole chunk as the host
/// computes it (tiny model, f32; bf16 with its rounding).
#[test]
#[ignore = "needs a CUDA GPU"]
fn frozen_prefix_on_cuda_matches_the_host() {
    let c = Pi05Config::tiny();
    let w = Pi05Weights::random(&c, 9);
    let inputs = TinyInputs::new(&c, 20, 8);
    let imgs = inputs.views();
    let obs = inputs.observation(&imgs);
    let frozen = rand(77, c.action_horizon * c.action_dim, 0.9);
    let (k, d) = (7, c.action_dim);
    let run = |ctx: Ctx, dt: DType, inpaint: bool, rows: usize| -> Vec<f32> {
        let s = ctx.stream(0).unwrap();
        let m = Pi05::build(
            &ctx,
            s,
            &w,
            &Pi05Options {
                prompt_mode: PromptMode::Fixed,
                inpaint_prefix: inpaint,
                ..untuned(dt)
            },
        )
        .unwrap();
        if inpaint {
            m.set_frozen_prefix(rows, &frozen).unwrap();
        }
        m.infer(&obs).unwrap()
    };
    let host = run(Ctx::host().unwrap(), DType::F32, true, k);
    for dt in [DType::F32, DType::BF16] {
        let cuda = || Ctx::cuda(0).unwrap();
        let plain = run(cuda(), dt, false, 0);
        assert_eq!(run(cuda(), dt, true, 0), plain, "{}: 0 rows", dt.name());
        let a = run(cuda(), dt, true, k);
        let worst = a[..k * d]
            .iter()
            .zip(&frozen)
            .map(|(x, f)| (x - f).abs() / (1.0 + f.abs()))
            .fold(0f32, f32::max);
        let cos = cosine(&host, &a);
        println!(
            "frozen prefix CUDA {}: frozen rows max rel |Δ| {worst:.2e}, cosine to host f32 {cos:.6}",
            dt.name()
        );
        let (tol, min_cos) = if dt == DType::F32 {
            (0.0, 0.9999)
        } else {
            (8e-3, 0.999)
        };
        assert!(worst <= tol, "{}: frozen rows off by {worst}", dt.name());
        assert!(cos >= min_cos, "{}: cosine {cos}", dt.name());
    }
}

/// The action tokens' RoPE angles are computed once an inference, in its first step, from the
/// positions the prompt wrote: a CUDA model that ran one prompt and then a shorter one (its
/// action tokens three positions earlier) gives for the second the bits of a model that only
/// ran that one, and the host's actions (tiny model, f32).
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_new_prompt_moves_the_action_tokens_on_cuda() {
    let c = Pi05Config::tiny();
    let w = Pi05Weights::random(&c, 13);
    let inputs = TinyInputs::new(&c, 40, 11);
    let imgs = inputs.views();
    let (long, short) = (&inputs.tokens[..], &inputs.tokens[..5]);
    let run = |ctx: Ctx, prompts: &[&[u32]]| -> Vec<f32> {
        let s = ctx.stream(0).unwrap();
        let m = Pi05::build(&ctx, s, &w, &untuned(DType::F32)).unwrap();
        let mut actions = Vec::new();
        for tokens in prompts {
            let obs = Observation {
                tokens,
                ..inputs.observation(&imgs)
            };
            actions = m.infer(&obs).unwrap();
        }
        actions
    };
    let host = run(Ctx::host().unwrap(), &[short]);
    let fresh = run(Ctx::cuda(0).unwrap(), &[short]);
    let after = run(Ctx::cuda(0).unwrap(), &[long, short]);
    assert_eq!(after, fresh, "the shorter prompt after the longer one");
    let cos = cosine(&host, &after);
    println!("after a longer prompt: cosine to the host {cos:.8}");
    assert!(cos >= 0.9999, "cosine {cos}");
    assert_ne!(
        run(Ctx::cuda(0).unwrap(), &[long]),
        after,
        "the prompts give other actions"
    );
}

/// A halt on the highest-priority stream while an inference runs on the policy stream: the
/// halt's output is the hold chunk however the two interleave (read at once, and again after
/// the inference finished), and the inference's output is its own actions.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_halt_during_an_inference_keeps_both_outputs_on_cuda() {
    let c = Pi05Config::tiny();
    let w = Pi05Weights::random(&c, 5);
    let inputs = TinyInputs::new(&c, 30, 6);
    let imgs = inputs.views();
    let obs = inputs.observation(&imgs);
    let ctx = Ctx::cuda(0).unwrap();
    let s = ctx.stream(ctx.priority_range().0).unwrap();
    let hi = ctx.stream(ctx.priority_range().1).unwrap();
    let m = Pi05::build(&ctx, s, &w, &Pi05Options::new(DType::F32)).unwrap();
    let actions = m.infer(&obs).unwrap();
    let hold: Vec<f32> = (0..actions.len()).map(|n| n as f32 * 0.001 - 0.3).collect();
    m.set_hold(hi, &hold).unwrap();
    let mut out = vec![0f32; actions.len()];
    for round in 0..20 {
        // Every stage queued (the last ones still to run), then the halt ahead of them.
        m.set_inputs(&obs).unwrap();
        m.run().unwrap();
        m.halt(hi).unwrap();
        m.read_halt(hi, &mut out).unwrap();
        assert_eq!(out, hold, "round {round}: the halt's output, read at once");
        m.read_actions(s, &mut out).unwrap();
        assert_eq!(out, actions, "round {round}: the inference's output");
        m.read_halt(hi, &mut out).unwrap();
        assert_eq!(
            out, hold,
            "round {round}: the halt's output after the inference"
        );
    }
}

/// Absent views left out (packed, the default) against every slot encoded and absent ones
/// masked, on CUDA: within tolerance of each other (tiny f32 and full-size bf16), for each
/// pattern of present views of three slots.
fn absent_views_match_the_masked_computation(c: &Pi05Config, dt: DType, min_cos: f64) {
    let w = Pi05Weights::random(c, 42);
    let ctx = Ctx::cuda(0).unwrap();
    let build = |compact_views: bool| {
        Pi05::build(
            &ctx,
            ctx.stream(0).unwrap(),
            &w,
            &frt_vla::Pi05Options {
                compact_views,
                ..frt_vla::Pi05Options::new(dt)
            },
        )
        .unwrap()
    };
    let (compact, masked) = (build(true), build(false));
    let px = c.siglip.image_size * c.siglip.image_size * 3;
    let images: Vec<ModelImage> = (0..c.views as u32)
        .map(|v| ModelImage::new(rand(10 + v, px, 1.0)).unwrap())
        .collect();
    let tokens: Vec<u32> = (0..40u32)
        .map(|i| 2 + (i * 7919) % (c.vocab as u32 - 2))
        .collect();
    let noise = rand(7, c.action_horizon * c.action_dim, 1.7);
    for present in [
        [true, false, true],
        [false, false, true],
        [false, true, true],
        [true; 3],
    ] {
        let imgs: Vec<Option<ViewImage>> = images
            .iter()
            .zip(present)
            .map(|(im, p)| p.then_some(ViewImage::Pixels(im)))
            .collect();
        let obs = Observation {
            state: &[],
            images: &imgs,
            tokens: &tokens,
            noise: &noise,
        };
        let (a, b) = (compact.infer(&obs).unwrap(), masked.infer(&obs).unwrap());
        let cos = cosine(&a, &b);
        let max_abs = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        println!(
            "{} views present {present:?}: packed vs masked cosine {cos:.7} (1 − cos {:.2e}), max |Δ| {max_abs:.4}",
            dt.name(),
            1.0 - cos
        );
        assert!(cos >= min_cos, "{present:?}: cosine {cos} < {min_cos}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn absent_views_on_cuda_match_the_masked_computation() {
    absent_views_match_the_masked_computation(&Pi05Config::tiny(), DType::F32, 0.99999);
    absent_views_match_the_masked_computation(&Pi05Config::base(), DType::BF16, 0.999);
}

/// The device resize (`resize_pad_pixels`) on CUDA equals the host backend's, bit for bit
/// (and so the host preprocessing, `inputs::the_device_resize_equals_the_host_preprocessing`).
#[test]
#[ignore = "needs a CUDA GPU"]
fn the_device_resize_on_cuda_equals_the_host() {
    let (cuda, host) = (Ctx::cuda(0).unwrap(), Ctx::host().unwrap());
    for (k, &(h, w)) in common::FRAME_SIZES.iter().enumerate() {
        let src = common::frame(k as u32 + 1, h, w);
        let want = common::pixels_on(&host, &src, h, w, 224);
        let got = common::pixels_on(&cuda, &src, h, w, 224);
        let differ = got
            .iter()
            .zip(&want)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        println!("{h}×{w} → 224×224: {differ} of {} values differ", got.len());
        assert_eq!(differ, 0, "{h}×{w}");
    }
}

/// On CUDA, camera frames resized by the model (`ViewImage::Rgb8`) give the same actions, bit
/// for bit, as the frames preprocessed on the host, for the tiny model in f32 and the
/// full-size one in bf16 (640×480 frames, one view absent, then every view present).
#[test]
#[ignore = "needs a CUDA GPU"]
fn camera_frames_on_cuda_match_host_preprocessing() {
    use frt_vla::inputs::{resize_with_pad, to_model_pixels};
    let ctx = Ctx::cuda(0).unwrap();
    let s = ctx.stream(0).unwrap();
    for (c, dtype) in [
        (Pi05Config::tiny(), DType::F32),
        (Pi05Config::base(), DType::BF16),
    ] {
        let m = Pi05::new(&ctx, s, &Pi05Weights::random(&c, 3), dtype).unwrap();
        let side = c.siglip.image_size;
        let (h, w) = (480, 640);
        let frames: Vec<Vec<u8>> = (0..c.views)
            .map(|v| common::frame(20 + v as u32, h, w))
            .collect();
        let pixels: Vec<ModelImage> = frames
            .iter()
            .map(|f| to_model_pixels(&resize_with_pad(f, h, w, side, side).unwrap()))
            .collect();
        // The frames in page-locked host buffers as well (uploaded without a staging copy).
        let hosted: Vec<frt_exec::HostBuffer> = frames
            .iter()
            .map(|f| {
                let mut b = frt_exec::HostBuffer::alloc(&ctx, "frame", f.len()).unwrap();
                b.write().unwrap().copy_from_slice(f);
                b
            })
            .collect();
        let tokens: Vec<u32> = (0..20u32).map(|i| 2 + i * 13).collect();
        let noise = rand(9, c.action_horizon * c.action_dim, 1.0);
        for (absent, hosted_frames) in [(Some(1), false), (None, false), (None, true)] {
            let run = |rgb: bool| {
                let images: Vec<Option<ViewImage>> = (0..c.views)
                    .map(|v| {
                        (Some(v) != absent).then(|| match (rgb, hosted_frames) {
                            (true, false) => ViewImage::Rgb8 {
                                width: w,
                                height: h,
                                data: &frames[v],
                            },
                            (true, true) => ViewImage::HostRgb8 {
                                width: w,
                                height: h,
                                data: &hosted[v],
                            },
                            _ => ViewImage::Pixels(&pixels[v]),
                        })
                    })
                    .collect();
                m.infer(&Observation {
                    state: &[],
                    images: &images,
                    tokens: &tokens,
                    noise: &noise,
                })
                .unwrap()
            };
            let (got, want) = (run(true), run(false));
            let differ = got
                .iter()
                .zip(&want)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            println!(
                "model image side {side}, {dtype:?}, view absent {absent:?}, frames in host buffers {hosted_frames}: {differ} of {} actions differ",
                got.len()
            );
            assert_eq!(differ, 0);
        }
    }
}

/// The FP8 model (SigLIP, prefix and expert) on CUDA against the same FP8 model on the host (exact
/// decoding, f32 sums) with the same calibration: the tiny model in bf16, calibrated on the
/// host on 3 observations; then a new calibration written into the CUDA model changes its
/// actions as it changes the host model's, with no recapture.
#[test]
#[ignore = "needs a CUDA GPU with FP8 tensor cores (sm_89 or newer)"]
fn fp8_on_cuda_matches_the_host() {
    let c = Pi05Config::tiny();
    let w = Pi05Weights::random(&c, 42);
    let px = c.siglip.image_size * c.siglip.image_size * 3;
    let owned: Vec<(Vec<ModelImage>, Vec<u32>, Vec<f32>)> = (0..4u32)
        .map(|k| {
            (
                (0..c.views as u32)
                    .map(|v| ModelImage::new(rand(100 * k + v, px, 1.0)).unwrap())
                    .collect(),
                vec![2, 17 + k, 99, 301, 5, 42, 7],
                rand(900 + k, c.action_horizon * c.action_dim, 1.0),
            )
        })
        .collect();
    let imgs: Vec<Vec<Option<ViewImage>>> = owned
        .iter()
        .map(|(i, _, _)| i.iter().map(|im| Some(ViewImage::Pixels(im))).collect())
        .collect();
    let obs: Vec<Observation> = owned
        .iter()
        .zip(&imgs)
        .map(|((_, t, n), i)| Observation {
            state: &[],
            images: i,
            tokens: t,
            noise: n,
        })
        .collect();
    let host = Ctx::host().unwrap();
    let hs = host.stream(0).unwrap();
    let base = Pi05::build(&host, hs, &w, &Pi05Options::new(DType::BF16)).unwrap();
    let cal = base.calibrate(&obs[..3], 99.9).unwrap();
    let mut o = Pi05Options::new(DType::BF16);
    o.fp8 = Some(cal.clone());
    o.fp8_vision = true;
    let on_host = Pi05::build(&host, hs, &w, &o).unwrap();
    let cuda = Ctx::cuda(0).unwrap();
    let cs = cuda.stream(0).unwrap();
    o.kernels = KernelOptions::from_env().unwrap();
    let on_cuda = Pi05::build(&cuda, cs, &w, &o).unwrap();
    assert!(on_cuda.fp8_expert() && on_cuda.fp8_prefix() && on_cuda.fp8_vision());
    let held = &obs[3];
    let check = |what: &str| {
        let (a, b) = (on_host.infer(held).unwrap(), on_cuda.infer(held).unwrap());
        let cos = cosine(&a, &b);
        let rms = (a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>() / a.len() as f64).sqrt();
        let max_d = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs() as f64)
            .fold(0.0, f64::max);
        println!("{what}: FP8 CUDA vs host: cosine {cos:.7}, max |Δ| {max_d:.4} (rms {rms:.3})");
        assert!(
            cos >= 0.999 && max_d <= 0.1 * rms,
            "{what}: cosine {cos}, max |Δ| {max_d}"
        );
        b
    };
    let first = check("calibration 1");
    let captures = on_cuda.capture_count();
    let mut cal2 = cal.clone();
    for r in cal2.ranges.values_mut() {
        *r *= 2.5;
    }
    on_host.set_calibration(&cal2).unwrap();
    on_cuda.set_calibration(&cal2).unwrap();
    assert_eq!(on_cuda.capture_count(), captures, "no new capture");
    let second = check("calibration 2");
    assert!(first != second, "the new scales are used on CUDA");
}

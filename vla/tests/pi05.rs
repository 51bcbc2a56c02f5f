//! The tiny Pi0.5 (and the tiny Pi0) on the host backend: end to end, masks, determinism,
//! subgoals without recapture, replay by replay, halting, the state input.

use frt_exec::{Ctx, HostBuffer, Stream};
use frt_kernels::DType;
use frt_vla::{
    ModelImage, Observation, Pi05, Pi05Config, Pi05Weights, PromptMode, Stage, ViewImage,
};

struct Inputs {
    images: Vec<ModelImage>,
    tokens: Vec<u32>,
    noise: Vec<f32>,
}

mod common;
use common::rand;

/// A random view of `n` values in [-1, 1].
fn image(seed: u32, n: usize) -> ModelImage {
    ModelImage::new(rand(seed, n, 1.0)).unwrap()
}

fn inputs(c: &Pi05Config, seed: u32) -> Inputs {
    let px = c.siglip.image_size * c.siglip.image_size * 3;
    Inputs {
        images: (0..c.views as u32).map(|v| image(seed + v, px)).collect(),
        tokens: vec![2, 17, 99, 301, 5, 42, 7, 108],
        noise: rand(seed + 100, c.action_horizon * c.action_dim, 1.7),
    }
}

fn infer(m: &Pi05, i: &Inputs, present: &[bool]) -> Vec<f32> {
    let imgs: Vec<Option<ViewImage>> = i
        .images
        .iter()
        .zip(present)
        .map(|(im, p)| p.then_some(ViewImage::Pixels(im)))
        .collect();
    m.infer(&Observation {
        state: &[],
        images: &imgs,
        tokens: &i.tokens,
        noise: &i.noise,
    })
    .unwrap()
}

fn model(ctx: &Ctx, seed: u64) -> (Pi05, Stream) {
    let c = Pi05Config::tiny();
    let s = ctx.stream(0).unwrap();
    (
        Pi05::new(ctx, s, &Pi05Weights::random(&c, seed), DType::F32).unwrap(),
        s,
    )
}

#[test]
fn end_to_end_is_deterministic_and_masks_work() {
    let ctx = Ctx::host().unwrap();
    let (m, _) = model(&ctx, 1);
    let c = m.config.clone();
    let i = inputs(&c, 3);
    let present = [true, false, true];
    let a = infer(&m, &i, &present);
    assert_eq!(a.len(), c.action_horizon * c.action_dim);
    assert!(a.iter().all(|v| v.is_finite()));
    assert!(
        a.iter().zip(&i.noise).any(|(x, n)| (x - n).abs() > 1e-3),
        "the steps moved the actions"
    );
    // Same inputs, same actions, bit for bit.
    assert_eq!(infer(&m, &i, &present), a);
    // A masked view's pixels do not matter ...
    let mut j = inputs(&c, 3);
    j.images[1] = image(999, j.images[1].values().len());
    assert_eq!(
        infer(&m, &j, &present),
        a,
        "a missing view's pixels leaked into the actions"
    );
    // ... nor do the padded prompt slots (written here behind the model's back).
    m.set_inputs(&Observation {
        state: &[],
        images: &[
            Some(ViewImage::Pixels(&i.images[0])),
            None,
            Some(ViewImage::Pixels(&i.images[2])),
        ],
        tokens: &i.tokens,
        noise: &i.noise,
    })
    .unwrap();
    let mut padded: Vec<i32> = i.tokens.iter().map(|t| *t as i32).collect();
    padded.resize(c.max_token_len, 0);
    for (n, slot) in padded.iter_mut().enumerate().skip(i.tokens.len()) {
        *slot = (n * 37 % c.vocab) as i32;
    }
    m.prompt_tokens().write_i32(m.stream(), &padded).unwrap();
    m.run().unwrap();
    let mut b = vec![0f32; a.len()];
    m.read_actions(m.stream(), &mut b).unwrap();
    assert_eq!(b, a, "padded prompt tokens leaked into the actions");
    // But a present view's pixels, the prompt and the noise all do.
    let mut k = inputs(&c, 3);
    k.images[0] = image(5, k.images[0].values().len());
    assert_ne!(infer(&m, &k, &present), a);
    let mut k = inputs(&c, 3);
    k.tokens[3] = 302;
    assert_ne!(infer(&m, &k, &present), a);
    assert_ne!(
        infer(&m, &inputs(&c, 4), &present),
        infer(&m, &inputs(&c, 3), &present)
    );
}

#[test]
fn a_new_subgoal_is_a_buffer_write_not_a_recapture() {
    let ctx = Ctx::host().unwrap();
    let (m, _) = model(&ctx, 2);
    let c = m.config.clone();
    let present = [true, true, true];
    let i = inputs(&c, 11);
    infer(&m, &i, &present);
    let (captures, variants) = (m.capture_count(), m.variant_count());
    let mut other = inputs(&c, 11);
    other.tokens = vec![2, 640, 13, 77, 9, 9, 9, 400, 12, 1, 3];
    let switched = infer(&m, &other, &present);
    assert_eq!(
        (m.capture_count(), m.variant_count()),
        (captures, variants),
        "no recapture, no new variant"
    );
    // A model built from scratch with that prompt gives the same actions, bit for bit.
    let (fresh, _) = model(&ctx, 2);
    assert_eq!(infer(&fresh, &other, &present), switched);
}

#[test]
fn stages_replay_one_by_one_and_halt_overrides() {
    let ctx = Ctx::host().unwrap();
    let (m, s) = model(&ctx, 3);
    let c = m.config.clone();
    let i = inputs(&c, 21);
    let whole = infer(&m, &i, &[true, true, false]);
    let imgs = [
        Some(ViewImage::Pixels(&i.images[0])),
        Some(ViewImage::Pixels(&i.images[1])),
        None,
    ];
    let obs = Observation {
        state: &[],
        images: &imgs,
        tokens: &i.tokens,
        noise: &i.noise,
    };
    m.set_inputs(&obs).unwrap();
    let stages = m.stages();
    assert_eq!(stages.len(), 2 + c.steps);
    assert_eq!(
        (stages[0], stages[1], stages[2]),
        (Stage::Vision, Stage::Prefix, Stage::Step(0))
    );
    for st in stages {
        m.replay(*st).unwrap();
    }
    let mut one_by_one = vec![0f32; whole.len()];
    m.read_actions(s, &mut one_by_one).unwrap();
    assert_eq!(one_by_one, whole);
    // Halt on a higher-priority stream: the halt output becomes the hold chunk.
    let hi = ctx.stream(ctx.priority_range().1).unwrap();
    let hold: Vec<f32> = (0..whole.len()).map(|n| n as f32 * 0.001).collect();
    m.set_hold(hi, &hold).unwrap();
    m.halt(hi).unwrap();
    let mut out = vec![0f32; whole.len()];
    m.read_halt(hi, &mut out).unwrap();
    assert_eq!(out, hold);
    // The halt leaves the inference's output alone, and stages that finish after it (a step
    // still running on the policy stream when a stop came) leave the halt's output alone.
    m.read_actions(s, &mut out).unwrap();
    assert!(out == whole, "the halt wrote the inference's output");
    m.set_inputs(&obs).unwrap();
    for st in stages {
        m.replay(*st).unwrap();
    }
    m.read_actions(s, &mut out).unwrap();
    assert!(out == whole, "the inference after the halt");
    m.read_halt(hi, &mut out).unwrap();
    assert!(
        out == hold,
        "a step after the halt changed the halt's output"
    );
}

#[test]
fn bad_inputs_are_rejected() {
    let ctx = Ctx::host().unwrap();
    let (m, _) = model(&ctx, 4);
    let c = m.config.clone();
    let i = inputs(&c, 1);
    let img = &i.images[0];
    let obs = |images: &[Option<ViewImage>], tokens: &[u32], noise: &[f32]| {
        m.set_inputs(&Observation {
            state: &[],
            images,
            tokens,
            noise,
        })
        .is_err()
    };
    assert!(
        obs(&[None, None, None], &i.tokens, &i.noise),
        "no view at all"
    );
    let short = ModelImage::new(img.values()[1..].to_vec()).unwrap();
    assert!(
        obs(
            &[Some(ViewImage::Pixels(&short)), None, None],
            &i.tokens,
            &i.noise
        ),
        "short image"
    );
    // Out-of-range pixels never become a ModelImage (the error names the first one).
    for bad in [3.0, -1.01, f32::NAN, f32::INFINITY] {
        let mut v = img.values().to_vec();
        v[3] = bad;
        let e = ModelImage::new(v).unwrap_err().to_string();
        assert!(
            e.contains("at 3 outside [-1, 1]"),
            "pixel {bad}: error `{e}`"
        );
    }
    let mut edge = img.values().to_vec();
    (edge[0], edge[1]) = (1.0, -1.0);
    assert!(ModelImage::new(edge).is_ok(), "the range's ends are in it");
    assert!(
        obs(&[Some(ViewImage::Pixels(img)), None], &i.tokens, &i.noise),
        "wrong view count"
    );
    assert!(
        obs(&[Some(ViewImage::Pixels(img)), None, None], &[], &i.noise),
        "empty prompt"
    );
    assert!(
        obs(
            &[Some(ViewImage::Pixels(img)), None, None],
            &vec![1; c.max_token_len + 1],
            &i.noise
        ),
        "long prompt"
    );
    assert!(
        obs(
            &[Some(ViewImage::Pixels(img)), None, None],
            &[2, c.vocab as u32],
            &i.noise
        ),
        "token outside the vocabulary"
    );
    let mut nan = i.noise.clone();
    nan[0] = f32::NAN;
    assert!(
        obs(&[Some(ViewImage::Pixels(img)), None, None], &i.tokens, &nan),
        "NaN noise"
    );
    assert!(m.set_hold(m.stream(), &[0.0; 3]).is_err());
    // A hold is never non-finite.
    let n = c.action_horizon * c.action_dim;
    let mut hold = vec![0.5f32; n];
    m.set_hold(m.stream(), &hold).unwrap();
    for bad in [f32::NAN, f32::INFINITY] {
        hold[n / 2] = bad;
        assert!(m.set_hold(m.stream(), &hold).is_err(), "{bad} in the hold");
    }
}

/// Exact mode: as many prompt rows as tokens, a prefix graph per prompt length (captured when
/// a length is first set, kept afterwards), and the same actions as fixed mode — padding rows
/// are masked there, so on the host backend the results are bit-identical.
#[test]
fn exact_prompt_mode_matches_fixed_mode() {
    let ctx = Ctx::host().unwrap();
    let c = Pi05Config::tiny();
    let w = Pi05Weights::random(&c, 5);
    let s = ctx.stream(0).unwrap();
    let fixed = Pi05::new(&ctx, s, &w, DType::F32).unwrap();
    let exact = Pi05::with_mode(&ctx, s, &w, DType::F32, PromptMode::Exact).unwrap();
    assert_eq!(exact.prompt_mode(), PromptMode::Exact);
    assert!(
        exact.run().is_err(),
        "no prefix graph before the first prompt"
    );
    let captures = exact.capture_count();
    let mut long = inputs(&c, 3);
    let mut short = inputs(&c, 3);
    short.tokens.truncate(5);
    long.tokens.extend([11, 12, 13]);
    // The last view missing.
    let present: Vec<bool> = (0..c.views).map(|v| v + 1 < c.views).collect();
    for (i, round) in [&long, &short, &long, &short].iter().enumerate() {
        let want = infer(&fixed, round, &present);
        let got = infer(&exact, round, &present);
        assert_eq!(got, want, "round {i}: exact mode differs from fixed mode");
        // One capture per new length, none when a length comes back.
        let new_lengths = if i == 0 { 1 } else { 2 };
        assert_eq!(exact.capture_count(), captures + new_lengths, "round {i}");
    }
    // Both lengths differ from each other (the prompt matters).
    assert_ne!(
        infer(&exact, &long, &present),
        infer(&exact, &short, &present)
    );
    // Stage by stage runs the current length's prefix.
    let imgs: Vec<Option<ViewImage>> = short
        .images
        .iter()
        .zip(&present)
        .map(|(im, p)| p.then_some(ViewImage::Pixels(im)))
        .collect();
    exact
        .set_inputs(&Observation {
            state: &[],
            images: &imgs,
            tokens: &short.tokens,
            noise: &short.noise,
        })
        .unwrap();
    for stage in exact.stages() {
        exact.replay(*stage).unwrap();
    }
    let mut staged = vec![0f32; c.action_horizon * c.action_dim];
    exact.read_actions(s, &mut staged).unwrap();
    assert_eq!(staged, infer(&fixed, &short, &present));
}

/// Frozen-prefix denoising on `ctx` (tiny model, f32): built with it and 0 frozen rows it
/// gives the model's actions bit for bit; with k rows frozen, those rows come out equal to
/// the given actions (the flow ends at t = 0 on them) and the rest still moves; a new count
/// and new actions take effect without recapture. Returns (plain, frozen) actions.
pub fn frozen_prefix_on(ctx: &Ctx, dtype: DType) -> (Vec<f32>, Vec<f32>) {
    frozen_prefix_with(ctx, dtype, &Pi05Config::tiny())
}

/// [`frozen_prefix_on`] for the model `c` describes.
fn frozen_prefix_with(ctx: &Ctx, dtype: DType, c: &Pi05Config) -> (Vec<f32>, Vec<f32>) {
    let c = c.clone();
    let w = Pi05Weights::random(&c, 9);
    let s = ctx.stream(0).unwrap();
    let plain = Pi05::with_mode(ctx, s, &w, dtype, PromptMode::Fixed).unwrap();
    let m = Pi05::build(
        ctx,
        s,
        &w,
        &frt_vla::Pi05Options {
            prompt_mode: PromptMode::Fixed,
            inpaint_prefix: true,
            ..frt_vla::Pi05Options::new(dtype)
        },
    )
    .unwrap();
    assert!(m.inpaints() && !plain.inpaints());
    let i = inputs(&c, 4);
    let all = [true, true, true];
    let base = infer(&plain, &i, &all);
    assert_eq!(infer(&m, &i, &all), base, "0 frozen rows: bit-identical");
    let captures = m.capture_count();
    let frozen = rand(77, c.action_horizon * c.action_dim, 0.9);
    let k = 7;
    m.set_frozen_prefix(k, &frozen).unwrap();
    let a = infer(&m, &i, &all);
    let d = c.action_dim;
    assert_eq!(
        &a[..k * d],
        &frozen[..k * d],
        "the frozen rows are the given actions"
    );
    assert_ne!(&a[k * d..], &base[k * d..], "the rest conditions on them");
    assert_eq!(m.capture_count(), captures, "no recapture");
    m.set_frozen_prefix(0, &frozen).unwrap();
    assert_eq!(infer(&m, &i, &all), base);
    // Refused: more rows than the horizon, non-finite actions, a model built without it.
    assert!(m.set_frozen_prefix(c.action_horizon + 1, &frozen).is_err());
    let mut bad = frozen.clone();
    bad[3] = f32::NAN;
    assert!(m.set_frozen_prefix(2, &bad).is_err());
    assert!(plain.set_frozen_prefix(2, &frozen).is_err());
    m.set_frozen_prefix(k, &frozen).unwrap();
    (base, infer(&m, &i, &all))
}

#[test]
fn frozen_prefix_rows_are_the_given_actions_and_disabled_changes_nothing() {
    frozen_prefix_on(&Ctx::host().unwrap(), DType::F32);
}

#[test]
fn pi0_frozen_prefix_rows_are_the_given_actions_and_disabled_changes_nothing() {
    frozen_prefix_with(&Ctx::host().unwrap(), DType::F32, &Pi05Config::pi0_tiny());
}

/// The tiny Pi0: its stages one by one give the whole inference; the state is an input of its
/// own (padded with zeros: a short state equals the same values padded explicitly, bit for
/// bit; another state gives other actions; non-finite or too long is refused); halting works;
/// bf16 (the suffix rounded, the action path in f32) stays close to f32.
#[test]
fn pi0_stages_state_input_and_precision() {
    let ctx = Ctx::host().unwrap();
    let c = Pi05Config::pi0_tiny();
    let w = Pi05Weights::random(&c, 5);
    let s = ctx.stream(0).unwrap();
    let m = Pi05::new(&ctx, s, &w, DType::F32).unwrap();
    use frt_vla::Policy as _;
    assert_eq!(m.spec().name, "Pi0");
    assert_eq!(m.spec().state, frt_vla::StateInput::Token);
    let i = inputs(&c, 31);
    let imgs = [
        Some(ViewImage::Pixels(&i.images[0])),
        None,
        Some(ViewImage::Pixels(&i.images[2])),
    ];
    let state: Vec<f32> = (0..7).map(|j| 0.3 - 0.1 * j as f32).collect();
    let mut padded = state.clone();
    padded.resize(c.action_dim, 0.0);
    fn with_state<'a>(
        images: &'a [Option<ViewImage<'a>>],
        i: &'a Inputs,
        state: &'a [f32],
    ) -> Observation<'a> {
        Observation {
            images,
            tokens: &i.tokens,
            noise: &i.noise,
            state,
        }
    }
    let obs = |state| with_state(&imgs, &i, state);
    let whole = m.infer(&obs(&state)).unwrap();
    assert!(whole.iter().all(|x| x.is_finite()));
    assert_eq!(m.infer(&obs(&padded)).unwrap(), whole, "padding");
    let other: Vec<f32> = state.iter().map(|x| x + 0.5).collect();
    assert_ne!(m.infer(&obs(&other)).unwrap(), whole, "the state matters");
    // Stage by stage.
    m.set_inputs(&obs(&state)).unwrap();
    assert_eq!(m.stages().len(), 2 + c.steps);
    for st in m.stages() {
        m.replay(*st).unwrap();
    }
    let mut one_by_one = vec![0f32; whole.len()];
    m.read_actions(s, &mut one_by_one).unwrap();
    assert_eq!(one_by_one, whole);
    // Refused states.
    let mut nan = state.clone();
    nan[2] = f32::NAN;
    let long = vec![0.1f32; c.action_dim + 1];
    for (bad, what) in [(&nan, "NaN"), (&long, "too long")] {
        let e = m.set_inputs(&obs(bad)).unwrap_err();
        assert!(e.to_string().contains("state"), "{what}: {e}");
    }
    // The halt.
    let hi = ctx.stream(ctx.priority_range().1).unwrap();
    let hold: Vec<f32> = (0..whole.len()).map(|n| n as f32 * 0.002).collect();
    m.set_hold(hi, &hold).unwrap();
    m.halt(hi).unwrap();
    let mut out = vec![0f32; whole.len()];
    m.read_halt(hi, &mut out).unwrap();
    assert_eq!(out, hold);
    // bf16 against f32.
    let b = Pi05::new(&ctx, s, &w, DType::BF16).unwrap();
    let a16 = b.infer(&obs(&state)).unwrap();
    let dot: f64 = a16
        .iter()
        .zip(&whole)
        .map(|(x, y)| (*x as f64) * (*y as f64))
        .sum();
    let norm = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let cos = dot / (norm(&a16) * norm(&whole));
    assert!(cos > 0.999, "bf16 vs f32 cosine {cos}");
}

/// A Pi0 checkpoint opened as Pi0.5 (and the reverse) is named as the other model.
#[test]
fn a_checkpoint_of_the_other_variant_is_named() {
    for (written, opened) in [
        (Pi05Config::pi0_tiny(), Pi05Config::tiny()),
        (Pi05Config::tiny(), Pi05Config::pi0_tiny()),
    ] {
        let dir = std::env::temp_dir().join(format!(
            "frt-vla-variant-{:?}-{}",
            written.variant,
            std::process::id()
        ));
        Pi05Weights::random(&written, 2)
            .write(&dir, false, 1, false)
            .unwrap();
        let e = Pi05Weights::load(&dir, &opened).unwrap_err().to_string();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            e.contains(&format!("is a {} model", written.variant.name())),
            "{e}"
        );
        assert!(
            e.contains(&format!("not a {}", opened.variant.name())),
            "{e}"
        );
    }
}

/// A tiny model built with absent views left out (the default) and with every slot encoded
/// and absent ones masked.
fn compact_and_masked(ctx: &Ctx, c: &Pi05Config, dtype: DType, mode: PromptMode) -> (Pi05, Pi05) {
    let w = Pi05Weights::random(c, 21);
    let build = |compact_views: bool| {
        Pi05::build(
            ctx,
            ctx.stream(0).unwrap(),
            &w,
            &frt_vla::Pi05Options {
                prompt_mode: mode,
                compact_views,
                ..frt_vla::Pi05Options::new(dtype)
            },
        )
        .unwrap()
    };
    (build(true), build(false))
}

#[test]
fn absent_views_cost_nothing_and_change_nothing() {
    let ctx = Ctx::host().unwrap();
    let (pi05, pi0) = (Pi05Config::tiny(), Pi05Config::pi0_tiny());
    for (c, dtype, mode) in [
        (&pi05, DType::F32, PromptMode::Fixed),
        (&pi05, DType::BF16, PromptMode::Fixed),
        (&pi05, DType::F32, PromptMode::Exact),
        (&pi0, DType::F32, PromptMode::Fixed),
        (&pi0, DType::BF16, PromptMode::Exact),
    ] {
        let (compact, masked) = compact_and_masked(&ctx, c, dtype, mode);
        let name = c.variant.name();
        // Every count of views has its vision, prefix (fixed mode) and step variants from the
        // start; the masked model has one of each.
        let per_count = 1 + usize::from(mode == PromptMode::Fixed) + c.steps;
        assert_eq!(
            compact.variant_count(),
            masked.variant_count() + per_count * (c.views - 1)
        );
        let i = inputs(c, 31);
        let (captures, variants) = (compact.capture_count(), compact.variant_count());
        for bits in 1u32..(1 << c.views) {
            let present: Vec<bool> = (0..c.views).map(|v| bits & (1 << v) != 0).collect();
            let a = infer(&compact, &i, &present);
            let b = infer(&masked, &i, &present);
            assert!(a.iter().all(|x| x.is_finite()));
            let worst = a
                .iter()
                .zip(&b)
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max);
            assert!(
                a == b,
                "{name} {dtype:?} {mode:?}, views present {present:?}: max |Δ| {worst:e}"
            );
        }
        if mode == PromptMode::Fixed {
            assert_eq!(
                (compact.capture_count(), compact.variant_count()),
                (captures, variants),
                "no capture while running"
            );
        }
        // The views that are present still matter, in their order.
        let swapped = Inputs {
            images: vec![
                i.images[2].clone(),
                i.images[1].clone(),
                i.images[0].clone(),
            ],
            tokens: i.tokens.clone(),
            noise: i.noise.clone(),
        };
        let p = [true, false, true];
        assert_ne!(infer(&compact, &swapped, &p), infer(&compact, &i, &p));
    }
}

/// Camera frames given as they are decoded (`ViewImage::Rgb8`) and resized on the model's
/// device give the same actions, bit for bit, as the same frames preprocessed on the host
/// (`Pixels` of `to_model_pixels(resize_with_pad(..))`): with a view absent (packed), with
/// frames and pixels mixed, at two frame sizes in turn (the buffers follow a size change),
/// in both prompt modes' model; malformed frames are refused by view.
#[test]
fn camera_frames_resized_on_the_device_match_host_preprocessing() {
    use frt_vla::inputs::{resize_with_pad, to_model_pixels};
    let ctx = Ctx::host().unwrap();
    let (m, _) = model(&ctx, 7);
    let c = &m.config;
    let side = c.siglip.image_size;
    let i = inputs(c, 40);
    for (round, &(h, w)) in [(48usize, 64usize), (30, 20), (48, 64)].iter().enumerate() {
        let frames: Vec<Vec<u8>> = (0..c.views)
            .map(|v| common::frame(round as u32 * 10 + v as u32, h, w))
            .collect();
        let pixels: Vec<ModelImage> = frames
            .iter()
            .map(|f| to_model_pixels(&resize_with_pad(f, h, w, side, side).unwrap()))
            .collect();
        let rgb = |v: usize| ViewImage::Rgb8 {
            width: w,
            height: h,
            data: &frames[v],
        };
        // The same frames in host buffers with room to spare (a frame is their first bytes).
        let hosted: Vec<HostBuffer> = frames
            .iter()
            .map(|f| {
                let mut b = HostBuffer::alloc(&ctx, "frame", f.len() + 7).unwrap();
                b.write().unwrap()[..f.len()].copy_from_slice(f);
                b
            })
            .collect();
        let host = |v: usize| ViewImage::HostRgb8 {
            width: w,
            height: h,
            data: &hosted[v],
        };
        // Every view a frame; the middle one absent; the first as pixels, the rest frames;
        // every view a frame in a host buffer, the last one absent.
        let cases: [Vec<Option<ViewImage>>; 4] = [
            (0..c.views).map(|v| Some(rgb(v))).collect(),
            (0..c.views).map(|v| (v != 1).then(|| rgb(v))).collect(),
            (0..c.views)
                .map(|v| {
                    Some(if v == 0 {
                        ViewImage::Pixels(&pixels[0])
                    } else {
                        rgb(v)
                    })
                })
                .collect(),
            (0..c.views)
                .map(|v| (v + 1 != c.views).then(|| host(v)))
                .collect(),
        ];
        for (k, views) in cases.iter().enumerate() {
            let want: Vec<Option<ViewImage>> = views
                .iter()
                .enumerate()
                .map(|(v, x)| x.map(|_| ViewImage::Pixels(&pixels[v])))
                .collect();
            let run = |images: &[Option<ViewImage>]| {
                m.infer(&Observation {
                    state: &[],
                    images,
                    tokens: &i.tokens,
                    noise: &i.noise,
                })
                .unwrap()
            };
            let (got, want) = (run(views), run(&want));
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{h}×{w}, case {k}: actions differ"
            );
        }
    }
    // Refusals name the view.
    let f = common::frame(1, 4, 4);
    let bad = |images: &[Option<ViewImage>]| {
        m.set_inputs(&Observation {
            state: &[],
            images,
            tokens: &i.tokens,
            noise: &i.noise,
        })
        .unwrap_err()
        .to_string()
    };
    let frame = |width, height, data| {
        Some(ViewImage::Rgb8 {
            width,
            height,
            data,
        })
    };
    let mut views: Vec<Option<ViewImage>> = vec![None; c.views];
    views[0] = frame(4, 4, &f[..47]);
    assert!(bad(&views).contains("image 0"), "{}", bad(&views));
    views[0] = frame(0, 4, &f[..0]);
    assert!(bad(&views).contains("0×4"), "{}", bad(&views));
    views[0] = frame(5000, 1, &f[..0]);
    assert!(bad(&views).contains("5000×1"), "{}", bad(&views));
    let short = HostBuffer::alloc(&ctx, "short", 47).unwrap();
    views[0] = Some(ViewImage::HostRgb8 {
        width: 4,
        height: 4,
        data: &short,
    });
    assert!(bad(&views).contains("47 bytes"), "{}", bad(&views));
}

//! The FP8 action expert and prefix on the host backend (E4M3 codes decoded exactly, products
//! summed in f32): calibrated on the 16-bit model, they stay close to it; a new calibration is a buffer
//! write (no recapture) and gives what a model built with it gives; calibrations of another
//! model, incomplete ones and Pi0 are refused by reason.

use frt_exec::Ctx;
use frt_kernels::DType;
use frt_vla::calibration::Calibration;
use frt_vla::{
    ModelImage, Observation, Pi05, Pi05Config, Pi05Options, Pi05Weights, Stage, StageOutput,
    Variant, ViewImage,
};

mod common;
use common::rand;

struct Owned {
    images: Vec<ModelImage>,
    tokens: Vec<u32>,
    noise: Vec<f32>,
}

fn owned(c: &Pi05Config, seed: u32) -> Owned {
    let px = c.siglip.image_size * c.siglip.image_size * 3;
    Owned {
        images: (0..c.views as u32)
            .map(|v| ModelImage::new(rand(seed * 7 + v, px, 1.0)).unwrap())
            .collect(),
        tokens: vec![2, 17 + seed, 99, 301, 5, 42 + seed, 7],
        noise: rand(seed + 1000, c.action_horizon * c.action_dim, 1.0),
    }
}

fn with_obs<T>(o: &Owned, f: impl FnOnce(&Observation) -> T) -> T {
    let imgs: Vec<Option<ViewImage>> = o
        .images
        .iter()
        .map(|i| Some(ViewImage::Pixels(i)))
        .collect();
    f(&Observation {
        state: &[],
        images: &imgs,
        tokens: &o.tokens,
        noise: &o.noise,
    })
}

fn calibrate(m: &Pi05, obs: &[Owned]) -> Calibration {
    // Observations borrow their owners: gathered one level at a time.
    let imgs: Vec<Vec<Option<ViewImage>>> = obs
        .iter()
        .map(|o| {
            o.images
                .iter()
                .map(|i| Some(ViewImage::Pixels(i)))
                .collect()
        })
        .collect();
    let list: Vec<Observation> = obs
        .iter()
        .zip(&imgs)
        .map(|(o, i)| Observation {
            state: &[],
            images: i,
            tokens: &o.tokens,
            noise: &o.noise,
        })
        .collect();
    m.calibrate(&list, 99.9).unwrap()
}

/// The tiny configuration on the host backend with random weights (`seed`), and the 16-bit
/// model of `dt` built from them.
struct Tiny {
    ctx: Ctx,
    s: frt_exec::Stream,
    c: Pi05Config,
    w: Pi05Weights,
    base: Pi05,
}

fn tiny(seed: u64, dt: DType) -> Tiny {
    let ctx = Ctx::host().unwrap();
    let s = ctx.stream(0).unwrap();
    let c = Pi05Config::tiny();
    let w = Pi05Weights::random(&c, seed);
    let base = Pi05::build(&ctx, s, &w, &Pi05Options::new(dt)).unwrap();
    Tiny { ctx, s, c, w, base }
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let n = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (n(a) * n(b))
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn an_fp8_expert_stays_close_and_recalibrates_without_recapture() {
    let ctx = Ctx::host().unwrap();
    let s = ctx.stream(0).unwrap();
    let c = Pi05Config::tiny();
    let w = Pi05Weights::random(&c, 7);
    let calib: Vec<Owned> = (0..4).map(|k| owned(&c, 10 + k)).collect();
    let held = owned(&c, 99);
    for dt in [DType::F32, DType::BF16] {
        let base = Pi05::build(&ctx, s, &w, &Pi05Options::new(dt)).unwrap();
        assert!(!base.fp8_expert());
        let cal = calibrate(&base, &calib);
        // The expert's 4 inputs a layer, the prefix's too but for its last layer's MLP,
        // SigLIP's 4 a layer.
        assert_eq!(
            cal.ranges.len(),
            4 * c.expert.depth + 4 * c.llm.depth - 2 + 4 * c.siglip.depth
        );
        assert!(cal.ranges.contains_key("vision.layers.1.fc2"));
        assert!(cal.ranges.contains_key("prefix.layers.0.gate_up"));
        let last = c.llm.depth - 1;
        assert!(cal.ranges.contains_key(&format!("prefix.layers.{last}.o")));
        assert!(
            !cal.ranges
                .contains_key(&format!("prefix.layers.{last}.down"))
        );
        assert_eq!(cal.observations, 4);
        assert_eq!(cal.model, base.calibration_model());
        assert!(cal.ranges.contains_key("expert.layers.0.down"));

        // The expert alone in FP8, then the prefix too.
        let mut o = Pi05Options::new(dt);
        o.fp8 = Some(cal.clone());
        o.fp8_prefix = false;
        let expert_only = Pi05::build(&ctx, s, &w, &o).unwrap();
        assert!(expert_only.fp8_expert() && !expert_only.fp8_prefix());
        let a16 = with_obs(&held, |obs| base.infer(obs).unwrap());
        let a8e = with_obs(&held, |obs| expert_only.infer(obs).unwrap());
        let cos = cosine(&a16, &a8e);
        eprintln!("{dt:?}: FP8 expert only vs 16-bit: cosine {cos:.6}");
        assert!(cos >= 0.9995, "{dt:?}: expert only: cosine {cos}");
        o.fp8_prefix = true;
        // SigLIP too where the model is 16-bit (its biases ride on a 16-bit output).
        o.fp8_vision = dt != DType::F32;
        let fp8 = Pi05::build(&ctx, s, &w, &o).unwrap();
        assert!(fp8.fp8_expert() && fp8.fp8_prefix());
        assert_eq!(fp8.fp8_vision(), dt != DType::F32);
        if fp8.fp8_vision() {
            // SigLIP's FP8 GEMMs change the actions (against the same model without them).
            let mut no_vision = o.clone();
            no_vision.fp8_vision = false;
            let m = Pi05::build(&ctx, s, &w, &no_vision).unwrap();
            let (a, b) = (
                with_obs(&held, |obs| m.infer(obs).unwrap()),
                with_obs(&held, |obs| fp8.infer(obs).unwrap()),
            );
            assert!(a != b, "SigLIP in FP8 computes something else");
        }
        let a8 = with_obs(&held, |obs| fp8.infer(obs).unwrap());
        let rms = (a16.iter().map(|x| (*x as f64).powi(2)).sum::<f64>() / a16.len() as f64).sqrt();
        let max_d = a16
            .iter()
            .zip(&a8)
            .map(|(x, y)| (x - y).abs() as f64)
            .fold(0.0, f64::max);
        let cos = cosine(&a16, &a8);
        eprintln!(
            "{dt:?}: FP8 (vision: {}) prefix and expert vs 16-bit: cosine {cos:.6}, max |Δ| {max_d:.4} (rms {rms:.4})",
            o.fp8_vision
        );
        assert!(
            a16 != a8,
            "{dt:?}: the FP8 expert computes something else than the 16-bit one"
        );
        // Seen: cosine 0.99987 and max |Δ| 0.18 of rms 1.21 (f32 and bf16; the expert alone
        // 0.99989).
        assert!(
            cos >= 0.9995 && max_d <= 0.25 * rms,
            "{dt:?}: cosine {cos}, max |Δ| {max_d} of rms {rms}"
        );

        // Calibrating the FP8 model runs its 16-bit path: the same ranges.
        assert_eq!(calibrate(&fp8, &calib), cal, "{dt:?}");

        // A new calibration: a buffer write, no recapture, the results of a model built with it.
        let (captures, variants) = (fp8.capture_count(), fp8.variant_count());
        let mut cal2 = cal.clone();
        for r in cal2.ranges.values_mut() {
            *r *= 3.0;
        }
        fp8.set_calibration(&cal2).unwrap();
        assert_eq!(fp8.capture_count(), captures, "{dt:?}: no new capture");
        assert_eq!(fp8.variant_count(), variants, "{dt:?}: no new variant");
        let a8b = with_obs(&held, |obs| fp8.infer(obs).unwrap());
        assert!(a8b != a8, "{dt:?}: the new scales are used");
        let mut o2 = Pi05Options::new(dt);
        o2.fp8 = Some(cal2.clone());
        o2.fp8_vision = o.fp8_vision;
        let fresh = Pi05::build(&ctx, s, &w, &o2).unwrap();
        let a8f = with_obs(&held, |obs| fresh.infer(obs).unwrap());
        assert_eq!(
            bits(&a8b),
            bits(&a8f),
            "{dt:?}: as a model built with the new calibration"
        );
    }
}

/// With `KernelOptions::fp8_fused_geglu` off, the FP8 expert runs its gate+up GEMM apart (the
/// deferred, scalar-scale GEMM) and then the GEGLU that applies the weight's feature scales:
/// the same sums rounded at other places, so close to the fused op's actions (in bf16 not the
/// same bits: the other path ran) and as close to the 16-bit model.
#[test]
fn an_fp8_expert_with_its_mlp_apart_computes_about_the_same() {
    for dt in [DType::F32, DType::BF16] {
        let Tiny { ctx, s, c, w, base } = tiny(13, dt);
        let cal = calibrate(&base, &[owned(&c, 1), owned(&c, 2)]);
        let held = owned(&c, 6);
        let build = |fused: bool| {
            let mut o = Pi05Options::new(dt);
            o.fp8 = Some(cal.clone());
            o.fp8_prefix = false;
            o.kernels.fp8_fused_geglu = fused;
            Pi05::build(&ctx, s, &w, &o).unwrap()
        };
        let run = |m: &Pi05| with_obs(&held, |obs| m.infer(obs).unwrap());
        let (a16, fused, apart) = (run(&base), run(&build(true)), run(&build(false)));
        let (both, to16) = (cosine(&fused, &apart), cosine(&a16, &apart));
        eprintln!("{dt:?}: FP8 expert, MLP apart vs fused: cosine {both:.7}; vs 16-bit {to16:.6}");
        assert!(both >= 0.99999, "{dt:?}: apart vs fused: cosine {both}");
        assert!(to16 >= 0.9995, "{dt:?}: apart vs 16-bit: cosine {to16}");
        if dt == DType::BF16 {
            assert!(bits(&fused) != bits(&apart), "the MLP ran apart");
        }
    }
}

/// An FP8 model built without its 16-bit weights (`fp8_keep_16bit` off) computes what one
/// with them computes, bit for bit, before and after a new calibration; it refuses to record
/// a calibration (the 16-bit path) by reason. Stacks left in 16-bit keep their weights.
#[test]
fn an_fp8_model_without_16bit_weights_computes_the_same() {
    let dt = DType::BF16;
    let Tiny { ctx, s, c, w, base } = tiny(11, dt);
    assert!(base.has_16bit_weights() && base.calibrating_refused().is_none());
    let cal = calibrate(&base, &[owned(&c, 1), owned(&c, 2)]);
    let mut cal3 = cal.clone();
    for r in cal3.ranges.values_mut() {
        *r *= 3.0;
    }
    let held = owned(&c, 5);
    for prefix in [true, false] {
        let build = |keep: bool| {
            let mut o = Pi05Options::new(dt);
            o.fp8 = Some(cal.clone());
            o.fp8_prefix = prefix;
            o.fp8_vision = true;
            o.fp8_keep_16bit = keep;
            Pi05::build(&ctx, s, &w, &o).unwrap()
        };
        let (kept, lean) = (build(true), build(false));
        assert!(kept.has_16bit_weights());
        assert!(!lean.has_16bit_weights(), "prefix in FP8: {prefix}");
        let run = |m: &Pi05| with_obs(&held, |obs| m.infer(obs).unwrap());
        assert_eq!(
            bits(&run(&kept)),
            bits(&run(&lean)),
            "prefix in FP8: {prefix}"
        );
        kept.set_calibration(&cal3).unwrap();
        lean.set_calibration(&cal3).unwrap();
        assert_eq!(
            bits(&run(&kept)),
            bits(&run(&lean)),
            "prefix in FP8: {prefix}, after a new calibration"
        );
        let why = lean.calibrating_refused().expect("refused");
        assert!(why.contains("fp8_keep_16bit"), "{why}");
        let mut rec = frt_vla::calibration::RangeRecorder::new(99.9).unwrap();
        let e = lean.calibrate_inference(&mut rec).unwrap_err().to_string();
        assert!(e.contains("16-bit weights"), "{e}");
        assert!(kept.calibrating_refused().is_none());
    }
    // Without FP8 the option changes nothing: a 16-bit model needs its weights.
    let mut o = Pi05Options::new(dt);
    o.fp8_keep_16bit = false;
    assert!(Pi05::build(&ctx, s, &w, &o).unwrap().has_16bit_weights());
}

#[test]
fn calibrations_that_do_not_fit_are_refused_by_reason() {
    let Tiny { ctx, s, c, w, base } = tiny(8, DType::F32);
    let cal = calibrate(&base, &[owned(&c, 1)]);
    let build = |cal: Calibration| {
        let mut o = Pi05Options::new(DType::F32);
        o.fp8 = Some(cal);
        Pi05::build(&ctx, s, &w, &o)
            .err()
            .expect("refused")
            .to_string()
    };
    // A range missing, a range this model does not have, another model's.
    let mut missing = cal.clone();
    missing.ranges.remove("expert.layers.1.o");
    let e = build(missing);
    assert!(
        e.contains("expert.layers.1.o") && e.contains("no range"),
        "{e}"
    );
    let mut extra = cal.clone();
    extra.ranges.insert("expert.layers.99.o".into(), 1.0);
    let e = build(extra);
    assert!(e.contains("expert.layers.99.o"), "{e}");
    let mut other = cal.clone();
    other.model = "pi05 expert: width 1024, 18 layers".into();
    let e = build(other.clone());
    assert!(e.contains("recorded on") && e.contains("width 1024"), "{e}");
    // A 16-bit model takes no calibration; an FP8 one refuses another model's.
    let e = base.set_calibration(&cal).unwrap_err().to_string();
    assert!(e.contains("FP8"), "{e}");
    let mut o = Pi05Options::new(DType::F32);
    o.fp8 = Some(cal.clone());
    let fp8 = Pi05::build(&ctx, s, &w, &o).unwrap();
    let e = fp8.set_calibration(&other).unwrap_err().to_string();
    assert!(e.contains("recorded on"), "{e}");
    // SigLIP in FP8 in an f32 model: refused (its biases need a 16-bit output).
    let mut o32 = Pi05Options::new(DType::F32);
    o32.fp8 = Some(cal.clone());
    o32.fp8_vision = true;
    let e = Pi05::build(&ctx, s, &w, &o32)
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("bf16 or f16"), "{e}");
    // Pi0: no FP8 expert.
    let mut c0 = Pi05Config::tiny();
    c0.variant = Variant::Pi0;
    let w0 = Pi05Weights::random(&c0, 9);
    let e = Pi05::build(&ctx, s, &w0, &o)
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("Pi0.5") || e.contains("recorded on"), "{e}");
}

/// `read_stage_output`: each stage's output, read after it, is what that stage computed; a
/// stage in 16 bits gives the 16-bit model's bits whatever runs in FP8 after it, and the FP8
/// stage itself differs a little.
#[test]
fn stage_outputs_show_where_fp8_begins() {
    let dt = DType::BF16;
    let Tiny { ctx, s, c, w, base } = tiny(11, dt);
    let cal = calibrate(&base, &[owned(&c, 3), owned(&c, 4)]);
    let model = |prefix: bool, vision: bool| {
        let mut o = Pi05Options::new(dt);
        o.fp8 = Some(cal.clone());
        o.fp8_prefix = prefix;
        o.fp8_vision = vision;
        Pi05::build(&ctx, s, &w, &o).unwrap()
    };
    let held = owned(&c, 50);
    // (vision output, prefix keys and values, noise before step 0, velocity·dt of step 0)
    let stages = |m: &Pi05| {
        with_obs(&held, |obs| m.set_inputs(obs).unwrap());
        m.replay(Stage::Vision).unwrap();
        let v = m.read_stage_output(StageOutput::Vision).unwrap();
        m.replay(Stage::Prefix).unwrap();
        let kv = m.read_stage_output(StageOutput::PrefixKv).unwrap();
        let x0 = m.read_stage_output(StageOutput::Noise).unwrap();
        m.replay(Stage::Step(0)).unwrap();
        let x1 = m.read_stage_output(StageOutput::Noise).unwrap();
        let vel: Vec<f32> = x1.iter().zip(&x0).map(|(a, b)| a - b).collect();
        (v, kv, x0, vel)
    };
    let (v16, kv16, x16, vel16) = stages(&base);
    let rows = c.views * c.siglip.tokens();
    assert_eq!(v16.len(), rows * c.llm.width);
    let prefix_rows = rows + c.max_token_len;
    assert_eq!(
        kv16.len(),
        2 * c.llm.depth * prefix_rows * c.llm.kv_heads * c.llm.head_dim
    );
    assert_eq!(bits(&x16), bits(&held.noise), "the noise as set");
    assert!(vel16.iter().any(|v| *v != 0.0));
    // FP8 expert only: vision and prefix are the 16-bit model's, bit for bit.
    let (v, kv, x, vel) = stages(&model(false, false));
    assert_eq!(bits(&v), bits(&v16));
    assert_eq!(bits(&kv), bits(&kv16));
    assert_eq!(bits(&x), bits(&x16));
    assert!(
        vel != vel16 && cosine(&vel, &vel16) > 0.999,
        "the step in FP8"
    );
    // The prefix in FP8 too: the same vision output, other keys and values.
    let (v, kv, _, _) = stages(&model(true, false));
    assert_eq!(bits(&v), bits(&v16));
    assert!(kv != kv16 && cosine(&kv, &kv16) > 0.99, "the prefix in FP8");
    // SigLIP too: another vision output.
    let (v, _, _, _) = stages(&model(true, true));
    let cos = cosine(&v, &v16);
    eprintln!("SigLIP in FP8: vision output cosine {cos:.7} against 16 bits");
    assert!(v != v16 && cos > 0.99, "SigLIP in FP8");
}

/// A checkpoint written with its FP8 weights pre-quantized (`Pi05Weights::write_fp8`) builds
/// FP8 models that compute what the same models built from the 16-bit checkpoint compute, bit
/// for bit, for each choice of stages in FP8, with the 16-bit weights kept or not (those a
/// model keeps are decoded from the codes); its quantized weights take half the bytes.
#[test]
fn a_pre_quantized_checkpoint_builds_the_same_fp8_models() {
    let dt = DType::BF16;
    let Tiny { ctx, s, c, w, base } = tiny(21, dt);
    let cal = calibrate(&base, &[owned(&c, 1), owned(&c, 2)]);
    let dir = std::env::temp_dir().join(format!("frt-vla-prequant-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let src = dir.join("bf16");
    w.write(&src, true, 2, false).unwrap();
    let bf16 = Pi05Weights::load(&src, &c).unwrap();
    let held = owned(&c, 5);
    let run = |m: &Pi05| with_obs(&held, |obs| m.infer(obs).unwrap());
    for (prefix, vision) in [(false, false), (true, false), (true, true)] {
        let out = dir.join(format!("fp8-{prefix}-{vision}"));
        let written = bf16.write_fp8(prefix, vision, &out).unwrap();
        let names = bf16.fp8_weight_names(prefix, vision).unwrap();
        let per_layer = |g: &frt_vla::GemmaConfig| 7 * g.depth;
        let want = per_layer(&c.expert)
            + if prefix { per_layer(&c.llm) } else { 0 }
            + if vision { 6 * c.siglip.depth } else { 0 };
        assert_eq!((names.len(), written.quantized), (want, want));
        assert!(written.files_copied >= 1, "config.json");
        let q = Pi05Weights::load(&out, &c).unwrap();
        assert_eq!(
            q.get(&names[0]).unwrap().stored(),
            frt_nn::Stored::E4M3,
            "{}",
            names[0]
        );
        // Codes and their scales in place of bf16 values.
        let (a, b) = (bf16.get(&names[0]).unwrap(), q.get(&names[0]).unwrap());
        let rows = a.shape()[0];
        assert_eq!(b.stored_len(), a.stored_len() / 2 + 4 * rows);
        for keep in [false, true] {
            let build = |w: &Pi05Weights| {
                let mut o = Pi05Options::new(dt);
                o.fp8 = Some(cal.clone());
                o.fp8_prefix = prefix;
                o.fp8_vision = vision;
                o.fp8_keep_16bit = keep;
                Pi05::build(&ctx, s, w, &o).unwrap()
            };
            assert!(
                bits(&run(&build(&bf16))) == bits(&run(&build(&q))),
                "prefix {prefix}, vision {vision}, 16-bit weights kept: {keep}"
            );
        }
    }
    // A 16-bit model of the pre-quantized checkpoint runs on the decoded weights: close to
    // the FP8 model's actions, not the 16-bit checkpoint's bits.
    let q = Pi05Weights::load(&dir.join("fp8-true-true"), &c).unwrap();
    let (expert, llm, vision) = (7 * c.expert.depth, 7 * c.llm.depth, 6 * c.siglip.depth);
    for (stages, outside) in [
        (Some((true, true)), 0),
        (Some((true, false)), vision),
        (Some((false, false)), llm + vision),
        (None, expert + llm + vision),
    ] {
        assert_eq!(
            q.pre_quantized_outside(stages).unwrap(),
            outside,
            "{stages:?}"
        );
    }
    assert_eq!(bf16.pre_quantized_outside(None).unwrap(), 0);
    // LeRobot's naming (`model.` before every name), one file: the same.
    let lerobot = dir.join("lerobot");
    w.write(&lerobot, true, 1, true).unwrap();
    let lw = Pi05Weights::load(&lerobot, &c).unwrap();
    lw.write_fp8(true, true, &dir.join("lerobot-fp8")).unwrap();
    let lq = Pi05Weights::load(&dir.join("lerobot-fp8"), &c).unwrap();
    assert_eq!(
        lq.pre_quantized_outside(None).unwrap(),
        expert + llm + vision
    );
    let fp8_model = |w: &Pi05Weights| {
        let mut o = Pi05Options::new(dt);
        o.fp8 = Some(cal.clone());
        o.fp8_vision = true;
        Pi05::build(&ctx, s, w, &o).unwrap()
    };
    assert!(
        bits(&run(&fp8_model(&lw))) == bits(&run(&fp8_model(&lq))),
        "LeRobot naming"
    );
    let decoded = run(&Pi05::build(&ctx, s, &q, &Pi05Options::new(dt)).unwrap());
    let original = run(&base);
    assert!(decoded != original && cosine(&decoded, &original) > 0.99);
    // Pi0 has no FP8 path to quantize for.
    let mut c0 = Pi05Config::tiny();
    c0.variant = Variant::Pi0;
    let w0 = Pi05Weights::random(&c0, 3);
    let e = w0.fp8_weight_names(true, true).unwrap_err().to_string();
    assert!(e.contains("no FP8 path"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

//! The tiny Pi0.5 on the host backend against actions recorded from an earlier build: code
//! that is moved or restructured must keep every value bit for bit (f32 and bf16, fixed and
//! exact prompt modes, with and without a frozen prefix).
//!
//! The recordings are `tests/data/golden_*.bin` (little-endian f32). A deliberate numerical
//! change re-records them: `FRT_RECORD_GOLDEN=1 cargo test -p frt-vla --test golden`, and the
//! commit says why the values changed.

use frt_exec::Ctx;
use frt_kernels::DType;
use frt_vla::{ModelImage, Observation, Pi05, Pi05Config, Pi05Weights, PromptMode, ViewImage};

mod common;
use common::rand;

/// Two inferences (the second with another prompt and noise, and one view missing) of the
/// tiny model built as asked, concatenated.
fn actions(dtype: DType, mode: PromptMode, frozen_rows: usize) -> Vec<f32> {
    let c = Pi05Config::tiny();
    let ctx = Ctx::host().unwrap();
    let s = ctx.stream(0).unwrap();
    let w = Pi05Weights::random(&c, 11);
    let m = Pi05::build(
        &ctx,
        s,
        &w,
        &frt_vla::Pi05Options {
            prompt_mode: mode,
            inpaint_prefix: frozen_rows > 0,
            ..frt_vla::Pi05Options::new(dtype)
        },
    )
    .unwrap();
    let px = c.siglip.image_size * c.siglip.image_size * 3;
    let images: Vec<ModelImage> = (0..c.views as u32)
        .map(|v| ModelImage::new(rand(5 + v, px, 1.0)).unwrap())
        .collect();
    let n = c.action_horizon * c.action_dim;
    if frozen_rows > 0 {
        m.set_frozen_prefix(frozen_rows, &rand(77, n, 0.8)).unwrap();
    }
    let mut out = Vec::new();
    for (k, tokens) in [vec![2u32, 17, 99, 301, 5, 42, 7, 108], vec![2, 64, 9]]
        .iter()
        .enumerate()
    {
        let present: Vec<bool> = (0..c.views).map(|v| k == 0 || v != 1).collect();
        let imgs: Vec<Option<ViewImage>> = images
            .iter()
            .zip(&present)
            .map(|(i, p)| p.then_some(ViewImage::Pixels(i)))
            .collect();
        let noise = rand(100 + k as u32, n, 1.3);
        out.extend(
            m.infer(&Observation {
                state: &[],
                images: &imgs,
                tokens,
                noise: &noise,
            })
            .unwrap(),
        );
    }
    out
}

fn check(name: &str, got: Vec<f32>) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(format!("golden_{name}.bin"));
    if std::env::var("FRT_RECORD_GOLDEN").as_deref() == Ok("1") {
        let bytes: Vec<u8> = got.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(&path, bytes).unwrap();
        return;
    }
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let want: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(got.len(), want.len(), "{name}: value count");
    let differ = got
        .iter()
        .zip(&want)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    let worst = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert_eq!(
        differ,
        0,
        "{name}: {differ} of {} values differ from the recording (max |Δ| {worst:e})",
        want.len()
    );
}

#[test]
fn f32_fixed_prompt_is_bit_identical() {
    check("f32_fixed", actions(DType::F32, PromptMode::Fixed, 0));
}

#[test]
fn f32_exact_prompt_is_bit_identical() {
    check("f32_exact", actions(DType::F32, PromptMode::Exact, 0));
}

#[test]
fn f32_frozen_prefix_is_bit_identical() {
    check("f32_frozen", actions(DType::F32, PromptMode::Fixed, 3));
}

#[test]
fn bf16_fixed_prompt_is_bit_identical() {
    check("bf16_fixed", actions(DType::BF16, PromptMode::Fixed, 0));
}

//! The tiny Pi0.5 and the tiny Pi0 on the host backend against openpi's own implementation:
//! the actions of openpi's PyTorch model (`PI0Pytorch`, pi05=True / False, float32) for the
//! same weights, inputs and noise, recorded in `data/{pi05,pi0}_tiny_openpi.json` by
//! `scripts/pi05-openpi-reference.py`. The weights go through the real loader, from the
//! checkpoint file the reference read.

use frt_exec::Ctx;
use frt_kernels::DType;
use frt_vla::{ModelImage, Observation, Pi05, Pi05Config, Pi05Weights, PromptMode, ViewImage};
use serde::Deserialize;

#[derive(Deserialize)]
struct Reference {
    seed: u64,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    present: Vec<bool>,
    noise_seed: u32,
    tokens: Vec<u32>,
    /// Pi0's state: this many values of [`robot_state`] (absent for Pi0.5: none).
    #[serde(default)]
    state_len: usize,
    actions: Vec<f32>,
}

/// View `view` (`[h, w, c]`), the formula the reference script evaluates: in f64, rounded to f32.
fn image(size: usize, view: usize) -> Vec<f32> {
    let mut v = Vec::with_capacity(size * size * 3);
    for y in 0..size {
        for x in 0..size {
            for c in 0..3 {
                let (x, y, c, view) = (x as f64, y as f64, c as f64, view as f64);
                let a = 0.031 * x * (c + 1.0) + 0.017 * y * (view + 2.0) + 0.5 * c + 1.1 * view;
                v.push((0.9 * a.sin()) as f32);
            }
        }
    }
    v
}

/// `n` normalized joint values (the reference pads them with zeros to `action_dim`; the model
/// does that itself).
fn robot_state(n: usize, seed: u32) -> Vec<f32> {
    let s = seed as f64;
    (0..n)
        .map(|i| (0.8 * (0.7 * i as f64 + s).sin() - 0.1 * s) as f32)
        .collect()
}

fn noise(n: usize, seed: u32) -> Vec<f32> {
    let s = seed as f64;
    (0..n)
        .map(|i| {
            let i = i as f64;
            (1.3 * (0.37 * i + s).sin() + 0.4 * (0.11 * i * (s + 1.0)).cos()) as f32
        })
        .collect()
}

#[test]
fn tiny_matches_openpi_pytorch() {
    check(
        include_str!("data/pi05_tiny_openpi.json"),
        &Pi05Config::tiny(),
    );
}

#[test]
fn tiny_pi0_matches_openpi_pytorch() {
    check(
        include_str!("data/pi0_tiny_openpi.json"),
        &Pi05Config::pi0_tiny(),
    );
}

fn check(reference: &str, c: &Pi05Config) {
    let r: Reference = serde_json::from_str(reference).unwrap();
    // The checkpoint goes through a folder of its own, removed however the loading ends.
    struct Scratch(std::path::PathBuf);
    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let dir = Scratch(std::env::temp_dir().join(format!(
        "frt-vla-openpi-{:?}-{}",
        c.variant,
        std::process::id()
    )));
    Pi05Weights::random(c, r.seed)
        .write(&dir.0, false, 1, false)
        .unwrap();
    let w = Pi05Weights::load(&dir.0, c).unwrap();
    drop(dir);
    let ctx = Ctx::host().unwrap();
    let images: Vec<ModelImage> = (0..c.views)
        .map(|v| ModelImage::new(image(c.siglip.image_size, v)).unwrap())
        .collect();
    for mode in [PromptMode::Fixed, PromptMode::Exact] {
        let m = Pi05::with_mode(&ctx, ctx.stream(0).unwrap(), &w, DType::F32, mode).unwrap();
        for case in &r.cases {
            let views: Vec<Option<ViewImage>> = images
                .iter()
                .zip(&case.present)
                .map(|(im, p)| p.then_some(ViewImage::Pixels(im)))
                .collect();
            let a = m
                .infer(&Observation {
                    state: &robot_state(case.state_len, case.noise_seed),
                    images: &views,
                    tokens: &case.tokens,
                    noise: &noise(c.action_horizon * c.action_dim, case.noise_seed),
                })
                .unwrap();
            assert_eq!(a.len(), case.actions.len());
            let (mut dot, mut na, mut nb, mut max) = (0f64, 0f64, 0f64, 0f64);
            for (x, y) in a.iter().zip(&case.actions) {
                let (x, y) = (*x as f64, *y as f64);
                dot += x * y;
                na += x * x;
                nb += y * y;
                max = max.max((x - y).abs());
            }
            let cos = dot / (na.sqrt() * nb.sqrt());
            eprintln!(
                "{} {mode:?}, {}: cosine {cos:.9}, max |Δ| {max:.3e}",
                c.variant.name(),
                case.name
            );
            assert!(
                cos >= 0.999_999 && max <= 1e-4,
                "{mode:?}, {}: cosine {cos}, max |Δ| {max} against openpi",
                case.name
            );
        }
    }
}

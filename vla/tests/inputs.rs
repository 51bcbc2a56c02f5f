//! Preprocessing against reference values from independent implementations
//! (`scripts/vla-references.py`: jax.image.resize, numpy.digitize).

use frt_vla::inputs::{
    ModelImage, Normalization, discretize_state, pi05_prompt, resize_with_pad, to_model_pixels,
};
use serde_json::Value;
use std::path::Path;

mod common;

fn refs() -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/preprocess.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// Counts pixels that differ, and by how much at most.
fn compare(got: &[u8], want: &[u8]) -> (usize, u8) {
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .filter(|(a, b)| a != b)
        .fold((0, 0), |(n, m), (a, b)| (n + 1, m.max(a.abs_diff(*b))))
}

#[test]
fn resize_with_pad_matches_jax() {
    let r = refs();
    for case in r["resize_with_pad"].as_array().unwrap() {
        let u = |k: &str| case[k].as_u64().unwrap() as usize;
        let bytes = |k: &str| {
            case[k]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u8)
                .collect::<Vec<u8>>()
        };
        let (th, tw) = (
            case["target"][0].as_u64().unwrap() as usize,
            case["target"][1].as_u64().unwrap() as usize,
        );
        let got = resize_with_pad(&bytes("src"), u("h"), u("w"), th, tw).unwrap();
        let (n, worst) = compare(&got, &bytes("out"));
        assert!(
            worst <= 1 && n * 200 <= got.len(),
            "{}x{} -> {th}x{tw}: {n} pixels differ, by up to {worst}",
            u("h"),
            u("w")
        );
    }
    // A camera-sized frame to the model's 224×224 (antialiased downscale, padding).
    let bin =
        std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/resize_240x320.bin"))
            .unwrap();
    let (src, want) = bin.split_at(240 * 320 * 3);
    let got = resize_with_pad(src, 240, 320, 224, 224).unwrap();
    let (n, worst) = compare(&got, want);
    println!(
        "240x320 -> 224x224: {n} of {} values differ (by at most {worst})",
        got.len()
    );
    assert!(worst <= 1 && n * 200 <= got.len());
    assert!(resize_with_pad(&src[1..], 240, 320, 224, 224).is_err());
    assert_eq!(
        to_model_pixels(&[0, 255, 51]).values(),
        [-1.0, 1.0, 51.0 / 255.0 * 2.0 - 1.0]
    );
    // Every uint8 value lands in [-1, 1] (what lets the model skip the range check).
    let all: Vec<u8> = (0..=255).collect();
    let px = to_model_pixels(&all);
    assert!(px.values().iter().all(|x| (-1.0..=1.0).contains(x)));
    assert_eq!(ModelImage::new(px.values().to_vec()).unwrap(), px);
}

/// The device op from `resize_tables`, on the host backend, gives exactly what the host
/// preprocessing gives (`to_model_pixels(resize_with_pad(..))`), bit for bit, at camera
/// sizes, odd sizes, the model's own size, upscales and an all-padding extreme.
#[test]
fn the_device_resize_equals_the_host_preprocessing() {
    let ctx = frt_exec::Ctx::host().unwrap();
    for (k, &(h, w)) in common::FRAME_SIZES.iter().enumerate() {
        let src = common::frame(k as u32 + 1, h, w);
        let want = to_model_pixels(&resize_with_pad(&src, h, w, 224, 224).unwrap());
        let got = common::pixels_on(&ctx, &src, h, w, 224);
        let differ = got
            .iter()
            .zip(want.values())
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(differ, 0, "{h}×{w}: {differ} values differ");
    }
}

#[test]
fn state_bins_match_numpy_digitize() {
    let r = refs();
    let state: Vec<f32> = r["digitize"]["state"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap() as f32)
        .collect();
    let want: Vec<i32> = r["digitize"]["bins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap() as i32)
        .collect();
    assert_eq!(discretize_state(&state).unwrap(), want);
    assert!(discretize_state(&[0.0, f32::NAN]).is_err());
    assert_eq!(
        pi05_prompt("  pick_up the\ncup ", &[-1.0, 0.0, 0.5]).unwrap(),
        "Task: pick up the cup, State: 0 128 192;\nAction: "
    );
    assert!(pi05_prompt("   ", &[0.0]).is_err());
}

#[test]
fn normalization_round_trips_and_rejects_bad_statistics() {
    let json = r#"{"norm_stats": {
        "state": {"mean": [1.0, -2.0], "std": [2.0, 0.5], "q01": [0.0, -4.0], "q99": [2.0, 0.0]},
        "actions": {"mean": [0.0, 1.0, 2.0], "std": [1.0, 2.0, 3.0], "q01": [-1.0, -1.0, -1.0], "q99": [1.0, 3.0, 5.0]}}}"#;
    for quantiles in [false, true] {
        let n = Normalization::parse(json, quantiles).unwrap();
        let mut s = vec![2.0f32, -1.0, 7.0];
        n.state.normalize(&mut s, quantiles).unwrap();
        let want = if quantiles {
            [
                (2.0 - 0.0) / (2.0 + 1e-6) * 2.0 - 1.0,
                (-1.0 + 4.0) / (4.0 + 1e-6) * 2.0 - 1.0,
            ]
        } else {
            [(2.0 - 1.0) / (2.0 + 1e-6), (-1.0 + 2.0) / (0.5 + 1e-6)]
        };
        assert!(
            (s[0] - want[0]).abs() < 1e-5 && (s[1] - want[1]).abs() < 1e-5 && s[2] == 7.0,
            "{s:?}"
        );
        let mut a = vec![0.25f32, -0.5, 0.75, 9.0];
        let orig = a.clone();
        n.actions.unnormalize(&mut a, quantiles).unwrap();
        n.actions.normalize(&mut a, quantiles).unwrap();
        for (x, y) in a.iter().zip(&orig).take(3) {
            assert!((x - y).abs() < 1e-5);
        }
    }
    for bad in [
        r#"{"norm_stats": {"state": {"mean": [1.0], "std": [1.0]}}}"#,
        r#"{"norm_stats": {"state": {"mean": [1.0], "std": [1.0, 2.0]}, "actions": {"mean": [0.0], "std": [1.0]}}}"#,
        r#"{"norm_stats": {"state": {"mean": [1.0], "std": [1.0]}, "actions": {"mean": [NaN], "std": [1.0]}}}"#,
        r#"not json"#,
    ] {
        assert!(Normalization::parse(bad, false).is_err(), "{bad}");
    }
    let no_quantiles = r#"{"norm_stats": {"state": {"mean": [1.0], "std": [1.0]}, "actions": {"mean": [0.0], "std": [1.0]}}}"#;
    assert!(Normalization::parse(no_quantiles, false).is_ok());
    assert!(
        Normalization::parse(no_quantiles, true).is_err(),
        "quantile mode needs q01/q99"
    );
}

//! Weights: the deterministic generator, the openpi/LeRobot writer and the loader.

use frt_vla::weights::{LLM, expected, random_tensors, write_tensors};
use frt_vla::{Error, Pi05Config, Pi05Weights};

fn tmp(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("frt-vla-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn configs_are_consistent() {
    for c in [Pi05Config::base(), Pi05Config::tiny()] {
        c.validate().unwrap();
    }
    assert_eq!(Pi05Config::base().siglip.tokens(), 256);
    assert_eq!(Pi05Config::base().prefix_len(), 3 * 256 + 200);
    let mut bad = Pi05Config::tiny();
    bad.expert.depth = 3;
    assert!(bad.validate().is_err());
    // The base model has the parameter count of pi05 (about 3.3 billion).
    let params: usize = expected(&Pi05Config::base())
        .iter()
        .map(|(_, s, _)| s.iter().product::<usize>())
        .sum();
    assert!((3.2e9..3.5e9).contains(&(params as f64)), "{params}");
}

#[test]
fn random_weights_are_deterministic() {
    let c = Pi05Config::tiny();
    let (a, b, other) = (
        Pi05Weights::random(&c, 7),
        Pi05Weights::random(&c, 7),
        Pi05Weights::random(&c, 8),
    );
    assert_eq!(a.store().len(), expected(&c).len());
    let name = format!("{LLM}.layers.1.mlp.up_proj.weight");
    let f = |w: &Pi05Weights| w.get(&name).unwrap().to_f32().unwrap();
    assert_eq!(f(&a), f(&b));
    assert_ne!(f(&a), f(&other));
    let d = f(&a);
    let mean = d.iter().sum::<f32>() / d.len() as f32;
    assert!(mean.abs() < 0.05 && d.iter().all(|v| v.is_finite()));
}

/// Every expected tensor's shape and values.
fn values(w: &Pi05Weights) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    expected(&w.config)
        .into_iter()
        .map(|(n, _, _)| {
            let v = w.get(&n).unwrap();
            (n, v.shape().to_vec(), v.to_f32().unwrap())
        })
        .collect()
}

#[test]
fn round_trips_through_the_real_loader() {
    let c = Pi05Config::tiny();
    let w = Pi05Weights::random(&c, 1);
    // f32, one file, openpi naming: exact.
    let d = tmp("f32");
    w.write(&d, false, 1, false).unwrap();
    let back = Pi05Weights::load(&d, &c).unwrap();
    back.check_finite().unwrap();
    assert_eq!(values(&back), values(&w));
    // bf16, three shards, LeRobot naming: every value rounded to bf16.
    let d2 = tmp("bf16");
    w.write(&d2, true, 3, true).unwrap();
    assert!(d2.join("model.safetensors.index.json").is_file());
    let back = Pi05Weights::load(&d2, &c).unwrap();
    for ((name, shape, t), (_, bshape, b)) in values(&w).iter().zip(values(&back)) {
        assert_eq!(&bshape, shape);
        for (x, y) in t.iter().zip(&b) {
            assert!(
                (x - y).abs() <= x.abs() / 128.0 + 1e-30,
                "{name}: {x} vs {y}"
            );
        }
    }
    let _ = (std::fs::remove_dir_all(&d), std::fs::remove_dir_all(&d2));
}

#[test]
fn missing_or_misshaped_tensors_are_named() {
    let c = Pi05Config::tiny();
    let gone = "action_out_proj.weight".to_string();
    let mut t = random_tensors(&c, 2);
    t.retain(|(n, _, _)| *n != gone);
    let d = tmp("missing");
    write_tensors(&d, &c, &t, false, 1, false).unwrap();
    match Pi05Weights::load(&d, &c) {
        Err(Error::Weights(frt_nn::Error::MissingTensor { name, expected })) => {
            assert_eq!(name, gone);
            assert_eq!(expected, vec![c.action_dim, c.expert.width]);
        }
        other => panic!("expected MissingTensor, got {other:?}"),
    }
    let mut t = random_tensors(&c, 2);
    for (n, shape, _) in &mut t {
        if n == "time_mlp_in.bias" {
            *shape = vec![c.expert.width / 2, 2];
        }
    }
    write_tensors(&d, &c, &t, false, 1, false).unwrap();
    match Pi05Weights::load(&d, &c) {
        Err(Error::Weights(frt_nn::Error::TensorShape {
            name,
            got,
            expected,
        })) => {
            assert_eq!(name, "time_mlp_in.bias");
            assert_eq!(got, vec![c.expert.width / 2, 2]);
            assert_eq!(expected, vec![c.expert.width]);
        }
        other => panic!("expected TensorShape, got {other:?}"),
    }
    // A non-finite value is named by the check and by the upload.
    let mut t = random_tensors(&c, 2);
    for (n, _, v) in &mut t {
        if n == "time_mlp_out.bias" {
            v[3] = f32::NAN;
        }
    }
    write_tensors(&d, &c, &t, true, 1, false).unwrap();
    let w = Pi05Weights::load(&d, &c).unwrap();
    let nan = |e: Error| matches!(e, Error::Weights(frt_nn::Error::NonFinite { name }) if name == "time_mlp_out.bias");
    assert!(nan(w.check_finite().unwrap_err()));
    let ctx = frt_exec::Ctx::host().unwrap();
    let s = ctx.default_stream();
    match frt_vla::Pi05::new(&ctx, s, &w, frt_kernels::DType::F32) {
        Err(e) => assert!(nan(e)),
        Ok(_) => panic!("a model was built from a NaN weight"),
    }
    // A config that does not match the checkpoint.
    let w = Pi05Weights::random(&c, 2);
    w.write(&d, false, 1, false).unwrap();
    let mut other = c.clone();
    other.action_dim = 7;
    assert!(matches!(
        Pi05Weights::load(&d, &other),
        Err(Error::Weights(frt_nn::Error::TensorShape { .. }))
    ));
    std::fs::write(d.join("model.safetensors"), b"not safetensors").unwrap();
    assert!(matches!(
        Pi05Weights::load(&d, &c),
        Err(Error::Weights(frt_nn::Error::BadCheckpoint { .. }))
    ));
    assert!(matches!(
        Pi05Weights::load(&d.join("absent"), &c),
        Err(Error::Weights(frt_nn::Error::ModelFolder { .. }))
    ));
    let _ = std::fs::remove_dir_all(&d);
}

//! Weights: the deterministic generator, the openpi/LeRobot writer and the loader.

use frt_vla::weights::{LLM, expected};
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
    assert_eq!(a.tensors.len(), expected(&c).len());
    let name = format!("{LLM}.layers.1.mlp.up_proj.weight");
    assert_eq!(a.get(&name).unwrap(), b.get(&name).unwrap());
    assert_ne!(a.get(&name).unwrap().data, other.get(&name).unwrap().data);
    let d = &a.get(&name).unwrap().data;
    let mean = d.iter().sum::<f32>() / d.len() as f32;
    assert!(mean.abs() < 0.05 && d.iter().all(|v| v.is_finite()));
}

#[test]
fn round_trips_through_the_real_loader() {
    let c = Pi05Config::tiny();
    let w = Pi05Weights::random(&c, 1);
    // f32, one file, openpi naming: exact.
    let d = tmp("f32");
    w.write(&d, false, 1, false).unwrap();
    let back = Pi05Weights::load(&d, &c).unwrap();
    assert_eq!(back.tensors, w.tensors);
    // bf16, three shards, LeRobot naming: every value rounded to bf16.
    let d2 = tmp("bf16");
    w.write(&d2, true, 3, true).unwrap();
    assert!(d2.join("model.safetensors.index.json").is_file());
    let back = Pi05Weights::load(&d2, &c).unwrap();
    for (name, t) in &w.tensors {
        let b = &back.tensors[name];
        assert_eq!(b.shape, t.shape);
        for (x, y) in t.data.iter().zip(&b.data) {
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
    let mut w = Pi05Weights::random(&c, 2);
    let gone = "action_out_proj.weight".to_string();
    w.tensors.remove(&gone);
    let d = tmp("missing");
    w.write(&d, false, 1, false).unwrap();
    match Pi05Weights::load(&d, &c) {
        Err(Error::MissingTensor { name, expected }) => {
            assert_eq!(name, gone);
            assert_eq!(expected, vec![c.action_dim, c.expert.width]);
        }
        other => panic!("expected MissingTensor, got {other:?}"),
    }
    let mut w = Pi05Weights::random(&c, 2);
    w.tensors.get_mut("time_mlp_in.bias").unwrap().shape = vec![c.expert.width / 2, 2];
    w.write(&d, false, 1, false).unwrap();
    assert!(matches!(
        Pi05Weights::load(&d, &c),
        Err(Error::TensorShape { .. })
    ));
    // A config that does not match the checkpoint.
    let w = Pi05Weights::random(&c, 2);
    w.write(&d, false, 1, false).unwrap();
    let mut other = c.clone();
    other.action_dim = 7;
    assert!(matches!(
        Pi05Weights::load(&d, &other),
        Err(Error::TensorShape { .. })
    ));
    std::fs::write(d.join("model.safetensors"), b"not safetensors").unwrap();
    assert!(matches!(
        Pi05Weights::load(&d, &c),
        Err(Error::BadCheckpoint { .. })
    ));
    assert!(matches!(
        Pi05Weights::load(&d.join("absent"), &c),
        Err(Error::ModelFolder { .. })
    ));
    let _ = std::fs::remove_dir_all(&d);
}

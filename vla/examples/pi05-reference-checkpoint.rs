//! Writes the tiny Pi0.5's (or, with `pi0`, the tiny Pi0's) deterministic random weights as an
//! openpi-named f32 checkpoint (`model.safetensors` + `config.json`): the input of
//! `scripts/pi05-openpi-reference.py`, which runs openpi's own model on it to regenerate
//! `vla/tests/data/{pi05,pi0}_tiny_openpi.json`.
//!
//!     cargo run --release -p frt-vla --example pi05-reference-checkpoint -- DIR [SEED [pi0]]

use frt_vla::{Pi05Config, Pi05Weights};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = args
        .next()
        .ok_or("usage: pi05-reference-checkpoint DIR [SEED [pi0]]")?;
    let seed: u64 = args.next().map_or(Ok(7), |s| s.parse())?;
    let config = match args.next().as_deref() {
        None | Some("pi05") => Pi05Config::tiny(),
        Some("pi0") => Pi05Config::pi0_tiny(),
        Some(other) => return Err(format!("unknown variant `{other}` (pi05 or pi0)").into()),
    };
    Pi05Weights::random(&config, seed).write(dir.as_ref(), false, 1, false)?;
    println!(
        "tiny {}, seed {seed}: {dir}/model.safetensors",
        config.variant.name()
    );
    Ok(())
}

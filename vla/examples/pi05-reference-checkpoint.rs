//! Writes the tiny Pi0.5's deterministic random weights as an openpi-named f32 checkpoint
//! (`model.safetensors` + `config.json`): the input of `scripts/pi05-openpi-reference.py`,
//! which runs openpi's own model on it to regenerate `vla/tests/data/pi05_tiny_openpi.json`.
//!
//!     cargo run --release -p frt-vla --example pi05-reference-checkpoint -- DIR [SEED]

use frt_vla::{Pi05Config, Pi05Weights};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = args
        .next()
        .ok_or("usage: pi05-reference-checkpoint DIR [SEED]")?;
    let seed: u64 = args.next().map_or(Ok(7), |s| s.parse())?;
    Pi05Weights::random(&Pi05Config::tiny(), seed).write(dir.as_ref(), false, 1, false)?;
    println!("tiny Pi0.5, seed {seed}: {dir}/model.safetensors");
    Ok(())
}

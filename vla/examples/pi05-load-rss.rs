//! Peak host memory while loading the full-size Pi0.5 onto a CUDA GPU.
//!
//! `pi05-load-rss load DIR [bf16|f32]`: loads DIR (a full-size checkpoint, e.g. from
//! `pi05-bench --write-checkpoint DIR`), builds the model on GPU 0 (uploads and captures), and
//! prints the checkpoint's size, the peak resident memory of the process (`VmHWM`) and their
//! ratio. Run it in a fresh process: the peak covers the whole process.

use frt_kernels::DType;
use frt_vla::{Pi05, Pi05Config, Pi05Weights};
use std::path::Path;

fn status_kib(key: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn config() -> Pi05Config {
    let mut c = Pi05Config::base();
    c.views = 2;
    c.max_token_len = 64;
    c
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage =
        "usage: pi05-load-rss load DIR [bf16|f32] (write DIR with pi05-bench --write-checkpoint)";
    let (Some(cmd), Some(dir)) = (args.get(1), args.get(2)) else {
        eprintln!("{usage}");
        std::process::exit(2)
    };
    let dir = Path::new(dir);
    let c = config();
    match cmd.as_str() {
        "load" => {
            let dtype = match args.get(3).map(String::as_str) {
                Some("f32") => DType::F32,
                _ => DType::BF16,
            };
            let bytes: u64 = std::fs::read_dir(dir)
                .unwrap()
                .filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().ends_with(".safetensors"))
                .map(|e| e.metadata().unwrap().len())
                .sum();
            let ctx = frt_exec::Ctx::cuda(0).unwrap();
            let s = ctx.stream(0).unwrap();
            let before = status_kib("VmHWM:");
            let t = std::time::Instant::now();
            let w = Pi05Weights::load(dir, &c).unwrap();
            let m = Pi05::new(&ctx, s, &w, dtype).unwrap();
            ctx.sync_stream(s).unwrap();
            let secs = t.elapsed().as_secs_f64();
            let peak = status_kib("VmHWM:") * 1024;
            let now = status_kib("VmRSS:") * 1024;
            let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
            println!(
                "| {} | checkpoint {:.2} GiB | peak RSS {:.2} GiB ({:.2}× the checkpoint; {:.2} GiB before loading) | RSS after build {:.2} GiB | load + build {secs:.1} s | {} graphs |",
                dtype.name(),
                gib(bytes),
                gib(peak),
                peak as f64 / bytes as f64,
                gib(before * 1024),
                gib(now),
                m.capture_count()
            );
            drop((m, w));
        }
        _ => {
            eprintln!("{usage}");
            std::process::exit(2)
        }
    }
}

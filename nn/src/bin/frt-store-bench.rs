//! How fast the weight store uploads a checkpoint: a generated bf16 safetensors file (weights
//! of `[4096, 2048]`, `--mib` MiB of them, 512 by default) uploaded as bf16 and quantized per
//! row into E4M3 codes (FP8 models), on the host backend or (`--cuda`) the first GPU.
//!
//! `frt-store-bench [--cuda] [--mib N] [--runs N]`
//!
//! The file is written to the system's temporary folder and read back from the page cache (a
//! warm start's reads). Each upload is timed until its copies have finished; the table has the
//! median and slowest of `--runs` (3) and the checkpoint bytes read per second.

use frt_exec::Ctx;
use frt_kernels::DType;
use frt_nn::{Store, upload_stacked, upload_stacked_e4m3};
use std::time::Instant;

fn arg(args: &[String], name: &str) -> Option<usize> {
    let at = args.iter().position(|a| a == name)?;
    match args.get(at + 1).and_then(|v| v.parse().ok()) {
        Some(v) => Some(v),
        None => {
            eprintln!("frt-store-bench: {name} takes a positive number");
            std::process::exit(2);
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(a) = args.iter().find(|a| {
        !matches!(a.as_str(), "--cuda" | "--mib" | "--runs") && a.parse::<usize>().is_err()
    }) {
        eprintln!("frt-store-bench: unknown argument {a} (--cuda, --mib N, --runs N)");
        std::process::exit(2);
    }
    let mib = arg(&args, "--mib").unwrap_or(512).max(16);
    let runs = arg(&args, "--runs").unwrap_or(3).max(1);
    let ctx = if args.iter().any(|a| a == "--cuda") {
        Ctx::cuda(0)
    } else {
        Ctx::host()
    }
    .unwrap_or_else(|e| {
        eprintln!("frt-store-bench: {e}");
        std::process::exit(1);
    });
    let s = ctx.stream(0).expect("a stream");

    let (rows, cols) = (4096usize, 2048usize);
    let count = (mib << 20) / (rows * cols * 2);
    let dir = std::env::temp_dir().join(format!("frt-store-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary folder");
    let mut x = 0x9e37_79b9u32;
    let data: Vec<Vec<u8>> = (0..count)
        .map(|_| {
            (0..rows * cols)
                .flat_map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    half::bf16::from_f32((x as f32 / u32::MAX as f32 - 0.5) * 0.05).to_le_bytes()
                })
                .collect()
        })
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView)> = data
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let v =
                safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, vec![rows, cols], b)
                    .expect("a tensor view");
            (format!("w{i}"), v)
        })
        .collect();
    safetensors::serialize_to_file(views, &None, &dir.join("model.safetensors"))
        .expect("the checkpoint written");
    drop(data);
    let store = Store::open(&dir).expect("the checkpoint opened");
    let names: Vec<String> = (0..count).map(|i| format!("w{i}")).collect();
    let bytes = (count * rows * cols * 2) as f64;

    println!(
        "{count} weights of [{rows}, {cols}] bf16 ({:.0} MiB), {}, {} threads available",
        bytes / (1 << 20) as f64,
        if args.iter().any(|a| a == "--cuda") {
            "CUDA"
        } else {
            "host backend"
        },
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    println!("| upload | median ms | slowest ms | GB/s read |");
    println!("|---|---|---|---|");
    for fp8 in [false, true] {
        let mut ms: Vec<f64> = (0..runs)
            .map(|_| {
                let views: Vec<_> = names
                    .iter()
                    .map(|n| store.view(n).expect("a weight"))
                    .collect();
                let t = Instant::now();
                if fp8 {
                    let q = upload_stacked_e4m3(&views, &ctx, s).expect("FP8 upload");
                    ctx.sync_stream(s).expect("copies done");
                    drop(q);
                } else {
                    let w = upload_stacked(&views, &ctx, s, DType::BF16).expect("bf16 upload");
                    ctx.sync_stream(s).expect("copies done");
                    drop(w);
                }
                t.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        ms.sort_by(f64::total_cmp);
        let med = ms[ms.len() / 2];
        println!(
            "| {} | {med:.1} | {:.1} | {:.2} |",
            if fp8 {
                "E4M3 codes, per-row scales"
            } else {
                "bf16"
            },
            ms[ms.len() - 1],
            bytes / (med * 1e-3) / 1e9
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

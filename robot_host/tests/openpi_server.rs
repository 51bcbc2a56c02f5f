//! The openpi websocket server (`frt-robot-host serve`) against the real `openpi-client` from
//! PyPI (installed into `.cache/pip-openpi` by `scripts/fetch-models.sh`, or
//! `$FRT_OPENPI_CLIENT`), on loopback, with the tiny random model on the host backend: the
//! metadata, each preset's observation layout as openpi's examples send it, the actions'
//! shape, dtype and limits, malformed observations (the client raises openpi's server error;
//! a new connection works), concurrent clients, stalled and dead clients beside a normal one,
//! an oversized message,
//! 1000 requests with flat memory, the health check.

mod serving;
use frt_robot_host::serve::{self, Server};
use serde_json::Value;
use serving::{client, config, config_with};

/// Runs a scenario to its end; its JSON findings.
fn run(server: &Server, args: &[&str]) -> Value {
    let out = client(server, args).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "openpi client {args:?}: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.lines().last().unwrap_or_default()).unwrap()
}

/// The tests share this process (and its resident memory): each holds the lock shared while
/// its server runs, the memory test alone holds it exclusively.
static MEMORY: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// A running server and this test's share of [`MEMORY`].
struct Running {
    server: Server,
    _shared: std::sync::RwLockReadGuard<'static, ()>,
}

impl Running {
    fn stop(self) -> Result<(), String> {
        self.server.stop()
    }
}

impl std::ops::Deref for Running {
    type Target = Server;
    fn deref(&self) -> &Server {
        &self.server
    }
}

fn start(preset: &str) -> Running {
    start_with(&config(preset))
}

fn start_with(cfg: &frt_robot_host::config::Config) -> Running {
    let shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    Running {
        server: serve::start(cfg, None).unwrap(),
        _shared: shared,
    }
}

/// Checks one reply's summary: `[50, dims]` float32, finite, within the configured limits.
fn check_actions(s: &Value, dims: u64) {
    assert_eq!(s["shape"], serde_json::json!([50, dims]), "{s}");
    assert_eq!(s["dtype"], "float32");
    assert_eq!(s["finite"], true);
    assert!(
        s["min"].as_f64().unwrap() >= -1.5 && s["max"].as_f64().unwrap() <= 1.5,
        "{s}"
    );
    assert_eq!(
        s["keys"],
        serde_json::json!(["actions", "policy_timing", "server_timing"])
    );
}

fn preset_round_trip(preset: &str, dims: u64) -> Value {
    let server = start(preset);
    let r = run(&server, &[preset]);
    let m = &r["metadata"];
    assert_eq!(m["server"], "frt");
    assert_eq!(m["model"], "Pi0.5");
    assert_eq!(m["preset"], preset);
    assert_eq!(m["action_horizon"], 50);
    assert_eq!(m["action_dim"], dims);
    check_actions(&r["first"], dims);
    check_actions(&r["second"], dims);
    // openpi's server reports the previous request's total time from the second one on.
    assert_eq!(r["first"]["server_timing"], serde_json::json!(["infer_ms"]));
    assert_eq!(
        r["second"]["server_timing"],
        serde_json::json!(["infer_ms", "prev_total_ms"])
    );
    server.stop().unwrap();
    r
}

#[test]
fn droid_observations_as_openpi_sends_them() {
    let r = preset_round_trip("droid", 8);
    // 640×480 frames (resized with padding), float CHW frames.
    check_actions(&r["vga"], 8);
    check_actions(&r["float_chw"], 8);
}

#[test]
fn libero_observations_as_openpi_sends_them() {
    preset_round_trip("libero", 7);
}

#[test]
fn aloha_observations_as_openpi_sends_them() {
    preset_round_trip("aloha", 14);
}

/// A malformed observation: the client raises openpi's server error with a message naming the
/// key; the server closes that connection and serves the next.
#[test]
fn malformed_observations_are_named_errors_and_the_server_keeps_serving() {
    let server = start("droid");
    let r = run(&server, &["errors"]);
    let want = [
        ("missing key", "observation/wrist_image_left"),
        ("short state", "observation/joint_position"),
        ("NaN state", "non-finite"),
        ("bad image shape", "observation/exterior_image_1_left"),
        ("float image out of range", "[0, 1]"),
        ("prompt not a string", "`prompt`"),
    ];
    let errors = r["errors"].as_array().unwrap();
    assert_eq!(errors.len(), want.len());
    for (e, (case, needle)) in errors.iter().zip(want) {
        assert_eq!(e["case"], case);
        assert_eq!(e["raised"], true, "{case}: {e}");
        let msg = e["message"].as_str().unwrap();
        assert!(
            msg.starts_with("Error in inference server:"),
            "{case}: {msg}"
        );
        assert!(msg.contains(needle), "{case}: `{needle}` not in {msg}");
        assert_eq!(e["after"], serde_json::json!([50, 8]), "{case}");
    }
}

#[test]
fn concurrent_clients_are_all_served() {
    let server = start("droid");
    let r = run(&server, &["concurrent"]);
    assert_eq!(r["failures"], serde_json::json!([]));
    assert_eq!(r["shapes"].as_array().unwrap().len(), 9);
}

/// A silent socket, a client that never reads its replies and one that disconnects with a
/// request in flight do not keep a normal client from being served.
#[test]
fn stalled_and_dead_clients_do_not_block_others() {
    let server = start("droid");
    let r = run(&server, &["stalls"]);
    assert_eq!(r["shapes"], serde_json::json!([[50, 8], [50, 8], [50, 8]]));
}

/// A message over `serve.max_message_bytes` ends its connection; the server serves the next.
#[test]
fn an_oversized_message_ends_only_its_connection() {
    // Two 224×224 frames (~301 kB) fit, two 640×480 frames (~1.8 MB) do not.
    let cfg = config_with("droid", "  max_message_bytes: 400000");
    let server = start_with(&cfg);
    let r = run(&server, &["oversize"]);
    assert_eq!(r["refused"], true, "{r}");
    assert_eq!(r["after"], serde_json::json!([50, 8]));
}

#[test]
fn the_health_check_answers() {
    let server = start("droid");
    let r = run(&server, &["health"]);
    assert_eq!(r["status"], 200);
    assert_eq!(r["body"], "OK\n");
}

/// This process's resident memory (the server runs in it), in KiB.
fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// 1000 requests on one connection: every reply a chunk, and the server's memory flat after
/// warm-up (within 8 MiB), with no other test running in the process (in CI, another test's
/// server beside it once moved the resident memory 8.7 MiB).
#[test]
fn a_thousand_requests_keep_memory_flat() {
    // Alone in the process: other tests' servers would move its resident memory.
    let _alone = MEMORY.write().unwrap_or_else(|p| p.into_inner());
    let server = serve::start(&config("droid"), None).unwrap();
    let mut warm = 0;
    let r = serving::sequential(&server, 1000, || warm = rss_kib());
    assert_eq!(r["ok"], 1000);
    let after = rss_kib();
    eprintln!("server RSS after 10 requests {warm} KiB, after 1000 {after} KiB");
    assert!(
        after <= warm + 8 * 1024,
        "RSS grew from {warm} to {after} KiB"
    );
}

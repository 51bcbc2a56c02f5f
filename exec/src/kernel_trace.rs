//! Kernels as the device ran them, from CUPTI's activity API: each kernel's start and end
//! (device timestamps, ns), its graph and graph node, its stream and its name, for kernels
//! launched on their own or from a replayed graph. A benchmark's tool: it shows what a replayed
//! graph's kernels take in place, with the overlaps that programmatic dependent launch gives
//! and the gaps between kernels, where a kernel profiler (`ncu`) runs each kernel alone.
//! Memsets and copies (a graph's memset and copy nodes, or those a library enqueues between its
//! kernels) are recorded too, as records named `[memset N bytes]` and `[memcpy N bytes]`.
//!
//! CUPTI (`libcupti.so`) is loaded from the loader's path at run time; without it
//! [`KernelTrace::start`] returns [`TraceError::NoCupti`]. One trace at a time per process.
//! Recording adds work to every launch (CUPTI's timestamps): compare times taken with a trace
//! running only with other such times.

use cudarc::cupti::result::{CuptiError, activity};
use cudarc::cupti::sys;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// One kernel that ran, or one memset or copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelRecord {
    /// The kernel's (mangled or `extern "C"`) name; `[memset N bytes]` or `[memcpy N bytes]`
    /// for a memset or a copy.
    pub name: String,
    /// Device timestamps in ns.
    pub start_ns: u64,
    pub end_ns: u64,
    /// CUPTI's id of the stream it ran on.
    pub stream: u32,
    /// The graph and graph node it was launched from (0 and 0 outside graphs).
    pub graph: u32,
    pub node: u64,
}

/// Why a trace could not start or be read.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("CUPTI (libcupti.so) could not be loaded; put its folder on LD_LIBRARY_PATH")]
    NoCupti,
    #[error("a kernel trace is already running in this process")]
    Busy,
    #[error("{call} failed: CUPTI {code:?}")]
    Cupti {
        call: &'static str,
        code: sys::CUptiResult,
    },
    #[error("CUPTI dropped {0} records (no buffer space)")]
    Dropped(usize),
}

fn cupti(call: &'static str) -> impl FnOnce(CuptiError) -> TraceError {
    move |e| TraceError::Cupti { call, code: e.0 }
}

/// What a trace records: kernels, and the memsets and copies that run between them (a graph's
/// memset and copy nodes, the ones a library enqueues), as records of their own.
const KINDS: [sys::CUpti_ActivityKind; 3] = [
    sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
    sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_MEMSET,
    sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_MEMCPY,
];

/// The running trace (one a process).
static RUNNING: AtomicBool = AtomicBool::new(false);
/// Records of the buffers CUPTI has completed.
static RECORDS: Mutex<Vec<KernelRecord>> = Mutex::new(Vec::new());

/// CUPTI's activity buffers: 8 MiB each (about 35 000 kernel records), 8-byte aligned.
const BUFFER_BYTES: usize = 8 << 20;
fn buffer_layout() -> std::alloc::Layout {
    std::alloc::Layout::from_size_align(BUFFER_BYTES, 8).expect("a valid layout")
}

extern "C" fn buffer_requested(buffer: *mut *mut u8, size: *mut usize, max_records: *mut usize) {
    // SAFETY: a non-zero-sized layout; CUPTI hands the buffer back to buffer_completed, which
    // frees it with the same layout. CUPTI passes valid out-pointers.
    unsafe {
        let p = std::alloc::alloc(buffer_layout());
        *buffer = p;
        *size = if p.is_null() { 0 } else { BUFFER_BYTES };
        *max_records = 0; // as many as fit
    }
}

extern "C" fn buffer_completed(
    _ctx: cudarc::driver::sys::CUcontext,
    _stream: u32,
    buffer: *mut u8,
    _size: usize,
    valid: usize,
) {
    if buffer.is_null() {
        return;
    }
    let mut kernels = Vec::new();
    let mut record: *mut sys::CUpti_Activity = std::ptr::null_mut();
    // SAFETY: CUPTI filled `valid` bytes of `buffer` with records; get_next_record walks them
    // and stops with an error at the end.
    while unsafe { activity::get_next_record(buffer, valid, &mut record) }.is_ok() {
        // SAFETY: a record CUPTI wrote; its kind says which struct it is.
        let kind = unsafe { std::ptr::addr_of!((*record).kind).read_unaligned() };
        // The fields every record kind read here has under the same names, read from the
        // record as struct `$t` (packed, so unaligned); `$name`, a closure of the record's
        // pointer that reads the name, runs inside the same unsafe block.
        macro_rules! record_as {
            ($t:ty, $name:expr) => {{
                let r = record as *const $t;
                // SAFETY: `record` is a record of a kind whose leading fields `$t` lays out
                // (see each use); only those are read.
                unsafe {
                    KernelRecord {
                        name: $name(r),
                        start_ns: std::ptr::addr_of!((*r).start).read_unaligned(),
                        end_ns: std::ptr::addr_of!((*r).end).read_unaligned(),
                        stream: std::ptr::addr_of!((*r).streamId).read_unaligned(),
                        graph: std::ptr::addr_of!((*r).graphId).read_unaligned(),
                        node: std::ptr::addr_of!((*r).graphNodeId).read_unaligned(),
                    }
                }
            }};
        }
        use sys::CUpti_ActivityKind as Kind;
        match kind {
            // Kernel records: the fields read are at the same offsets in every version from 9
            // to 13 (CUPTI writes its own newest version).
            Kind::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL => kernels.push(record_as!(
                sys::CUpti_ActivityKernel10,
                |k: *const sys::CUpti_ActivityKernel10| {
                    let name = std::ptr::addr_of!((*k).name).read_unaligned();
                    if name.is_null() {
                        String::new()
                    } else {
                        std::ffi::CStr::from_ptr(name)
                            .to_string_lossy()
                            .into_owned()
                    }
                }
            )),
            // Memset records: the same offsets in versions 4 and 5.
            Kind::CUPTI_ACTIVITY_KIND_MEMSET => kernels.push(record_as!(
                sys::CUpti_ActivityMemset4,
                |m: *const sys::CUpti_ActivityMemset4| {
                    let bytes = std::ptr::addr_of!((*m).bytes).read_unaligned();
                    format!("[memset {bytes} bytes]")
                }
            )),
            // Copy records: the same offsets in versions 5 to 7.
            Kind::CUPTI_ACTIVITY_KIND_MEMCPY => kernels.push(record_as!(
                sys::CUpti_ActivityMemcpy6,
                |m: *const sys::CUpti_ActivityMemcpy6| {
                    let bytes = std::ptr::addr_of!((*m).bytes).read_unaligned();
                    format!("[memcpy {bytes} bytes]")
                }
            )),
            _ => {}
        }
    }
    // SAFETY: allocated by buffer_requested with this layout.
    unsafe { std::alloc::dealloc(buffer, buffer_layout()) };
    RECORDS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .extend(kernels);
}

/// A running trace: every kernel, memset and copy run in this process from
/// [`start`](Self::start) until it is dropped is recorded; [`take`](Self::take) hands over
/// those recorded so far.
pub struct KernelTrace {
    _one: (),
}

impl KernelTrace {
    /// Starts recording kernels (CUPTI's concurrent-kernel activity, which leaves kernels free
    /// to overlap), memsets and copies. Best started before the graphs to be traced are
    /// captured.
    pub fn start() -> Result<KernelTrace, TraceError> {
        // SAFETY: only tries to load the library.
        if !unsafe { sys::is_culib_present() } {
            return Err(TraceError::NoCupti);
        }
        if RUNNING.swap(true, Ordering::AcqRel) {
            return Err(TraceError::Busy);
        }
        let started = activity::register_callbacks(Some(buffer_requested), Some(buffer_completed))
            .map_err(cupti("cuptiActivityRegisterCallbacks"))
            .and_then(|()| {
                KINDS.iter().try_for_each(|&kind| {
                    activity::enable(kind).map_err(cupti("cuptiActivityEnable"))
                })
            });
        match started {
            Ok(()) => {
                RECORDS.lock().unwrap_or_else(|p| p.into_inner()).clear();
                Ok(KernelTrace { _one: () })
            }
            Err(e) => {
                RUNNING.store(false, Ordering::Release);
                Err(e)
            }
        }
    }

    /// The records made since the start or the last `take`, in the order CUPTI reported
    /// them (sort by `start_ns` for the device's order). Call it after the work is done (a
    /// stream sync): it flushes CUPTI's buffers, and a kernel still running is not in them.
    pub fn take(&self) -> Result<Vec<KernelRecord>, TraceError> {
        // CUPTI_ACTIVITY_FLAG_FLUSH_FORCED (1; the enum shares the value with another flag).
        activity::flush_all(1).map_err(cupti("cuptiActivityFlushAll"))?;
        let mut dropped = 0usize;
        // SAFETY: a null context asks for the records dropped outside any context's buffers;
        // `dropped` is a valid out-pointer.
        unsafe { activity::get_num_dropped_records(std::ptr::null_mut(), 0, &mut dropped) }
            .map_err(cupti("cuptiActivityGetNumDroppedRecords"))?;
        let kernels = std::mem::take(&mut *RECORDS.lock().unwrap_or_else(|p| p.into_inner()));
        if dropped > 0 {
            return Err(TraceError::Dropped(dropped));
        }
        Ok(kernels)
    }
}

impl Drop for KernelTrace {
    fn drop(&mut self) {
        // Errors here leave nothing to undo: the trace ends either way.
        for kind in KINDS {
            let _ = activity::disable(kind);
        }
        let _ = activity::flush_all(1);
        RECORDS.lock().unwrap_or_else(|p| p.into_inner()).clear();
        RUNNING.store(false, Ordering::Release);
    }
}

/// One kernel of a replayed graph: medians over the replays, in µs from the start of the
/// replay's first kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplayKernel {
    pub name: String,
    pub start_us: f64,
    pub run_us: f64,
    /// From the latest end of the kernels that started before it to its start (negative: it
    /// started before they had all ended, as a dependent launch may; 0 for the first).
    pub gap_us: f64,
}

/// The kernels of several replays of the same graphs, each graph node once a replay: per
/// kernel its medians, in the order of their median start; per replay its span (first start
/// to last end) and the time some kernel ran (the union of their intervals), as medians.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplayProfile {
    pub kernels: Vec<ReplayKernel>,
    pub span_us: f64,
    pub busy_us: f64,
}

/// Why records are not `replays` replays of the same graphs.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProfileError {
    #[error("no kernels recorded")]
    Empty,
    #[error("graph {graph} node {node} ran {runs} times in {replays} replays")]
    Uneven {
        graph: u32,
        node: u64,
        runs: usize,
        replays: usize,
    },
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[(v.len() - 1) / 2]
}

impl ReplayProfile {
    /// The profile of `records` taken over `replays` replays (run r of every node is replay
    /// r's, in time order).
    pub fn new(records: &[KernelRecord], replays: usize) -> Result<ReplayProfile, ProfileError> {
        let mut nodes: std::collections::BTreeMap<(u32, u64), Vec<&KernelRecord>> =
            std::collections::BTreeMap::new();
        for r in records {
            nodes.entry((r.graph, r.node)).or_default().push(r);
        }
        if nodes.is_empty() || replays == 0 {
            return Err(ProfileError::Empty);
        }
        if let Some((&(graph, node), runs)) = nodes.iter().find(|(_, v)| v.len() != replays) {
            return Err(ProfileError::Uneven {
                graph,
                node,
                runs: runs.len(),
                replays,
            });
        }
        let mut nodes: Vec<Vec<&KernelRecord>> = nodes.into_values().collect();
        nodes.iter_mut().for_each(|v| v.sort_by_key(|r| r.start_ns));
        let us = |ns: f64| ns / 1e3;
        let (mut spans, mut busy) = (Vec::new(), Vec::new());
        // Per node: its starts, run times and gaps over the replays.
        let mut per: Vec<[Vec<f64>; 3]> = (0..nodes.len()).map(|_| Default::default()).collect();
        for r in 0..replays {
            let mut order: Vec<usize> = (0..nodes.len()).collect();
            order.sort_by_key(|&i| nodes[i][r].start_ns);
            let t0 = nodes[order[0]][r].start_ns;
            // The union of the intervals so far ends at `reach`, and covers `covered`.
            let (mut reach, mut covered) = (t0, 0u64);
            for &i in &order {
                let k = nodes[i][r];
                per[i][0].push(us((k.start_ns - t0) as f64));
                per[i][1].push(us(k.end_ns.saturating_sub(k.start_ns) as f64));
                per[i][2].push(us(k.start_ns as f64 - reach as f64));
                covered += k.end_ns.saturating_sub(k.start_ns.max(reach));
                reach = reach.max(k.end_ns);
            }
            spans.push(us((reach - t0) as f64));
            busy.push(us(covered as f64));
        }
        let mut kernels: Vec<ReplayKernel> = nodes
            .iter()
            .zip(&mut per)
            .map(|(runs, [start, run, gap])| ReplayKernel {
                name: runs[0].name.clone(),
                start_us: median(start),
                run_us: median(run),
                gap_us: median(gap),
            })
            .collect();
        kernels.sort_by(|a, b| a.start_us.total_cmp(&b.start_us));
        Ok(ReplayProfile {
            kernels,
            span_us: median(&mut spans),
            busy_us: median(&mut busy),
        })
    }
}

/// `records` as a Chrome trace (JSON, which ui.perfetto.dev and chrome://tracing open): a
/// track per stream, named `stream N`, and each kernel a complete event on its stream's track,
/// from its start (µs after the earliest start in `records`) for as long as it ran, with its
/// graph and graph node as arguments.
pub fn chrome_trace(records: &[KernelRecord]) -> String {
    use std::fmt::Write;
    let t0 = records.iter().map(|r| r.start_ns).min().unwrap_or(0);
    let mut streams: Vec<u32> = records.iter().map(|r| r.stream).collect();
    streams.sort_unstable();
    streams.dedup();
    let mut events: Vec<String> = streams
        .iter()
        .map(|s| {
            format!(
                r#"{{"name":"thread_name","ph":"M","pid":1,"tid":{s},"args":{{"name":"stream {s}"}}}}"#
            )
        })
        .collect();
    for r in records {
        let mut e = String::from(r#"{"name":""#);
        for c in r.name.chars() {
            match c {
                '"' => e.push_str("\\\""),
                '\\' => e.push_str("\\\\"),
                c if (c as u32) < 0x20 => {
                    let _ = write!(e, "\\u{:04x}", c as u32);
                }
                c => e.push(c),
            }
        }
        let _ = write!(
            e,
            r#"","ph":"X","pid":1,"tid":{},"ts":{:.3},"dur":{:.3},"args":{{"graph":{},"node":{}}}}}"#,
            r.stream,
            (r.start_ns - t0) as f64 / 1e3,
            r.end_ns.saturating_sub(r.start_ns) as f64 / 1e3,
            r.graph,
            r.node
        );
        events.push(e);
    }
    format!("{{\"traceEvents\":[\n{}\n]}}\n", events.join(",\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(name: &str, node: u64, start_ns: u64, end_ns: u64) -> KernelRecord {
        KernelRecord {
            name: name.into(),
            start_ns,
            end_ns,
            stream: 7,
            graph: 1,
            node,
        }
    }

    #[test]
    fn a_replay_profile_orders_kernels_and_measures_gaps_and_overlaps() {
        // Two replays of a graph of three kernels: node 2 runs first, node 9 starts 1 µs
        // after it ends, node 5 starts 0.5 µs before node 9 ends (a dependent launch).
        // Replay 1 runs 10 µs later and its middle gap is 3 µs, not 1.
        let mut records = Vec::new();
        for (shift, gap) in [(0u64, 1000u64), (10_000_000, 3000)] {
            let t = 100_000 + shift;
            records.push(rec("norm", 2, t, t + 2000));
            let a = t + 2000 + gap;
            records.push(rec("gemm", 9, a, a + 4000));
            records.push(rec("merge", 5, a + 3500, a + 5000));
        }
        // CUPTI's order is not the device's.
        records.reverse();
        let p = ReplayProfile::new(&records, 2).unwrap();
        let names: Vec<&str> = p.kernels.iter().map(|k| k.name.as_str()).collect();
        assert_eq!(names, ["norm", "gemm", "merge"]);
        // Medians of two values take the lower one.
        assert_eq!(p.kernels[1].start_us, 3.0);
        assert_eq!(p.kernels[1].gap_us, 1.0);
        assert_eq!(p.kernels[0].gap_us, 0.0);
        assert_eq!(p.kernels[2].gap_us, -0.5);
        assert_eq!(p.kernels[2].run_us, 1.5);
        // Replay 0: span 2 + 1 + 5 = 8 µs, busy 2 + 5 = 7 µs (the overlap counted once).
        assert_eq!(p.span_us, 8.0);
        assert_eq!(p.busy_us, 7.0);
        // A node that ran once in two replays (the last record, reversed, is the first) is not
        // a replay of the same graphs.
        assert_eq!(
            ReplayProfile::new(&records[1..], 2),
            Err(ProfileError::Uneven {
                graph: 1,
                node: 5,
                runs: 1,
                replays: 2
            })
        );
        assert_eq!(ReplayProfile::new(&[], 2), Err(ProfileError::Empty));
    }

    #[test]
    fn a_chrome_trace_has_a_track_per_stream_and_an_event_per_kernel() {
        let mut a = rec("cast \"a\\b\"\n", 3, 5_000, 7_500);
        a.stream = 14;
        let b = rec("softmax", 4, 8_000, 9_000);
        let json: serde_json::Value = serde_json::from_str(&chrome_trace(&[a, b])).unwrap();
        let events = json["traceEvents"].as_array().unwrap();
        let tracks: Vec<(u64, &str)> = events
            .iter()
            .filter(|e| e["ph"] == "M")
            .map(|e| {
                (
                    e["tid"].as_u64().unwrap(),
                    e["args"]["name"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(tracks, [(7, "stream 7"), (14, "stream 14")]);
        let kernels: Vec<_> = events.iter().filter(|e| e["ph"] == "X").collect();
        assert_eq!(kernels.len(), 2);
        assert_eq!(kernels[0]["name"], "cast \"a\\b\"\n");
        assert_eq!(kernels[0]["tid"], 14);
        assert_eq!(kernels[0]["ts"], 0.0);
        assert_eq!(kernels[0]["dur"], 2.5);
        assert_eq!(kernels[1]["ts"], 3.0);
        assert_eq!(kernels[1]["args"]["node"], 4);
        assert_eq!(chrome_trace(&[]), "{\"traceEvents\":[\n\n]}\n");
    }
}

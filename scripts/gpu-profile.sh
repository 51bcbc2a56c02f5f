#!/usr/bin/env bash
# Per-kernel profile of one Pi0.5 inference's graphs (vision, prefix, one step) on the GPU
# machine, from the staged folder (scripts/stage-gpu.sh), with Nsight Compute's counters:
#     bash .gpu/gpu-profile.sh bf16    # pi05-bench --profile (the canonical bf16 model)
#     bash .gpu/gpu-profile.sh fp8     # pi05-bench --fp8-expert --profile (every stage in FP8)
#     bash .gpu/gpu-profile.sh bf16 step   # only the stages named (vision,prefix,step)
# Prints one row per kernel in launch order (vision, then the prefix, then one step): its
# time, the DRAM bytes it read and wrote and their rate, the L2 bytes it moved, and its SM and
# memory throughput as a share of the peak. The raw CSV goes to $OUT/profile-<part>.csv when
# $OUT is set. The clocks are left alone (--clock-control none).
# WARM=1: only each kernel's time, with the caches left as the kernel before left them
# (--cache-control none, one pass a kernel), for a sum of kernel times to hold against the
# replayed graph's time: what is left is the time between kernels.
set -uo pipefail
cd "$(dirname "$0")"
# One kernel and GEMM-tuning cache for every run here (the profiled run then tunes nothing).
export FRT_KERNEL_CACHE=${FRT_KERNEL_CACHE:-/tmp/kc}
part=${1:-bf16}
case "$part" in
bf16) args=(--profile) ;;
fp8)
    # Calibrated first without the profiler (under it, building and calibrating the bf16
    # model alone takes minutes); the profiled run builds only the FP8 model on that file.
    cal=${TMPDIR:-/tmp}/frt-profile-calibration.json
    ./pi05-bench --fp8-expert --profile --write-calibration "$cal" > /dev/null || {
        echo "calibrating for the FP8 profile failed"
        exit 1
    }
    args=(--fp8-expert --profile --calibration "$cal")
    ;;
*)
    echo "unknown part $part (bf16, fp8)"
    exit 2
    ;;
esac
if [ -n "${2:-}" ]; then
    args+=(--profile-only "$2")
fi
ncu=${NCU:-$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)}
if [ -z "$ncu" ]; then
    echo "no ncu on this machine"
    exit 1
fi
csv=${OUT:-/tmp}/profile-$part${2:+-${2//,/-}}.csv
metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum
metrics=$metrics,sm__throughput.avg.pct_of_peak_sustained_elapsed
metrics=$metrics,gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed
cache=()
if [ "${WARM:-0}" = 1 ]; then
    metrics=gpu__time_duration.sum
    cache=(--cache-control none)
    csv=${csv%.csv}-warm.csv
fi
"$ncu" --profile-from-start off --graph-profiling node --clock-control none --csv --page raw --print-units base \
    "${cache[@]}" --metrics "$metrics" ./pi05-bench "${args[@]}" > "$csv" 2> "${csv%.csv}.log" || {
    echo "ncu failed:"
    tail -20 "${csv%.csv}.log"
    exit 1
}
python3 - "$csv" <<'EOF'
import csv, sys

rows = [l for l in open(sys.argv[1]) if l.startswith('"')]
table = list(csv.reader(rows))
head, data = table[0], table[1:]
# ncu's raw page: a row of units under the header, then one row per kernel.
data = [r for r in data if r and r[0].isdigit()]
col = {name: i for i, name in enumerate(head)}


def val(r, name):
    try:
        return float(r[col[name]].replace(",", ""))
    except (KeyError, ValueError):
        return float("nan")


print("| # | kernel | µs | DRAM read MB | DRAM write MB | DRAM GB/s | L2 MB | SM % | memory % |")
print("|---|---|---|---|---|---|---|---|---|")
total = 0.0
for i, r in enumerate(data):
    ns = val(r, "gpu__time_duration.sum")
    rd, wr = val(r, "dram__bytes_read.sum"), val(r, "dram__bytes_write.sum")
    name = r[col["Kernel Name"]] if "Kernel Name" in col else "?"
    total += ns
    print(
        f"| {i} | {name[:60]} | {ns / 1e3:.1f} | {rd / 1e6:.2f} | {wr / 1e6:.2f} | "
        f"{(rd + wr) / ns:.0f} | {val(r, 'lts__t_bytes.sum') / 1e6:.2f} | "
        f"{val(r, 'sm__throughput.avg.pct_of_peak_sustained_elapsed'):.0f} | "
        f"{val(r, 'gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed'):.0f} |"
    )
print(f"{len(data)} kernels, {total / 1e6:.3f} ms of kernel time")
EOF

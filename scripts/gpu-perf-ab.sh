#!/usr/bin/env bash
# Same-run A/B of the CUDA launch and GEMM settings, on the GPU machine from the staged folder
# (scripts/stage-gpu.sh):  bash .gpu/gpu-perf-ab.sh
# First the kernel and model correctness tests with programmatic dependent launch on (the
# default settings are covered by gpu-suite.sh), then pi05-bench's canonical row under each
# setting, one process each.
set -uo pipefail
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
fail=0
for t in "./kernels-ops --ignored --test-threads=1" "./vla-gpu --ignored --test-threads=1 --nocapture"; do
    echo "=== FRT_PDL=1 $t"
    out=$(FRT_PDL=1 $t 2>&1)
    rc=$?
    echo "$out" | grep -E "cosine|test result|panicked|FAILED"
    [ "$rc" = 0 ] || fail=1
done
for setting in "FRT_GEMM_TUNING=0" "FRT_PDL=0" "FRT_PDL=1" "FRT_PDL=1 FRT_GEMM_TUNING=0"; do
    echo "=== $setting pi05-bench --canonical"
    env $setting ./pi05-bench --iters 200 --canonical 2>&1 | grep -E "^\| 64" || fail=1
done
exit $fail

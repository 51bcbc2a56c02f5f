#!/usr/bin/env bash
# The GPU suite, run on the GPU machine from the staged folder (scripts/stage-gpu.sh):
#     bash .gpu/gpu-suite.sh
# Runs every CUDA test and benchmark of the staged crates; exits non-zero if any fails.
set -uo pipefail
cd "$(dirname "$0")"
fail=0
step() {
    echo
    echo "=== $*"
    "$@" || { echo "=== FAILED: $*"; fail=1; }
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
step ./exec-contract --ignored --test-threads=1 --nocapture
step ./exec-host_backend
step ./exec-alloc_free --ignored
step ./abi_test cuda
step ./abi_test host
step python3 test_torch_adopt.py ./libflashrt_exec.so
step ./frt-exec-bench --backend cuda --rounds 300
step ./kernels-ops --ignored --test-threads=1
step ./kernels-cache --ignored --nocapture
step ./frt-kernels-bench --iters 200
echo
if [ "$fail" = 0 ]; then echo "GPU suite: all steps passed"; else echo "GPU suite: FAILURES"; fi
exit $fail

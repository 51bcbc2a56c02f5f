#!/usr/bin/env bash
# Same-session A/B on the GPU machine, from the staged folder (scripts/stage-gpu.sh), in parts
# that each fit one device call:
#   bash .gpu/gpu-perf-ab.sh ab      # pi05-bench's canonical row: this build against the
#                                    # builds staged beside it as .gpu/pi05-bench-<name>
#                                    # (e.g. -main), alternating, three rounds; then every
#                                    # CUDA op test
#   bash .gpu/gpu-perf-ab.sh fp8     # pi05-bench --fp8-expert (bf16 and the FP8 models, their
#                                    # accuracy against bf16): this build, then each
#                                    # .gpu/pi05-bench-<name> (about 150 s a build)
#   bash .gpu/gpu-perf-ab.sh fp8trace  # the FP8 model's prefix and step kernels as they ran
#                                    # (pi05-bench --fp8-expert --profile --kernel-times; CUPTI
#                                    # from the CUDA install): this build, then each
#                                    # .gpu/pi05-bench-<name> (about 100 s a build)
#   bash .gpu/gpu-perf-ab.sh model   # the full-size model test (CUDA bf16/f32 vs host)
#   bash .gpu/gpu-perf-ab.sh ops     # frt-kernels-bench's memory-bound and attention rows
#                                    # (and main's, from .gpu/frt-kernels-bench-main)
# Each line is printed as it comes and also written to $OUT/<part>.log when $OUT is set.
set -uo pipefail
cd "$(dirname "$0")"
part=${1:-ab}
log=${OUT:-/tmp}/$part.log
exec > >(tee "$log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
fail=0
case "$part" in
ab)
    runs=("./pi05-bench")
    for other in ./pi05-bench-*; do
        [ -x "$other" ] && runs+=("$other")
    done
    for round in 1 2 3; do
        for r in "${runs[@]}"; do
            echo "=== $r --canonical (round $round)"
            # With the GEMM tuning's choices (to tell a slow run's cause).
            FRT_GEMM_TUNING_LOG=1 $r --iters 200 --canonical 2>&1 | grep -E "^\| 64|^gemm|rror" || fail=1
        done
    done
    echo "=== ./kernels-ops --ignored"
    ./kernels-ops --ignored --test-threads=1 2>&1 | grep -E "test result|panicked|FAILED|mismatch" || fail=1
    ;;
fp8)
    for r in ./pi05-bench ./pi05-bench-*; do
        [ -x "$r" ] || continue
        echo "=== $r --fp8-expert"
        $r --iters 100 --fp8-expert 2>&1 | grep -E "^\| (bf16|FP8|canonical|random)|rror" || fail=1
    done
    ;;
fp8trace)
    # CUPTI from the machine's CUDA install, found as gpu-suite.sh finds it.
    cupti=$(dirname "$(find /usr/local /usr/lib /opt -name 'libcupti.so*' 2>/dev/null | head -1)")
    for r in ./pi05-bench ./pi05-bench-*; do
        [ -x "$r" ] || continue
        echo "=== $r --fp8-expert --profile --kernel-times"
        LD_LIBRARY_PATH="$cupti:${LD_LIBRARY_PATH:-}" $r --fp8-expert --profile --kernel-times \
            --profile-only prefix,step 2>&1 | grep -E "^(Prefix|Step)|^\| [a-z\[]|rror" || fail=1
    done
    ;;
model)
    ./vla-gpu --ignored --test-threads=1 --nocapture 2>&1 | grep -E "cosine|test result|panicked" || fail=1
    ;;
ops)
    ./frt-kernels-bench --iters 200 --only mem,attention 2>&1 || fail=1
    if [ -x ./frt-kernels-bench-main ]; then
        # All its rows (an older build may have no --only), the memory-bound and attention
        # ones kept, cut after two minutes.
        echo "=== ./frt-kernels-bench-main (memory-bound and attention rows)"
        timeout 120 ./frt-kernels-bench-main --iters 200 2>&1 | grep -E "^\| (rms_norm|layer_norm|softmax|ada_rms_norm|gated_residual|geglu|rope|expert|siglip|gemma prefix)"
    fi
    ;;
*)
    echo "unknown part $part (ab, fp8, fp8trace, model, ops)"
    exit 2
    ;;
esac
exit $fail

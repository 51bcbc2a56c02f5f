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
# Whisper tiny.en: joined from the two halves carried on consecutive calls (stage-gpu.sh).
export FRT_WHISPER_TINY_EN=/tmp/frt-whisper FRT_ASR_TEST_DATA="$(pwd)/../asr/tests/data"
if [ -f ../.gpu-model2/model.bin.part2 ] && [ -f /tmp/frt-whisper/model.bin.part1 ]; then
    cat /tmp/frt-whisper/model.bin.part1 ../.gpu-model2/model.bin.part2 > /tmp/frt-whisper/model.bin
    [ "$(sha256sum /tmp/frt-whisper/model.bin | cut -d' ' -f1)" = "$(cat ../.gpu-model2/model.bin.sha256)" ] || { echo "model halves do not join"; exit 1; }
fi
step ./exec-frt_exec --ignored --test-threads=1
step ./exec-contract --ignored --test-threads=1 --nocapture
step ./exec-host_backend
step ./exec-alloc_free --ignored
step ./abi_test cuda
step ./abi_test host
step python3 test_torch_adopt.py ./libflashrt_exec.so
# FlashRT's own exec tests, unchanged, with the real torch, against this library on CUDA.
for t in test_exec test_plan_vla; do
    step env FRT_EXEC_LIB="$(pwd)/libflashrt_exec.so" FRT_EXEC_BACKEND=cuda PYTHONPATH="$(pwd)/flashrt" \
        python3 "flashrt/tests/$t.py"
done
step ./frt-exec-bench --backend cuda --rounds 300
step ./kernels-ops --ignored --test-threads=1
step ./kernels-fp8 --ignored --test-threads=1 --nocapture
step ./kernels-cache --ignored --nocapture
step ./kernels-targets --ignored --nocapture
step ./frt-kernels-bench --iters 200
# Models built on several threads at once (the test harness's threads): kernels-threads
# captures GEMMs on one thread while another makes plans, captures, replays, copies.
step ./kernels-threads --ignored
# The kernel trace (CUPTI, from the CUDA install on the machine), then each stage's kernels
# as they ran in a replay.
cupti=$(find /usr/local /usr/lib /opt -name 'libcupti.so*' 2>/dev/null | head -1)
if [ -n "$cupti" ]; then
    export LD_LIBRARY_PATH="$(dirname "$cupti"):${LD_LIBRARY_PATH:-}"
    step ./kernels-kernel_trace --ignored
    step ./pi05-bench --kernel-times
else
    echo "=== CUPTI (libcupti.so) not found: kernel trace steps skipped"; fail=1
fi
step ./vla-gpu --ignored --nocapture
step ./pi05-bench --iters 200
step ./pi05-bench --fp8-expert --iters 100
if [ -f /tmp/frt-whisper/model.bin ]; then
    step ./asr-real_model --ignored --test-threads=1 --nocapture
    step ./transcribe ../asr/tests/data/pick_blue_cup.wav --model /tmp/frt-whisper --backend cuda
    step ./frt-asr-bench --model /tmp/frt-whisper --wav ../asr/tests/data/pick_blue_cup.wav --iters 50
    if [ -f /tmp/frt-gemma-tokenizer.json ]; then
        step ./frt-robot-host bench --iters 200 --whisper /tmp/frt-whisper --tokenizer /tmp/frt-gemma-tokenizer.json --clip ../asr/tests/data/arm_left.wav
    else
        echo "=== Gemma tokenizer not carried: robot host bench skipped"; fail=1
    fi
else
    echo "=== Whisper model not carried: ASR steps skipped"; fail=1
fi
echo
if [ "$fail" = 0 ]; then echo "GPU suite: all steps passed"; else echo "GPU suite: FAILURES"; fi
exit $fail

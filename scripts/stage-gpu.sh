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

cargo build --release -p frt-exec-capi -p frt-kernels --bins --lib
# Test executables: name them after their target (e.g. exec-contract, exec-alloc_free).
cargo test --release -p frt-exec -p frt-exec-capi -p frt-kernels --no-run --message-format=json 2>/dev/null |
    python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        src = m["target"]["src_path"]
        crate = "capi" if "/exec/capi/" in src else ("kernels" if "/kernels/" in src else "exec")
        print(m["executable"], crate + "-" + m["target"]["name"])
' | while read -r exe name; do cp "$exe" "$out/$name"; done

cp target/release/libflashrt_exec.so target/release/frt-exec-bench target/release/frt-kernels-bench "$out/"
cc -std=c11 -Wall -Wextra -Werror -pedantic -O2 -I exec/include exec/capi/tests/c/abi_test.c \
    -o "$out/abi_test" -L "$out" -lflashrt_exec -Wl,-rpath,'$ORIGIN'
cp exec/python/test_torch_adopt.py scripts/gpu-suite.sh "$out/"
strip "$out"/exec-* "$out"/capi-* "$out"/kernels-* "$out/frt-exec-bench" "$out/frt-kernels-bench" "$out/abi_test" "$out/libflashrt_exec.so"
ls -la "$out"
du -sh "$out"

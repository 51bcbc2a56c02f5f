#!/usr/bin/env bash
# Start-up of the robot host at full size from a checkpoint file, on the GPU machine, from the
# staged folder (scripts/stage-gpu.sh; the Gemma tokenizer unpacked to
# /tmp/frt-gemma-tokenizer.json):
#
#     [ROUNDS=N] bash .gpu/gpu-startup.sh [bf16|f32|fp8|fp8q ...]
#
# For each checkpoint precision (default: bf16 and f32) it writes full-size random Pi0.5
# weights as a safetensors checkpoint (`pi05-bench --write-checkpoint`; `fp8`: a bf16
# checkpoint run with `precision: fp8`, its calibration recorded first on the same simulation
# by `frt-robot-host calibrate`, with a kernel cache of its own; `fp8q`: the same, then the
# checkpoint written with its FP8 weights pre-quantized by `frt-robot-host quantize`, and the
# node started from that one), then runs
# `frt-robot-host run --live` on a two-second simulation, cold (an empty kernel and GEMM
# tuning cache, the page cache dropped where this user may) then warm (the same cache, the
# checkpoint's pages as the run before left them), ROUNDS times (default 1). Each run prints
# the node's start-up log lines (device opened, weights opened, model built, first action
# chunk published with the seconds since the process started) and the process's wall time.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
tokenizer=/tmp/frt-gemma-tokenizer.json
[ -f "$tokenizer" ] || { echo "no $tokenizer (see the README's GPU section)"; exit 1; }
work=/tmp/frt-startup
mkdir -p "$work"
rm -f "$work/fp8.calibration.json"
cat > "$work/sim.yaml" <<'EOF'
duration_s: 2
camera_rate_hz: 15
state_rate_hz: 50
EOF
drop_caches() {
    sync
    if echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; then
        echo "page cache dropped"
    else
        echo "page cache NOT dropped (not permitted): the checkpoint may be read from memory"
    fi
}
for precision in "${@:-bf16 f32}"; do
    for p in $precision; do
        ckpt="$work/pi05-$p"
        rm -rf "$ckpt"
        flag=""
        [ "$p" = f32 ] && flag="--f32"
        # The model's precision: the checkpoint's, or FP8 from a bf16 one.
        model_precision=$p
        [ "$p" = f32 ] || model_precision=bf16
        "$here/pi05-bench" --write-checkpoint "$ckpt" $flag
        du -sh "$ckpt"
        # The disk's own pace: the largest shard read cold, alone.
        shard=$(ls -S "$ckpt"/*.safetensors | head -1)
        drop_caches > /dev/null
        echo "cold read of $(basename "$shard"): $(dd if="$shard" of=/dev/null bs=16M 2>&1 | tail -1)"
        cat > "$work/$p.yaml" <<EOF
model:
  checkpoint: $ckpt
  tokenizer: $tokenizer
  precision: $model_precision
  backend: cuda
  max_token_len: 64
cameras:
  - { name: base, topic: /base/image_raw, format: raw, view: 0 }
  - { name: wrist, topic: /wrist/image_raw, format: raw, view: 1 }
state:
  topic: /joint_states
  joints: [j1, j2, j3, j4, j5, j6, j7, j8]
control:
  rate_hz: 20
  initial_subgoal: pick up the red block
  action_dim: 8
  dt: 0.05
safety:
  max_observation_age_ms: 1000
  missing_camera: degrade
  action_space: velocity
  action_min: [-10.0]
  action_max: [10.0]
EOF
        if [ "$p" = fp8 ] || [ "$p" = fp8q ]; then
            # One calibration for `fp8` and `fp8q` (the same generated weights).
            [ -f "$work/fp8.calibration.json" ] ||
                echo "calibrating: $(FRT_KERNEL_CACHE="$work/cache-fp8-calibration" "$here/frt-robot-host" calibrate \
                    --config "$work/$p.yaml" --from "$work/sim.yaml" --out "$work/fp8.calibration.json" 2>&1 | tail -1)"
            sed -i "s|^  precision: bf16|  precision: fp8\n  calibration: $work/fp8.calibration.json|" "$work/$p.yaml"
        fi
        if [ "$p" = fp8q ]; then
            rm -rf "$ckpt-e4m3"
            start=$(date +%s.%N)
            "$here/frt-robot-host" quantize --config "$work/$p.yaml" --out "$ckpt-e4m3" | head -1
            echo "quantize wall time: $(awk "BEGIN { printf \"%.2f\", $(date +%s.%N) - $start }") s"
            du -sh "$ckpt-e4m3"
            sed -i "s|^  checkpoint: .*|  checkpoint: $ckpt-e4m3|" "$work/$p.yaml"
        fi
        cache="$work/cache-$p"
        for run in $(for _ in $(seq "${ROUNDS:-1}"); do echo cold warm; done); do
            echo
            echo "=== $p checkpoint, $run start"
            if [ "$run" = cold ]; then
                rm -rf "$cache"
                drop_caches
            fi
            start=$(date +%s.%N)
            FRT_KERNEL_CACHE="$cache" "$here/frt-robot-host" --log-level info run --live \
                --config "$work/$p.yaml" --sim "$work/sim.yaml" 2>&1 |
                grep -E "device opened|loading the weights|weights opened|weights uploaded|model built|first action chunk|ready|Error|error" | head -20
            echo "process wall time: $(awk "BEGIN { printf \"%.2f\", $(date +%s.%N) - $start }") s"
        done
    done
done
